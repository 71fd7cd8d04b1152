"""zsched's peers in the same run (issue 14): huey and Celery, each on a redis-server of our own,
each with its documented default worker set-up, through the same workloads and payload as zsched.

* W1 enqueue: 20 000 jobs due in 1 h one by one (huey ``task.schedule(eta=)``, Celery
  ``apply_async(eta=)``) and batched where the peer has a batch form (Celery ``group``; huey none);
  rounds alternate zsched / huey / Celery on one server (order rotated), medians of 3; and one by
  one again in interleaved slices of 500 calls (:func:`enqueue_slices`), the drift-proof ratio;
* W2 memory: Redis ``used_memory`` delta per pending job at 20 000 (huey also at 1 M);
* W3 drain: 20 000 jobs due at T0, no-op handler, 1 worker process; runs alternate huey / Celery;
* W4 lateness: 2 000 jobs over 20 s and 20 000 over 20 s; handler start - run_at.

``run(quick)`` returns ``{"huey": ..., "celery": ..., "settings": ..., "zsched": ...}``: ``zsched``
holds its W1 rounds from the same interleaving and its W2 at 20 000 on the same server set-up, and,
with ``with_zsched=True``, its W3/W4 (``bench.workloads``) alternating with the peers' runs.
``bench.peers.report`` turns it into RESULTS.md rows. ``python -m bench.peers [--quick]``.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import PAYLOAD, machine, median_of
from bench.peers import celery_peer, huey_peer
from bench.peers import common as c

PEERS = ("huey", "celery")


def zsched_enqueue_round(url: str, n: int) -> dict[str, Any]:
    """zsched's W1 round as ``bench.core.enqueue`` runs it: ``schedule`` one by one, ``schedule_many``."""
    import redis

    from scheduler import Client

    r = redis.Redis.from_url(url)
    r.flushall()
    cl = Client.from_url(url, namespace="bench")
    at = time.time() + 3600
    t = time.perf_counter()
    for _ in range(n):
        cl.schedule(at, PAYLOAD)
    one = n / (time.perf_counter() - t)
    r.flushall()
    cl.close()
    cl = Client.from_url(url, namespace="bench")
    t = time.perf_counter()
    cl.schedule_many([(at, PAYLOAD)] * n)
    many = n / (time.perf_counter() - t)
    cl.close()
    r.close()
    return {"one_jobs_per_s": one, "batched_jobs_per_s": many}


def enqueue_interleaved(n: int, rounds: int) -> dict[str, list[dict[str, Any]]]:
    """W1 rounds of the three sides on one redis-server (FLUSHALL before each), the order rotated
    per round so no side always runs first or last."""
    sides: dict[str, Callable[[str, int], dict[str, Any]]] = {
        "zsched": zsched_enqueue_round, "huey": huey_peer.enqueue_round, "celery": celery_peer.enqueue_round}
    names = list(sides)
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    srv = c.redis(aof=False)
    try:
        for i in range(rounds):
            for name in names[i % 3:] + names[:i % 3]:
                out[name].append(sides[name](srv.url, n))
    finally:
        srv.stop()
    return out


def enqueue_slices(n: int, rounds: int, size: int = 500) -> dict[str, Any]:
    """W1 one by one, drift-proof: the three sides keep one producer each on one redis-server and
    take turns in slices of ``size`` calls (``n`` calls per side per round, the order rotated every
    slice, FLUSHALL between rounds), so every slice of zsched's ran beside a slice of each peer's.
    On a machine whose speed drifts by 2x within a minute (seen here), whole rounds one after the
    other compare drift as much as code. Per side: jobs/s over all its slices; per peer: the median
    of the per-slice ratios zsched / peer.

    Where a call's time goes, per side (``per_call_us``): the wall time, the producer's CPU
    (process time) and Redis's CPU (``INFO cpu``, its network system calls included). A fourth
    side takes the same turns: redis-py ``PING`` (``ping_floor``), the round trip every side pays
    on top of its own CPU (wake-ups on both ends, loopback TCP). With W that floor's wall time less
    its CPU, a call takes about W + producer CPU + Redis CPU, so the ratio to huey cannot exceed
    (W + huey's CPU) / (W + zsched's CPU): the floor says how much of a slow hour is W. A fifth
    side sends an empty Lua script (``return 1``) with a one-job ``schedule``'s keys and arguments
    through redis-py (``empty_script``): its Redis CPU is what any call costs Redis when every job
    transition is one script, before the script does anything."""
    import redis

    from scheduler import Client, JobOptions

    srv = c.redis(aof=False)
    try:
        admin = redis.Redis.from_url(srv.url)
        pinger = redis.Redis.from_url(srv.url)
        zc = Client.from_url(srv.url, namespace="bench")
        _h, htask, hr = huey_peer.make(srv.url)
        capp, ctask, cr = celery_peer.make(srv.url)
        at = time.time() + 3600
        eta = c.utc(at)
        empty = pinger.register_script("return 1")
        _, ekeys, eargs = zc.calls.prepare_one(at, PAYLOAD, None, JobOptions())
        calls: dict[str, Callable[[], Any]] = {
            "zsched": lambda: zc.schedule(at, PAYLOAD),
            "huey": lambda: htask.schedule((PAYLOAD,), eta=eta),
            "celery": lambda: ctask.apply_async((PAYLOAD,), eta=eta),
            "ping_floor": pinger.ping,
            "empty_script": lambda: empty(keys=ekeys, args=eargs)}
        names = list(calls)
        spent = {k: 0.0 for k in names}
        cpu = {k: 0.0 for k in names}
        server = {k: 0.0 for k in names}
        ratios: dict[str, list[float]] = {p: [] for p in PEERS}
        done = 0

        def redis_cpu() -> float:
            info = admin.info("cpu")
            return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])

        for r in range(rounds):
            admin.flushall()
            for s in range(n // size):
                rate: dict[str, float] = {}
                k = (r * (n // size) + s) % len(names)
                for name in names[k:] + names[:k]:
                    one = calls[name]
                    r0, p0 = redis_cpu(), time.process_time()
                    t = time.perf_counter()
                    for _ in range(size):
                        one()
                    took = time.perf_counter() - t
                    cpu[name] += time.process_time() - p0
                    server[name] += redis_cpu() - r0
                    spent[name] += took
                    rate[name] = size / took
                for p in PEERS:
                    ratios[p].append(rate["zsched"] / rate[p])
                done += size
        zc.close()
        hr.close()
        cr.close()
        capp.close()
        pinger.close()
        admin.close()
    finally:
        srv.stop()
    sides = [k for k in names if k not in ("ping_floor", "empty_script")]
    return {"slice_calls": size, "calls_per_side": done,
            "jobs_per_s": {k: round(done / spent[k]) for k in sides},
            "slice_ratio_median": {p: round(median_of(v), 3) for p, v in ratios.items()},
            "slice_ratio_quartiles": {p: [round(q, 3) for q in statistics.quantiles(v, n=4)]
                                      for p, v in ratios.items()},
            "per_call_us": {k: {"wall": round(spent[k] / done * 1e6, 1), "producer_cpu": round(cpu[k] / done * 1e6, 1),
                                "redis_cpu": round(server[k] / done * 1e6, 1)} for k in names}}


def zsched_memory(n: int) -> dict[str, Any]:
    from bench.core import memory

    srv = c.redis(aof=False)
    try:
        return memory(srv.url, n)
    finally:
        srv.stop()


def run(quick: bool, with_zsched: bool = False, lateness_rounds: int = 1) -> dict[str, Any]:
    """Both peers through W1-W4, sides alternating per workload (module docstring); W3 median of 3
    runs per side (1 when quick), W4 the median-p99 run of ``lateness_rounds`` per side and rate."""
    import celery
    import huey
    import kombu

    n = 2000 if quick else 20_000
    span = 2.0 if quick else 20.0
    rounds = 1 if quick else 3
    t_start = time.time()
    w1 = enqueue_interleaved(n, 3)
    one = [x["one_jobs_per_s"] for x in w1["zsched"]]
    many = [x["batched_jobs_per_s"] for x in w1["zsched"]]
    # per round, zsched's one-by-one rate over each peer's (rounds ran back to back: less drift)
    paired = {p: [round(z / x["one_jobs_per_s"], 3) for z, x in zip(one, w1[p])] for p in PEERS}
    zs: dict[str, Any] = {"core": {"enqueue": {
        "schedule_one_jobs_per_s": round(median_of(one)), "runs_one": [round(x) for x in one],
        "schedule_many_jobs_per_s": round(median_of(many)), "runs_many": [round(x) for x in many],
        "one_ratio_per_round": paired, "one_ratio_median": {p: median_of(v) for p, v in paired.items()},
        "one_by_one_slices": enqueue_slices(n, rounds)},
        "memory": [zsched_memory(20_000)]}}
    hu: dict[str, Any] = {"version": huey.__version__, "enqueue": huey_peer.enqueue_summary(w1["huey"])}
    ce: dict[str, Any] = {"version": celery.__version__, "kombu": kombu.__version__,
                          "enqueue": celery_peer.enqueue_summary(w1["celery"])}
    hu.update(huey_peer.memory(20_000, 100_000 if quick else 1_000_000))
    ce.update(celery_peer.memory(n))

    from bench import workloads

    drains: dict[str, list[dict[str, Any]]] = {"huey": [], "celery": [], "zsched": []}
    for _ in range(rounds):
        drains["huey"].append(huey_peer.drain(n))
        drains["celery"].append(celery_peer.drain(n))
        if with_zsched:
            drains["zsched"].append(workloads.w3_drain(n, workers=1))
    hu["drain"], ce["drain"] = [median_run(drains["huey"])], [median_run(drains["celery"])]
    late: dict[str, list[dict[str, Any]]] = {"huey": [], "celery": [], "zsched": []}
    for jobs in (n // 10, n):
        runs: dict[str, list[dict[str, Any]]] = {"huey": [], "celery": [], "zsched": []}
        for _ in range(lateness_rounds):
            runs["huey"].append(huey_peer.lateness(jobs, span))
            runs["celery"].append(celery_peer.lateness(jobs, span))
            if with_zsched:
                runs["zsched"].append(workloads.w4_lateness(jobs, span))
        for k, v in runs.items():
            if v:
                late[k].append(median_run(v, p99))
    hu["lateness"], ce["lateness"] = late["huey"], late["celery"]
    if with_zsched:
        zs["drain"], zs["lateness"] = [median_run(drains["zsched"])], late["zsched"]
    return {"huey": hu, "celery": ce, "zsched": zs, "settings": settings(),
            "seconds": round(time.time() - t_start, 1), "machine": machine()}


def jobs_per_s(run: dict[str, Any]) -> float:
    return float(run["jobs_per_s"])


def p99(run: dict[str, Any]) -> float:
    return float(run["handler_lateness_ms"]["p99"])


def median_run(runs: list[dict[str, Any]], key: Callable[[dict[str, Any]], float] = jobs_per_s) -> dict[str, Any]:
    """The run with the median ``key`` (the lower middle one of an even count), with every run's
    figure beside it (``runs_<key>``, in the order they ran)."""
    ordered = sorted(runs, key=key)
    out = dict(ordered[(len(ordered) - 1) // 2])
    out[f"runs_{key.__name__}"] = [key(x) for x in runs]
    return out


def settings() -> dict[str, Any]:
    """What each side ran with; every setting that differs from the peer's documented default is
    under ``differs_from_default``."""
    return {
        "huey": huey_peer.SETTINGS,
        "celery": celery_peer.SETTINGS,
        "redis": "our own redis-server per workload, 127.0.0.1 only, zsched's options: W1/W2 hz 10 without "
                 "persistence (as bench core), W3/W4 hz 10 with AOF appendfsync everysec (as bench.stack)",
        "payload": "bench.common.PAYLOAD as the task's single positional argument (zsched stores it as msgpack)",
        "handler": "no-op that appends '<id> <run_at> <start>' to a per-process file with one os.write "
                   "(bench/peers/records.py); run_at is the eta the producer gave, start is time.time() at "
                   "handler entry: both this host's CLOCK_REALTIME",
        "drain_end": "W3 ends at the last handler start (zsched's at the acked counter reaching N)",
        "setup": "W3/W4 jobs are all sent, and held where the peer keeps pending jobs (huey: the schedule set; "
                 "Celery: the worker's timer), before the first is due; T0 is set far enough ahead for that",
    }
