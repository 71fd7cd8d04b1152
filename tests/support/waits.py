"""The tests' one way to wait: for a state or an event to show, never for a fixed time.

:func:`wait_until` (blocking) and :func:`wait_for` (asyncio; the condition may be a coroutine
function) take the same arguments, in the same order, with the same defaults, and fail the same
way: ``AssertionError("timed out after T s waiting for WHAT")``. The library's own wait for its
child servers (``scheduler.shell.servers.wait_for``) is for the library; tests use these.
"""
from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

TIMEOUT = 10.0    # seconds, unless the caller knows better
INTERVAL = 0.02   # between two looks at the condition


What = str | Callable[[], str]  # what is awaited: a text, or a function making it at the timeout (a log's tail)


class _Deadline:
    def __init__(self, timeout: float, what: What) -> None:
        self.timeout, self.what = timeout, what
        self.at = time.monotonic() + timeout

    def check(self) -> None:
        if time.monotonic() > self.at:
            what = self.what() if callable(self.what) else self.what
            raise AssertionError(f"timed out after {self.timeout:g} s waiting for {what}")


def wait_until(cond: Callable[[], Any], timeout: float = TIMEOUT, interval: float = INTERVAL,
               what: What = "condition") -> Any:
    """Look at ``cond()`` until it returns something truthy, and return that; AssertionError
    naming ``what`` (a text, or a function called then) after ``timeout`` seconds."""
    deadline = _Deadline(timeout, what)
    while True:
        v = cond()
        if v:
            return v
        deadline.check()
        time.sleep(interval)


async def wait_for(cond: Callable[[], Any], timeout: float = TIMEOUT, interval: float = INTERVAL,
                   what: What = "condition") -> Any:
    """:func:`wait_until` for asyncio: ``cond`` may return an awaitable, which is awaited; the
    event loop runs between looks."""
    deadline = _Deadline(timeout, what)
    while True:
        v = cond()
        if inspect.isawaitable(v):
            v = await v
        if v:
            return v
        deadline.check()
        await asyncio.sleep(interval)


def wait_until_time(t: float) -> None:
    """Let the wall clock pass ``t`` (epoch seconds): for a deadline the test itself set (a grace
    period, a TTL, a lease) that only time ends. Sleeps as long as that takes, no longer."""
    while (left := t - time.time()) > 0:
        time.sleep(left)


async def wait_for_time(t: float) -> None:
    """:func:`wait_until_time` for asyncio: the event loop runs meanwhile."""
    while (left := t - time.time()) > 0:
        await asyncio.sleep(left)
