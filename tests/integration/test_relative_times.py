"""Relative times (timedelta) are resolved by Redis's clock inside the schedule script, so a
producer whose clock is off neither fires jobs early nor misfires them; absolute times stay as given."""
from __future__ import annotations

import time
import types
from datetime import timedelta

import pytest
import redis

import scheduler.protocol.calls as client_module
from scheduler import AsyncClient, Client, JobState
from scheduler.testing.transitions import Ops
from tests.support.waits import wait_until


def redis_now(r: redis.Redis) -> float:
    secs, usecs = r.time()
    return int(secs) + int(usecs) / 1e6


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    conn = redis.Redis.from_url(redis_url)
    yield conn
    conn.close()


@pytest.mark.parametrize("skew", [-120.0, 120.0], ids=["clock-behind", "clock-ahead"])
def test_a_skewed_producer_lands_relative_times_at_redis_time(redis_url: str, r: redis.Redis,
                                                              monkeypatch: pytest.MonkeyPatch, skew: float) -> None:
    skewed = types.SimpleNamespace(time=lambda: time.time() + skew, monotonic=time.monotonic,
                                   perf_counter=time.perf_counter, sleep=time.sleep)
    monkeypatch.setattr(client_module, "time", skewed)
    c = Client.from_url(redis_url, namespace="skew", partitions=2)
    ops = Ops(c)
    # first call: the client does not know the offset yet; the script resolves the time itself
    first = c.schedule(timedelta(seconds=30), "a", misfire="skip", misfire_grace=1)
    info = c.get(first)
    assert info.state is JobState.SCHEDULED, "a relative time from a skewed clock misfired"
    assert abs(info.run_at.timestamp() - (redis_now(r) + 30)) < 1.0
    # later calls use the offset learned from the reply: same result, and no 'moved' entry needed
    later = [c.schedule(timedelta(seconds=30), i) for i in range(20)]
    for jid in later:
        assert abs(c.get(jid).run_at.timestamp() - (redis_now(r) + 30)) < 1.0
    assert abs(c.calls.clock_offset_ms - (-skew * 1000)) < 500
    assert r.hlen("{skew:0}:m") + r.hlen("{skew:1}:m") <= 1
    # run_late: never early, even though this host thinks it is 2 minutes elsewhere
    t_sent = time.time()
    soon = c.schedule(timedelta(seconds=0.6), "soon")
    assert ops.tick_all() == 0
    wait_until(lambda: ops.tick_all() == 1, 3, what="the job due in 0.6 s to fire")
    assert time.time() - t_sent >= 0.6 - 0.002 and c.get(soon).state is JobState.READY
    # absolute times stay as given (epoch seconds are the producer's statement of a moment)
    absolute = c.schedule(time.time() + 3600, "abs")  # skewed clock + 1 h, taken literally
    assert abs(c.get(absolute).run_at.timestamp() - (time.time() + 3600)) < 0.01
    c.close()


def test_relative_times_in_a_batch_and_with_jitter(redis_url: str, r: redis.Redis) -> None:
    c = Client.from_url(redis_url, namespace="skewb", partitions=4)
    ids = c.schedule_many([(timedelta(seconds=10 + i), i) for i in range(50)], jitter=2.0)
    now = redis_now(r)
    for i, jid in enumerate(ids):
        at = c.get(jid).run_at.timestamp()
        assert now + 10 + i - 1 <= at <= now + 10 + i + 2 + 1
    c.close()


@pytest.mark.parametrize("skew", [-120.0, 120.0], ids=["clock-behind", "clock-ahead"])
def test_a_skewed_producer_reschedules_and_requeues_relative_times_at_redis_time(
        redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch, skew: float) -> None:
    skewed = types.SimpleNamespace(time=lambda: time.time() + skew, monotonic=time.monotonic,
                                   perf_counter=time.perf_counter, sleep=time.sleep)
    monkeypatch.setattr(client_module, "time", skewed)
    c = Client.from_url(redis_url, namespace="skewr", partitions=2)
    ops = Ops(c)
    moved = c.schedule(timedelta(hours=1), "moved", queue="q")
    assert c.reschedule(moved, timedelta(seconds=30))
    assert abs(c.get(moved).run_at.timestamp() - (redis_now(r) + 30)) < 1.0
    assert c.reschedule(moved, timedelta(0)) and c.get(moved).state is JobState.READY, "now is Redis's now"

    [claimed] = ops.claim("q")
    ops.fail(claimed, kind="p")
    assert c.get(moved).state is JobState.DEAD
    assert c.requeue(moved, at=timedelta(seconds=45))
    info = c.get(moved)
    assert info.state is JobState.SCHEDULED and abs(info.run_at.timestamp() - (redis_now(r) + 45)) < 1.0
    # absolute times stay as given
    assert c.reschedule(moved, time.time() + 3600)
    assert abs(c.get(moved).run_at.timestamp() - (time.time() + 3600)) < 0.01
    c.close()


async def test_the_async_client_reschedules_and_requeues_relative_times_at_redis_time(
        redis_url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    skewed = types.SimpleNamespace(time=lambda: time.time() - 300, monotonic=time.monotonic,
                                   perf_counter=time.perf_counter, sleep=time.sleep)
    monkeypatch.setattr(client_module, "time", skewed)
    c = await AsyncClient.from_url(redis_url, namespace="skewa", partitions=2).connect()
    jid = await c.schedule(timedelta(hours=1), "x", queue="q")
    assert await c.reschedule(jid, timedelta(seconds=30))
    info = await c.get(jid)
    assert info is not None and abs(info.run_at.timestamp() - (redis_now(r) + 30)) < 1.0
    sync = Client.from_url(redis_url, namespace="skewa", partitions=2)
    ops = Ops(sync)
    assert await c.reschedule(jid, timedelta(0))
    [claimed] = ops.claim("q")
    ops.fail(claimed, kind="p")
    assert await c.requeue(jid, at=timedelta(seconds=45))
    info = await c.get(jid)
    assert info is not None and info.state is JobState.SCHEDULED
    assert abs(info.run_at.timestamp() - (redis_now(r) + 45)) < 1.0
    sync.close()
    await c.close()
