"""Ticks of several partitions in one round trip.

A replica owns several partitions, each fired by its own :class:`~.runner.PartitionRunner` task,
and each tick is a round trip to Redis. Under spread traffic (jobs due at their own moments) a
busy partition ticks about once per job, and the round trip's fixed cost in the replica (taking a
connection, packing, reading, releasing) was most of the replica's CPU per job. The runners wake
on a shared grid of instants (:data:`GRID_S`, within the hand-off lead, so no job is handed off
later than the lead minus the grid step) and send their calls through one :class:`TickBatcher`,
which sends every call submitted in one turn of the event loop as one pipelined round trip and
hands each runner its own replies. A runner whose calls failed gets their first error, as from the
transport, and the others are not affected; a round trip that fails as a whole fails them all.

A busy partition also **widens its own hand-off lead** (:class:`HandoffLead`): under spread traffic
each tick, each claim and each wake-up carried about one job, and their fixed costs were most of
what a spread job costs Redis and the replicas. A partition that fires enough jobs per second
doubles its lead (and its grid step with it) until a step holds a few due jobs, up to the
``--coalesce-lead`` ceiling; a quiet partition keeps the configured lead. Jobs are handed off
earlier, never later, and workers still start each one at its due time.

A partition whose next timers come due together (a **burst**: ``BURST_RING`` of them within
``BURST_SPAN_MS``, 10 ms, which the tick reports) hands them off with the wider **burst lead** (``zsched scheduler
--burst-lead``). A burst's tick rings the queue's burst bell, which wakes every idle worker, most of
them cold processes; with the default lead some of them claimed after the due time, when a claim
takes no more due jobs than its free handler slots, so a partition's burst went out in several
claims and wake-ups instead of one (docs/scaling.md, "Adding workers").
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from ..protocol.bells import BURST_SPAN_MS
from ..protocol.call import Call
from ..redisio.transport import AsyncScriptTransport

GRID_S = 0.010
"""The step of the grid the runners' wake-ups are aligned to, at most half the hand-off lead: a job
is then handed off at least half the lead ahead of its due time (10-20 ms with the default 20 ms),
and the partitions due within one step share a round trip."""

JOBS_PER_STEP = 2.0
"""A busy partition widens its lead until one grid step holds this many due jobs on average."""
MIN_JOBS_PER_STEP = 0.5
"""...and only when the widest step would hold at least this many: below, a wider lead would still
move about one job per tick, buying nothing for the longer window in which a job is ``ready``."""
RATE_WINDOW_S = 0.25
"""The partition's firing rate is measured over windows this long, and its lead chosen again at the
end of each: it widens at most one level per window. With 1 s windows a partition whose traffic
began took 3 s to reach 160 ms (20, 40, 80, 160), a third of the fan-out bench's 10 s loads."""
RATE_SPAN_S = 1.0
"""A narrower lead is taken only when the rate over the windows of about this long asks for one too:
a quarter second of a partition firing 19 jobs/s holds 4.75 jobs on average, and one in twenty holds
one or none, which alone would drop the lead to the configured one and climb back a level at a time."""


def grid_step(lead: float) -> float:
    """The grid step of the configured hand-off ``lead``: at most half of it (0: no grid)."""
    return min(GRID_S, lead / 2)


def idle_turn(after: float, interval: float) -> float:
    """The time of an idle check or reap turn due ``interval`` after ``after`` (monotonic), moved
    down onto the multiples of ``interval``: the turns of a replica's partitions then fall on the
    same instants whatever their phases, the replica wakes once for all of them and the batcher
    sends their calls as one round trip (each partition woke twice a second at its own phase). The
    turn comes at most ``interval`` after ``after``, and after it."""
    if interval <= 0:
        return after
    point = math.floor((after + interval) / interval) * interval
    return point if point > after else point + interval


def next_wake(tick: float, tick_lazy: bool, reap: float, reap_lazy: bool) -> tuple[float, float | None]:
    """When a runner wakes next (monotonic) for its next ``tick`` and ``reap`` (each ``_lazy``: an
    idle check or a reap turn, on :func:`idle_turn`'s instants), and that instant when a lazy one
    comes first (the runner waits for it on the :class:`IdleGrid`)."""
    lazy, due = math.inf, math.inf
    for at, is_lazy in ((tick, tick_lazy), (reap, reap_lazy)):
        if is_lazy:
            lazy = min(lazy, at)
        else:
            due = min(due, at)
    return (lazy, lazy) if lazy < due else (due, None)


class IdleGrid:
    """One timer per instant of :func:`idle_turn` for all runners of a replica: those waiting for
    the same instant resume in the same turn of the event loop, so their calls reach the
    :class:`TickBatcher` together. (A timer each, set from different moments and rounded to whole
    milliseconds, fired a millisecond apart and split the round trip.)"""

    def __init__(self) -> None:
        self._points: dict[float, asyncio.Future[None]] = {}

    async def wait(self, point: float, wake: asyncio.Event) -> None:
        """Until monotonic time ``point`` (a millisecond after, never before) or ``wake`` is set."""
        fut = self._points.get(point)
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self._points[point] = loop.create_future()
            loop.call_later(max(0.0, point - time.monotonic()) + 0.001, self._fire, point)
        waiter = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait((waiter, fut), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()

    def _fire(self, point: float) -> None:
        fut = self._points.pop(point, None)
        if fut is not None and not fut.done():
            fut.set_result(None)


def aligned_sleep(seconds: float, now: float, step: float) -> float:
    """``seconds`` stretched so that the wake-up falls on the next point of the grid of ``step``
    (``now``: the monotonic clock); unchanged without a grid (no hand-off lead, where a later tick
    would be a later job). The grids of the steps a :class:`HandoffLead` uses nest (each step is
    the configured one times a power of two), so partitions on different steps still meet."""
    if step <= 0:
        return seconds
    wake = now + seconds
    return (-(-wake // step)) * step - now


class HandoffLead:
    """The hand-off lead of one partition and the grid step that goes with it.

    ``base`` is the configured lead (``zsched scheduler --handoff-lead``), ``widest`` the ceiling
    (``--coalesce-lead``). While the partition fires at ``rate`` jobs per second, the lead is the
    smallest ``base * 2**k`` (at most ``widest``) whose step holds :data:`JOBS_PER_STEP` jobs,
    provided the widest allowed step holds :data:`MIN_JOBS_PER_STEP`; otherwise ``base``. The step
    scales with the lead, so a job is still handed off at least half the configured lead ahead of
    its due time, and more than that once widened. It widens one level per window
    (:data:`RATE_WINDOW_S`) and narrows at once when both that window's rate and the rate over the
    last :data:`RATE_SPAN_S` ask for a narrower lead. ``burst`` (``--burst-lead``, 0: none) is the
    lead of a tick that hands off a burst (:meth:`look_ahead`), when wider."""

    def __init__(self, base: float, widest: float, burst: float = 0.0) -> None:
        self.base = base
        self.base_step = grid_step(base)
        self.levels = [base]  # base * 2**k up to widest; just [base] when widening is off
        while base > 0 and self.levels[-1] * 2 <= widest + 1e-9:
            self.levels.append(self.levels[-1] * 2)
        self.lead = base
        self.step = self.base_step
        self.burst = burst if base > 0 else 0.0  # no lead, no grid: every job fires at its due time
        self.burst_ahead = False
        self._moved = 0
        self._since: float | None = None
        self._recent: deque[tuple[int, float]] = deque()  # the last windows' (moved, seconds), RATE_SPAN_S of them

    @property
    def next_lead(self) -> float:
        """The lead of the partition's next tick: the burst lead while a burst is next (and wider)."""
        return max(self.lead, self.burst) if self.burst_ahead else self.lead

    def look_ahead(self, next_due_ms: int | None, burst_due_ms: int | None) -> None:
        """A tick reported its partition's earliest remaining timer and its ``BURST_RING``-th
        (``lua/_lib.lua`` ``burst_score``): a burst is next when they are due within
        :data:`~scheduler.protocol.bells.BURST_SPAN_MS`, i.e. when the tick that hands the first
        one off would ring the burst bell. (Within a widened step, 80 ms at 160, four spread jobs
        are common and no burst: the partition would wake a whole lead ahead for them.)"""
        self.burst_ahead = (self.burst > self.lead and next_due_ms is not None and burst_due_ms is not None
                            and burst_due_ms - next_due_ms <= BURST_SPAN_MS)

    @property
    def wake_ahead(self) -> float:
        """How long before the partition's next timer is due its next tick wakes (before the grid
        rounds the wake-up up to a step), while the tick still hands off everything due within
        :attr:`next_lead`: the step plus the configured lead minus the configured step. The
        wake-up then lands at least the configured lead minus its step ahead of the timer, widened
        or not (the lead itself when not widened). Widened, waking a whole lead ahead (as before)
        ended the tick's window on average half a step past the timer: at 19 jobs/s and 160 ms, 1.8
        jobs per tick and as many claims and wake-ups; the window now reaches 70-150 ms past it,
        about 3 jobs. A burst keeps its whole lead."""
        if self.burst_ahead:
            return self.next_lead
        return self.step + self.base - self.base_step

    @property
    def widened(self) -> bool:
        """Whether the lead is wider than the configured one now."""
        return self.lead > self.base

    def choose(self, rate: float) -> float:
        """The lead for a partition firing ``rate`` jobs per second."""
        if len(self.levels) == 1:
            return self.base
        per_s = rate * self.base_step / self.base  # jobs per grid step, per second of lead
        if per_s * self.levels[-1] < MIN_JOBS_PER_STEP:
            return self.base
        return next((lead for lead in self.levels if per_s * lead >= JOBS_PER_STEP), self.levels[-1])

    def observe(self, moved: int, now: float) -> bool:
        """A tick moved ``moved`` jobs at ``now`` (monotonic); once per :data:`RATE_WINDOW_S` the
        lead is chosen again from the rate of that window and of the last :data:`RATE_SPAN_S`. True
        when the lead changed."""
        if self._since is None:
            self._since = now
        self._moved += moved
        elapsed = now - self._since
        before = self.lead
        if elapsed >= RATE_WINDOW_S:
            recent = self._recent
            recent.append((self._moved, elapsed))
            span = sum(s for _, s in recent)
            while span - recent[0][1] >= RATE_SPAN_S:  # keep just enough windows to cover the span
                span -= recent.popleft()[1]
            want = self.choose(self._moved / elapsed)
            # Up one level per window, down at once (once both rates agree). The first tick on a wider
            # lead hands off every job due before the new edge at once, from all the replica's
            # partitions on the same grid point, and the jobs due soonest among them have only the
            # old lead to reach a worker: a jump from 20 to 160 ms made a lone worker (16 rings, 45
            # jobs in that moment, its prefetch allowance full) start some of them up to 50 ms late.
            if want > self.lead:
                self.lead = min(want, self.lead * 2)
            else:  # choose() is not monotonic in the rate: too few jobs and too many both narrow
                self.lead = min(self.lead, max(want, self.choose(sum(m for m, _ in recent) / span)))
            self.step = self.base_step * self.lead / self.base if self.widened else self.base_step
            self._moved, self._since = 0, now
        return self.lead != before


TICK_LANE = "ticks"  # the transport lane the replica's tick round trips keep their connection on


class TickBatcher:
    """Sends the calls its callers submit in one event-loop turn as one round trip."""

    def __init__(self, transport: AsyncScriptTransport) -> None:
        self.transport = transport
        self._pending: list[tuple[list[Call], asyncio.Future[list[Any]]]] = []
        self._atomic = False  # a caller of the pending round trip asked for it
        self.round_trips = 0  # for the tests and the benchmark: how many round trips carried ticks
        self.calls = 0
        self.answered = float("-inf")  # monotonic time of the last fully answered round trip

    def answered_within(self, seconds: float) -> bool:
        """Whether a round trip every call of which Redis answered came back in the last
        ``seconds``. The replica's readiness takes it for a PING: an owner ticks every partition at
        least once per idle check anyway, so it sends no PING of its own; a replica that owns no
        partition, or whose ticks fail, still does."""
        return time.monotonic() - self.answered <= seconds

    async def call_many(self, calls: Sequence[Call], atomic: bool = False) -> list[Any]:
        """The replies of ``calls`` (raises the first error among them, as the transport does).
        ``atomic``: the round trip these calls go in runs as one ``MULTI``/``EXEC`` on one Redis
        (a tick that hands off a burst: its partition's burst ring and the other partitions'
        of the same step then reach a waiting worker together, and it takes several at once,
        workers/doorbell.py ``take_many``). Only then: the workers blocked on the bells are served
        after the transaction's last call, so a spread job's ring would wait for the step's
        other ticks (W = 1 at 1 000 jobs/s, every step atomic: handler p99 1.30x)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Any]] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((list(calls), fut))
        self._atomic = self._atomic or atomic
        return await fut

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        atomic, self._atomic = self._atomic, False
        task = asyncio.ensure_future(self._send(batch, atomic))
        task.add_done_callback(_consumed)

    async def _send(self, batch: list[tuple[list[Call], asyncio.Future[list[Any]]]], atomic: bool = False) -> None:
        flat = [c for calls, _ in batch for c in calls]
        self.round_trips += 1
        self.calls += len(flat)
        try:
            # on a lane: the round trip keeps its pool connection for the next one instead of a
            # checkout and return (the pool's lock, its probe, its book-keeping) per grid step; a
            # round trip that overlaps one still in flight checks out a connection of its own
            # atomic: one MULTI/EXEC on one server, so the burst rings of a grid step land together
            # and a worker waiting on the burst bells takes several at once (Doorbell.take_many);
            # one by one, each woke a worker of its own (docs/architecture.md "Waking workers")
            replies = await self.transport.call_many(flat, raise_on_error=False, lane=TICK_LANE, atomic=atomic)
        except BaseException as exc:  # the round trip as a whole: every caller gets it
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        if not any(isinstance(r, BaseException) for r in replies):
            self.answered = time.monotonic()
        at = 0
        for calls, fut in batch:
            mine, at = replies[at:at + len(calls)], at + len(calls)
            if fut.done():  # its runner was cancelled meanwhile (a hand-over)
                continue
            error = next((r for r in mine if isinstance(r, BaseException)), None)
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(mine)


def _consumed(task: asyncio.Task[None]) -> None:
    """Retrieve the task's outcome (its callers already have it) so asyncio does not log it."""
    if not task.cancelled():
        task.exception()
