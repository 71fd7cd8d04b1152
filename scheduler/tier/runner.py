"""Firing loop of one owned partition: sleep until the earliest due timer (or a wake-up), run
``tick`` (and ``reap`` when a lease may have expired) with the ownership epoch, repeat.

Work per wake-up is bounded by the batch size; an idle partition costs one tick per ``idle_check``
(a safety net for lost wake-up messages) and a reap per ``reap_interval``, on the replica's idle grid.

When Redis refuses the epoch, the runner asks (``check_conflict``) whether that is a hand-over
(another replica owns the partition now: stop) or an **epoch conflict** (etcd still says this
replica owns it with exactly this epoch, yet Redis has seen a newer one: etcd's history was
restored or replaced). A conflict cannot be solved by re-acquiring: every epoch etcd hands out is
still too old. So the runner keeps the partition and retries with capped exponential backoff, a
handful of refused calls per minute instead of a re-acquire loop, until an operator resets the
stored epoch (``zsched epochs reset``) and a tick is accepted again.
"""
from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from ..client import tracing
from ..metrics import SchedulerMetrics
from ..protocol.calls import Calls
from ..protocol.errors import ZschedError, failure_kind
from ..protocol.ids import encode_id
from ..protocol.tick import (
    NO_RETENTION,
    EpochRefused,
    QueueTokens,
    Retention,
    TickReply,
    parse_cron_fill,
    parse_reap,
    parse_tick,
    reap_call,
    tick_call,
)
from ..redisio.errors import REDIS_ERRORS
from ..redisio.transport import AsyncScriptTransport
from .coalesce import HandoffLead, IdleGrid, TickBatcher, aligned_sleep, idle_turn, next_wake
from .crons import cron_names, fill_calls
from .limits import TokenLedger

if TYPE_CHECKING:
    from .bells import BellRinger

log = logging.getLogger("zsched.scheduler")

INITIAL_BACKOFF = 0.05  # seconds before the first retry after a failed step (then doubling)
# Housekeeping (tick with housekeeping=1: queue-name retirement, dead-letter retention, held jobs of
# queues no longer rate-limited) runs on one tick per this many seconds per partition; the others
# take tick's fast path (lua/tick.lua): a second more changes nothing an operator can see.
HOUSEKEEPING_EVERY = 1.0


@dataclass
class RunnerConfig:
    """How a partition's firing loop paces itself (shared by all partitions of a replica)."""

    batch: int = 1000            # jobs per tick call
    reap_batch: int = 1000
    idle_check: float = 1.0      # max sleep without a wake-up (lost pub/sub message safety net)
    reap_interval: float = 0.5   # reap at least this often while jobs are in flight
    min_sleep: float = 0.0005    # never spin: Redis may see the job due a hair later than we do
    # Hand jobs to the workers this long before they are due: the hops between "due" and "a
    # handler starts" (this loop's wake-up, the tick, the ready notification, the worker's
    # claim) then happen ahead of time, and the worker starts the job on its own timer at its due
    # time, never before it (workers/runner.py). 0 fires at the due time, as before.
    handoff_lead: float = 0.020
    # A partition firing enough jobs per second widens its lead, doubling it up to this, so that
    # one tick, one claim and one wake-up carry several spread jobs instead of one each
    # (tier/coalesce.py HandoffLead). Jobs still start at their due time, but a cancel finds them
    # claimed earlier, workers need the prefetch for them, and they reach the workers in bursts:
    # off unless asked for (docs/architecture.md, "On time"). At or below handoff_lead: never.
    coalesce_lead: float = 0.0
    # A burst (tier/coalesce.py) is handed off this long ahead; at or below handoff_lead: never
    burst_lead: float = 0.050
    # Redis retry backoff cap. Short: a partition must fire again within a second of Redis
    # answering (a Redis Cluster failover takes 2-3 s; with a 2 s cap the first retry after it
    # could come ~2.5 s late). Each step already retries for the transport's budget (0.5 s), so an
    # outage costs a partition a few refused connects per second, nothing more.
    backoff_max: float = 0.5
    conflict_retry_min: float = 1.0   # first retry after an epoch conflict (then doubling, with jitter)
    conflict_retry_max: float = 30.0  # cap: a conflict costs each partition ~2 refused calls per minute
    # share of the ticks that fire jobs recorded as OpenTelemetry spans (docs/tracing.md), once a
    # tracer provider is installed in the replica's process; 0: none, and nothing is checked
    trace_firing: float = 0.0


class PartitionRunner:
    """Ticks one partition while ``is_valid()`` says this replica may act for it."""

    def __init__(self, partition: int, epoch: int, *, scripts: AsyncScriptTransport, core: Calls,
                 metrics: SchedulerMetrics, config: RunnerConfig,
                 is_valid: Callable[[], bool], valid_for: Callable[[], float],
                 on_refused: Callable[[int, int], Awaitable[None]],
                 limits: Callable[[], dict[str, tuple[float, float]]] = dict,
                 retention: Callable[[], Retention] = Retention,
                 check_conflict: Callable[[int, int, int], Awaitable[bool]] | None = None,
                 on_conflict_resolved: Callable[[int, int, int, float], None] | None = None,
                 ringer: BellRinger | None = None, batcher: TickBatcher | None = None,
                 listening: Callable[[], bool] = lambda: True, grid: IdleGrid | None = None) -> None:
        """``on_refused(partition, newest_epoch)``: a hand-over, the runner has stopped.
        ``check_conflict(partition, epoch, newest_epoch)``: asked on every refusal; True means an
        epoch conflict (keep the partition, retry with backoff). Without it every refusal is a
        hand-over. ``on_conflict_resolved(partition, epoch, refused_attempts, seconds)``: a tick
        was accepted again after a conflict. ``limits()`` (queue -> rate, burst) and
        ``retention()`` (tick's housekeeping arguments) are read before every tick. ``ringer``: on
        Redis Cluster, rings the doorbells of the queues a tick fired into (tier/bells.py).
        ``batcher``: sends the ticks of the replica's partitions that wake together as one round
        trip (tier/coalesce.py); without it each tick is a round trip of its own. ``listening()``:
        False while producers' wake-ups cannot arrive (the subscription is down): then every
        wake-up of the loop ticks, the reap's turns too. ``grid``: the replica's idle grid."""
        self.partition = partition
        self.epoch = epoch
        self._scripts = scripts
        self._core = core
        self._m = metrics
        self._cfg = config
        self._is_valid = is_valid
        self._valid_for = valid_for
        self._on_refused = on_refused
        self._check_conflict = check_conflict
        self._on_conflict_resolved = on_conflict_resolved
        self._limits = limits
        self._retention = retention
        self._ringer = ringer
        self._send_ticks = batcher.call_many if batcher is not None else scripts.call_many
        self._listening = listening
        self._grid = grid
        self._lazy_point: float | None = None  # the idle-grid point the next sleep ends at, if one
        self._tokens = TokenLedger(core.ks, partition)  # rate-limited queues: held jobs, unused tokens
        self.lead = HandoffLead(config.handoff_lead, config.coalesce_lead, config.burst_lead)
        self.wake = asyncio.Event()
        self._stopping = False
        # set only by stop(): the epoch-conflict backoff waits on this, not on ``wake`` (producers' wake-ups)
        self._stopped = asyncio.Event()
        self._retry = asyncio.Event()  # an operator reset the epoch: end the conflict backoff now
        self._conflict_since: float | None = None  # monotonic time of the first refusal of this conflict
        self._conflict_refusals = 0
        self._conflict_base = 0.0                  # current backoff step (0: not backing off)
        self._task: asyncio.Task[None] | None = None
        self._next_reap = 0.0
        self._next_tick = 0.0  # monotonic time by which the next tick is due (0: at once)
        # next tick an idle check, next reap a turn (nothing waits for them): coalesce.idle_turn
        self._tick_lazy = self._reap_lazy = False
        self._next_housekeeping = 0.0  # monotonic time of the next housekeeping tick (the first is one)
        self._paused_logged = False
        self._backoff = INITIAL_BACKOFF            # next wait after a failed step
        self._down_since: float | None = None      # monotonic time of the first failure of an outage
        self._down_kind = ""                          # failure_kind() of the failure last logged

    def start(self) -> None:
        """Start firing in a task of its own (:meth:`stop` ends it)."""
        self._task = asyncio.create_task(self._run(), name=f"partition-{self.partition}")

    async def _first_step(self) -> None:
        if self._ringer is not None:  # jobs may have become ready while nobody owned the partition
            self._ringer.ring_waiting(self.partition)
        try:
            await self.sweep_crons()
        except (_Refused, _EpochConflict):
            raise
        except Exception as exc:  # never let the sweep keep the partition from firing
            log.warning("partition %d: cron sweep failed (%s: %s); retried on the next acquisition or fire",
                        self.partition, type(exc).__name__, exc)

    async def stop(self) -> None:
        """Stop after the call in flight (if any) completes; never abandons a half-sent call."""
        self._stopping = True
        self.wake.set()
        self._stopped.set()
        if self._task is not None:
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception:  # already logged by _run
                pass

    @property
    def in_conflict(self) -> bool:
        """True while this partition's epoch is refused in an epoch conflict."""
        return self._conflict_since is not None

    def _next_conflict_wait(self) -> float:
        """Capped exponential backoff (min, 2*min, ... max) with jitter: many partitions and
        replicas hit by the same etcd restore must not retry in lockstep. The jitter only
        shortens a step, so no wait exceeds ``conflict_retry_max``."""
        cfg = self._cfg
        self._conflict_base = (cfg.conflict_retry_min if self._conflict_base <= 0
                               else min(cfg.conflict_retry_max, self._conflict_base * 2))
        return self._conflict_base * random.uniform(0.75, 1.0)

    def retry_now(self) -> None:
        """The partition's stored epoch was reset: end an epoch-conflict backoff at once (a lost
        message only costs the rest of the current backoff step)."""
        if self._conflict_since is not None:
            self._retry.set()

    async def _conflict_backoff(self, seconds: float) -> None:
        """Sleep until stop(), retry_now() or the timeout; wake-ups from producers do not count."""
        waits = [asyncio.ensure_future(self._stopped.wait()), asyncio.ensure_future(self._retry.wait())]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        self._retry.clear()

    def _conflict_over(self) -> None:
        """A call with our epoch was accepted after a conflict (an operator reset the epoch)."""
        since, refused = self._conflict_since, self._conflict_refusals
        self._conflict_since, self._conflict_refusals, self._conflict_base = None, 0, 0.0
        self._retry.clear()
        if since is not None and self._on_conflict_resolved is not None:
            self._on_conflict_resolved(self.partition, self.epoch, refused, time.monotonic() - since)

    async def _run(self) -> None:
        conflict_wait = 0.0
        if self._is_valid():
            try:
                await self._first_step()
            except _Refused:
                return
            except _EpochConflict:
                conflict_wait = self._next_conflict_wait()
        while not self._stopping:
            if conflict_wait > 0:
                await self._conflict_backoff(conflict_wait)
                conflict_wait = 0.0
                continue
            if not await self._confirmed():
                continue
            woken = self.wake.is_set()  # a producer's wake-up (or stop()): tick whatever else is due
            self.wake.clear()  # before the call: a wake-up during the call makes the loop run again
            try:
                sleep_for = await self._step(woken)
            except _Refused:
                return
            except _EpochConflict:
                conflict_wait = self._next_conflict_wait()
                continue
            except Exception as exc:  # Redis errors, and bugs: neither may leave the partition dark
                await self._failed(exc)
                continue
            self._succeeded()
            if self._conflict_since is not None:
                self._conflict_over()
                try:  # the cron sweep was refused with everything else while in conflict
                    await self._first_step()
                except _Refused:
                    return
                except _EpochConflict:  # a newer epoch again (another replica): back off once more
                    conflict_wait = self._next_conflict_wait()
                    continue
            if sleep_for > 0:
                await self._sleep(sleep_for, self._lazy_point)
            else:
                await asyncio.sleep(0)  # full batch: go again, but let other partitions run

    async def _confirmed(self) -> bool:
        """Whether this replica may act for the partition now; if not, say so once and pause."""
        if not self._is_valid():
            if not self._paused_logged:
                log.warning("partition %d: ownership not confirmed in time (etcd unreachable?); "
                            "stopped ticking until the lease is refreshed", self.partition)
                self._m.deadline_pauses.labels(self._m.replica).inc()
                self._paused_logged = True
            self.wake.clear()
            await self._sleep(0.05)
            return False
        if self._paused_logged:
            log.info("partition %d: ownership confirmed again, ticking resumed", self.partition)
            self._paused_logged = False
        return True

    async def _failed(self, exc: Exception) -> None:
        """A step failed: log (once per Redis outage), back off, double the next backoff."""
        self._m.redis_errors.labels(self._m.replica).inc()
        if isinstance(exc, REDIS_ERRORS):
            self._backoff *= random.uniform(0.8, 1.2)  # replicas and partitions must not retry in lockstep
            kind = failure_kind(exc)
            if self._down_since is None or kind != self._down_kind:  # once per outage, and per kind
                if self._down_since is None:
                    self._down_since = time.monotonic()
                self._down_kind = kind
                log.error("partition %d: Redis call failed (%s: %s); retrying with backoff up to %.1fs",
                          self.partition, type(exc).__name__, exc, self._cfg.backoff_max)
        else:  # a bug must not leave the partition dark without a word
            log.error("partition %d: unexpected error in the firing loop; retrying in %.1fs",
                      self.partition, self._backoff, exc_info=exc)
        await self._sleep(self._backoff)
        self._backoff = min(self._cfg.backoff_max, self._backoff * 2)

    def _succeeded(self) -> None:
        """A step went through: end the Redis outage (if any) and reset the backoff."""
        if self._down_since is not None:
            log.info("partition %d: Redis reachable again after %.1fs", self.partition,
                     time.monotonic() - self._down_since)
            self._down_since = None
        self._backoff = INITIAL_BACKOFF

    async def _sleep(self, seconds: float, point: float | None = None) -> None:
        if self._stopping:
            return
        if point is not None and self._grid is not None:  # with the replica's other idle wake-ups
            await self._grid.wait(point, self.wake)
            return
        # whole milliseconds, rounded up: asyncio's epoll_wait does that anyway, and uvloop (libuv
        # timers) rounds to the nearest millisecond, so a 0.4 ms sleep would not sleep at all and a
        # wake-up could come before the hand-off window opens (one tick for nothing)
        seconds = math.ceil(seconds * 1000) / 1000
        try:
            async with asyncio.timeout(seconds):  # no task of its own, unlike wait_for
                await self.wake.wait()
        except TimeoutError:
            pass

    async def _take_tokens(self, limits: dict[str, tuple[float, float]]) -> tuple[dict[str, int], float]:
        """Ask the queues' token buckets for this partition's share; returns grants and how long
        until a token is available for a queue that got none."""
        want, calls = self._tokens.requests(limits)
        if not want:
            return {}, float("inf")
        return self._tokens.grants(want, await self._scripts.call_many(calls))

    async def _step(self, woken: bool = True) -> float:
        """One tick (+ reap), or the reap alone when only it is due; returns how long to sleep
        (0 = more work right now). ``woken``: a wake-up came (the tick is due whatever the clock
        says)."""
        cfg = self._cfg
        now_local = time.monotonic()
        if not (woken or now_local + cfg.min_sleep >= self._next_tick or now_local >= self._next_housekeeping
                or not self._listening()):
            return await self._reap_only(now_local)
        self._next_tick, self._tick_lazy = 0.0, False  # until this tick went through: a failed one is sent again
        limits = self._limits()
        # a queue whose limit was removed is forgotten by the ledger: tick releases what it holds without tokens
        grants, token_wait = (await self._take_tokens(limits) if limits or self._tokens.held
                              else ({}, float("inf")))
        housekeeping = now_local >= self._next_housekeeping
        if housekeeping:
            self._next_housekeeping = now_local + HOUSEKEEPING_EVERY
        retention = self._retention() if housekeeping else NO_RETENTION
        calls = [tick_call(self._core, self.partition, self.epoch, cfg.batch, TokenLedger.tick_tokens(limits, grants),
                           retention, round(self.lead.next_lead * 1000), housekeeping)]
        # a reap due within half its interval goes along (its next turn counts from this one's time)
        do_reap = now_local >= self._next_reap - cfg.reap_interval / 2
        if do_reap:
            calls.append(reap_call(self._core, self.partition, self.epoch, cfg.reap_batch))
        t0 = time.perf_counter()
        start_ns = time.time_ns() if cfg.trace_firing else 0
        # a burst's tick goes in one MULTI/EXEC with the step's others (TickBatcher.call_many)
        replies = await self._send_ticks(calls, atomic=self.lead.burst_ahead)
        received = time.monotonic()
        self._m.tick_duration.labels(self._m.replica).observe(time.perf_counter() - t0)
        tick = parse_tick(replies[0])
        if not isinstance(tick, EpochRefused):
            self.lead.look_ahead(tick.next_due_ms, tick.burst_due_ms)  # a burst next: the next tick's lead
            if self.lead.observe(tick.moved, received):
                log.debug("partition %d: hand-off lead now %.0f ms", self.partition, 1000 * self.lead.lead)
        if start_ns and not isinstance(tick, EpochRefused) and tick.lateness_ms \
                and random.random() < cfg.trace_firing:
            tracing.record_firing(self._core.ks.namespace, self.partition, self._m.replica, len(tick.lateness_ms),
                                  tick.moved, max(tick.lateness_ms), start_ns, time.time_ns())
        if isinstance(tick, EpochRefused):
            await self._refused(tick.newest_epoch)
        held_any = self._account_tokens(tick.queues, grants)
        for raw_id, queue in tick.dropped_dead:  # one line per job, so support can answer "where did it go"
            log.warning("partition %d: dead job %s (queue %r) dropped by the dead-letter retention rule "
                        "(max_dead / dead_ttl, see Client.set_dead_retention)", self.partition,
                        encode_id(raw_id), queue)
        if tick.to_ring and self._ringer is not None:
            self._ringer.ring(tick.to_ring, str(self.partition), tick.now_ms)
        if tick.crons_to_refill:
            await self._refill_fired_crons(tick.crons_to_refill)
        if tick.lateness_ms:
            self._m.observe_lateness(tick.lateness_ms)
            self._m.fired.labels(self._m.replica).inc(len(tick.lateness_ms))
        more = tick.moved >= cfg.batch
        if held_any and any(grants.get(q, 0) > 0 for q in grants):
            more = True  # tokens were available: ask again at once, the bucket paces us
        if do_reap and await self._reaped(replies[1], received):
            more = True
        if more:
            return 0.0  # _next_tick is still 0
        wait = self._tick_wait(tick, held_any, token_wait)
        self._tick_lazy = wait >= cfg.idle_check
        self._next_tick = idle_turn(received, wait) if self._tick_lazy else received + wait
        return self._sleep_time()

    async def _reap_only(self, now_local: float) -> float:
        """A wake-up for the reap alone: a tick would only have said "nothing due" again."""
        if now_local >= self._next_reap:
            replies = await self._send_ticks([reap_call(self._core, self.partition, self.epoch,
                                                        self._cfg.reap_batch)])
            if await self._reaped(replies[0], time.monotonic()):
                self._next_tick, self._tick_lazy = 0.0, False
                return 0.0
        return self._sleep_time()

    def _account_tokens(self, queues: list[QueueTokens], grants: dict[str, int]) -> bool:
        """Record what the tick held back and did not spend (refunded next time); True when a
        rate-limited queue still holds due jobs in this partition."""
        for q in queues:
            if q.newly_held:
                self._m.rate_limited.labels(self._m.replica, q.queue).inc(q.newly_held)
        return self._tokens.account(queues, grants)

    async def _refill_fired_crons(self, names: list[str]) -> None:
        try:
            await self.refill_crons(names)
        except (_Refused, _EpochConflict, *REDIS_ERRORS):
            raise
        except Exception as exc:  # a bad definition must not stop the partition's firing
            log.error("partition %d: refilling crons %s failed (%s: %s)", self.partition, names,
                      type(exc).__name__, exc)

    async def _reaped(self, reply: list[Any], received: float) -> bool:
        """Account a reap reply and plan the next reap; True when a full batch came back."""
        reap = parse_reap(reply)
        if isinstance(reap, EpochRefused):
            await self._refused(reap.newest_epoch)
        if reap.reaped:
            self._m.reaped.labels(self._m.replica).inc(reap.reaped)
        if reap.reaped >= self._cfg.reap_batch:
            self._next_reap, self._reap_lazy = 0.0, False
            return True
        wait, self._reap_lazy = self._cfg.reap_interval, True
        if reap.next_deadline_ms is not None and (reap.next_deadline_ms - reap.now_ms) / 1000.0 < wait:
            wait, self._reap_lazy = max(0.0, (reap.next_deadline_ms - reap.now_ms) / 1000.0), False
        self._next_reap = idle_turn(max(received, self._next_reap), wait) if self._reap_lazy else received + wait
        return False

    def _tick_wait(self, tick: TickReply, held_any: bool, token_wait: float) -> float:
        """How long after its reply the next tick is due, after a tick that left no work for
        right now: when the next timer enters the hand-off window, a rate-limited queue gets a
        token, or ``idle_check`` passed."""
        wait = self._cfg.idle_check
        if tick.next_due_ms is not None:  # wake when the next timer enters the hand-off window
            wait = min(wait, (tick.next_due_ms - tick.now_ms) / 1000.0 - self.lead.wake_ahead)
        if held_any:
            wait = min(wait, token_wait if token_wait != float("inf") else 0.01)
        return wait

    def _sleep_time(self) -> float:
        """Until the next tick or reap (or the ownership must be confirmed again), whichever first."""
        now = time.monotonic()
        at, point = next_wake(self._next_tick, self._tick_lazy, self._next_reap, self._reap_lazy)
        valid_for = self._valid_for()
        self._lazy_point = point if point is not None and at - now <= valid_for else None
        sleep_for = max(self._cfg.min_sleep, min(at - now, valid_for))
        # wake on the replica's grid, with the other partitions due about then: one round trip
        return aligned_sleep(sleep_for, now, self.lead.step)

    async def sweep_crons(self) -> None:
        """On taking a partition: make sure every cron has its pending occurrence and a full table
        (a previous owner may have died between firing and refilling)."""
        names = await cron_names(self._scripts, self._core, self.partition)
        if names:
            await self.refill_crons(names, only_if_needed=True)

    async def refill_crons(self, names: list[str], only_if_needed: bool = False) -> None:
        """Compute upcoming occurrences (croniter, time zones) and hand them to ``cron_fill``."""
        calls = await fill_calls(self._scripts, self._core, self.partition, self.epoch, names, only_if_needed)
        if calls:
            for reply in await self._scripts.call_many(calls):
                filled = parse_cron_fill(reply)
                if isinstance(filled, EpochRefused):
                    await self._refused(filled.newest_epoch)

    async def _refused(self, current: int) -> NoReturn:
        """Redis refused our epoch: stop (hand-over), or raise _EpochConflict to back off and retry."""
        if self._check_conflict is not None and await self._check_conflict(self.partition, self.epoch, current):
            if self._conflict_since is None:
                self._conflict_since = time.monotonic()
            self._conflict_refusals += 1
            raise _EpochConflict(current)
        log.error("partition %d: Redis refused epoch %d (it has seen %d): another replica owns it now; "
                  "stopping this partition", self.partition, self.epoch, current)
        self._m.epoch_refusals.labels(self._m.replica).inc()
        self._stopping = True
        await self._on_refused(self.partition, current)
        raise _Refused()


class _Refused(ZschedError):
    """The partition was handed over: the runner ends."""


class _EpochConflict(ZschedError):
    """Refused, yet etcd says the partition is still ours with this epoch: back off and retry."""


