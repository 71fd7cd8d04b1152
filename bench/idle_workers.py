"""``python -m bench.idle_workers``: what idle worker processes cost, per second (issue 26).

W worker processes (default 1, 8 and 16; concurrency 4, the no-op handler of ``bench/handlers.py``)
serve a queue with nothing due, on the project's stack (``bench.stack.Stack``: one redis-server with
AOF everysec, or with ``--backend cluster`` a 3-master Redis Cluster with the partitions spread
evenly; etcd, 2 scheduler replicas, 16 partitions). After a settling pause, over a window of
S seconds (20): each worker's CPU (every thread's run time from ``/proc/PID/task/*/schedstat``, in
nanoseconds: idle costs are a few ms per second, below ``/proc/PID/stat``'s 10 ms ticks), the
replicas' CPU, Redis's CPU (INFO cpu, summed over a cluster's masters) and the commands Redis ran
per second by name (INFO commandstats of every master, reset when the window opens: the commands
scripts run count too).

A worker's idle cost is what a fleet pays for being there: at 1 000 idle workers, each round trip
per worker per second is 1 000 calls per second on Redis, and a burst that wakes all of them pays
for their upkeep in its jobs' cost (``bench fanout``'s batched shape at W = 16).

``--compare OTHER`` (another checkout of zsched, set up as ``bench fanout --compare`` needs it)
runs every round once with each side's code, alternating which goes first; rounds (2) take the W
values in another order each time. Prints JSON: every window, and per side and W the median over
rounds of the mean worker CPU, Redis CPU and calls per second.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from bench.common import cpu_ns, emit, machine
from bench.fanout import Side, UsageError, orders, stack, wait_up
from bench.stack import ROOT, redis_cpu, redis_nodes

WORKERS = (1, 8, 16)
SECONDS = 20.0
SETTLE_S = 3.0  # after every worker is up: start-up sweeps and first role checks are not idle cost
ROUNDS = 2
CONCURRENCY = 4
BACKENDS = ("single", "cluster")
# counted apart from the window's commands: the measurement's own INFO and CONFIG RESETSTAT
OWN = {"info", "config|resetstat"}


def window(side: Side, workers: int, seconds: float, backend: str = "single") -> dict[str, Any]:
    """One stack on ``backend``, ``workers`` idle workers, one measured window."""
    with stack(backend, side) as st:
        st.start_workers(workers, concurrency=CONCURRENCY, settle=0)
        try:
            wait_up(st)
            time.sleep(SETTLE_S)
            nodes = redis_nodes(st.redis_srv)
            wpids = [p.proc.pid for p, _ in st.workers if p.proc is not None]
            rpids = [s.proc.pid for s in st.schedulers if s.proc is not None]
            conns = [redis.Redis.from_url(n.url) for n in nodes]
            for r in conns:
                r.config_resetstat()
            c0 = redis_cpu(st.redis_srv)
            before = {pid: cpu_ns(pid) for pid in wpids + rpids}
            t0 = time.monotonic()
            time.sleep(seconds)
            after = {pid: cpu_ns(pid) for pid in wpids + rpids}
            elapsed = time.monotonic() - t0
            c1 = redis_cpu(st.redis_srv)
            per_s: dict[str, float] = {}
            for r in conns:
                for name, v in r.info("commandstats").items():
                    key = name[len("cmdstat_"):]
                    per_s[key] = per_s.get(key, 0.0) + v["calls"] / elapsed
                r.close()
        finally:
            st.stop_workers()
    redis_s = sum(c1[port] - c0[port] for port in c1)
    each = [(after[p] - before[p]) / elapsed / 1e6 for p in wpids]
    return {"side": side.name, "backend": backend, "workers": workers, "seconds": round(elapsed, 2),
            "worker_cpu_ms_per_s_each": [round(x, 3) for x in each],
            "worker_cpu_ms_per_s_mean": round(statistics.fmean(each), 3),
            "replica_cpu_ms_per_s": round(sum(after[p] - before[p] for p in rpids) / elapsed / 1e6, 3),
            "redis_cpu_ms_per_s": round(redis_s * 1000 / elapsed, 3),
            "calls_per_s": {k: round(v, 2) for k, v in sorted(per_s.items(), key=lambda kv: -kv[1])
                            if k not in OWN and v >= 0.05},
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per side and W: medians over rounds."""
    out = []
    for side in dict.fromkeys(r["side"] for r in runs):
        for w in sorted({r["workers"] for r in runs}):
            mine = [r for r in runs if r["side"] == side and r["workers"] == w]
            calls = {k for r in mine for k in r["calls_per_s"]}
            out.append({"side": side, "workers": w, "rounds": len(mine),
                        **{k: round(statistics.median(r[k] for r in mine), 3)
                           for k in ("worker_cpu_ms_per_s_mean", "replica_cpu_ms_per_s", "redis_cpu_ms_per_s")},
                        "calls_per_s": {k: round(statistics.median(r["calls_per_s"].get(k, 0.0) for r in mine), 2)
                                        for k in sorted(calls)}})
    return out


def run(workers: Sequence[int] = WORKERS, seconds: float = SECONDS, rounds: int = ROUNDS,
        compare: Path | None = None, backend: str = "single") -> dict[str, Any]:
    sides = [Side("this", ROOT)] + ([Side("other", compare)] if compare is not None else [])
    runs = []
    for rnd in range(rounds):
        for w in orders(rnd, list(workers)):
            for side in sides if rnd % 2 == 0 else sides[::-1]:
                runs.append(window(side, w, seconds, backend) | {"round": rnd})
                print(f"  round {rnd} {side.name} W={w}: worker {runs[-1]['worker_cpu_ms_per_s_mean']} ms/s each, "
                      f"Redis {runs[-1]['redis_cpu_ms_per_s']} ms/s", file=sys.stderr)
    return {"machine": machine(), "backend": backend, "workers": list(workers), "seconds": seconds, "rounds": rounds,
            "sides": [s.describe() for s in sides], "runs": runs, "summary": summary(runs)}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.idle_workers", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", default=",".join(map(str, WORKERS)), help="worker process counts (default 1,8,16)")
    p.add_argument("--seconds", type=float, default=SECONDS, help="the measured window (default 20)")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="rounds (default 2)")
    p.add_argument("--compare", type=Path, metavar="OTHER_CHECKOUT", help="also run every round with this checkout")
    p.add_argument("--backend", choices=BACKENDS, default="single",
                   help="one redis-server (default) or a 3-master Redis Cluster")
    a = p.parse_args(argv)
    try:
        ws = [int(x) for x in a.workers.split(",")]
        if not ws or min(ws) < 1 or not a.seconds > 0 or a.rounds < 1:
            raise ValueError
    except ValueError:
        p.error("--workers takes positive integers (1,8,16), --seconds a positive number, --rounds at least 1")
    try:
        emit(run(ws, a.seconds, a.rounds, a.compare, a.backend))
    except UsageError as exc:  # the other checkout does not import
        p.error(str(exc))


if __name__ == "__main__":
    main()
