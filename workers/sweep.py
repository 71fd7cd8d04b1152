"""When a worker next tries for its queues' safety-net sweep (:mod:`.fetch`).

A worker tries for the sweep's turn (:meth:`~workers.doorbell.Doorbell.sweep_turns`, one round
trip) once per sweep period, a sleeper every few periods (``Doorbell.sweep_stretch``), at a random
0.8-1.0 of it so the workers of a queue do not all try at once. On an idle worker the try rides
on an idle turn (:mod:`.turns`): the wake-up of a bell wait's timeout in the last part of that
wait, beside the role check, instead of a wake-up of its own; on one server its commands go ahead
of the next bell wait, in its write (``ride``), and the sweep reads their replies
(:meth:`SweepTimer.swept`) instead of making the round trip itself.
"""
from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from .turns import Ride, Ticket, Turns


class SweepTimer:
    """The time of the last sweep (``last``, monotonic) and of the next try; ``wake`` is set when
    an idle turn gives the try its turn (the claim loop waits on it)."""

    def __init__(self, turns: Turns, wake: asyncio.Event, ride: Ride | None = None) -> None:
        self.last = time.monotonic()
        self._turns = turns
        self._wake = wake
        self._ride = ride
        self._ticket: Ticket | None = None
        self._ridden: tuple[float, list[Any]] | None = None  # (when, the replies of the try that rode)

    def wait(self, every: float, stretch: float) -> float:
        """Seconds until the next try (0 or less: now), the period ``every`` times ``stretch``
        after the last sweep; 0 once an idle turn came in its window."""
        ticket = self._ticket
        if ticket is not None and ticket.done() and not ticket.cancelled():
            return 0.0
        wait = self.last + every * stretch * random.uniform(0.8, 1.0) - time.monotonic()
        if wait > 0 and ticket is None:
            self._ticket = self._turns.ticket(wait, self._ride)
            self._ticket.add_done_callback(self._turn)
        return wait

    def swept(self, fresh: float = 0.0) -> list[Any] | None:
        """A sweep (or a try for its turn) just happened: the period starts again. Returns the
        replies of the try's commands when they rode on a bell wait less than ``fresh`` seconds
        ago (else None: the try makes a round trip of its own); they serve one sweep."""
        got, self._ridden = self._ridden, None
        self.last = time.monotonic()
        if self._ticket is not None:
            self._ticket.cancel()
            self._ticket = None
        return got[1] if got is not None and self.last - got[0] < fresh else None

    def _turn(self, ticket: Ticket) -> None:
        if not ticket.cancelled():
            replies = ticket.result()
            if replies is not None:
                self._ridden = (time.monotonic(), replies)
            self._wake.set()
