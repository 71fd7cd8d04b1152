"""Scheduler tier in-process against real etcd and redis-server: ownership spread, on-time firing,
wake-ups, epoch fencing."""
from __future__ import annotations

import asyncio
import math
import time

import pytest
import redis

from scheduler import Client, JobState, Outcome
from scheduler.coord import EtcdCoordinator
from scheduler.protocol.ids import run_at_of
from scheduler.protocol.tick import NO_RETENTION, reap_call, tick_call
from scheduler.redisio.connection import SyncRedis, sync_redis
from scheduler.testing.transitions import Ops
from scheduler.tier import SchedulerConfig, SchedulerProcess
from tests.support.helpers import on_both_backends, snapshot
from tests.support.waits import wait_for

NS = "tier"


async def start_replica(redis_url: str, etcd: str, rid: str, ttl: float = 2.0,
                        **kw) -> tuple[SchedulerProcess, asyncio.Task]:
    proc = SchedulerProcess(SchedulerConfig(redis_url=redis_url, etcd_endpoints=etcd, namespace=NS,
                                            replica_id=rid, lease_ttl=ttl, **kw))
    task = asyncio.create_task(proc.run())
    return proc, task


async def stop_replica(proc: SchedulerProcess, task: asyncio.Task) -> None:
    proc.stop()
    await asyncio.wait_for(task, 10)


async def owners(etcd: str) -> dict[int, str]:
    async with EtcdCoordinator.from_endpoints(etcd) as c:
        kvs, _ = await c.get_prefix(f"/zsched/{NS}/owners/")
    return {int(kv.key.rsplit("/", 1)[1]): kv.value.decode() for kv in kvs}


async def settled(etcd: str, procs: list[SchedulerProcess], parts: int, timeout: float = 5.0) -> dict[int, str]:
    share = math.ceil(parts / len(procs))
    deadline = time.monotonic() + timeout
    while True:
        own = await owners(etcd)
        local = [set(p.runners) for p in procs]
        disjoint = sum(len(s) for s in local) == len(set().union(*local))
        if (len(own) == parts and disjoint and set().union(*local) == set(range(parts))
                and all(len(s) <= share for s in local)
                and all(own[p] == proc.replica_id for proc in procs for p in proc.runners)):
            return own
        if time.monotonic() > deadline:
            raise AssertionError(f"not settled: etcd={own} local={local}")
        await asyncio.sleep(0.05)


async def test_partitions_spread_evenly_and_each_has_one_owner(redis_url: str, etcd_endpoint: str) -> None:
    Client.from_url(redis_url, namespace=NS, partitions=16).connect()
    procs = []
    try:
        for n in range(1, 4):
            procs.append(await start_replica(redis_url, etcd_endpoint, f"r{n}"))
            own = await settled(etcd_endpoint, [p for p, _ in procs], 16)
            counts = sorted(list(own.values()).count(p.replica_id) for p, _ in procs)
            assert sum(counts) == 16 and max(counts) == math.ceil(16 / n)
        # a planned stop hands the partitions to the others
        await stop_replica(*procs.pop(0))
        await settled(etcd_endpoint, [p for p, _ in procs], 16)
    finally:
        for p, t in procs:
            await stop_replica(p, t)


async def test_due_jobs_fire_once_on_time(redis_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=8).connect()
    procs = [await start_replica(redis_url, etcd_endpoint, f"r{n}") for n in range(2)]
    try:
        await settled(etcd_endpoint, [p for p, _ in procs], 8)
        t0 = time.time() + 0.5
        ids = client.schedule_many([(t0 + i * 0.002, i) for i in range(500)])
        late_at_birth = max(0.0, time.time() - t0)  # in a full run on 2 cores: not the tier's lateness
        r = redis.Redis.from_url(redis_url)

        def fired() -> int:
            return sum(int(r.hget(client.keyspace.key(p, "c"), "fired:default") or 0) for p in range(8))

        # a cheap look while they fire: a full snapshot reads every key of 8 partitions with a
        # blocking client, and the replicas, which share this event loop, waited for it (10-100 ms
        # late firings, measured); in a thread it raced with them
        await wait_for(lambda: fired() >= 500, 5, what="every job fired")
        assert fired() == 500, "each job fired exactly once"
        assert all(s == "ready" for s in map(snapshot(r, client).get, ids)), "every job on its ready list"
        lateness = [v for p, _ in procs for v in _hist_samples(p)]
        assert lateness and max(lateness) < 0.25 + late_at_birth
    finally:
        for p, t in procs:
            await stop_replica(p, t)


def _hist_samples(proc: SchedulerProcess) -> list[float]:
    """Upper bounds of the buckets that hold firing-lateness observations (coarse, for sanity)."""
    out: list[float] = []
    prev = 0.0
    for metric in proc.metrics.registry.collect():
        if metric.name != "zsched_firing_lateness_seconds":
            continue
        for s in metric.samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                if s.value > prev:
                    out.extend([le] * int(s.value - prev))
                prev = s.value if le != math.inf else 0.0
    return out


async def test_earlier_job_wakes_a_sleeping_owner(redis_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=1).connect()
    proc, task = await start_replica(redis_url, etcd_endpoint, "solo",
                                     )
    proc.cfg.runner.idle_check = 30.0  # only a wake-up can make it fire in time
    try:
        await settled(etcd_endpoint, [proc], 1)
        client.schedule(time.time() + 3600, "far")
        await asyncio.sleep(0.3)  # the owner now sleeps on the 1 h timer
        at = time.time() + 0.05
        jid = client.schedule(at, "soon")
        while client.get(jid).state is not JobState.READY:
            assert time.time() < at + 1, "job 50 ms ahead did not fire"
            await asyncio.sleep(0.002)
        assert time.time() - at < 0.1
    finally:
        await stop_replica(proc, task)


async def test_stale_epoch_is_refused_by_redis(redis_url: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=2).connect()
    ops = Ops(client)
    assert ops.send(tick_call(ops.calls, 0, 10, 100, {}, NO_RETENTION, tomb_ms=0))[0] == 0
    assert ops.send(tick_call(ops.calls, 0, 12, 100, {}, NO_RETENTION, tomb_ms=0))[0] == 0
    assert ops.send(tick_call(ops.calls, 0, 11, 100, {}, NO_RETENTION, tomb_ms=0)) == [-1, 12]
    assert ops.send(reap_call(ops.calls, 0, 11, 100)) == [-1, 12]
    assert ops.send(tick_call(ops.calls, 1, 11, 100, {}, NO_RETENTION, tomb_ms=0))[0] == 0, "epochs are per partition"


class FlakyCoordinator(EtcdCoordinator):
    """An etcd client whose keepalives can be made to fail, as if this replica were cut off."""

    cut_off = False

    async def keepalive_once(self, lease_id: int, *, timeout: float | None = None) -> float:
        if self.cut_off:
            from scheduler.coord import CoordinatorUnavailable
            raise CoordinatorUnavailable("cut off by the test")
        return await super().keepalive_once(lease_id, timeout=timeout)


async def test_frozen_replica_cannot_fire_a_partition_that_moved(redis_url: str, etcd_endpoint: str) -> None:
    """The epoch fence alone (local deadline check disabled) stops a replica that froze past its
    lease and woke up without hearing from etcd."""
    client = Client.from_url(redis_url, namespace=NS, partitions=2).connect()
    coord = FlakyCoordinator.from_endpoints(etcd_endpoint)
    a = SchedulerProcess(SchedulerConfig(redis_url=redis_url, etcd_endpoints=etcd_endpoint, namespace=NS,
                                         replica_id="a", lease_ttl=1.0, ignore_deadline=True), coord=coord)
    a_task = asyncio.create_task(a.run())
    await settled(etcd_endpoint, [a], 2)
    coord.cut_off = True
    time.sleep(2.5)  # a GC pause: the whole event loop of replica a is frozen past its 1 s lease
    b, b_task = await start_replica(redis_url, etcd_endpoint, "b", ttl=1.0)
    try:
        # b takes both partitions (a's lease expired) and fires with a newer epoch; a keeps trying
        ids = client.schedule_many([(time.time() + 0.2, i) for i in range(50)])
        await wait_for(lambda: a.metrics.epoch_refusals.labels("a")._value.get() >= 1 and not a.runners, 5,
                       what="the stale replica to be fenced off")
        r = redis.Redis.from_url(redis_url)
        await wait_for(lambda: all(s == "ready" for s in map(snapshot(r, client).get, ids)), 5,
                       what="replica b to fire every job")
        assert sum(int(r.hget(client.keyspace.key(p, "c"), "fired:default") or 0) for p in range(2)) == 50
    finally:
        await stop_replica(b, b_task)
        coord.cut_off = False
        await stop_replica(a, a_task)


def _fired(r: SyncRedis, client: Client, queue: str) -> int:
    return sum(int(r.hget(client.keyspace.key(p, "c"), f"fired:{queue}") or 0)
               for p in range(client.keyspace.partitions))


@on_both_backends
async def test_rate_limited_herd_drains_as_a_stream_oldest_first(backend_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(backend_url, namespace=NS, partitions=8).connect()
    r = sync_redis(backend_url)
    client.set_rate_limit("herd", 400)
    assert client.rate_limits() == {"herd": (400.0, 100.0)}
    procs = [await start_replica(backend_url, etcd_endpoint, f"r{n}") for n in range(2)]
    try:
        await settled(etcd_endpoint, [p for p, _ in procs], 8)
        t0 = time.time() + 0.3
        # 1600 jobs due within the same 100 ms, older ones first by due time
        herd = client.schedule_many([(t0 + i * 0.0000625, i) for i in range(1600)], queue="herd")
        other = client.schedule_many([(t0 + 1 + i * 0.01, i) for i in range(100)], queue="other")
        await asyncio.sleep(0.35)
        samples = []
        while _fired(r, client, "herd") < 1600:
            samples.append((time.monotonic(), _fired(r, client, "herd")))
            assert len(samples) < 1000, "herd did not drain"
            await asyncio.sleep(0.05)
        # steady-state rate, ignoring the first and last 10 % (burst at start, tail at end)
        lo = next(t for t, n in samples if n >= 160)
        hi = next(t for t, n in samples if n >= 1440)
        rate = (1440 - 160) / (hi - lo)
        # Never faster than the limit (+10 % for sampling). The floor only says "a stream, not
        # starved": a replica stalled past the bucket's burst (100 tokens, 250 ms) loses the tokens
        # that overflow, and with the suite on two test workers this VM stalls for 0.3-0.6 s at
        # times (348 and 359/s seen against a floor of 360), so the floor is 75 % of the limit.
        assert 300 <= rate <= 440, f"herd streamed at {rate:.0f}/s, limit 400/s"
        # the other queue was not starved: all of it fired within its due times + a little
        assert _fired(r, client, "other") == 100
        # oldest first: a held job's due time is never older than a fired one's within a partition
        st = snapshot(r, client)
        assert all(st[i] == "ready" for i in herd + other)
        rl = sum(int(p.metrics.rate_limited.labels(p.replica_id, "herd")._value.get()) for p, _ in procs)
        assert rl > 0
    finally:
        for p, t in procs:
            await stop_replica(p, t)


async def test_held_jobs_can_be_inspected_cancelled_and_released_by_clearing_the_limit(
        redis_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=2).connect()
    r = redis.Redis.from_url(redis_url)
    client.set_rate_limit("slow", 1, burst=1)
    proc, task = await start_replica(redis_url, etcd_endpoint, "solo")
    try:
        await settled(etcd_endpoint, [proc], 2)
        ids = client.schedule_many([(time.time() + 0.1, i) for i in range(50)], queue="slow")
        # the limit lets the burst through and holds the rest
        await wait_for(lambda: "ready" in map(snapshot(r, client).get, ids), 5, what="the burst to fire")
        st = snapshot(r, client)
        held = [i for i in ids if st[i] == "scheduled"]
        assert 40 <= len(held) <= 49
        info = client.get(held[-1])
        assert info.state is JobState.SCHEDULED and info.run_at is not None
        assert client.cancel(held[-1])
        assert client.reschedule(held[-2], time.time() + 3600)
        assert client.stats()["slow"]["scheduled"] >= len(held) - 1
        assert client.clear_rate_limit("slow") is Outcome.DONE
        # promptly, not at once: a replica whose 2 s etcd lease lapsed in a stall of a loaded
        # machine registers again and takes its partitions back first (seen once, 3 s were short)
        deadline = time.monotonic() + 10
        while sum(1 for i in ids if snapshot(r, client).get(i) == "ready") < 48:
            assert time.monotonic() < deadline, "clearing the limit did not release held jobs"
            await asyncio.sleep(0.05)
        assert client.get(held[-2]).state is JobState.SCHEDULED
        assert client.get(held[-1]).state is JobState.CANCELLED
    finally:
        await stop_replica(proc, task)


def test_rate_limit_validation(redis_url: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=2).connect()
    for bad in (0, -1, float("nan"), "10"):
        with pytest.raises((ValueError, TypeError)):
            client.set_rate_limit("q", bad)
    with pytest.raises(ValueError):
        client.set_rate_limit("bad:queue", 10)
    assert client.clear_rate_limit("never-limited") is Outcome.UNCHANGED


class RefusingCoordinator(EtcdCoordinator):
    """An etcd client that connects but whose lease grants always fail, as when etcd answers
    the connection yet refuses or times out every write."""

    grants = 0

    async def grant(self, ttl: float, *, timeout: float | None = None) -> int:
        from scheduler.coord import CoordinatorUnavailable

        self.grants += 1
        raise CoordinatorUnavailable("grant refused by the test")


async def test_a_stop_ends_a_replica_that_keeps_failing_to_register(redis_url: str, etcd_endpoint: str) -> None:
    """Start-up has one more phase after connecting: registering with etcd (a lease, the member
    key), retried while it fails. A stop asked for then ends the replica at once."""
    coord = RefusingCoordinator.from_endpoints(etcd_endpoint)
    proc = SchedulerProcess(SchedulerConfig(redis_url=redis_url, etcd_endpoints=etcd_endpoint, namespace=NS,
                                            replica_id="unregistered", lease_ttl=2.0), coord=coord)
    task = asyncio.create_task(proc.run())
    deadline = time.monotonic() + 10
    while coord.grants < 2:  # retrying: the second attempt comes a second after the first
        assert time.monotonic() < deadline and not task.done(), "the replica never tried to register"
        await asyncio.sleep(0.02)
    proc.stop()
    await asyncio.wait_for(task, 5)  # before the fix it retried until etcd granted a lease: forever here
    assert not proc.runners


async def test_housekeeping_rides_on_at_most_one_tick_per_second_of_a_busy_partition(
        redis_url: str, etcd_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # With the hand-off lead a busy partition ticks about once per job; housekeeping (the
    # retirement pass, an HSCAN of the queue names, and the search for held jobs) rides along on one
    # tick per HOUSEKEEPING_EVERY only, and still retires; the other ticks take the fast path.
    from scheduler.tier import runner as runner_mod

    passes: list[float] = []
    ticks: list[float] = []
    real_tick_call = runner_mod.tick_call

    def recording(calls, partition, epoch, batch, tokens, retention, lead_ms=0, housekeeping=True):  # type: ignore[no-untyped-def]
        ticks.append(time.monotonic())
        if retention.queue_idle_ms:
            assert housekeeping
            passes.append(time.monotonic())
        return real_tick_call(calls, partition, epoch, batch, tokens, retention, lead_ms, housekeeping)

    monkeypatch.setattr(runner_mod, "tick_call", recording)
    client = Client.from_url(redis_url, namespace=NS, partitions=1).connect()
    client.set_queue_retirement(0.2)
    gone = client.schedule(time.time() + 3600, "x", queue="old")
    client.cancel(gone)  # "old" is now empty: idle from here on
    r = redis.Redis.from_url(redis_url)
    proc, task = await start_replica(redis_url, etcd_endpoint, "solo")
    try:
        await settled(etcd_endpoint, [proc], 1)
        t0 = time.time()
        client.schedule_many([(t0 + 0.1 + i * 0.004, i) for i in range(600)], queue="busy")
        deadline = time.monotonic() + 10
        while r.hget("{tier:0}:q", "n:old") is not None or time.time() < t0 + 2.7:
            assert time.monotonic() < deadline, "the idle queue name was not retired"
            await asyncio.sleep(0.05)
    finally:
        await stop_replica(proc, task)
    # Busy: many ticks per housekeeping pass (one per job at best; a loaded host's replica wakes
    # later and moves several jobs per tick, 98 ticks for the 600 jobs once).
    assert len(ticks) > 10 * len(passes), f"{len(ticks)} ticks, {len(passes)} passes: the partition was not busy"
    assert len(passes) >= 2
    gaps = [b - a for a, b in zip(passes, passes[1:])]
    assert min(gaps) >= runner_mod.HOUSEKEEPING_EVERY * 0.99, gaps


async def test_a_busy_partition_widens_its_hand_off_lead_and_narrows_it_when_traffic_stops(
        redis_url: str, etcd_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Spread traffic at 40 jobs/s on one partition: one job per 10 ms grid step would cost a tick
    # each, so with --coalesce-lead 160 the runner doubles its lead, a level per second, up to
    # 160 ms (an 80 ms step, about three jobs per tick), exports it, and goes back to the
    # configured lead once traffic stops.
    # Every job reaches ready, none earlier than the widest lead ahead of its due time.
    from scheduler.tier import runner as runner_mod

    leads: list[int] = []
    real_tick_call = runner_mod.tick_call

    def recording(calls, partition, epoch, batch, tokens, retention, lead_ms=0, housekeeping=True):  # type: ignore[no-untyped-def]
        leads.append(lead_ms)
        return real_tick_call(calls, partition, epoch, batch, tokens, retention, lead_ms, housekeeping)

    monkeypatch.setattr(runner_mod, "tick_call", recording)
    client = Client.from_url(redis_url, namespace=NS, partitions=1).connect()
    r = redis.Redis.from_url(redis_url)
    ready_key = client.calls.ks.ready(0, "spread")
    widest = 0.160
    proc, task = await start_replica(redis_url, etcd_endpoint, "solo",
                                     runner=runner_mod.RunnerConfig(coalesce_lead=widest))

    def widened() -> float | None:
        return proc.metrics.registry.get_sample_value("zsched_coalescing_partitions", {"replica": "solo"})

    n, gap = 160, 0.025
    early: list[float] = []
    try:
        await settled(etcd_endpoint, [proc], 1)
        assert widened() == 0
        t0 = time.time() + 0.5
        client.schedule_many([(t0 + i * gap, i) for i in range(n)], queue="spread")
        seen_widened = False
        while time.time() < t0 + n * gap:
            seen_widened = seen_widened or widened() == 1
            now = time.time()
            for raw in r.lrange(ready_key, 0, -1):  # how far ahead of its due time each ready job is
                early.append(run_at_of(raw) / 1000 - now)
            await asyncio.sleep(0.02)
        await wait_for(lambda: r.llen(ready_key) == n, 5, what="every job to reach ready")
        ticks_under_load = len(leads)
        await wait_for(lambda: widened() == 0, 5, what="the lead to narrow again")
    finally:
        await stop_replica(proc, task)
        client.close()
    assert seen_widened
    assert leads[0] == 20 and max(leads) == 160, leads  # and back to 20: the gauge went to 0
    assert ticks_under_load < n * 0.8, f"{ticks_under_load} ticks for {n} jobs: not coalesced (one per job without)"
    assert early and max(early) <= widest + 0.005, max(early)


async def test_a_burst_is_handed_off_with_the_burst_lead_and_lone_jobs_with_the_configured_one(
        redis_url: str, etcd_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A lone job, then 12 jobs due at one instant, then a lone job. The tick before the burst sees
    # it coming (its fourth earliest timer is due with the first) and the burst goes out in one tick
    # sent with the burst lead (50 ms), so cold workers woken by its burst bell claim before it is
    # due; the lone jobs go with the configured 20 ms. None is handed off earlier than its lead.
    from scheduler.tier import runner as runner_mod

    sent: list[int] = []
    replies: list[runner_mod.TickReply] = []
    real_tick_call, real_parse = runner_mod.tick_call, runner_mod.parse_tick

    def recording(calls, partition, epoch, batch, tokens, retention, lead_ms=0, housekeeping=True):  # type: ignore[no-untyped-def]
        sent.append(lead_ms)
        return real_tick_call(calls, partition, epoch, batch, tokens, retention, lead_ms, housekeeping)

    def parsing(reply):  # type: ignore[no-untyped-def]
        tick = real_parse(reply)
        assert isinstance(tick, runner_mod.TickReply)
        replies.append(tick)
        return tick

    monkeypatch.setattr(runner_mod, "tick_call", recording)
    monkeypatch.setattr(runner_mod, "parse_tick", parsing)
    client = Client.from_url(redis_url, namespace=NS, partitions=1).connect()
    r = redis.Redis.from_url(redis_url)
    ready_key = client.calls.ks.ready(0, "burst")
    cfg = runner_mod.RunnerConfig()
    proc, task = await start_replica(redis_url, etcd_endpoint, "solo")
    try:
        await settled(etcd_endpoint, [proc], 1)
        t0 = round(time.time()) + 1.0  # whole seconds: every job of the burst has the same due ms
        client.schedule(t0, "lone", queue="burst")
        client.schedule_many([(t0 + 0.4, i) for i in range(12)], queue="burst")
        client.schedule(t0 + 0.8, "lone", queue="burst")
        await wait_for(lambda: r.llen(ready_key) == 14, 10, what="every job to reach ready")
    finally:
        await stop_replica(proc, task)
        client.close()
    firing = [(lead, tick.lateness_ms) for lead, tick in zip(sent, replies) if tick.lateness_ms]
    burst = [(lead, late) for lead, late in firing if len(late) > 1]
    assert len(burst) == 1 and len(burst[0][1]) == 12, f"the burst went out in one tick: {firing}"
    assert burst[0][0] == round(cfg.burst_lead * 1000), firing
    lone = [(lead, late) for lead, late in firing if len(late) == 1]
    assert [lead for lead, _ in lone] == [round(cfg.handoff_lead * 1000)] * 2, firing
    # never earlier than the lead it went with (the lateness of a job handed off early is negative)
    assert all(min(late) >= -lead for lead, late in firing), firing
