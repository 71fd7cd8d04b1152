"""What the browser tests share: the system Chromium, where screenshots land, and a readiness probe.
The ``browser`` fixture itself is in tests/conftest.py."""
from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = "/usr/bin/chromium"
# screenshots of the console (copies in docs/img/, shown in docs/operations.md)
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"


def http_ok(url: str) -> bool:
    """True if ``url`` answers 200 within a second."""
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def shot(page: Page, name: str) -> None:
    """A full-page screenshot of ``page`` as tests/artifacts/NAME."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)
