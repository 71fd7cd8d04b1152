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

**Riding.** A chore whose round trip is a few plain commands may ride (``ticket(delay, ride)``):
once its window has opened, the doorbell's next bell wait on the connection it keeps (one server,
:mod:`.kept`) takes the commands (:meth:`Turns.rides`) and sends them ahead of the wait, in the
same write; Redis runs them at once, before the wait blocks, and the chore gets their replies as
its ticket's result. The round trip through redis-py's client (its pool, retry wrapper and
command book-keeping), about 75 us warm and several times that in an idle, cold process, was most
of what each chore cost an idle worker (docs/scaling.md, "Chores ride on the bell waits"). A
ticket with a ride that no wait took by the end of its interval (a busy worker, a cluster) ends
as any other, and the chore makes its round trip itself.
"""
from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import Any

WINDOW_S = 2.5
"""How early a chore may go to ride on a bell-wait timeout: a little over the doorbell's
``BELL_WAIT`` (2 s; tests/unit/test_turns.py checks the order), so that one such timeout falls in
every window of an idle worker, also when Redis answers a wait's timeout late (it checks them
``hz`` times a second)."""


Ride = Callable[[], Sequence[tuple[Any, ...]]]
"""A chore's commands, built when a bell wait takes them (so they say what is true then)."""

Ticket = asyncio.Future[list[Any] | None]
"""A chore's turn: its result is None (go now, with a round trip of your own) or the replies of
the commands it rode with (one each, an error reply as its exception)."""


class Turns:
    """The chores waiting for a turn, and the pulses that give them one (one per ``serve()``)."""

    def __init__(self, window: float = WINDOW_S) -> None:
        self.window = window
        # (window opens, ticket, ride, interval ends), in loop time
        self._waiting: list[tuple[float, Ticket, Ride | None, float]] = []
        # when the first ride's window opens (or earlier: a ticket since dropped), so that a
        # listener's waits, one per ring, look through the tickets only once one may ride
        self._ride_at = math.inf

    def ticket(self, delay: float, ride: Ride | None = None) -> Ticket:
        """A future that the first :meth:`pulse` after ``delay - window`` seconds from now
        resolves (and never one before ``delay / 2``), to None. With ``ride``, a bell wait sent
        from then on may take the chore's commands instead (:meth:`rides`): the result is then
        their replies. The caller waits for it, or ``delay``, or anything else, then cancels it."""
        loop = asyncio.get_running_loop()
        fut: Ticket = loop.create_future()
        # the tickets of chores that went on their own (no pulse came: a busy worker) go here, so
        # the list stays as short as the chores are few
        self._waiting = [w for w in self._waiting if not w[1].done()]
        now = loop.time()
        at = now + max(delay - self.window, delay / 2)
        self._waiting.append((at, fut, ride, now + delay))
        if ride is not None:
            self._ride_at = min(self._ride_at, at)
        return fut

    def ride_due(self) -> float:
        """When the first chore that may ride and waits for its turn must go (loop time: the end
        of its interval, when it goes on its own), or infinity if none waits: a sleeper's bell
        wait may last until just before then, and the chore rides on the next one."""
        return min((end for _at, fut, ride, end in self._waiting if ride is not None and not fut.done()),
                   default=math.inf)

    async def sleep(self, delay: float, ride: Ride | None = None) -> list[Any] | None:
        """Sleep ``delay`` seconds, or until the first pulse in its last ``window``; with ``ride``,
        the replies of the commands it rode with (:meth:`ticket`), else None."""
        fut = self.ticket(delay, ride)
        try:
            await asyncio.wait([fut], timeout=delay)
            return fut.result() if fut.done() and not fut.cancelled() else None
        finally:
            fut.cancel()

    def pulse(self, riding: bool = False) -> None:
        """The worker is awake with nothing else to do (a bell wait timed out): every chore whose
        window has opened goes now, except, with ``riding`` (the caller's next wait will call
        :meth:`rides`), those that can ride. Chores whose callers stopped waiting are dropped."""
        if not self._waiting:
            return
        now = asyncio.get_running_loop().time()
        keep = []
        for w in self._waiting:
            at, fut, ride, _end = w
            if fut.done():
                continue
            if at <= now and not (riding and ride is not None):
                fut.set_result(None)
            else:
                keep.append(w)
        self._waiting = keep

    def rides(self) -> list[tuple[Sequence[tuple[Any, ...]], Ticket]]:
        """The commands of the chores that can ride and whose window has opened, each with its
        ticket, taken off the list: a bell wait about to be sent carries them ahead of its own
        command and sets each ticket's result to its commands' replies (:mod:`.kept`)."""
        now = asyncio.get_running_loop().time()
        if now < self._ride_at:
            return []
        out: list[tuple[Sequence[tuple[Any, ...]], Ticket]] = []
        keep = []
        self._ride_at = math.inf
        for w in self._waiting:
            at, fut, ride, _end = w
            if fut.done():
                continue
            if ride is not None and at <= now:
                out.append((ride(), fut))
            else:
                keep.append(w)
                if ride is not None:
                    self._ride_at = min(self._ride_at, at)
        self._waiting = keep
        return out

    @property
    def waiting(self) -> int:
        """Tickets held: chores waiting for a turn, and those that stopped waiting since the last
        ticket or pulse."""
        return len(self._waiting)
