"""Core engine benchmarks (issue 2 / W1, W2 and tick throughput):

* enqueue: jobs/s for ``schedule`` one by one and ``schedule_many`` (jobs due in 1 h)
* memory: Redis ``used_memory`` delta per pending job, with where the bytes go
* tick: jobs moved from timers to ready lists per second by the ``tick`` script
* tombstone: Redis ``used_memory`` delta per finished (acked) job: the summary ``get`` reads for
  ``tombstone_ttl``, without and with a 20-byte idempotency key
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import redis

from bench.common import PAYLOAD, percentiles, redis_server
from scheduler import Client
from scheduler.protocol.transitions import ack_call
from scheduler.testing.transitions import Ops


def enqueue(url: str, n_one: int = 20_000, n_many: int = 20_000, rounds: int = 3) -> dict[str, Any]:
    one, many = [], []
    for _ in range(rounds):
        r = redis.Redis.from_url(url)
        r.flushall()
        c = Client.from_url(url, namespace="bench")
        at = time.time() + 3600
        t = time.perf_counter()
        for _ in range(n_one):
            c.schedule(at, PAYLOAD)
        one.append(n_one / (time.perf_counter() - t))
        r.flushall()
        c = Client.from_url(url, namespace="bench")
        jobs = [(at, PAYLOAD)] * n_many
        t = time.perf_counter()
        c.schedule_many(jobs)
        many.append(n_many / (time.perf_counter() - t))
        c.close()
    return {"schedule_one_jobs_per_s": percentiles(one)["p50"], "schedule_many_jobs_per_s": percentiles(many)["p50"],
            "runs_one": [round(x) for x in one], "runs_many": [round(x) for x in many]}


def memory(url: str, n: int) -> dict[str, Any]:
    """W2: what ``n`` pending jobs add to Redis's ``used_memory``, per job. The namespace's one-time
    costs (its settings, each partition's bookkeeping hashes, the loaded script and its Lua
    state, the connection's buffers) are measured apart, as ``namespace_fixed_bytes``, after a
    warm-up of 1 000 jobs has created them; ``bytes_per_job_incl_namespace`` adds them back
    (spread over the ``n`` jobs) for comparison with runs that counted them in."""
    r = redis.Redis.from_url(url)
    r.flushall()
    c = Client.from_url(url, namespace="bench")
    empty = r.info("memory")["used_memory"]
    at = time.time() + 3600
    warm = 1000
    c.schedule_many([(at + 7200 + i, PAYLOAD) for i in range(warm)])  # every partition's bookkeeping
    base = r.info("memory")["used_memory"]
    chunk = 50_000
    t = time.perf_counter()
    for s in range(0, n, chunk):
        c.schedule_many([(at + (i % 3600), PAYLOAD) for i in range(s, min(n, s + chunk))])
    elapsed = time.perf_counter() - t
    used = r.info("memory")["used_memory"] - base
    per_job = used / n
    fixed = (base - empty) - warm * per_job
    ks = c.keyspace
    timers = sum(r.memory_usage(ks.key(p, "t"), samples=0) or 0 for p in range(ks.partitions))
    others = {}
    for suffix in ("g", "c", "q"):
        others[suffix] = sum(r.memory_usage(ks.key(p, suffix), samples=0) or 0 for p in range(ks.partitions))
    member = 15 + 9 + len(__import__("msgpack").packb(PAYLOAD))
    return {
        "pending_jobs": n,
        "bytes_per_job": round(per_job, 1),
        "namespace_fixed_bytes": round(fixed),
        "bytes_per_job_incl_namespace": round(per_job + fixed / n, 1),
        "timer_sets_bytes_per_job": round(timers / (n + warm), 1),
        "per_partition_bookkeeping_bytes": sum(others.values()),
        "timer_member_bytes": member,
        "schedule_many_jobs_per_s": round(n / elapsed),
    }


def tombstone(url: str, n: int = 100_000, key_bytes: int = 0, partitions: int = 16) -> dict[str, Any]:
    """Schedule ``n`` due jobs, claim and ack them all (workers' batched acks: 500 per call), and
    measure what stays: the tombstone summaries (1 h TTL, so none expires meanwhile)."""
    r = redis.Redis.from_url(url)
    r.flushall()
    c = Client.from_url(url, namespace="bench", partitions=partitions)
    core = c.calls
    ops = Ops(c)
    c.schedule(time.time() + 3600, PAYLOAD)  # creates the per-partition bookkeeping (q, g, c)

    def claim_ack(ttl_ms: int) -> int:
        done = 0
        while True:
            jobs = ops.claim("default", 5000)
            if not jobs:
                return done
            by_part: dict[int, list[tuple[bytes, int]]] = {}
            for j in jobs:
                by_part.setdefault(ops.partition(j.raw_id), []).append((j.raw_id, j.token))
            calls = [ack_call(core, p, done_jobs[s:s + 500], ttl_ms)
                     for p, done_jobs in by_part.items() for s in range(0, len(done_jobs), 500)]
            done += sum(sum(reply) for reply in c.transport.call_many(calls))

    # warm-up without tombstones: the in-flight sets' hash tables grow to a batch's size and stay
    c.schedule_many([(timedelta(0), PAYLOAD)] * 5000)
    claim_ack(0)
    c.redis.connection_pool.disconnect()  # no client buffers in either reading
    time.sleep(0.2)
    base = r.info("memory")["used_memory"]
    keyfmt = "k%0" + str(max(1, key_bytes - 1)) + "d"
    for s in range(0, n, 50_000):
        m = min(50_000, n - s)
        if key_bytes:
            c.schedule_many([(timedelta(0), PAYLOAD, keyfmt % (s + i)) for i in range(m)])
        else:
            c.schedule_many([(timedelta(0), PAYLOAD)] * m)
    t = time.perf_counter()
    acked = claim_ack(core.tomb_ms)
    wall = time.perf_counter() - t
    c.redis.connection_pool.disconnect()
    time.sleep(0.2)
    used = r.info("memory")["used_memory"] - base
    ks = c.keyspace
    f_bytes = sum(r.memory_usage(ks.key(p, "f"), samples=0) or 0 for p in range(ks.partitions))
    c.close()
    return {"finished_jobs": acked, "key_bytes": key_bytes, "bytes_per_finished_job": round(used / acked, 1),
            "f_hash_bytes_per_job": round(f_bytes / acked, 1), "claim_ack_jobs_per_s": round(acked / wall)}


def tick(url: str, n: int = 200_000, batch: int = 1000) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    r.flushall()
    c = Client.from_url(url, namespace="bench")
    due = time.time() + 2
    for s in range(0, n, 50_000):
        c.schedule_many([(due, PAYLOAD)] * min(50_000, n - s))
    time.sleep(max(0.0, due - time.time()) + 0.05)
    ops = Ops(c)
    r.config_resetstat()
    t = time.perf_counter()
    moved = ops.tick_all(limit=batch)
    wall = time.perf_counter() - t
    stats = r.info("commandstats")["cmdstat_evalsha"]
    return {"jobs": moved, "batch": batch, "jobs_per_s_wall": round(moved / wall),
            "jobs_per_s_redis_cpu": round(moved / (stats["usec"] / 1e6)),
            "redis_usec_per_tick_call": stats["usec_per_call"]}


def run(args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with redis_server() as srv:
        out["enqueue"] = enqueue(srv.url)
        out["tick"] = tick(srv.url)
        out["memory"] = [memory(srv.url, n) for n in args.memory_sizes]
        out["tombstone"] = [tombstone(srv.url, 100_000, k) for k in (0, 20)]
    return out
