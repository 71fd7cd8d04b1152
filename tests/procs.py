"""Waiting on ``zsched`` child processes in tests (the processes themselves are
``scheduler.shell.servers.ZschedProc``)."""
from __future__ import annotations

import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the working tree: cwd for processes that import test apps


def wait_until(pred, timeout: float, interval: float = 0.02, what: str = "condition"):
    """Poll ``pred`` until it returns something truthy and return that; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
