"""Where things are."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]  # the working tree: cwd for processes that import test apps
