"""Worker fault tests: kill -9 of a real ``zsched worker`` mid-job, Redis crashing under a worker.

Lease expiry is driven by ``TierStandIn`` (a test stand-in for the scheduler tier's reaper).
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from scheduler import Client, JobState
from scheduler.shell.servers import ZschedProc
from scheduler.tier import SchedulerConfig, SchedulerProcess
from tests.support.servers import RedisServer
from tests.support.waits import wait_for
from tests.support.workers import TierStandIn, read_runs, serving, spawn_worker, wait_worker_ready, write_app
from workers import Job, Worker

pytestmark = pytest.mark.fault


async def test_kill9_mid_job_runs_it_again_once_after_its_lease(redis_url: str, tmp_path: Path) -> None:
    write_app(tmp_path)
    client = Client.from_url(redis_url)
    lease = 1.0
    p1 = spawn_worker(tmp_path, redis_url, "--concurrency", "4")
    p2 = None
    try:
        async with TierStandIn(redis_url) as tier:
            await wait_worker_ready(p1)
            fast = client.schedule_many([(timedelta(0), {"i": i}) for i in range(30)], lease=lease)
            await wait_for(lambda: p1.metric("zsched_worker_acked_total") == 30, 10, what="fast jobs acked")
            slow = client.schedule(timedelta(0), {"slow": True}, lease=lease, max_attempts=3)
            await wait_for(lambda: any(r[1] == slow for r in read_runs(tmp_path)), 5, what="slow job to start")
            # the rescuer is up before the kill: the bound below is about the lease, not about how
            # long a Python process takes to start on a busy machine
            p2 = spawn_worker(tmp_path, redis_url, "--concurrency", "4")
            await wait_worker_ready(p2)
            await asyncio.sleep(lease * 0.8)  # heartbeats have extended the lease meanwhile
            p1.kill()
            killed_at = time.time()
            assert client.get(slow).state is JobState.RUNNING

            await wait_for(lambda: sum(1 for r in read_runs(tmp_path) if r[1] == slow and r[0] == "END"), 10,
                           what="the slow job to run again")
            await asyncio.sleep(lease * 2)  # time for a wrongful third run
            assert tier.reaped == 1
        runs = read_runs(tmp_path)
        slow_starts = [r for r in runs if r[1] == slow and r[0] == "START"]
        assert [(r[2], r[3]) for r in slow_starts] == [(1, p1.pid), (2, p2.pid)]
        # It ran again only once its lease (last extended < lease/3 before the kill) had expired.
        assert killed_at + lease * 0.5 <= slow_starts[1][4] <= killed_at + lease + 3
        ends = Counter(r[1] for r in runs if r[0] == "END")
        assert all(ends[j] == 1 for j in fast) and ends[slow] == 1
        assert sum(1 for r in runs if r[0] == "START") == len(fast) + 2  # nothing else ran twice
        assert client.get(slow).state is JobState.DONE
        assert client.get(slow) is not None
    finally:
        for p in (p1, p2):
            if p is not None and p.alive:
                p.term(10)
        client.close()


async def test_kill9_while_acks_linger_runs_the_finished_job_again_once_after_its_lease(
        redis_url: str, tmp_path: Path) -> None:
    """``zsched worker --ack-linger``: a worker killed while a finished job's ack waits leaves the
    job leased to nobody; it runs again once, after its lease, as after any kill -9 before the ack
    landed (at-least-once; docs/workers.md "Lingering acks"). Through the command line, so this
    also proves the option reaches the worker: without it the ack lands within milliseconds."""
    ns, lease = "lingerkill", 12.0  # a tenth of the lease caps the wait: 1.2 s, above the 1 s linger
    write_app(tmp_path)
    client = Client.from_url(redis_url, namespace=ns)
    p1 = spawn_worker(tmp_path, redis_url, "--namespace", ns, "--ack-linger", "1000")
    p2 = None
    try:
        async with TierStandIn(redis_url, namespace=ns) as tier:
            await wait_worker_ready(p1)
            jid = client.schedule(timedelta(0), {}, lease=lease)

            def ends() -> list[float]:
                return [r[4] for r in read_runs(tmp_path) if r[0] == "END" and r[1] == jid]

            await wait_for(lambda: bool(ends()), 10, what="the job to run")
            p1.kill()
            assert time.time() - ends()[0] < 1.0  # killed within the linger: the ack was still waiting
            assert client.get(jid).state is JobState.RUNNING
            p2 = spawn_worker(tmp_path, redis_url, "--namespace", ns)
            await wait_worker_ready(p2)
            await wait_for(lambda: len(ends()) == 2, lease + 15, what="the job to run again after its lease")
            await wait_for(lambda: client.get(jid).state is JobState.DONE, 5, what="the second run's ack")
            assert tier.reaped == 1
        starts = [r for r in read_runs(tmp_path) if r[0] == "START" and r[1] == jid]
        assert [(r[2], r[3]) for r in starts] == [(1, p1.pid), (2, p2.pid)]
        assert starts[1][4] >= starts[0][4] + lease - 0.5  # not before the first claim's lease ran out
    finally:
        for p in (p1, p2):
            if p is not None and p.alive:
                p.term(10)
        client.close()


@pytest.mark.parametrize("ack_linger", [0.0, 0.3])  # 0.3: the lingering ack's first try fails too
async def test_redis_crash_outcomes_are_delivered_after_restart(tmp_path: Path, ack_linger: float) -> None:
    # AOF with fsync on every write, so a kill -9 of Redis loses nothing and the job's lease survives.
    srv = RedisServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"]).start()
    client = Client.from_url(srv.url)
    gate = asyncio.Event()
    ran: list[tuple[str, int]] = []
    w = Worker.from_url(srv.url, shutdown_grace=2, ack_linger=ack_linger)

    @w.handler("default")
    async def handle(job: Job) -> None:
        ran.append((job.id, job.attempt))
        if job.payload == "blocked":
            await gate.wait()

    try:
        async with serving(w):
            jid = client.schedule(timedelta(0), "blocked")
            await wait_for(lambda: ran, 5, what="job to start")
            srv.kill()
            gate.set()  # the handler returns while Redis is down: the ack cannot be delivered
            await asyncio.sleep(0.7)  # the outage lasts a while: no ack can get through meanwhile
            assert w.stats.acked == 0 and w.serving
            srv.restart()
            await wait_for(lambda: w.stats.acked == 1, 10, what="ack delivered after restart")
            assert client.get(jid).state is JobState.DONE
            # The pub/sub connection came back too: a new job is picked up at once.
            jid2 = client.schedule(timedelta(0), "after")
            await wait_for(lambda: w.stats.acked == 2, 5, what="job after restart")
        assert ran == [(jid, 1), (jid2, 1)]
        assert w.stats.lease_lost == 0 and w.stats.failed == 0
    finally:
        client.close()
        srv.stop()


async def test_a_stopping_worker_gives_up_outcomes_redis_cannot_take_after_its_drain_timeout(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Redis dies while a handler runs; the worker is stopped: it waits for the handler, retries
    the ack for ``drain_timeout`` s (not the default 10 s), says it could not deliver it and
    stops; the job, still running in Redis, runs again after its lease (as after kill -9)."""
    srv = RedisServer().start()
    client = Client.from_url(srv.url)
    gate = asyncio.Event()
    w = Worker.from_url(srv.url, shutdown_grace=5, drain_timeout=0.5)

    @w.handler("default")
    async def handle(job: Job) -> None:
        await gate.wait()

    try:
        async with serving(w):
            client.schedule(timedelta(0), "blocked")
            await wait_for(lambda: w.stats.claimed == 1, 5, what="the job to start")
            srv.kill()
            stopping = asyncio.ensure_future(w.stop())
            await asyncio.sleep(0.1)
            gate.set()  # the handler ends within the grace; its ack cannot reach Redis
            started = time.monotonic()
            await asyncio.wait_for(stopping, 30)
            stopped_in = time.monotonic() - started
        assert w.stats.acked == 0
        # the 0.5 s drain, plus the last round trip's connect attempt; the default would be 10 s
        assert stopped_in < 4.0, f"stopped {stopped_in:.1f} s after its handler ended"
        assert "could not deliver 1 outcome(s) before exiting" in caplog.text
    finally:
        client.close()
        srv.stop()


async def _kill_the_listener_and_see_the_survivor_take_over(client: Client, tmp_path: Path, first: ZschedProc,
                                                            second: ZschedProc, role: str) -> None:
    """A job runs on ``first`` (the listener); ``first`` is killed with SIGKILL; a job made ready
    then starts on ``second`` within BELL_WAIT + STALE_RING_MS, and ``second`` holds the role
    LISTEN_TTL + BELL_WAIT after the kill."""
    from workers.doorbell import BELL_WAIT, LISTEN_TTL_MS, STALE_RING_MS

    held_by_first = client.redis.get(role)
    before = client.schedule(timedelta(0), {"before": True})
    await wait_for(lambda: any(r[1] == before and r[0] == "END" for r in read_runs(tmp_path)), 10,
                   what="a job on the listener")
    assert [r[3] for r in read_runs(tmp_path) if r[1] == before] == [first.pid] * 2
    first.kill()
    killed_at = time.time()
    after = client.schedule(timedelta(0), {"after": True})
    bound = BELL_WAIT + STALE_RING_MS / 1000
    await wait_for(lambda: any(r[1] == after and r[0] == "END" for r in read_runs(tmp_path)), bound + 5,
                   what="the job on the surviving worker")
    [start] = [r for r in read_runs(tmp_path) if r[1] == after and r[0] == "START"]
    assert start[3] == second.pid and start[4] - killed_at <= bound + 1.5
    role_bound = LISTEN_TTL_MS / 1000 + BELL_WAIT
    await wait_for(lambda: client.redis.get(role) not in (None, held_by_first),
                   killed_at + role_bound + 2 - time.time(), what="the survivor to take the role")
    assert client.get(after).state is JobState.DONE


async def test_kill9_of_the_one_listener_leaves_its_rings_to_a_sleeper_long_before_its_role_expires(
        redis_url: str, tmp_path: Path) -> None:
    """``--one-listener``: the listener is killed with SIGKILL, so nobody hands its role on. A job
    made ready then waits in the bell until the survivor finds it, by its safety sweep (every 2 s)
    or at its next role check (its wait times out every BELL_WAIT), which finds the ring older
    than STALE_RING_MS and helps: within BELL_WAIT + STALE_RING_MS, once, long before the role
    expires; and the survivor holds the role LISTEN_TTL + BELL_WAIT after the kill."""
    write_app(tmp_path)
    client = Client.from_url(redis_url)
    role = client.keyspace.listener(["default", "sync"])
    first = spawn_worker(tmp_path, redis_url, "--one-listener")
    second = None
    try:
        await wait_worker_ready(first)
        await wait_for(lambda: client.redis.get(role) is not None, 10, what="the first worker to take the role")
        held_by_first = client.redis.get(role)
        second = spawn_worker(tmp_path, redis_url, "--one-listener")
        await wait_worker_ready(second)
        # both idle, their start-up sweeps done: the listener on the bells, the other on the wake key
        await wait_for(lambda: int(client.redis.info("clients")["blocked_clients"]) == 2, 10, what="two idle workers")
        assert client.redis.get(role) == held_by_first  # an idle listener keeps its role
        await _kill_the_listener_and_see_the_survivor_take_over(client, tmp_path, first, second, role)
    finally:
        for p in (first, second):
            if p is not None and p.alive:
                p.term(10)
        client.close()


async def test_kill9_of_the_one_listener_on_a_cluster_leaves_its_rings_to_the_watching_sleeper(
        redis_cluster_url: str, etcd_endpoint: str, tmp_path: Path) -> None:
    """The same on a Redis Cluster, where a sleeper that does not hold the watch waits up to 5 s:
    the other worker is the watcher (its waits time out every BELL_WAIT), and a job made ready
    after the listener's SIGKILL (its ring relayed by the partition's owner, a real replica) starts
    on it within BELL_WAIT + STALE_RING_MS; it holds the role after the role's expiry."""
    write_app(tmp_path)
    client = Client.from_url(redis_cluster_url).connect()
    queues = ["default", "sync"]
    role, watch = client.keyspace.listener(queues), client.keyspace.listen_watch(queues)
    replica = SchedulerProcess(SchedulerConfig(redis_url=redis_cluster_url, etcd_endpoints=etcd_endpoint,
                                               namespace=client.keyspace.namespace, replica_id="owner",
                                               lease_ttl=2.0))
    owning = asyncio.create_task(replica.run())
    first = spawn_worker(tmp_path, redis_cluster_url, "--one-listener")
    second = None
    try:
        await wait_for(lambda: len(replica.runners) == client.keyspace.partitions, 15,
                       what="the replica to own every partition")
        await wait_worker_ready(first)
        await wait_for(lambda: client.redis.get(role) is not None, 10, what="the first worker to take the role")
        second = spawn_worker(tmp_path, redis_cluster_url, "--one-listener")
        await wait_worker_ready(second)
        await wait_for(lambda: client.redis.get(watch) is not None, 10, what="the second worker to take the watch")
        await _kill_the_listener_and_see_the_survivor_take_over(client, tmp_path, first, second, role)
    finally:
        for proc in [p for p in (first, second) if p is not None and p.alive]:
            proc.term(10)
        replica.stop()
        await asyncio.wait_for(owning, 10)
        client.close()
