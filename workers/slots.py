"""The exact concurrency limit: a count of free handler slots."""
from __future__ import annotations

import asyncio


class Slots:
    """Free handler slots. The claimer takes slots *before* its round trip (so the worker never
    holds a job it cannot start) and gives back those the reply did not fill; the runner gives a
    slot back when a handler ends. ``wake`` is the claim loop's wake-up: set when a slot comes
    back, when a notification makes a partition a candidate, and at shutdown."""

    __slots__ = ("free", "wake")

    def __init__(self, concurrency: int) -> None:
        self.free = concurrency
        self.wake = asyncio.Event()

    def give_back(self) -> None:
        """A handler ended: one more slot, and the claim loop may have work to do."""
        self.free += 1
        self.wake.set()
