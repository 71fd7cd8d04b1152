"""A zsched stack for an application's tests, in-process: :class:`TestStack`.

::

    from datetime import timedelta
    from scheduler.testing import TestStack

    with TestStack() as stack:                       # in-memory Redis (fakeredis + Lua), fake clock
        stack.client.schedule(timedelta(hours=4), {"to": "a@example.com"}, queue="emails")
        stack.assert_scheduled("emails", at=timedelta(hours=4))
        stack.advance(timedelta(hours=4))            # no sleeping: the scripts see the new time
        report = stack.run_due(worker)               # the worker's handlers run here, now

The stack plays the scheduler tier (``tick``, ``reap``, cron refills: :mod:`.tier`) and, in
``run_due``, one worker (:mod:`.run`), with the production Lua scripts on either an in-memory
Redis whose clock the stack owns (:mod:`.clock`) or, with ``redis_url``, a real Redis, whose
clock nobody can move.
"""
from __future__ import annotations

import asyncio
import random
import reprlib
import uuid
import weakref
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from workers import Worker
from workers.outcome import Poison

from ..client import AsyncClient, Client
from ..protocol.errors import ZschedError
from ..protocol.models import JobInfo, JobState
from ..protocol.replies import Claimed
from ..protocol.timeutil import MAX_MS
from .assertions import StackAssertions
from .clock import ClockedServer, FakeClock, fake_async_redis, fake_redis
from .run import RunReport, TimedOutThreads, WorkerPass, call_handler, call_handler_async
from .tier import Fired, TierPass
from .transitions import Ops

__all__ = ["TestStack", "TimeTravelUnavailable"]


class TimeTravelUnavailable(ZschedError, RuntimeError):
    """The stack runs on a real Redis, whose clock (``TIME``) the stack cannot move."""


def _delta(delta: timedelta | float | None, units: dict[str, float]) -> timedelta:
    if delta is None:
        return timedelta(**units)
    if units:
        raise TypeError("pass either a timedelta (or seconds) or keyword units (hours=1), not both")
    if isinstance(delta, timedelta):
        return delta
    if isinstance(delta, bool) or not isinstance(delta, (int, float)):
        raise TypeError(f"advance() takes a timedelta or seconds, got {type(delta).__name__}")
    try:
        return timedelta(seconds=delta)
    except (OverflowError, ValueError):  # beyond timedelta's 999999999 days, inf, nan
        raise ValueError(f"advance() takes a finite number of seconds up to timedelta.max, "
                         f"got {reprlib.repr(delta)}") from None


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class TestStack(StackAssertions):
    """A Redis with zsched's scripts, a :class:`~scheduler.Client` bound to it, and the scheduler
    tier's and a worker's transitions run in-process on demand.

    ``redis_url``: None (default) for an in-memory Redis (fakeredis with Lua) with a fake clock
    starting at ``now`` (an aware datetime or epoch seconds; default: the host's time); a URL to
    run on a real Redis (then ``advance``/``now =`` raise :class:`TimeTravelUnavailable`).
    ``namespace``: default a fresh one (on a real Redis its keys are deleted by :meth:`close`).
    ``partitions``: the namespace's partition count (default 1: the scripts are the same with more,
    only slower; pass 4 or 16 to test code that spreads work over partitions). ``seed``: seeds the
    retry backoff's jitter (an int or a ``random.Random``), so a test sees the same delays on
    every run.
    ``tombstone_ttl``: seconds finished jobs stay visible to ``get()``: set as the stack's
    namespace's setting (``Client.set_tombstone_ttl``); default, the namespace's (1 h).
    """

    __test__ = False  # a class named Test* is not a pytest test class

    def __init__(self, *, redis_url: str | None = None, namespace: str | None = None, partitions: int = 1,
                 now: datetime | float | None = None, seed: int | random.Random | None = 0,
                 tombstone_ttl: float | None = None) -> None:
        self.namespace = namespace or f"test-{uuid.uuid4().hex[:12]}"
        self._own_namespace = namespace is None
        self.redis_url = redis_url
        self.partitions = partitions
        self.tombstone_ttl = tombstone_ttl
        self.rng = seed if isinstance(seed, random.Random) else random.Random(seed)
        """The random source of the retry backoff's jitter in ``run_due``."""
        self.clock: FakeClock | None = None
        """The fake clock (None on a real Redis)."""
        self._server: ClockedServer | None = None
        if redis_url is None:
            self.clock = FakeClock(now)
            self._server = ClockedServer(self.clock)
            self.redis: Any = fake_redis(self._server)
        else:
            if now is not None:
                raise TimeTravelUnavailable(self._no_time_travel("start at now=..."))
            from ..redisio.connection import sync_redis
            self.redis = sync_redis(redis_url)
        self.client = Client(self.redis, namespace=self.namespace, partitions=partitions).connect()
        if tombstone_ttl is not None:
            self.client.set_tombstone_ttl(tombstone_ttl)
        """The producer client of the stack's namespace: pass it to the code under test."""
        self.ops = Ops(self.client)
        """The raw transitions (claim, ack, fail, extend, release, tick, reap) for tests that act
        as a worker step by step."""
        self.tier = TierPass(self.client, self._now_ms, fake_clock=self.clock is not None)
        """The scheduler tier's work (tick, reap, cron refills); :meth:`fire` runs it."""
        self._aclient: AsyncClient | None = None
        # per worker: its sync handlers still running past their timeout, each holding a slot
        self._timed_out: weakref.WeakKeyDictionary[Worker, TimedOutThreads] = weakref.WeakKeyDictionary()
        self._teach_clock(self.client)

    # -- the clock ------------------------------------------------------------------------------
    def _no_time_travel(self, what: str) -> str:
        return (f"cannot {what}: this TestStack runs on the real Redis at {self.redis_url}, and the scripts read "
                "Redis's own clock (TIME), which no client can move. Use the in-memory backend for time travel: "
                "TestStack() without redis_url (the zsched_stack fixture does by default); on a real Redis, "
                "schedule jobs due now (or in the past) and call run_due()")

    def _now_ms(self) -> int:
        if self.clock is not None:
            return self.clock.ms
        secs, us = self.redis.time()
        return int(secs) * 1000 + int(us) // 1000

    @property
    def now(self) -> datetime:
        """The time the scripts see (UTC). Settable on the in-memory backend: the clock jumps
        there (forwards or back) with nothing running meanwhile, as after an outage of the
        scheduler tier; compare :meth:`advance`."""
        return datetime.fromtimestamp(self._now_ms() / 1000, tz=UTC)

    @now.setter
    def now(self, when: datetime | float) -> None:
        self._need_clock("set now").set(when)

    def _need_clock(self, what: str) -> FakeClock:
        if self.clock is None:
            raise TimeTravelUnavailable(self._no_time_travel(what))
        return self.clock

    def _teach_clock(self, client: Client | AsyncClient) -> None:
        """Producers read this host's clock for what they compute themselves (an id's run_at
        estimate, which the schedule script keeps when it is within a few ms of Redis's, created
        times, a new cron's first occurrences): on the fake clock, they read the fake one."""
        clock = self.clock
        if clock is not None:
            client.calls.clock = lambda: clock.us / 1_000_000

    def _target_ms(self, delta: timedelta | float | None, units: dict[str, float]) -> int:
        clock = self._need_clock("advance the clock")
        step = _delta(delta, units)
        if step < timedelta(0):
            raise ValueError(f"advance() moves forwards only, got {step!r}; set stack.now to jump back")
        target = clock.ms + step // timedelta(milliseconds=1)
        if target > MAX_MS:
            raise ValueError(f"advance() by {step!r} would move the clock past 9999-12-31 UTC")
        return target

    def _steps(self, target_ms: int) -> Iterator[None]:
        """Move the clock to ``target_ms`` stopping at every due timer and lease deadline on the
        way; yields at each stop (the tier has fired there) so the caller can run a worker."""
        clock = self._need_clock("advance the clock")
        while True:
            yield
            nxt = self.fire().next_event_ms
            if nxt is None or nxt > target_ms:
                break
            clock.set_ms(max(nxt, clock.ms + 1))
        clock.set_ms(max(target_ms, clock.ms))
        yield

    def advance(self, delta: timedelta | float | None = None, *, worker: Worker | None = None,
                **units: float) -> RunReport:
        """Let time pass: ``advance(timedelta(hours=4))``, ``advance(90)`` (seconds) or
        ``advance(hours=1, minutes=30)``. The clock stops at every timer and lease deadline on
        the way, where the scheduler tier fires (so a cron fires once per occurrence and nothing
        misfires); with ``worker``, its handlers run at each stop (:meth:`run_due`), so retries
        due within the span run at their times too. Returns what the worker ran (empty without
        one). Raises :class:`TimeTravelUnavailable` on a real Redis."""
        report = RunReport()
        for _ in self._steps(self._target_ms(delta, units)):
            if worker is not None:
                report.extend(self.run_due(worker))
        if worker is None:
            self.fire()
        return report

    async def advance_async(self, delta: timedelta | float | None = None, *, worker: Worker | None = None,
                            **units: float) -> RunReport:
        """:meth:`advance` for async tests: the worker's async handlers run on the running loop."""
        report = RunReport()
        for _ in self._steps(self._target_ms(delta, units)):
            if worker is not None:
                report.extend(await self.run_due_async(worker))
        if worker is None:
            self.fire()
        return report

    # -- the scheduler tier and a worker ------------------------------------------------------
    def fire(self) -> Fired:
        """Do what the scheduler tier does at the current time: fire due timers (ready, or
        misfired by their policy), reap expired leases, refill crons."""
        return self.tier.fire()

    def _pass(self, worker: Worker, max_runs: int) -> WorkerPass:
        if not isinstance(worker, Worker):
            raise TypeError(f"run_due() takes a workers.Worker, got {type(worker).__name__}")
        # run_due fires at one instant, usually right after advance() fired there: tick only when
        # a timer is due, reap only when the clock moved since the last reap
        return WorkerPass(self.client, worker, self.tier.fire_due, self.rng, max_runs,
                          self._timed_out.setdefault(worker, TimedOutThreads()))

    def run_due(self, worker: Worker, *, max_runs: int = 10_000) -> RunReport:
        """Fire what is due now and run ``worker``'s handlers on it, in-process, until nothing due
        is left (a retry due now runs again; one due later waits for :meth:`advance`). Outcomes
        go through the production scripts: acks, retries with the job's backoff (jittered from
        :attr:`rng`), ``Retry``, ``PermanentError``, dead-lettering. Async handlers run on a
        private event loop: from a coroutine, use :meth:`run_due_async`. The worker's Redis URL
        and namespace are not used: its handlers run against this stack."""
        wp = self._pass(worker, max_runs)
        if any(spec is not None and spec.is_async for spec in wp.specs.values()) and _loop_running():
            raise RuntimeError("run_due() cannot run the worker's async handlers inside a running event loop: "
                               "use `await stack.run_due_async(worker)` (or advance_async) in async tests")
        runner: asyncio.Runner | None = None

        def loop() -> asyncio.Runner:
            nonlocal runner
            if runner is None:
                runner = asyncio.Runner()
            return runner

        try:
            while batch := wp.claim_due():
                for item in batch:
                    spec, job = item.spec, item.job
                    wp.settle(item, None if spec is None or isinstance(job, Poison) else call_handler(spec, job, loop))
                wp.flush()
        finally:
            if runner is not None:
                runner.close()
        return wp.report

    async def run_due_async(self, worker: Worker, *, max_runs: int = 10_000) -> RunReport:
        """:meth:`run_due` for async tests: async handlers run on the running loop, sync ones inline."""
        wp = self._pass(worker, max_runs)
        while batch := wp.claim_due():
            for item in batch:
                spec, job = item.spec, item.job
                exc = None
                if spec is not None and not isinstance(job, Poison):
                    exc = await call_handler_async(spec, job)
                wp.settle(item, exc)
            wp.flush()
        return wp.report

    def claim(self, queue: str = "default", n: int = 1) -> list[Claimed]:
        """Claim up to ``n`` ready jobs of ``queue`` and never finish them: a worker that died
        holding them. Their leases expire after each job's ``lease``; :meth:`advance` past it
        and the tier reaps them (ready again, or dead when the attempts are spent)."""
        self.fire()
        return self.ops.claim(queue, n)

    # -- inspection -----------------------------------------------------------------------------
    def queues(self) -> list[str]:
        """The queues that have (or had) jobs in the namespace."""
        return sorted(self.client.stats())

    def jobs_in(self, state: JobState | str, queue: str | None = None) -> list[JobInfo]:
        """Every job of ``queue`` (default: every queue) in ``state`` (``scheduled``, ``ready``,
        ``running`` or ``dead``), with payloads, in the order ``Client.jobs`` lists them."""
        out: list[JobInfo] = []
        for q in [queue] if queue is not None else self.queues():
            cursor: str | None = None
            while True:
                page, cursor = self.client.jobs(queue=q, state=state, limit=1000, cursor=cursor)
                out += page
                if cursor is None:
                    break
        return out

    def scheduled(self, queue: str | None = None) -> list[JobInfo]:
        """The scheduled jobs (of ``queue``, or all), soonest first within a partition."""
        return self.jobs_in(JobState.SCHEDULED, queue)

    def ready(self, queue: str | None = None) -> list[JobInfo]:
        """The ready jobs: due, waiting for a worker (:meth:`run_due`)."""
        return self.jobs_in(JobState.READY, queue)

    def running(self, queue: str | None = None) -> list[JobInfo]:
        """The running (claimed, leased) jobs."""
        return self.jobs_in(JobState.RUNNING, queue)

    def dead(self, queue: str | None = None) -> list[JobInfo]:
        """The dead-lettered jobs, with their last error."""
        return self.jobs_in(JobState.DEAD, queue)

    def get(self, job_id: str) -> JobInfo | None:
        """``Client.get``: the job in any state, tombstones included."""
        return self.client.get(job_id)

    # -- clients and lifetime -------------------------------------------------------------------
    async def async_client(self) -> AsyncClient:
        """An :class:`~scheduler.AsyncClient` of the stack's namespace, connected (one per stack:
        create it inside the event loop that uses it)."""
        if self._aclient is None:
            redis = fake_async_redis(self._server) if self._server is not None else None
            if redis is None:
                from ..redisio.connection import async_redis
                assert self.redis_url is not None
                redis = async_redis(self.redis_url)
            self._aclient = await AsyncClient(redis, namespace=self.namespace, partitions=self.partitions).connect()
            self._teach_clock(self._aclient)
        return self._aclient

    def close(self) -> None:
        """Close the clients; on a real Redis, delete the namespace's keys when the stack made
        the namespace up."""
        if self.redis_url is not None and self._own_namespace:
            for pattern in (f"{{{self.namespace}:*", f"{{{self.namespace}}}:*"):
                keys = list(self.redis.scan_iter(match=pattern, count=1000))
                for i in range(0, len(keys), 500):
                    self.redis.delete(*keys[i:i + 500])
        self.client.close()

    def __enter__(self) -> TestStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.redis_url or "in-memory"
        return f"TestStack(namespace={self.namespace!r}, {where}, now={self.now.isoformat()})"
