"""huey (``RedisHuey``, ``huey_consumer`` with no options) through W1-W4 on our own redis-servers.

How huey holds a job scheduled for later: ``task.schedule(eta=)`` LPUSHes the pickled task onto
the queue list; a worker pops it, sees it is not due and ZADDs it to the schedule sorted set; the
consumer's scheduler thread, once per ``scheduler_interval`` (default 1 s), pops every due task
from that set and LPUSHes it back onto the queue, where a worker BRPOPs and runs it.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis as redis_py

from bench.common import PAYLOAD, median_of
from bench.peers import common as c
from bench.peers import huey_app

QUEUE_KEY, SCHEDULE_KEY = "huey.redis.bench", "huey.schedule.bench"
CONSUMER = ["huey.bin.huey_consumer", "bench.peers.huey_app.huey"]
# huey's documented defaults we run with (huey_consumer --help, huey.RedisHuey); none changed
SETTINGS = {
    "consumer": "huey_consumer bench.peers.huey_app.huey, no options: 1 worker (-w 1) of type thread (-k thread) "
                "in 1 process, scheduler interval 1 s (-s 1), periodic tasks on, logging INFO to stderr "
                "(our log file: huey logs each task's start, end and schedule move)",
    "storage": "RedisHuey('bench', url=...): blocking BRPOP (read_timeout 1 s), results on (a task returning None "
               "stores nothing: store_none False), utc True, pickle serializer, no compression",
    "task": "@huey.task(context=True): handler receives the task to read its id and eta",
    "batch_enqueue": "none: huey has no batch API for scheduled tasks (Task.map enqueues one by one, without eta)",
    "differs_from_default": "nothing in huey; Redis as zsched's (hz 10; AOF everysec in W3/W4)",
}
SETUP_RATE = 1500  # jobs/s huey gets through schedule() + the worker's move to the schedule, with margin


def make(url: str) -> tuple[Any, Any, redis_py.Redis]:
    h, task = huey_app.make(url)
    return h, task, redis_py.Redis.from_url(url)


def enqueue_round(url: str, n: int) -> dict[str, Any]:
    """One W1 round on an empty server: ``n`` ``task.schedule((PAYLOAD,), eta=now + 1 h)``, one by one;
    what Redis then holds for them (the queue list: no consumer runs)."""
    _h, task, r = make(url)
    r.flushall()
    base = r.info("memory")["used_memory"]
    eta = c.utc(time.time() + 3600)
    t = time.perf_counter()
    for _ in range(n):
        task.schedule((PAYLOAD,), eta=eta)
    rate = n / (time.perf_counter() - t)
    used = r.info("memory")["used_memory"] - base
    r.close()
    return {"one_jobs_per_s": rate, "queue_list_bytes_per_job": used / n}


def memory(n: int, big: int) -> dict[str, Any]:
    """W2: bytes per pending job, at ``n`` through the API and a running consumer (the steady state:
    the jobs in the schedule sorted set), and at ``big`` written straight into that set with huey's
    own serializer (the same bytes the consumer's ``add_schedule`` writes, without 1 M round trips)."""
    srv = c.redis(aof=False)
    try:
        h, task, r = make(srv.url)
        base = c.used_memory(srv)
        at = time.time() + 3600
        for i in range(n):
            task.schedule((PAYLOAD,), eta=c.utc(at + i % 3600))
        queued = c.used_memory(srv) - base
        w = c.PeerWorker("huey", CONSUMER, srv.url).start()
        c.wait_until(lambda: r.llen(QUEUE_KEY) == 0 and r.zcard(SCHEDULE_KEY) == n, 30 + n / 500,
                     f"huey's consumer moving {n} jobs to its schedule")
        w.finish()
        r.connection_pool.disconnect()
        time.sleep(0.2)
        scheduled = c.used_memory(srv) - base
        out = [{"pending_jobs": n, "where": "schedule sorted set (consumer ran)",
                "bytes_per_job": round(scheduled / n, 1),
                "queue_list_bytes_per_job": round(queued / n, 1),
                "zset_member_bytes": len(r.zrange(SCHEDULE_KEY, 0, 0)[0])}]
        if big:
            r.flushall()
            base = c.used_memory(srv)
            for s in range(0, big, 50_000):
                pipe = r.pipeline(transaction=False)
                for i in range(s, min(big, s + 50_000)):
                    t = task.s(PAYLOAD, eta=c.utc(at + i % 3600))
                    pipe.zadd(SCHEDULE_KEY, {h.serialize_task(t): h.storage.convert_ts(t.eta)})
                pipe.execute()
            assert r.zcard(SCHEDULE_KEY) == big
            r.connection_pool.disconnect()
            time.sleep(0.2)
            out.append({"pending_jobs": big, "where": "schedule sorted set (written with huey's serializer)",
                        "bytes_per_job": round((c.used_memory(srv) - base) / big, 1)})
        r.close()
        return {"memory": out}
    finally:
        srv.stop()


def _pending(url: str, due: Callable[[float], list[float]]) -> tuple[c.PeerWorker, set[str], Any, float, float]:
    """Start a consumer, schedule one job per run_at in ``due(now)`` (now: it is ready) and wait
    (until the first is due, at most) until every one sits in the schedule set.
    Returns the worker, the ids, redis, setup s, the first run_at."""
    _h, task, r = make(url)
    w = c.PeerWorker("huey", CONSUMER, url).start()
    t = time.time()
    jobs = due(t)
    first_due = jobs[0]
    ids = {task.schedule((PAYLOAD,), eta=c.utc(at)).id for at in jobs}
    n = len(jobs)
    try:
        c.wait_until(lambda: r.llen(QUEUE_KEY) == 0 and r.zcard(SCHEDULE_KEY) == n,
                     max(1.0, first_due - time.time()), f"{n} jobs in huey's schedule before the first is due")
    except RuntimeError:
        w.finish(grace=5)
        raise
    return w, ids, r, time.time() - t, first_due


def drain(n: int) -> dict[str, Any]:
    """W3: ``n`` jobs due at T0, 1 consumer (1 worker thread), jobs/s from T0 to the last start."""
    srv = c.redis(aof=True)
    try:
        w, ids, r, setup, t0 = _pending(srv.url, lambda now: [now + 3 + n / SETUP_RATE] * n)
        out = {"worker_processes": 1, "setup_s": round(setup, 2), "t0_after_setup_s": round(t0 - time.time(), 2)}
        out.update(c.drain_result(w, srv, ids, t0, 60 + n / 200))
        r.close()
        return out
    finally:
        srv.stop()


def lateness(n: int, span: float) -> dict[str, Any]:
    """W4: ``n`` jobs uniform over ``span`` s, 1 worker; handler start - run_at."""
    return c.lateness_run(_pending, SETUP_RATE, "huey", n, span)


def enqueue(n: int, rounds: int = 3) -> dict[str, Any]:
    """W1 alone (``bench.peers.run`` interleaves the sides' rounds instead)."""
    return enqueue_summary(c.enqueue_rounds(enqueue_round, n, rounds))


def enqueue_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    one = [x["one_jobs_per_s"] for x in runs]
    return {"schedule_one_jobs_per_s": round(median_of(one)), "runs_one": [round(x) for x in one],
            "batched_jobs_per_s": None, "batched_api": "none",
            "queue_list_bytes_per_job": round(median_of([x["queue_list_bytes_per_job"] for x in runs]), 1)}


def run(quick: bool, enqueue_runs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """W1-W4 for huey; ``enqueue_runs``: W1 rounds measured already (interleaved with the others)."""
    import huey

    n = 2000 if quick else 20_000
    span = 2.0 if quick else 20.0
    out: dict[str, Any] = {"version": huey.__version__}
    out["enqueue"] = enqueue_summary(enqueue_runs) if enqueue_runs else enqueue(n)
    out.update(memory(20_000, 100_000 if quick else 1_000_000))
    out["drain"] = [drain(n)]
    out["lateness"] = [lateness(n // 10, span), lateness(n, span)]
    return out
