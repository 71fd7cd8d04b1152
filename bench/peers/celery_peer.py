"""Celery (Redis broker, ``celery worker`` with no options) through W1-W4 on our own redis-servers.

How Celery holds a job with an ETA on Redis: ``apply_async(eta=)`` LPUSHes the message (JSON,
body base64) onto the queue list at once; a worker fetches it right away (each ETA message raises
the prefetch limit, so a worker takes every one), keeps it in its own memory on a timer and runs it
when due. Meanwhile Redis keeps a copy in the transport's ``unacked`` hash (visibility timeout 1 h:
another worker re-delivers it only an hour after its fetch), so a job is not lost when the worker
dies, but it fires from one worker's memory, and a second worker cannot take it over in time.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis as redis_py
from celery import group

from bench.common import PAYLOAD, median_of
from bench.peers import celery_app
from bench.peers import common as c

WORKER = ["celery", "-A", "bench.peers.celery_app", "worker"]
SETTINGS = {
    "worker": "celery -A bench.peers.celery_app worker, no options: prefork pool, concurrency = CPU count "
              "(2 here: 1 main process + 2 pool processes), prefetch multiplier 4, loglevel WARNING, "
              "gossip/mingle/heartbeat on",
    "app": "Celery(broker=redis://...): no result backend, json serializer, acks on receipt (acks_late off), "
           "UTC; Redis transport defaults (visibility_timeout 3600 s)",
    "task": "@app.task(bind=True): handler reads its id and eta from self.request",
    "batch_enqueue": "group(task.s(PAYLOAD).set(eta=...) for each).apply_async(): Celery's one-call form for many "
                     "tasks; it publishes message by message on one producer (one LPUSH each), no Redis batching",
    "eta_jobs": "held in the worker's memory until due (a copy in Redis's unacked hash, re-delivered after "
                "visibility_timeout); W2 gives what Redis holds and the worker's RSS per job",
    "differs_from_default": "nothing in Celery; Redis as zsched's (hz 10; AOF everysec in W3/W4)",
}
SETUP_RATE = 500  # jobs/s Celery gets through apply_async while its worker fetches them, with margin


def make(url: str) -> tuple[Any, Any, redis_py.Redis]:
    app, task = celery_app.make(url)
    return app, task, redis_py.Redis.from_url(url)


def enqueue_round(url: str, n: int) -> dict[str, Any]:
    """One W1 round on an empty server: ``n`` ``apply_async((PAYLOAD,), eta=now + 1 h)`` one by one,
    what Redis holds for them (the queue list: no worker runs), then ``n`` through one ``group``."""
    app, task, r = make(url)
    r.flushall()
    base = r.info("memory")["used_memory"]
    eta = c.utc(time.time() + 3600)
    t = time.perf_counter()
    for _ in range(n):
        task.apply_async((PAYLOAD,), eta=eta)
    one = n / (time.perf_counter() - t)
    used = r.info("memory")["used_memory"] - base
    r.flushall()
    sigs = [task.s(PAYLOAD).set(eta=eta) for _ in range(n)]
    t = time.perf_counter()
    group(sigs).apply_async()
    batched = n / (time.perf_counter() - t)
    assert r.llen("celery") == n
    r.close()
    app.close()
    return {"one_jobs_per_s": one, "batched_jobs_per_s": batched, "queue_list_bytes_per_job": used / n}


def memory(n: int) -> dict[str, Any]:
    """W2 with a worker running: ``n`` jobs due in 1 h fetched by it; Redis's ``used_memory`` delta
    (the unacked hash and its index) and the worker main process's RSS delta, per job."""
    srv = c.redis(aof=False)
    try:
        app, task, r = make(srv.url)
        w = c.PeerWorker("celery", WORKER, srv.url).start()
        time.sleep(1.0)
        base, rss0 = c.used_memory(srv), w.rss_bytes()
        at = time.time() + 3600
        for i in range(n):
            task.apply_async((PAYLOAD,), eta=c.utc(at + i % 3600))
        c.wait_until(lambda: r.llen("celery") == 0 and r.hlen("unacked") == n, 60 + n / 300,
                     f"Celery's worker fetching {n} ETA jobs")
        time.sleep(0.5)
        used, rss = c.used_memory(srv) - base, w.rss_bytes() - rss0
        w.finish(grace=60)
        r.close()
        app.close()
        return {"memory": [{"pending_jobs": n, "where": "Redis: unacked hash + index (worker holds the jobs)",
                            "bytes_per_job": round(used / n, 1), "worker_rss_bytes_per_job": round(rss / n, 1)}]}
    finally:
        srv.stop()


def _pending(url: str, due: Callable[[float], list[float]]) -> tuple[c.PeerWorker, set[str], Any, float, float]:
    """Start a worker, send one job per run_at in ``due(now)`` (now: the worker is ready) and wait
    (until the first is due, at most) until the worker has fetched every one.
    Returns the worker, the ids, redis, setup s, the first run_at."""
    app, task, r = make(url)
    w = c.PeerWorker("celery", WORKER, url).start()
    t = time.time()
    jobs = due(t)
    first_due = jobs[0]
    ids = {task.apply_async((PAYLOAD,), eta=c.utc(at)).id for at in jobs}
    n = len(jobs)
    try:
        c.wait_until(lambda: r.llen("celery") == 0 and r.hlen("unacked") == n, max(1.0, first_due - time.time()),
                     f"Celery's worker fetching {n} jobs before the first is due")
    except RuntimeError:
        w.finish(grace=5)
        raise
    app.close()
    return w, ids, r, time.time() - t, first_due


def drain(n: int) -> dict[str, Any]:
    """W3: ``n`` jobs due at T0, 1 worker (default prefork pool), jobs/s from T0 to the last start."""
    srv = c.redis(aof=True)
    try:
        w, ids, r, setup, t0 = _pending(srv.url, lambda now: [now + 3 + n / SETUP_RATE] * n)
        out = {"worker_processes": 1, "pool_processes": len(c.descendants(w.pid or 0)), "setup_s": round(setup, 2),
               "t0_after_setup_s": round(t0 - time.time(), 2)}
        out.update(c.drain_result(w, srv, ids, t0, 60 + n / 100))
        r.close()
        return out
    finally:
        srv.stop()


def lateness(n: int, span: float) -> dict[str, Any]:
    """W4: ``n`` jobs uniform over ``span`` s, 1 worker; handler start - run_at."""
    return c.lateness_run(_pending, SETUP_RATE, "Celery", n, span)


def enqueue(n: int, rounds: int = 3) -> dict[str, Any]:
    """W1 alone (``bench.peers.run`` interleaves the sides' rounds instead)."""
    return enqueue_summary(c.enqueue_rounds(enqueue_round, n, rounds))


def enqueue_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    one = [x["one_jobs_per_s"] for x in runs]
    many = [x["batched_jobs_per_s"] for x in runs]
    return {"schedule_one_jobs_per_s": round(median_of(one)), "runs_one": [round(x) for x in one],
            "batched_jobs_per_s": round(median_of(many)), "runs_batched": [round(x) for x in many],
            "batched_api": "group(...).apply_async()",
            "queue_list_bytes_per_job": round(median_of([x["queue_list_bytes_per_job"] for x in runs]), 1)}


def run(quick: bool, enqueue_runs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """W1-W4 for Celery; ``enqueue_runs``: W1 rounds measured already (interleaved with the others)."""
    import celery
    import kombu

    n = 2000 if quick else 20_000
    span = 2.0 if quick else 20.0
    out: dict[str, Any] = {"version": celery.__version__, "kombu": kombu.__version__}
    out["enqueue"] = enqueue_summary(enqueue_runs) if enqueue_runs else enqueue(n)
    out.update(memory(n))
    out["drain"] = [drain(n)]
    out["lateness"] = [lateness(n // 10, span), lateness(n, span)]
    return out
