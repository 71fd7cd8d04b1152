"""Redis faults under the producer clients and the worker: restarts, stalls longer than the client
timeout, lost writes. Every component recovers without a restart, and nothing runs twice.

Real redis-server processes (tests/support/servers.py): kill -9 and restart on the same port, a busy
script stalling the server, SAVE + SHUTDOWN NOSAVE for a real rollback of acknowledged writes.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
import redis

from scheduler import AsyncClient, Client
from scheduler.protocol.options import JobOptions
from scheduler.redisio.transport import RedisRetry
from scheduler.testing.transitions import Ops
from tests.support.servers import RedisServer
from tests.support.waits import wait_for
from tests.support.workers import Recorder, TierStandIn, serving
from workers import Worker

pytestmark = pytest.mark.fault

FAST_FAIL = RedisRetry(budget=0.05, attempts=2)


LATER = timedelta(minutes=5)


def connected_clients(srv: RedisServer) -> int:
    info = srv.command("INFO", "clients")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return int(text.split("connected_clients:", 1)[1].split()[0])


def counters(r: redis.Redis, ns: str, parts: int, field: str) -> int:
    return sum(int(r.hget("{%s:%d}:c" % (ns, p), field) or 0) for p in range(parts))


def ready_ids(r: redis.Redis, ns: str, parts: int, queue: str) -> list[bytes]:
    out: list[bytes] = []
    for p in range(parts):
        out += r.lrange("{%s:%d}:r:%s" % (ns, p, queue), 0, -1)
    return out


# --------------------------------------------------------------------------- restarts


@pytest.mark.parametrize("aof", [False, True], ids=["no-persistence", "aof"])
def test_sync_client_works_again_at_its_first_call_after_a_redis_restart(aof: bool) -> None:
    with RedisServer(aof=aof) as srv:
        c = Client.from_url(srv.url, namespace="rs", partitions=4, retry=FAST_FAIL)
        c.schedule(LATER, "before")
        srv.kill()
        # an application keeps calling while Redis is down: far more calls than the old leak allowed
        for _ in range(120):
            with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
                c.schedule(LATER, "while down")
        srv.restart()
        t0 = time.monotonic()
        job_id = c.schedule(LATER, "after")
        assert time.monotonic() - t0 < 1.0
        assert c.get(job_id) is not None
        for _ in range(100):
            c.schedule(LATER, "more")
        assert connected_clients(srv) <= 3, "the client holds more connections than it ever used at once"
        if aof:  # AOF everysec kept the job acknowledged before the crash (written >1 s earlier)
            assert c.stats()["default"]["scheduled"] >= 101
        c.close()


def test_a_connection_the_server_closed_while_idle_costs_one_resend_and_creates_one_job() -> None:
    """A one-job ``schedule`` is sent without first looking whether the server closed the held
    connection (transport.call): the reply then fails to come and the call is sent again, with its
    re-send flag, on a new connection. A call that may not be sent again still looks first."""
    with RedisServer() as srv:
        c = Client.from_url(srv.url, namespace="idle", partitions=2)
        first = c.schedule(LATER, "before")
        admin = redis.Redis.from_url(srv.url)
        assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
        second = c.schedule(LATER, "after CLIENT KILL")
        assert c.transport.resends == 1
        assert c.get(first) is not None and c.get(second) is not None
        assert c.stats()["default"]["scheduled"] == 2, "the re-sent call created its job once"

        admin.client_kill_filter(_type="normal", skipme=True)
        call = c.calls.prepare_one(LATER, "not re-sendable", None, JobOptions())
        c.transport.call(*call, resend=False)  # looks first, reconnects, sends once
        assert c.transport.resends == 1 and c.stats()["default"]["scheduled"] == 3

        admin.close()
        srv.kill()
        srv.restart()
        third = c.schedule(LATER, "after a restart")
        assert c.transport.resends == 2
        assert c.get(third) is not None and c.stats()["default"]["scheduled"] == 1  # no persistence
        c.close()


def test_async_client_works_again_at_its_first_call_after_a_redis_restart() -> None:
    async def main(srv: RedisServer) -> None:
        c = await AsyncClient.from_url(srv.url, namespace="ars", partitions=4, retry=FAST_FAIL).connect()
        await c.schedule(LATER, "before")
        srv.kill()
        for _ in range(120):
            with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
                await c.schedule(LATER, "while down")
        srv.restart()
        t0 = time.monotonic()
        job_id = await c.schedule(LATER, "after")
        assert time.monotonic() - t0 < 1.0
        assert await c.get(job_id) is not None
        assert connected_clients(srv) <= 3
        await c.close()

    with RedisServer() as srv:
        asyncio.run(main(srv))


def test_a_call_made_while_redis_restarts_waits_for_it_instead_of_failing() -> None:
    """The default retry policy rides out a short outage: the call made while Redis is down
    returns once Redis is back (within its 10 s budget)."""
    with RedisServer() as srv:
        c = Client.from_url(srv.url, namespace="rw", partitions=2)
        srv.kill()
        restart = threading.Timer(0.5, srv.restart)
        restart.start()
        t0 = time.monotonic()
        job_id = c.schedule(LATER, "during the restart")
        assert 0.3 < time.monotonic() - t0 < 5.0
        assert c.get(job_id) is not None
        c.close()
        # the call can succeed before the restart's own readiness check is done: stopping the
        # server under it made that thread raise (a warning in a later test)
        restart.join()


def test_short_lived_threads_leave_no_connections_behind(redis_server: RedisServer, redis_url: str) -> None:
    """300 threads that each schedule once (a threaded web server): connections are pooled, not
    owned by threads, so the count stays at the peak concurrency."""
    c = Client.from_url(redis_url, namespace="thr", partitions=4)
    before = connected_clients(redis_server)
    errors: list[BaseException] = []

    def one() -> None:
        try:
            c.schedule(LATER, "from a thread")
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    for _ in range(30):
        threads = [threading.Thread(target=one) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert connected_clients(redis_server) - before <= 10
    c.schedule(LATER, "main thread")
    assert c.stats()["default"]["scheduled"] == 301
    c.close()


# --------------------------------------------------------------------------- stalls


def _check_once_each(r: redis.Redis, ns: str, parts: int, queue: str, ids: list[str], due_now: bool) -> None:
    assert len(set(ids)) == len(ids)
    assert counters(r, ns, parts, f"scheduled:{queue}") == len(ids), "a re-sent schedule created jobs twice"
    if due_now:
        ready = ready_ids(r, ns, parts, queue)
        assert len(ready) == len(ids) and len(set(ready)) == len(ready), "an id is twice in a ready list"


@pytest.mark.parametrize("due_now", [False, True], ids=["future", "due-now"])
@pytest.mark.parametrize("call", ["schedule", "schedule_many", "async_schedule"])
def test_a_stall_longer_than_the_client_timeout_creates_each_job_once(call: str, due_now: bool) -> None:
    ns, parts, q = "stall", 4, "st"
    with RedisServer() as srv:
        r = redis.Redis(host="127.0.0.1", port=srv.port)
        at = timedelta(0) if due_now else LATER
        ids: list[str] = []
        resends = 0
        if call == "async_schedule":
            async def main() -> int:
                c = await AsyncClient.from_url(srv.url, namespace=ns, partitions=parts,
                                               redis_options={"socket_timeout": 0.1}).connect()
                for i in range(5):
                    stall = srv.stall(400)
                    ids.append(await c.schedule(at, i, queue=q))
                    stall.join()
                n = c.transport.resends
                await c.close()
                return n

            resends = asyncio.run(main())
        else:
            c = Client.from_url(srv.url, namespace=ns, partitions=parts, redis_options={"socket_timeout": 0.1})
            for i in range(5):
                stall = srv.stall(400)
                if call == "schedule":
                    ids.append(c.schedule(at, i, queue=q))
                else:
                    ids += c.schedule_many([(at, (i, k)) for k in range(20)], queue=q)
                stall.join()
            resends = c.transport.resends
            c.close()
        assert resends >= 1, "no call was re-sent: the stall did not exercise the retry path"
        _check_once_each(r, ns, parts, q, ids, due_now)
        r.close()


def test_stalls_during_claims_and_acks_run_every_job_exactly_once() -> None:
    """A worker with a 100 ms socket timeout drains jobs while Redis stalls for 400 ms again and
    again: claims whose replies were lost are answered from their receipts, acks are re-sent;
    no lease expires and every job runs once."""
    ns, parts, q, n = "stallw", 4, "w", 300
    with RedisServer() as srv:
        rec = Recorder()
        c = Client.from_url(srv.url, namespace=ns, partitions=parts).connect()
        w = Worker(srv.url, namespace=ns, concurrency=8, redis_options={"socket_timeout": 0.1}, idle_sweep=0.2)

        @w.handler(q)
        async def handle(job: Any) -> None:
            rec.start(job)
            await asyncio.sleep(0.002)
            rec.end(job)

        async def main() -> None:
            async with TierStandIn(srv.url, ns), serving(w):
                ids = c.schedule_many([(timedelta(0), i) for i in range(n)], queue=q)
                stalls = 0
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and len(rec.ends) < n and stalls < 40:
                    stall = srv.stall(400)
                    await asyncio.to_thread(stall.join)
                    stalls += 1
                    await asyncio.sleep(0.03)
                idle = {"scheduled": 0, "ready": 0, "running": 0, "dead": 0}
                await wait_for(lambda: len(rec.ends) >= n and c.stats().get(q) == idle, 30,
                               interval=0.1, what="every job run and acked")
            runs = Counter(s[0] for s in rec.starts)
            assert set(runs) == set(ids)
            doubled = {k: v for k, v in runs.items() if v > 1}
            assert not doubled, f"{len(doubled)} jobs ran twice under stalls"
            assert w.stats.lease_lost == 0
            # a claim whose reply was lost and never recovered would run its jobs only after their
            # lease expired and the reaper put them back, with an attempt spent
            assert all(attempt == 1 for _, attempt, _ in rec.starts), "a lost claim spent an attempt"
            assert stalls >= 2
            assert c.stats()[q] == {"scheduled": 0, "ready": 0, "running": 0, "dead": 0}

        asyncio.run(main())
        c.close()


# --------------------------------------------------------------------------- lost writes


def test_fences_never_repeat_after_redis_loses_its_latest_writes() -> None:
    """SAVE, claim (a worker now runs the job with fence F1), crash back to the save point: the
    job is ready again and a new claim must get a fence above F1, never F1 again."""
    with RedisServer() as srv:
        c = Client.from_url(srv.url, namespace="fence", partitions=1)
        ops = Ops(c)
        job_id = c.schedule(timedelta(0), "x", max_attempts=3)
        warm = c.schedule(timedelta(0), "warm")
        ops.claim(n=1)  # advance the counter before the save point, as a long-running partition has
        srv.save_point()
        first = ops.claim(n=1)
        assert len(first) == 1
        srv.crash_to_save_point()
        second = ops.claim(n=1)
        assert len(second) == 1 and second[0].raw_id == first[0].raw_id
        assert {job_id, warm} >= {c.get(job_id).id}
        assert second[0].token > first[0].token, (
            f"fence went backwards after a rollback: {second[0].token} <= {first[0].token}")
        c.close()


# --------------------------------------------------------------------------- the whole stack


@pytest.mark.parametrize("aof", [False, True], ids=["no-persistence", "aof"])
async def test_the_whole_stack_recovers_from_a_redis_restart_without_a_restart_of_its_own(
        aof: bool, etcd_endpoint: str, tmp_path: Any) -> None:
    """kill -9 Redis while a sync client, an async client, 2 scheduler replicas and 2 workers run;
    start it again on the same port: every component carries on (same processes), jobs scheduled
    after the restart run once each, and acknowledged jobs persisted by AOF run too."""
    from scheduler.shell.servers import scheduler_proc, stop_all
    from tests.support.workers import read_runs, spawn_worker, wait_worker_ready, write_app

    ns = "rstack"
    with RedisServer(aof=aof) as srv:
        sync_c = Client.from_url(srv.url, namespace=ns, partitions=8, retry=FAST_FAIL).connect()
        async_c = await AsyncClient.from_url(srv.url, namespace=ns, partitions=8, retry=FAST_FAIL).connect()
        write_app(tmp_path)
        replicas = [scheduler_proc(srv.url, etcd_endpoint, ns, f"s{i}", ttl=2.0).start() for i in range(2)]
        workers = [spawn_worker(tmp_path, srv.url, "--namespace", ns) for _ in range(2)]
        try:
            for w in workers:
                await wait_worker_ready(w)
            before = sync_c.schedule_many([(time.time() + 0.2, {"i": i}) for i in range(50)])
            await wait_for(lambda: len({r[1] for r in read_runs(tmp_path) if r[0] == "END"}) >= 50, 15,
                           what="jobs before the restart")
            # due a few seconds after the restart; with AOF they must survive the crash
            persisted = sync_c.schedule_many([(time.time() + 4.0, {"p": i}) for i in range(20)])
            if aof:  # without AOF the crash loses everything anyway: nothing to wait for
                time.sleep(1.5)  # appendfsync everysec: older than a second is on disk (no WAITAOF before Redis 7.2)
            srv.kill()
            for _ in range(5):
                with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
                    sync_c.schedule(LATER, "down")
                with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
                    await async_c.schedule(LATER, "down")
            time.sleep(0.5)  # the outage: Redis stays down this long
            srv.restart()
            t_back = time.monotonic()
            after = [sync_c.schedule(time.time() + 0.3, {"sync": i}) for i in range(20)]
            after += [await async_c.schedule(time.time() + 0.3, {"async": i}) for i in range(20)]
            assert time.monotonic() - t_back < 2.0
            expected = set(after) | (set(persisted) if aof else set())
            await wait_for(lambda: expected <= {r[1] for r in read_runs(tmp_path) if r[0] == "END"}, 20,
                           interval=0.1, what="jobs scheduled after the restart to run")
            assert all(p.alive for p in replicas + workers), "a component died instead of recovering"
            starts = Counter(r[1] for r in read_runs(tmp_path) if r[0] == "START")
            assert all(starts[j] == 1 for j in expected | set(before)), "a job ran twice"
            assert connected_clients(srv) <= 40
        finally:
            stop_all(workers + replicas)
            sync_c.close()
            await async_c.close()


async def test_stalls_longer_than_every_timeout_do_not_wedge_the_tier_or_the_workers(
        etcd_endpoint: str, tmp_path: Any) -> None:
    """A real `zsched scheduler` and a real worker, both with a 100 ms Redis timeout, while Redis
    stalls for 400 ms again and again: they keep firing and running, every job once, none early."""
    from scheduler.shell.servers import scheduler_proc, stop_all
    from tests.support.workers import read_runs, spawn_worker, wait_worker_ready, write_app

    ns, n = "stier", 200
    with RedisServer() as srv:
        c = Client.from_url(srv.url, namespace=ns, partitions=4).connect()
        write_app(tmp_path)
        tier = scheduler_proc(srv.url, etcd_endpoint, ns, "s0", ttl=2.0, extra=["--redis-timeout", "0.1"]).start()
        worker = spawn_worker(tmp_path, srv.url + "?socket_timeout=0.1", "--namespace", ns)
        try:
            await wait_worker_ready(worker)
            t0 = time.time() + 0.5
            due = dict(zip(c.schedule_many([(t0 + i * 0.02, {"i": i}) for i in range(n)]),
                           [t0 + i * 0.02 for i in range(n)]))
            stalls = 0
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len({r[1] for r in read_runs(tmp_path) if r[0] == "END"}) < n:
                if stalls < 8:
                    stall = srv.stall(400)
                    await asyncio.to_thread(stall.join)
                    stalls += 1
                await asyncio.sleep(0.1)
            starts = [r for r in read_runs(tmp_path) if r[0] == "START"]
            assert sorted(r[1] for r in starts) == sorted(due), "every job ran exactly once"
            assert min(r[4] - due[r[1]] for r in starts) >= -0.001, "a job ran before its run_at"
            assert stalls >= 4 and tier.alive and worker.alive
            assert "Redis call failed" in tier.output() or "Redis unavailable" in worker.output(), \
                "no timeout happened: the stalls did not exercise the fault path"
        finally:
            stop_all([worker, tier])
            c.close()
