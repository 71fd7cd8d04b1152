"""Worker runtime against a real redis-server, with in-process workers.

Timers and lease expiry are driven by ``TierStandIn`` (a test stand-in for the scheduler tier).
"""
from __future__ import annotations

import asyncio
import random
import statistics
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
import redis

from scheduler import Client, JobState, Outcome
from scheduler.protocol.ids import decode_id, partition_of
from scheduler.protocol.tick import reap_call
from tests.support.waits import wait_for
from tests.support.workers import Recorder, TierStandIn, serving
from workers import Job, PermanentError, Retry, Worker, WorkerStats


@pytest.fixture
def client(redis_url: str):
    c = Client.from_url(redis_url)
    yield c
    c.close()


def _worker(url: str, **kw) -> Worker:
    kw.setdefault("shutdown_grace", 5.0)
    return Worker.from_url(url, **kw)


# --------------------------------------------------------------------------- exactly once


async def _run_exactly_once(redis_url: str, client: Client, n_workers: int) -> None:
    rec = Recorder()
    lateness: list[float] = []
    workers = [_worker(redis_url, concurrency=8) for _ in range(n_workers)]
    for w in workers:
        @w.handler("default")
        async def handle(job: Job) -> None:
            rec.start(job)
            lateness.append(time.time() - job.run_at.timestamp())
            await asyncio.sleep(random.uniform(0, 0.004))
            rec.end(job)

    now_ids = client.schedule_many([(timedelta(0), {"i": i}) for i in range(150)])
    async with TierStandIn(redis_url), serving(*workers):
        later = [(time.time() + random.uniform(0.1, 1.0), {"i": i}) for i in range(150)]
        later_ids = client.schedule_many(later)
        ids = now_ids + later_ids
        await wait_for(lambda: len(rec.ends) >= len(ids), 15, what="all jobs to run")
        await asyncio.sleep(0.3)  # a duplicate would show up here
        await wait_for(lambda: WorkerStats.total(w.stats for w in workers).acked == len(ids), 5, what="acks")
    counts = Counter(rec.ok_ids())
    assert set(counts) == set(ids)
    assert max(counts.values()) == 1
    assert all(a == 1 for _, a, _ in rec.starts)
    # Timed jobs ran at (not before) their time: run_at is when the attempt became due.
    assert min(lateness) > -0.05
    total = WorkerStats.total(w.stats for w in workers)
    assert total.claimed == total.acked == len(ids)
    assert total.failed == total.lease_lost == total.poison == 0
    if n_workers > 1:
        assert all(w.stats.acked > 0 for w in workers), [w.stats.acked for w in workers]
    assert client.get(ids[0]).state is JobState.DONE


async def test_each_job_runs_once_one_worker(redis_url: str, client: Client) -> None:
    await _run_exactly_once(redis_url, client, 1)


async def test_each_job_runs_once_three_workers(redis_url: str, client: Client) -> None:
    await _run_exactly_once(redis_url, client, 3)


async def test_sync_handler_runs_in_thread_pool(redis_url: str, client: Client) -> None:
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()
    w = _worker(redis_url, concurrency=3)

    @w.handler("default")
    def handle(job: Job) -> None:
        with lock:
            seen.append((job.id, threading.current_thread().name))
        time.sleep(0.002)

    ids = client.schedule_many([(timedelta(0), i) for i in range(60)])
    async with serving(w):
        await wait_for(lambda: w.stats.acked == 60, 10, what="acks")
    assert sorted(i for i, _ in seen) == sorted(ids)
    names = {n for _, n in seen}
    assert all(n.startswith("zsched-handler") for n in names)
    assert 1 < len(names) <= 3


# --------------------------------------------------------------------------- leases


async def test_heartbeat_keeps_a_long_job_running_once(redis_url: str, client: Client) -> None:
    rec = Recorder()
    w = _worker(redis_url)

    @w.handler("default")
    async def handle(job: Job) -> None:
        rec.start(job)
        await asyncio.sleep(1.8)  # 3x the lease
        rec.end(job)

    async with TierStandIn(redis_url) as tier, serving(w):
        jid = client.schedule(timedelta(0), None, lease=0.6)
        await wait_for(lambda: w.stats.acked == 1, 10, what="ack")
        await tier.passed()  # a reap of a lease the heartbeats let lapse would have shown by now
        assert tier.reaped == 0
    assert [s[0] for s in rec.starts] == [jid]
    assert w.stats.lease_lost == 0
    assert client.get(jid).state is JobState.DONE


async def test_ack_refused_after_lease_lost_is_counted_not_raised(redis_url: str, client: Client) -> None:
    release_first = asyncio.Event()
    rec = Recorder()
    w = _worker(redis_url, concurrency=4)

    @w.handler("default")
    async def handle(job: Job) -> None:
        rec.start(job)
        if job.attempt == 1:
            await release_first.wait()
        rec.end(job)

    async with serving(w):
        jid = client.schedule(timedelta(0), None)
        await wait_for(lambda: rec.starts, 5, what="first attempt")
        # Expire the lease under the handler and reap it, as the scheduler tier would.
        raw = decode_id(jid)
        p = partition_of(raw, client.keyspace.partitions)
        client.redis.zadd(client.keyspace.key(p, "i"), {raw: 0}, xx=True)
        core = client.calls
        assert client.transport.call(*reap_call(core, p, 0, 100))[0] == 1
        await wait_for(lambda: w.stats.acked == 1, 5, what="second attempt acked")
        release_first.set()
        await wait_for(lambda: w.stats.lease_lost == 1, 5, what="refused ack counted")
        assert w.serving
    assert [a for _, a, _ in rec.starts] == [1, 2]
    assert w.stats.acked == 1 and w.stats.lease_lost == 1
    assert client.get(jid).state is JobState.DONE


# --------------------------------------------------------------------------- outcomes


async def test_retries_with_growing_jittered_backoff_then_dead_then_requeue(redis_url: str, client: Client) -> None:
    starts: dict[str, list[tuple[int, float]]] = {}
    fences: dict[str, list[int]] = {}
    # per job and retry: the backoff Redis chose, from its own clock (the failed attempt's error
    # time to the retry's due time), so the check does not depend on how loaded the machine is
    backoffs: dict[str, list[float]] = {}
    succeed = False
    w = _worker(redis_url, concurrency=16)

    @w.handler("default")
    async def handle(job: Job) -> None:
        starts.setdefault(job.id, []).append((job.attempt, time.monotonic()))
        fences.setdefault(job.id, []).append(job.fence)
        if job.attempt > 1 and not succeed:
            err = (await asyncio.to_thread(client.get, job.id)).last_error
            assert err is not None and err.at is not None and err.message == f"boom on attempt {job.attempt - 1}"
            backoffs.setdefault(job.id, []).append((job.run_at - err.at).total_seconds())
        if succeed:
            return
        raise ValueError(f"boom on attempt {job.attempt}")

    n, base, cap = 16, 0.05, 1.0
    async with TierStandIn(redis_url, interval=0.005), serving(w):
        ids = client.schedule_many([(timedelta(0), i) for i in range(n)], max_attempts=4, backoff=(base, cap))
        await wait_for(lambda: w.stats.dead == n, 15, what="all dead")
        for jid in ids:
            assert [a for a, _ in starts[jid]] == [1, 2, 3, 4]
            assert fences[jid] == sorted(fences[jid]) and len(set(fences[jid])) == 4  # fence grows
            info = client.get(jid)
            assert info.state is JobState.DEAD
            assert info.last_error.type == "ValueError"
            assert info.last_error.message == "boom on attempt 4"
            assert "ValueError" in info.last_error.traceback
        # The backoff after attempt k is uniform in [0, min(cap, base * 2**k)] (ms precision).
        gaps = {k: [backoffs[j][k - 1] for j in ids] for k in (1, 2, 3)}
        for k, gs in gaps.items():
            assert min(gs) >= -0.001 and max(gs) <= min(cap, base * 2 ** k) + 0.001, (k, gs)
            assert statistics.pstdev(gs) > 0.005, (k, gs)  # jittered, not a fixed delay
        assert statistics.mean(gaps[3]) > statistics.mean(gaps[1])  # growing
        assert w.stats.failed == 4 * n and w.stats.retried == 3 * n

        succeed = True
        assert client.requeue(ids[0]) is Outcome.DONE
        assert client.requeue(ids[0]) is Outcome.NOT_DEAD
        await wait_for(lambda: w.stats.acked == 1, 5, what="requeued job to run")
    assert starts[ids[0]][-1][0] == 1  # attempts were reset
    assert client.get(ids[0]).state is JobState.DONE


async def test_retry_with_delay_and_permanent_error(redis_url: str, client: Client) -> None:
    times: dict[str, list[float]] = {}
    w = _worker(redis_url)

    @w.handler("default")
    async def handle(job: Job) -> None:
        times.setdefault(job.id, []).append(time.monotonic())
        if job.payload == "retry" and job.attempt == 1:
            raise Retry(delay=timedelta(seconds=0.4))
        if job.payload == "permanent":
            raise PermanentError("customer 42 does not exist")

    async with TierStandIn(redis_url), serving(w):
        rid = client.schedule(timedelta(0), "retry", max_attempts=5)
        pid = client.schedule(timedelta(0), "permanent", max_attempts=5)
        await wait_for(lambda: w.stats.acked == 1 and w.stats.dead == 1, 5, what="outcomes")
    assert len(times[rid]) == 2
    assert 0.35 <= times[rid][1] - times[rid][0] < 2.0
    assert len(times[pid]) == 1
    dead = client.get(pid)
    assert dead.state is JobState.DEAD and dead.attempts == 1
    assert dead.last_error.type.endswith("PermanentError")
    assert dead.last_error.message == "customer 42 does not exist"
    assert w.stats.retried == 1 and w.stats.failed == 1
    assert client.get(rid).state is JobState.DONE


async def test_handler_timeout_counts_as_failure(redis_url: str, client: Client) -> None:
    attempts: list[int] = []
    w = _worker(redis_url, handler_timeouts={"sync": 0.15})

    @w.handler("default", timeout=0.2)
    async def slow(job: Job) -> None:
        attempts.append(job.attempt)
        await asyncio.Event().wait()  # until its 0.2 s timeout cancels it

    @w.handler("sync")
    def slow_sync(job: Job) -> None:
        time.sleep(0.4)

    async with TierStandIn(redis_url), serving(w):
        aid = client.schedule(timedelta(0), None, max_attempts=2, backoff=(0.01, 0.01))
        sid = client.schedule(timedelta(0), None, queue="sync", max_attempts=1)
        await wait_for(lambda: w.stats.dead == 2, 5, what="both dead")
    assert attempts == [1, 2]
    for jid in (aid, sid):
        info = client.get(jid)
        assert info.state is JobState.DEAD
        assert info.last_error.type == "HandlerTimeout"
        assert "did not finish within" in info.last_error.message
    assert w.stats.failed == 3


# --------------------------------------------------------------------------- poison


async def test_poison_jobs_are_dead_lettered_and_worker_survives(redis_url: str, client: Client) -> None:
    ran: list[object] = []
    w = _worker(redis_url, queues=["default", "orphan"])

    @w.handler("default")
    async def handle(job: Job) -> None:
        ran.append(job.payload)

    bad_rec = client.schedule(timedelta(0), "x")
    bad_payload = client.schedule(timedelta(0), "y")
    orphan = client.schedule(timedelta(0), "z", queue="orphan")
    r = client.redis
    for jid, corrupt in ((bad_rec, "record"), (bad_payload, "payload")):
        raw = decode_id(jid)
        key = client.keyspace.key(partition_of(raw, client.keyspace.partitions), "j")
        v = r.hget(key, raw)
        due, rec = v[:6], v[6:]
        if corrupt == "record":  # claims a 200-byte idempotency key that is not there
            hdr = bytearray(rec[:9])
            hdr[4] |= 4
            rec = bytes(hdr) + bytes([200]) + b"ab"
        else:  # 0xc1 is never valid msgpack
            rec = rec[:9] + b"\xc1"
        r.hset(key, raw, due + rec)

    async with serving(w):
        # the malformed record never reaches the worker: the claim script dead-letters it itself
        await wait_for(lambda: w.stats.poison == 2 and w.stats.dead == 2, 5, what="poison dead-lettered")
        good = client.schedule(timedelta(0), "fine")
        await wait_for(lambda: ran == ["fine"], 5, what="a good job after the poison ones")
        assert w.serving
    errs = {jid: client.get(jid).last_error for jid in (bad_rec, bad_payload, orphan)}
    assert all(client.get(j).state is JobState.DEAD for j in errs)
    assert errs[bad_rec].type == "CorruptRecord" and "record" in errs[bad_rec].message
    assert "_undecodable" in client.get(bad_rec).payload
    assert errs[bad_payload].type == "PoisonJob" and "msgpack" in errs[bad_payload].message
    assert errs[orphan].type == "NoHandler" and "'orphan'" in errs[orphan].message
    assert client.get(good).state is JobState.DONE


# --------------------------------------------------------------------------- backpressure & waiting


@pytest.mark.parametrize("kind", ["async", "sync"])
async def test_concurrency_limit_is_exact(redis_url: str, client: Client, kind: str) -> None:
    limit = 4
    cur = peak = 0
    lock = threading.Lock()
    w = _worker(redis_url, concurrency=limit)

    def enter() -> None:
        nonlocal cur, peak
        with lock:
            cur += 1
            peak = max(peak, cur)

    def leave() -> None:
        nonlocal cur
        with lock:
            cur -= 1

    if kind == "async":
        @w.handler("default")
        async def handle(job: Job) -> None:
            enter()
            await asyncio.sleep(0.02)
            leave()
    else:
        @w.handler("default")
        def handle_sync(job: Job) -> None:
            enter()
            time.sleep(0.02)
            leave()

    client.schedule_many([(timedelta(0), i) for i in range(48)])
    async with serving(w):
        await wait_for(lambda: w.stats.acked == 48, 10, what="acks")
    assert peak == limit


def _total_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(v["calls"] for v in stats.values())


async def test_idle_worker_is_quiet_and_picks_up_fast(redis_url: str, client: Client) -> None:
    started: dict[str, float] = {}
    w = _worker(redis_url, queues=["default", "other"])

    @w.handler("default")
    async def handle(job: Job) -> None:
        started[job.id] = time.perf_counter()

    async with serving(w):
        await asyncio.sleep(0.3)
        before = _total_calls(client.redis)
        await asyncio.sleep(1.0)  # the measurement window: commands an idle worker sends in a second
        idle_calls = _total_calls(client.redis) - before - 1  # minus our INFO
        lat = []
        for _ in range(25):
            t = time.perf_counter()
            jid = client.schedule(timedelta(0), None)
            await wait_for(lambda jid=jid: jid in started, 2, interval=0.0005, what="pick-up")
            lat.append(started[jid] - t)
            await asyncio.sleep(0.01)
    lat.sort()
    print(f"\nidle commands/s: {idle_calls}; pick-up latency p50 {lat[12] * 1000:.2f} ms, max {lat[-1] * 1000:.2f} ms")
    # An idle sweep (one claim per queue and partition, every ~2 s) may fall in the window, and a
    # refresh of the worker's registry record (every 5 s: EVALSHA and the 6 commands it runs).
    assert idle_calls <= 2 * 16 + 5 + 7
    assert lat[-1] < 0.2


async def test_stop_while_redis_is_unreachable_returns_promptly(caplog: pytest.LogCaptureFixture) -> None:
    from scheduler.shell.servers import free_port

    w = Worker.from_url(f"redis://127.0.0.1:{free_port()}/0", shutdown_grace=1)

    @w.handler("default")
    async def handle(job: Job) -> None:  # pragma: no cover - never runs
        pass

    task = asyncio.create_task(w.serve())
    await wait_for(lambda: "Redis unavailable" in caplog.text, 5, what="the worker to find Redis unreachable")
    assert not task.done()
    t = time.monotonic()
    await w.stop()
    await asyncio.wait_for(task, 2)
    assert time.monotonic() - t < 2


# --------------------------------------------------------------------------- graceful shutdown


async def test_graceful_shutdown_under_load_loses_nothing_and_reruns_nothing(redis_url: str, client: Client) -> None:
    finished: Counter[str] = Counter()
    first_runs: dict[str, int] = {}
    started_w1: set[str] = set()

    w1 = _worker(redis_url, concurrency=8, shutdown_grace=0.15)

    @w1.handler("default")
    async def slow(job: Job) -> None:
        started_w1.add(job.id)
        await asyncio.sleep(0.05 + 0.35 * job.payload)
        finished[job.id] += 1

    # the first jobs are short; later ones outlast the 0.15 s grace, so some are in flight at stop
    ids = client.schedule_many([(timedelta(0), random.random() if n < 24 else 1.6) for n in range(120)])
    async with serving(w1):
        await wait_for(lambda: sum(finished.values()) >= 20, 10, what="some progress")
    # w1 is stopped: its running handlers got 0.15 s, the rest were released.
    s1 = w1.stats
    assert s1.released > 0, s1
    assert s1.acked == sum(finished.values())
    assert s1.claimed == s1.acked + s1.released
    done_by_w1 = set(finished)
    released = started_w1 - done_by_w1

    w2 = _worker(redis_url, concurrency=32)

    @w2.handler("default")
    async def fast(job: Job) -> None:
        first_runs[job.id] = job.attempt
        finished[job.id] += 1

    async with serving(w2):
        await wait_for(lambda: len(finished) == len(ids), 10, what="the rest to run")
        await asyncio.sleep(0.2)
    assert set(finished) == set(ids)
    assert max(finished.values()) == 1  # nothing that finished ran again
    assert not (set(first_runs) & done_by_w1)
    assert released and released <= set(first_runs)
    assert all(first_runs[j] == 1 for j in released)  # a release does not spend an attempt
    assert w2.stats.lease_lost == 0 and w1.stats.lease_lost == 0


async def test_shutdown_waits_for_handlers_within_grace(redis_url: str, client: Client) -> None:
    done: list[str] = []
    w = _worker(redis_url, concurrency=4, shutdown_grace=3)

    @w.handler("default")
    async def handle(job: Job) -> None:
        await asyncio.sleep(0.3)
        done.append(job.id)

    ids = client.schedule_many([(timedelta(0), i) for i in range(4)])
    async with serving(w):
        await wait_for(lambda: w.running == 4, 5, what="4 running")
    assert sorted(done) == sorted(ids)
    assert w.stats.released == 0 and w.stats.acked == 4
    assert all(client.get(j).state is JobState.DONE for j in ids)


async def test_metrics_hook_and_stats_by_queue(redis_url: str, client: Client) -> None:
    events: list[tuple[str, str]] = []

    class Hook:
        def job_started(self, job: Job) -> None:
            events.append(("start", job.queue))

        def job_finished(self, job: Job, outcome: str, seconds: float) -> None:
            assert seconds >= 0
            events.append((outcome, job.queue))

    w = _worker(redis_url, metrics=Hook())

    @w.handler("a")
    async def a(job: Job) -> None:
        pass

    @w.handler("b")
    async def b(job: Job) -> None:
        raise PermanentError("no")

    client.schedule(timedelta(0), None, queue="a")
    client.schedule(timedelta(0), None, queue="b")
    async with serving(w):
        await wait_for(lambda: w.stats.acked == 1 and w.stats.dead == 1, 5, what="outcomes")
    by_q = w.stats_by_queue()
    assert by_q["a"].acked == 1 and by_q["a"].dead == 0
    assert by_q["b"].dead == 1 and by_q["b"].failed == 1
    assert sorted(events) == sorted([("start", "a"), ("ok", "a"), ("start", "b"), ("permanent", "b")])
