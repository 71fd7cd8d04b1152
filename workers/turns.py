"""Idle turns: the moments an idle worker is awake anyway, for its periodic chores to ride on.

An idle worker's bell wait times out every few seconds (``BELL_WAIT``, :mod:`.doorbell`) and the
doorbell then checks the listener role (a sleeper's check, on one server, comes back in the wait's
own reply): one wake-up. The worker's other
periodic chores, the registry record (:mod:`.presence`, every 5 s), the namespace settings
(:mod:`.namespace`, every 5 s) and a sleeper's try for the safety-net sweep's turn
(:mod:`.sweep`, every 6.4-8 s), each came on a timer of its own and woke the process once more.
A wake-up of an idle process costs far more than the little it does there (about 0.2 ms of CPU
each on the 2-core VM: the process is cold), and an idle worker's upkeep is what every added
worker costs the fleet per second, jobs or not: 16 workers' upkeep over a 10 s load of 3 000
batched jobs was about as much as the jobs' own work (docs/scaling.md, "Adding workers").

So a chore that waits for its next turn (:meth:`Turns.sleep`, or :meth:`Turns.ticket` beside
other events) goes at the first bell-wait timeout (:meth:`Turns.pulse`) in the last
:data:`WINDOW_S` of its interval, and at the end of its interval when none comes (a busy worker,
whose bell waits are answered by rings or not sent at all): never later than before, at most
:data:`WINDOW_S` earlier (never before half its interval), and on an idle worker in the same
wake-up as the role check, its round trip sent beside the role check's.
"""
from __future__ import annotations

import asyncio

WINDOW_S = 2.5
"""How early a chore may go to ride on a bell-wait timeout: a little over the doorbell's
``BELL_WAIT`` (2 s; tests/unit/test_turns.py checks the order), so that one such timeout falls in
every window of an idle worker, also when Redis answers a wait's timeout late (it checks them
``hz`` times a second)."""


class Turns:
    """The chores waiting for a turn, and the pulses that give them one (one per ``serve()``)."""

    def __init__(self, window: float = WINDOW_S) -> None:
        self.window = window
        self._waiting: list[tuple[float, asyncio.Future[None]]] = []

    def ticket(self, delay: float) -> asyncio.Future[None]:
        """A future that the first :meth:`pulse` after ``delay - window`` seconds from now
        resolves (and never one before ``delay / 2``). The caller waits for it, or ``delay``, or
        anything else, then cancels it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        # the tickets of chores that went on their own (no pulse came: a busy worker) go here, so
        # the list stays as short as the chores are few
        self._waiting = [w for w in self._waiting if not w[1].done()]
        self._waiting.append((loop.time() + max(delay - self.window, delay / 2), fut))
        return fut

    async def sleep(self, delay: float) -> None:
        """Sleep ``delay`` seconds, or until the first pulse in its last ``window``."""
        fut = self.ticket(delay)
        try:
            await asyncio.wait([fut], timeout=delay)
        finally:
            fut.cancel()

    def pulse(self) -> None:
        """The worker is awake with nothing else to do (a bell wait timed out): every chore whose
        window has opened goes now. Chores whose callers stopped waiting are dropped."""
        if not self._waiting:
            return
        now = asyncio.get_running_loop().time()
        keep = []
        for at, fut in self._waiting:
            if fut.done():
                continue
            if at <= now:
                fut.set_result(None)
            else:
                keep.append((at, fut))
        self._waiting = keep

    @property
    def waiting(self) -> int:
        """Tickets held: chores waiting for a turn, and those that stopped waiting since the last
        ticket or pulse."""
        return len(self._waiting)
