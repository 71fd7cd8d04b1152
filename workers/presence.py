"""The worker's entry in its namespace's worker registry (:mod:`scheduler.protocol.registry`).

One ``serve()`` registers under a fresh id when its parts are up, refreshes its record every
``registry_interval`` seconds (at once as well when a stop is asked for, so the registry shows it
draining), and removes it after its graceful shutdown. A refresh is one small script call: nothing
is sent per job, and nothing grows with the partitions. A failed refresh never stops the worker:
an outage is logged once (as the worker's other loops do) and the refresh is tried again within
the interval, so a Redis that restarted empty or failed over has the record back at the next one.
"""
from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from redis.exceptions import ResponseError

from scheduler.protocol.call import Call
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.masking import mask_secrets
from scheduler.protocol.registry import (
    LIVENESS_INTERVALS,
    MAX_CURRENT_JOBS,
    CurrentJob,
    WorkerRecord,
    beat_call,
    encode_record,
    leave_call,
    new_worker_id,
    zsched_version,
)
from scheduler.redisio.batch import evalsha, not_run
from scheduler.redisio.errors import REDIS_ERRORS
from scheduler.redisio.transport import AsyncScriptTransport

from .attempt import Attempt
from .lifecycle import Lifecycle, supervise
from .stats import WorkerStats
from .wire import Outage

log = logging.getLogger("zsched.worker")

LEAVE_TIMEOUT = 2.0  # seconds a graceful stop waits to remove the record (it expires by itself anyway)


def base_record(queues: list[str], concurrency: int, prefetch: int, interval: float,
                ack_linger: float = 0.0) -> WorkerRecord:
    """This process's record before anything ran; :class:`~scheduler.protocol.registry.RecordTooLarge`
    (a ValueError) when a refresh could ever exceed the record size limit, so that a worker serving
    too many queue names is refused when it starts, not at its first refresh."""
    rec = WorkerRecord(socket.gethostname(), os.getpid(), tuple(queues), concurrency, prefetch, interval,
                       version=zsched_version(), ack_linger_s=ack_linger)
    encode_record(rec.worst_case())
    return rec


class Presence:
    """Registers, refreshes and removes one ``serve()``'s record. ``running`` and ``qstats`` are the
    worker's own book-keeping, read (not copied) at each refresh."""

    def __init__(self, ks: Keyspace, transport: AsyncScriptTransport, base: WorkerRecord,
                 running: set[Attempt], qstats: Mapping[str, WorkerStats], life: Lifecycle) -> None:
        self.ks = ks
        self.transport = transport
        self.base = base
        self.id = new_worker_id(base.host, base.pid)
        self.running = running
        self.qstats = qstats
        self.life = life
        self.t0 = time.monotonic()
        self._done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping_sent = False
        self._rode = False  # a bell wait took this interval's refresh (ride)
        self._outage = Outage("worker registry")
        self._refusal: str | None = None  # the refusal last logged (NOPERM, ...), until a refresh succeeds

    def record(self) -> WorkerRecord:
        """The record as of now: slots in use per queue, the longest-running jobs (at most
        MAX_CURRENT_JOBS: a refresh stays small at any concurrency), counters, uptime, stopping or not."""
        busy = held = 0
        per = dict.fromkeys(self.base.queues, 0)
        handlers = []
        for r in self.running:
            if r.held:
                held += 1
            else:
                busy += 1
                per[r.queue] = per.get(r.queue, 0) + 1
                handlers.append(r)
        now = time.monotonic()
        longest = heapq.nsmallest(MAX_CURRENT_JOBS, handlers, key=lambda r: r.started)
        stats = WorkerStats.total(self.qstats.values())
        return replace(self.base, busy=busy, running=tuple(per[q] for q in self.base.queues) if busy else (),
                       held=held, claimed=stats.claimed, acked=stats.acked, uptime_s=now - self.t0,
                       stopping=self.life.stop_requested.is_set(),
                       current=tuple(CurrentJob(r.raw_id, r.queue, now - r.started) for r in longest))

    def start(self) -> None:
        """Register now and refresh from then on (a task on the running loop)."""
        self._task = asyncio.get_running_loop().create_task(supervise("registry", self._run))

    async def beat(self, ridden: list[Any] | None = None) -> float:
        """One refresh; returns the seconds until the next one (sooner after a failure).
        ``ridden``: the replies of the refresh that rode on a bell wait (:meth:`ride`); a refresh
        whose ride did not come back whole, or came back refused (NOSCRIPT after a restart or a
        ``SCRIPT FLUSH``, a failover's READONLY, NOPERM, ...), is sent again as usual, so its
        error is handled and logged as any other."""
        if ridden is None or any(isinstance(r, Exception) for r in ridden):
            rec = self.record()
            self._stopping_sent = rec.stopping
            try:
                await self.transport.call(*self._call(rec))
            except REDIS_ERRORS as exc:
                return self._failed(exc)
        self._outage.ok()
        if self._refusal is not None:
            log.info("worker registry: Redis accepts this worker's record again")
            self._refusal = None
        return self.base.interval_s

    def ride(self) -> list[tuple[Any, ...]]:
        """A refresh's command, for a bell wait to send ahead of its own (:mod:`.turns`): built
        when the wait takes it, so the record says what is true then."""
        rec = self.record()
        self._stopping_sent = rec.stopping
        self._rode = True
        return [evalsha(self.transport.scripts, self._call(rec))]

    def _call(self, rec: WorkerRecord) -> Call:
        return beat_call(self.ks, self.id, encode_record(rec), rec.interval_s)

    def _failed(self, exc: BaseException) -> float:
        if isinstance(exc, ResponseError) and not not_run(exc):
            # refused, not unreachable: say what to fix, once, and try again each interval
            # (permissions can be granted while the worker runs)
            if self._refusal != str(exc):
                self._refusal = str(exc)
                log.error("worker registry: Redis refused this worker's record (%s: %s); the worker runs on, but "
                          "zsched workers, zsched stats and the zsched_workers metrics do not see it. A "
                          "NoPermissionError (NOPERM) means its ACL user lacks the keys %s and %s "
                          "(docs/operations.md, 'ACL users')", type(exc).__name__, mask_secrets(str(exc)),
                          self.ks.workers_key, self.ks.workers_live_key)
            return self.base.interval_s
        return min(self.base.interval_s, self._outage.failed(exc))

    async def _run(self) -> None:
        ridden = None
        while not self._done.is_set():
            delay = await self.beat(ridden)
            ridden = await self._sleep(delay)

    async def _sleep(self, delay: float) -> list[Any] | None:
        """Until the next refresh is due, :meth:`leave` is called, or (once) a stop is asked for;
        or until the idle turn in its last seconds (workers/turns.py: an idle worker is awake then
        anyway), whose bell wait may have taken the refresh along: its replies, else None."""
        events = [self._done] if self._stopping_sent else [self._done, self.life.stop_requested]
        self._rode = False
        ticket = self.life.turns.ticket(delay, self.ride)
        waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(e.wait()) for e in events]
        try:
            waiters.append(ticket)
            await asyncio.wait(waiters, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            if self._rode and not ticket.done():
                # a wait took the refresh and its reply is on the way: it lands before whatever
                # comes next (a removal after it would leave the record live until it expires)
                await asyncio.wait([ticket], timeout=LEAVE_TIMEOUT / 2)
            return ticket.result() if ticket.done() and not ticket.cancelled() else None
        finally:
            for w in waiters:
                w.cancel()
            ticket.cancel()

    async def leave(self, timeout: float = LEAVE_TIMEOUT) -> None:
        """Stop refreshing (a refresh under way finishes first, so none lands after the removal) and
        remove the record, within ``timeout`` seconds in all. If Redis cannot be reached, the record
        drops out of the live list by itself within
        :data:`~scheduler.protocol.registry.LIVENESS_INTERVALS` intervals."""
        self._done.set()
        deadline = asyncio.get_running_loop().time() + timeout  # for both steps: a stop is not held up
        if self._task is not None:
            await asyncio.wait([self._task], timeout=timeout)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            async with asyncio.timeout_at(deadline):
                await self.transport.call(*leave_call(self.ks, self.id))
        except REDIS_ERRORS as exc:  # asyncio.timeout's TimeoutError is one of them
            log.info("worker registry: could not remove this worker's record (%s: %s); it drops out of the live "
                     "list within %.0f s by itself", type(exc).__name__, mask_secrets(str(exc)),
                     self.base.interval_s * LIVENESS_INTERVALS)
