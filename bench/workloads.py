"""End-to-end workloads W3-W7 of the benchmark suite (see bench/README.md)."""
from __future__ import annotations

import random
import signal
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from bench.common import PAYLOAD, percentiles
from bench.stack import Stack, bucket_summary
from scheduler.protocol.ids import partition_for_key
from scheduler.runtime import loop_factory
from scheduler.testing.transitions import Ops


def records_summary(records: list[tuple[str, int, float]], expected: set[str]) -> dict[str, Any]:
    counts = Counter(jid for jid, _, _ in records)
    lat = [(start * 1000 - due) for _, due, start in records]
    return {"duplicates": sum(c - 1 for c in counts.values() if c > 1), "missing": len(expected - set(counts)),
            "started_before_run_at": sum(1 for v in lat if v < 0),
            "handler_lateness_ms": {k: round(v, 2) if isinstance(v, float) else v for k, v in percentiles(lat).items()}}


def wait_acked(st: Stack, target: int, timeout: float) -> float:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if st.counter("acked") >= target:
            return time.time()
        time.sleep(0.005)
    raise RuntimeError(f"only {st.counter('acked')} of {target} acked after {timeout}s")


DRAIN_CONCURRENCY = 64  # no-op handlers: a worker process can keep 64 in flight


def w3_drain(jobs: int = 20_000, workers: int = 1, replicas: int = 2) -> dict[str, Any]:
    with Stack() as st:
        st.start_schedulers(replicas)
        st.start_workers(workers, concurrency=DRAIN_CONCURRENCY)
        t0 = time.time() + 3
        ids = set()
        for s in range(0, jobs, 5000):
            ids |= set(st.client.schedule_many([(t0, PAYLOAD)] * min(5000, jobs - s), queue="bench"))
        time.sleep(max(0.0, t0 - time.time() - 0.5))
        cpu0 = st.cpu()
        done = wait_acked(st, jobs, 120)
        cpu1 = st.cpu()
        elapsed = done - t0
        records = st.stop_workers()
        per_k = {k: round((cpu1[k] - cpu0[k]) / jobs * 1000, 3) for k in cpu0}
        out = {"jobs": jobs, "worker_processes": workers, "replicas": replicas, "concurrency": DRAIN_CONCURRENCY,
               "jobs_per_s": round(jobs / elapsed), "seconds_from_t0": round(elapsed, 3),
               "cpu_s_per_1000_jobs": per_k}
        out.update({k: v for k, v in records_summary(records, ids).items() if k != "handler_lateness_ms"})
        return out


def w4_lateness(jobs: int, span: float = 20.0, workers: int = 1, replicas: int = 2, lead_ms: float | None = None,
                prefetch: int | None = None, worker_args: Sequence[str] = (),
                scheduler_args: Sequence[str] = ()) -> dict[str, Any]:
    """W4: ``jobs`` spread over ``span`` s; handler start - run_at. ``lead_ms``: the replicas'
    ``--handoff-lead``, ``prefetch``: the workers' ``--prefetch`` (None: their defaults),
    ``worker_args``: more arguments of ``zsched worker`` (e.g. ``["--no-one-listener"]``),
    ``scheduler_args``: more arguments of ``zsched scheduler`` (e.g. ``["--coalesce-lead", "320"]``)."""
    with Stack() as st:
        st.start_schedulers(replicas, [*([] if lead_ms is None else ["--handoff-lead", str(lead_ms)]), *scheduler_args])
        st.start_workers(workers, extra=[*([] if prefetch is None else ["--prefetch", str(prefetch)]), *worker_args])
        start = time.time() + 2
        rnd = random.Random(7)
        times = sorted(start + rnd.random() * span for _ in range(jobs))
        ids = set(st.client.schedule_many([(t, PAYLOAD) for t in times], queue="bench"))
        before = st.firing_buckets()
        wait_acked(st, jobs, span + 60)
        time.sleep(0.5)
        after = st.firing_buckets()
        records = st.stop_workers()
        out = {"jobs": jobs, "rate_per_s": round(jobs / span), "worker_processes": workers, "replicas": replicas,
               "handoff_lead_ms": lead_ms, "prefetch": prefetch,
               "event_loop": "asyncio" if loop_factory() is None else "uvloop"}  # the children's (same env)
        out.update(records_summary(records, ids))
        out["firing_lateness"] = bucket_summary(before, after)
        return out


def w5_herd(jobs: int = 100_000, limit: float | None = None, workers: int = 2, replicas: int = 2) -> dict[str, Any]:
    with Stack() as st:
        if limit:
            st.client.set_rate_limit("bench", limit)
        st.start_schedulers(replicas)
        st.start_workers(workers, concurrency=DRAIN_CONCURRENCY)
        t0 = time.time() + 8
        for s in range(0, jobs, 20_000):
            st.client.schedule_many([(t0, PAYLOAD)] * min(20_000, jobs - s), queue="bench")
        time.sleep(max(0.0, t0 - time.time()))
        samples = []
        deadline = time.time() + (jobs / limit * 1.5 + 30 if limit else 120)
        fired = 0
        while fired < jobs and time.time() < deadline:
            fired = st.counter("fired")
            samples.append((time.time() - t0, fired, st.counter("acked")))
            time.sleep(0.1)
        done = wait_acked(st, jobs, 120) - t0
        st.stop_workers()
        lo = next(t for t, n, _ in samples if n >= 0.1 * jobs)
        hi = next(t for t, n, _ in samples if n >= 0.9 * jobs)
        return {"jobs": jobs, "rate_limit": limit, "worker_processes": workers,
                "all_fired_after_s": round(samples[-1][0], 2), "all_acked_after_s": round(done, 2),
                "fire_rate_10_90_per_s": round(0.8 * jobs / (hi - lo)) if hi > lo else None,
                "drain_rate_per_s": round(jobs / done)}


def w6_scale(backlog: int, jobs: int = 20_000, span: float = 20.0) -> dict[str, Any]:
    """Tick cost and lateness with a large backlog of far-future jobs in the same timer sets."""
    with Stack(aof=False) as st:  # loading 10 M jobs is the setup, not the measurement
        far = time.time() + 30 * 86400
        for s in range(0, backlog, 50_000):
            st.client.schedule_many([(far + (i % 86400), PAYLOAD) for i in range(s, min(backlog, s + 50_000))],
                                    queue="backlog")
        st.start_schedulers(2)
        st.start_workers(1)
        start = time.time() + 2
        rnd = random.Random(11)
        times = sorted(start + rnd.random() * span for _ in range(jobs))
        ids = set(st.client.schedule_many([(t, PAYLOAD) for t in times], queue="bench"))
        st.r.config_resetstat()
        before = st.firing_buckets()
        wait_acked(st, jobs, span + 60)
        after = st.firing_buckets()
        stats = st.r.info("commandstats").get("cmdstat_evalsha", {})
        records = st.stop_workers()
        out = {"backlog": backlog, "jobs": jobs, "rate_per_s": round(jobs / span),
               "redis_usec_per_script_call": stats.get("usec_per_call")}
        out.update(records_summary(records, ids))
        out["firing_lateness"] = bucket_summary(before, after)
        # raw tick throughput with this backlog: the replicas stop, 100 000 due jobs are moved by
        # tick calls alone, and Redis's own accounting gives the CPU they took
        for p in st.schedulers:
            p.stop()
        due = time.time() + 1.5
        for _ in range(0, 100_000, 50_000):
            st.client.schedule_many([(due, PAYLOAD)] * 50_000, queue="tickbench")
        time.sleep(max(0.0, due - time.time()) + 0.1)
        st.r.config_resetstat()
        moved = Ops(st.client).tick_all(limit=1000)
        calls = st.r.info("commandstats").get("cmdstat_evalsha", {})
        out["tick_jobs_per_redis_cpu_s"] = round(moved / (calls.get("usec", 1) / 1e6)) if moved else None
        out["tick_usec_per_call"] = calls.get("usec_per_call")
        return out


def _keys_in(st: Stack, parts: set[int], n: int, prefix: str) -> list[str]:
    """n idempotency keys whose jobs land in the given partitions."""
    keys: list[str] = []
    i = 0
    while len(keys) < n:
        k = f"{prefix}{i}"
        if partition_for_key(k, st.partitions) in parts:
            keys.append(k)
        i += 1
    return keys


def _disrupt_owner(st: Stack, n: int, spacing: float, prefix: str, action: Any) -> tuple[list, Any]:
    """Schedule n jobs (one every ``spacing`` s from t) into the partitions of partition 0's owner,
    apply ``action`` to that replica's process at t, and return the jobs' records."""
    own = st.owners()
    target = own[0]
    keys = _keys_in(st, {p for p, r in own.items() if r == target}, n, prefix)
    t = time.time() + 1.0
    st.client.schedule_many([(t + i * spacing, PAYLOAD, k) for i, k in enumerate(keys)], queue="bench")
    time.sleep(max(0.0, t - time.time()))
    result = action(st.schedulers[int(target[1:])])
    deadline = time.time() + 60
    while st.counter("acked") < st.counter("scheduled") and time.time() < deadline:
        time.sleep(0.01)
    return st.stop_workers(), result


def w7_failover(ttl: float = 2.0) -> dict[str, Any]:
    with Stack(lease_ttl=ttl) as st:
        st.start_schedulers(2)
        st.start_workers(1)
        # kill -9: the gap shows as the largest lateness of the jobs due after the kill
        records, _ = _disrupt_owner(st, 200, 0.025, "k", lambda proc: proc.kill())
        kill_gap = max(start - due / 1000 for _, due, start in records)
        # SIGTERM hand-over to the other replicas (a third one joins first)
        st.start_schedulers(1)
        st.start_workers(1)

        def term(proc: Any) -> int:
            proc.signal(signal.SIGTERM)
            return proc.wait(15)

        rec2, code = _disrupt_owner(st, 100, 0.01, "t", term)
        lat2 = sorted(start * 1000 - due for _, due, start in rec2)
        return {"lease_ttl_s": ttl, "kill9_max_lateness_s": round(kill_gap, 3),
                "kill9_target_s": ttl + 1, "sigterm_exit_code": code,
                "sigterm_max_lateness_ms": round(lat2[-1], 1) if lat2 else None,
                "sigterm_p50_lateness_ms": round(lat2[len(lat2) // 2], 1) if lat2 else None}
