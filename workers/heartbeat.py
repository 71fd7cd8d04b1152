"""Heartbeats: the lease of every running job is extended every lease/3, through the outbox.

A long but healthy handler is therefore never run twice. The loop sleeps until the next
heartbeat is due (or until a job starts whose heartbeat is due sooner), so an idle worker or one
running only short jobs sends no extensions at all.
"""
from __future__ import annotations

import asyncio
import math
import time

from .attempt import Attempt
from .outbox import Outbox


class Heartbeats:
    """Queues an ``extend`` per running attempt when its heartbeat is due (one at a time per
    attempt: none while the last is unanswered). ``next_due`` is the earliest heartbeat time
    (monotonic); whoever starts an attempt due sooner sets ``wake``."""

    def __init__(self, running: set[Attempt], outbox: Outbox) -> None:
        self.running = running
        self.outbox = outbox
        self.wake = asyncio.Event()
        self.next_due = math.inf

    def due(self, now: float) -> float:
        """Queue the extensions due at ``now``; returns when the next one is due."""
        nxt = math.inf
        extend = self.outbox.extend
        for r in self.running:
            if r.lost:
                continue
            if r.next_hb <= now:
                r.next_hb = now + r.lease_s / 3.0
                if not r.hb_pending:
                    r.hb_pending = True
                    extend(r)
            if r.next_hb < nxt:
                nxt = r.next_hb
        return nxt

    async def run(self) -> None:
        """The heartbeat loop (until cancelled)."""
        while True:
            if not self.running:
                self.next_due = math.inf
                self.wake.clear()
                await self.wake.wait()
                continue
            nxt = self.next_due = self.due(time.monotonic())
            self.wake.clear()
            if nxt == math.inf:
                # Every running attempt has lost its lease: nothing to extend until a job starts
                # (looping back at once would spin without ever yielding to the event loop).
                await self.wake.wait()
                continue
            try:
                async with asyncio.timeout(max(0.005, nxt - time.monotonic())):
                    await self.wake.wait()
            except TimeoutError:
                pass
