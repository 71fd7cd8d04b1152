"""The partition runner's reaction to a refused epoch, without servers: a stand-in transport that
refuses every tick, and a ``check_conflict`` that says conflict (or hand-over).

The real thing (a replica whose etcd was replaced, fixed with ``zsched epochs reset``) is in
tests/fault/test_epoch_conflict.py; this pins the backoff's shape and the callbacks."""
from __future__ import annotations

import asyncio
import time

import pytest

from scheduler.metrics import SchedulerMetrics
from scheduler.shell.admin import BadInput
from scheduler.shell.epochs import select_partitions
from scheduler.tier.runner import PartitionRunner, RunnerConfig
from tests.support.tierfakes import FakeCore, FakeTransport


def make_runner(transport: FakeTransport, cfg: RunnerConfig, *, conflict: bool,
                refused: list[tuple[int, int]], resolved: list[tuple[int, int, int, float]],
                metrics: SchedulerMetrics | None = None) -> PartitionRunner:
    async def check(p: int, epoch: int, current: int) -> bool:
        assert (p, epoch, current) == (3, 5, 100)
        return conflict

    async def on_refused(p: int, current: int) -> None:
        refused.append((p, current))

    return PartitionRunner(3, 5, scripts=transport, core=FakeCore(),  # type: ignore[arg-type]
                           metrics=metrics or SchedulerMetrics("t"), config=cfg,
                           is_valid=lambda: True, valid_for=lambda: 3600.0, on_refused=on_refused,
                           check_conflict=check, on_conflict_resolved=lambda *a: resolved.append(a))


def test_conflict_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    r = make_runner(FakeTransport(), RunnerConfig(), conflict=True, refused=[], resolved=[])
    steps = [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    for base in steps:
        w = r._next_conflict_wait()
        assert 0.75 * base <= w <= base, (base, w)


async def test_conflict_keeps_the_partition_ignores_wakeups_and_resumes_after_a_reset() -> None:
    transport = FakeTransport()
    refused: list[tuple[int, int]] = []
    resolved: list[tuple[int, int, int, float]] = []
    metrics = SchedulerMetrics("t")
    cfg = RunnerConfig(conflict_retry_min=0.2, conflict_retry_max=10.0, idle_check=0.05)
    runner = make_runner(transport, cfg, conflict=True, refused=refused, resolved=resolved, metrics=metrics)
    runner.start()
    try:
        # ticks (all refused) at 0, then after 0.15-0.2, 0.3-0.4, 0.6-0.8, 1.2-1.6 s: four in the first
        # 1.5 s. A producer's wake-up every 10 ms must not shorten any of the waits.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.5:
            runner.wake.set()
            await asyncio.sleep(0.01)
        assert 2 <= len(transport.ticks) <= 5, [round(t - t0, 3) for t in transport.ticks]
        assert runner.in_conflict and not refused and not resolved
        assert metrics.epoch_refusals.labels("t")._value.get() == 0  # a conflict is not a hand-over
        # the operator's reset: accepted from now on; the reset's pub/sub message ends the wait
        refused_ticks = len(transport.ticks)  # the runner sleeps now: its next tick is >= 0.75 s away
        transport.accept = True
        t_reset = time.monotonic()
        runner.retry_now()
        deadline = t_reset + 0.5  # the next backoff step is >= 0.75 s away: only retry_now can be this fast
        while not resolved:
            assert time.monotonic() < deadline, "retry_now did not end the backoff"
            await asyncio.sleep(0.005)
        [(p, epoch, attempts, seconds)] = resolved
        assert (p, epoch) == (3, 5) and attempts == refused_ticks and seconds >= 1.4
        assert not runner.in_conflict
        # back to normal: idle ticks every idle_check
        n = len(transport.ticks)
        while len(transport.ticks) < n + 3:
            assert time.monotonic() < t_reset + 2, "the runner did not go back to ticking"
            await asyncio.sleep(0.01)
    finally:
        await runner.stop()


async def test_stop_ends_a_conflict_backoff_at_once() -> None:
    transport = FakeTransport()
    cfg = RunnerConfig(conflict_retry_min=30.0, conflict_retry_max=30.0)
    runner = make_runner(transport, cfg, conflict=True, refused=[], resolved=[])
    runner.start()
    while not transport.ticks:
        await asyncio.sleep(0.005)
    t0 = time.monotonic()
    await asyncio.wait_for(runner.stop(), 2.0)
    assert time.monotonic() - t0 < 1.0 and len(transport.ticks) == 1


async def test_a_hand_over_stops_the_runner_once() -> None:
    transport = FakeTransport()
    refused: list[tuple[int, int]] = []
    metrics = SchedulerMetrics("t")
    runner = make_runner(transport, RunnerConfig(), conflict=False, refused=refused, resolved=[], metrics=metrics)
    runner.start()
    assert runner._task is not None
    await asyncio.wait_for(runner._task, 2.0)
    assert refused == [(3, 100)] and len(transport.ticks) == 1
    assert metrics.epoch_refusals.labels("t")._value.get() == 1
    assert metrics.epoch_conflicts.labels("t")._value.get() == 0


def test_select_partitions() -> None:
    assert select_partitions([2, 0, 2], False, 4) == [0, 2]
    assert select_partitions(None, True, 3) == [0, 1, 2]
    with pytest.raises(BadInput, match="nothing selected"):
        select_partitions(None, False, 4)
    with pytest.raises(BadInput, match="not both"):
        select_partitions([1], True, 4)
    with pytest.raises(BadInput, match="partition 4 does not exist: this namespace has 4 partition"):
        select_partitions([0, 4], False, 4)
