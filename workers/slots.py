"""The exact concurrency limit: free handler slots, and the prefetch allowance for jobs handed off
ahead of their due time."""
from __future__ import annotations

import asyncio
from collections import deque

from .pace import DuePace


class Slots:
    """Free handler slots (``free``) and free prefetch slots (``hold``).

    The claimer takes slots *before* its round trip (so the worker never holds a job it has no
    room for) and gives back those the reply did not fill. A job that is due when claimed takes a
    handler slot. A job the tier handed off ahead of its due time (``zsched scheduler
    --handoff-lead``) waits for that time on a prefetch slot instead, so waiting jobs never keep
    due ones from running; when it is due it moves to a handler slot (:meth:`take_for_held`),
    waiting for the next one to come back if none is free, and its prefetch slot comes back.
    The claim script takes due jobs only up to the handler slots reserved for them (lua/claim.lua,
    ARGV 9), so a worker whose handlers are all busy never claims due jobs it cannot start soon:
    beyond those, only as many as ``pace`` expects its handlers to start within half a claim's
    round trip (:mod:`workers.pace`; 0 for handlers slower than that), on prefetch slots.

    ``wake`` is the claim loop's wake-up: set when a slot comes back, when a notification makes a
    partition a candidate, and at shutdown."""

    __slots__ = ("concurrency", "free", "hold", "pace", "prefetch", "wake", "waiting")

    def __init__(self, concurrency: int, prefetch: int = 0) -> None:
        self.concurrency = concurrency
        self.free = concurrency
        self.prefetch = prefetch
        self.hold = prefetch
        self.wake = asyncio.Event()
        self.waiting: deque[asyncio.Future[None]] = deque()
        """Held jobs that are due, waiting for a handler slot, first come first served."""
        self.pace = DuePace(concurrency)  # the handlers' and the claims' times (HandlerRunner, the fetch)

    @property
    def held(self) -> int:
        """Prefetch slots taken: by jobs waiting on them, and by claims in flight."""
        return self.prefetch - self.hold

    def reserve(self, n: int) -> int:
        """Take ``n`` slots for a claim: handler slots first, then prefetch slots; returns how
        many of them are handler slots (the claim's limit on due jobs)."""
        return self.reserve_many([n])[0]

    def reserve_many(self, ns: list[int]) -> list[int]:
        """Take slots for a round trip's claims (``ns[i]`` jobs for claim i, together at most
        ``free + hold``); returns each claim's handler slots (its limit on due jobs). The handler
        slots are spread evenly over the claims, each given at most its ``n``, and all of them go
        out before any prefetch slot does: a claim with no handler slot refuses a due job (it
        stays in the ready list for the next round trip), so giving the first claim every
        handler slot made the others come back empty. (Measured at 1 000 jobs/s with the
        hand-off lead: 0.9 empty claims per job, each a full script run in Redis.)"""
        hs = self.handler_share(ns)
        for n, h in zip(ns, hs):
            self.free -= h
            self.hold -= n - h
        return hs

    def handler_share(self, ns: list[int]) -> list[int]:
        """The handler slots :meth:`reserve_many` would give claims of ``ns`` jobs (takes nothing)."""
        hs = [0] * len(ns)
        left = min(self.free, sum(ns))
        while left > 0:
            for i, n in enumerate(ns):
                if left and hs[i] < n:
                    hs[i] += 1
                    left -= 1
        return hs

    def put_back(self, handler: int, hold: int = 0) -> None:
        """Slots a claim did not fill (or a job that did not run) come back."""
        self.hold += hold
        for _ in range(handler):
            self.give_back()
        if hold:
            self.wake.set()

    def give_back(self) -> None:
        """A handler slot comes back (a handler ended): to the first due held job waiting for one,
        else to the claim loop."""
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1
        self.wake.set()

    async def take_for_held(self) -> None:
        """A job on a prefetch slot is due: take a handler slot for it (waiting for one if none is
        free), then give its prefetch slot back. Cancelled while waiting, it takes nothing and its
        prefetch slot stays taken (the caller gives it back with the job)."""
        if self.free > 0 and not self.waiting:
            self.free -= 1
        else:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiting.append(fut)
            try:
                await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():  # handed a slot just as we were cancelled
                    self.give_back()
                raise
        self.hold += 1
        self.wake.set()
