"""How often a partition's firing loop calls Redis when nothing is due, without servers: one tick
per ``idle_check``, one reap per ``reap_interval``, and the reap alone when only it is due; a
wake-up, housekeeping or a failed tick still tick at once; a replica's idle partitions wake
together (coalesce.idle_turn, IdleGrid)."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from scheduler.metrics import SchedulerMetrics
from scheduler.tier.coalesce import TICK_LANE, IdleGrid, TickBatcher
from scheduler.tier.runner import PartitionRunner, RunnerConfig
from tests.support.tierfakes import FakeCore, FakeTransport


def make_runner(transport: FakeTransport, cfg: RunnerConfig, listening: bool = True, partition: int = 3,
                batcher: TickBatcher | None = None, grid: IdleGrid | None = None) -> PartitionRunner:
    async def on_refused(p: int, current: int) -> None:
        raise AssertionError("no refusal expected")

    return PartitionRunner(partition, 5, scripts=transport, core=FakeCore(),  # type: ignore[arg-type]
                           metrics=SchedulerMetrics("t"), config=cfg, is_valid=lambda: True,
                           valid_for=lambda: 3600.0, on_refused=on_refused, listening=lambda: listening,
                           batcher=batcher, grid=grid)


async def run_for(runner: PartitionRunner, seconds: float) -> None:
    runner.start()
    try:
        await asyncio.sleep(seconds)
    finally:
        await runner.stop()


async def test_an_idle_partition_ticks_once_per_idle_check_and_reaps_alone_in_between() -> None:
    transport = FakeTransport(accept=True)
    # no hand-off lead: no grid to round the wake-ups up to
    cfg = RunnerConfig(idle_check=0.3, reap_interval=0.05, handoff_lead=0.0)
    await run_for(make_runner(transport, cfg), 1.2)
    ticks = [t for t, names in transport.trips if "tick" in names]
    reaps = [t for t, names in transport.trips if names == ["reap"]]
    # the first step, one tick per 0.3 s and the housekeeping tick once a second (on the first
    # reap turn after it is due): 5 in 1.2 s; with a tick on every reap turn there were 20 or more
    assert 3 <= len(ticks) <= 6, [round(t - ticks[0], 3) for t in ticks]
    assert len(reaps) >= 10, "the reaps between the ticks went alone"


async def test_without_the_wake_up_subscription_every_reap_turn_ticks() -> None:
    """Producers' wake-ups cannot arrive (Redis restarted, the subscription not back yet): a job
    scheduled then is found on the next reap turn, not only by the next idle check."""
    transport = FakeTransport(accept=True)
    cfg = RunnerConfig(idle_check=30.0, reap_interval=0.05, handoff_lead=0.0)
    await run_for(make_runner(transport, cfg, listening=False), 0.5)
    assert len(transport.trips) >= 4 and all("tick" in names for _, names in transport.trips), transport.trips


async def test_a_wake_up_ticks_at_once_between_idle_checks() -> None:
    transport = FakeTransport(accept=True)
    runner = make_runner(transport, RunnerConfig(idle_check=30.0, reap_interval=0.05, handoff_lead=0.0))
    runner.start()
    try:
        while len(transport.trips) < 3:  # the first step, then reaps alone
            await asyncio.sleep(0.005)
        assert len(transport.ticks) == 1
        t_wake = time.monotonic()
        runner.wake.set()  # a producer scheduled a job earlier than everything the partition had
        while len(transport.ticks) < 2:
            # the next idle check is 30 s away, the next reap turns tick nothing: only the wake-up ticks
            assert time.monotonic() < t_wake + 1, "the wake-up did not tick"
            await asyncio.sleep(0.001)
    finally:
        await runner.stop()


async def test_a_tick_that_failed_is_sent_again_not_skipped_for_a_reap() -> None:
    """A woken tick that hit a Redis error: the retry must tick (the wake-up is not lost), even
    though no wake-up and no idle check is due any more."""
    transport = FakeTransport(accept=True)
    runner = make_runner(transport, RunnerConfig(idle_check=30.0, reap_interval=0.05, handoff_lead=0.0))
    runner.start()
    try:
        while len(transport.trips) < 3:
            await asyncio.sleep(0.005)
        transport.fail_next = 1
        runner.wake.set()
        t_wake = time.monotonic()
        while len(transport.ticks) < 2:
            assert time.monotonic() < t_wake + 2, "the failed tick was not sent again"
            await asyncio.sleep(0.001)
        failed = next(names for t, names in transport.trips if t >= t_wake)
        assert "tick" in failed  # the woken step's round trip, refused; the next tick is its retry
    finally:
        await runner.stop()


async def test_a_replicas_idle_partitions_wake_together_on_the_idle_grid() -> None:
    """Four idle partitions of one replica, started at different moments: their reap turns and idle
    checks fall on the multiples of their intervals and resume on the grid's one timer per
    instant, so each round trip carries all four, and the replica wakes twice a second however
    many partitions it owns (each woke twice a second on its own, at its own phase)."""
    transport = FakeTransport(accept=True)
    batcher, grid = TickBatcher(transport), IdleGrid()  # type: ignore[arg-type]
    cfg = RunnerConfig(idle_check=1.0, reap_interval=0.5, handoff_lead=0.0)
    runners = []
    for p in range(4):
        runners.append(make_runner(transport, cfg, partition=p, batcher=batcher, grid=grid))
        runners[-1].start()
        await asyncio.sleep(0.03)  # different phases
    try:
        await asyncio.sleep(2.0)
    finally:
        for r in runners:
            await r.stop()
    settled = [parts for (t, _), parts in zip(transport.trips, transport.parts) if t > transport.trips[0][0] + 0.6]
    assert settled and all(parts == {0, 1, 2, 3} for parts in settled), transport.parts
    assert len(settled) <= 4, f"{len(settled)} round trips in about 1.4 s"
    # on one lane: the round trips keep their pool connection (no checkout per grid step)
    assert set(transport.lanes) == {TICK_LANE}


class BusyTransport(FakeTransport):
    """A busy partition: every tick says the next timer is 30 ms away."""

    async def call_many(self, calls: Any, raise_on_error: bool = True, lane: str | None = None,
                        atomic: bool = False) -> list[Any]:
        out = await super().call_many(calls, raise_on_error, lane, atomic)
        now_ms = int(time.time() * 1000)
        return [[0, now_ms + 30, now_ms, 0, 0, 0, 0, -1] if name == "tick" else reply
                for (name, _, _), reply in zip(calls, out)]


async def test_a_busy_partition_still_reaps_once_per_interval() -> None:
    """Its ticks come every 30 ms and take along a reap due within half the interval; the next
    turn counts from the turn served, so reaps stay one per interval (counted from the early
    time, they came about twice as often)."""
    transport = BusyTransport(accept=True)
    await run_for(make_runner(transport, RunnerConfig(idle_check=1.0, reap_interval=0.5, handoff_lead=0.0)), 2.1)
    reaps = sum(names.count("reap") for _, names in transport.trips)
    assert len(transport.ticks) >= 30, "a busy partition ticks on its timers"
    assert 4 <= reaps <= 6, f"{reaps} reaps in 2.1 s at a 0.5 s interval"


async def test_a_tick_batch_runs_as_one_transaction_when_one_of_its_ticks_asks_for_it() -> None:
    """``TickBatcher.call_many(atomic=True)`` (a tick handing off a burst) makes the whole round
    trip of its event-loop turn one MULTI/EXEC, so the step's burst rings land together; the next
    round trip, whose callers did not ask, is a plain pipeline again (a spread job's ring must not
    wait for the step's other ticks)."""
    transport = FakeTransport(accept=True)
    batcher = TickBatcher(transport)  # type: ignore[arg-type]
    one = [("tick", [], [p, 5]) for p in range(3)]
    await asyncio.gather(batcher.call_many(one[:1]), batcher.call_many(one[1:2], atomic=True),
                         batcher.call_many(one[2:]))
    await asyncio.gather(batcher.call_many(one[:1]), batcher.call_many(one[1:2]))
    assert [len(names) for _, names in transport.trips] == [3, 2]
    assert transport.atomic == [True, False]
