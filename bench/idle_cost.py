"""``python -m bench idle_cost``: what a round trip and a job cost a process that was idle (issue 26).

Two measurements, each interleaved over rounds (another order each round) and reported as the
median with min and max:

* **round trip**: one asyncio redis-py client (the worker's event loop, uvloop) sends ``EVALSHA``
  of a one-line script N times back to back, then N times with a sleep of G ms between them
  (G = 1, 10, 50). CPU per round trip is the process's CPU over the N calls minus that of the same
  N sleeps alone. A process woken after a sleep runs with cold caches and pays more for the same
  instructions: this is the floor under what a job costs a worker that is not busy.
* **worker**: one ``zsched worker`` process (concurrency 4, the no-op handler of
  ``bench/handlers.py``) on the project's stack (``bench.stack.Stack``: redis-server, etcd, 2
  replicas), fed jobs due at random moments at R jobs/s (20, 75, 300). CPU per job over the window
  from the first due time to the last ack. With W workers sharing a queue's traffic each runs at
  1/W of it: a worker at 20 jobs/s is one of 16 sharing 300 jobs/s (``bench fanout``'s spread).

The ratios (cold over back-to-back, 20 over 300 jobs/s) are what to read: the absolute figures
depend on the machine and on what else runs on it (``foreign_load`` is the load average).
"""
from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

from bench.common import cpu_seconds, emit, machine
from bench.stack import LIFELINE, NS, Stack

GAPS_MS = (0, 1, 10, 50)
RATES = (20, 75, 300)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 1), "min": round(min(values), 1), "max": round(max(values), 1)}


async def _roundtrips(url: str, gap_s: float, n: int) -> float:
    """CPU µs per round trip with ``gap_s`` of sleep between calls (that sleep's own cost taken out)."""
    import redis.asyncio as aredis

    r = aredis.Redis.from_url(url)
    try:
        sha = await r.script_load("return 1")
        for _ in range(20):  # connect and warm up the path
            await r.evalsha(sha, 0)
        c0 = time.process_time()
        for _ in range(n):
            await r.evalsha(sha, 0)
            if gap_s:
                await asyncio.sleep(gap_s)
        with_calls = time.process_time() - c0
        c0 = time.process_time()
        for _ in range(n if gap_s else 0):
            await asyncio.sleep(gap_s)
        sleeps = time.process_time() - c0
    finally:
        await r.aclose()
    return (with_calls - sleeps) / n * 1e6


def roundtrip_rounds(url: str, rounds: int, n: int) -> dict[str, Any]:
    import uvloop

    got: dict[int, list[float]] = {g: [] for g in GAPS_MS}
    for k in range(rounds):
        order = list(GAPS_MS) if k % 2 == 0 else list(reversed(GAPS_MS))
        for gap in order:
            got[gap].append(uvloop.run(_roundtrips(url, gap / 1000, n if gap < 10 else max(50, n // 5))))
    out: dict[str, Any] = {f"gap_{g}ms_us": _spread(v) for g, v in got.items()}
    base = statistics.median(got[0])
    out["cold_over_back_to_back"] = {f"gap_{g}ms": round(statistics.median(v) / base, 2) for g, v in got.items() if g}
    return out


def _worker_cpu_per_job(st: Stack, rate: float, seconds: float) -> float:
    """Start one worker, feed it ``rate`` jobs/s for ``seconds``, return its CPU µs per job."""
    from bench.stack import ROOT
    from scheduler.shell.servers import ZschedProc

    n = int(rate * seconds)
    acked0 = st.counter("acked")
    proc = ZschedProc(["worker", "bench.handlers:worker", "--redis", st.url, "--namespace", NS], metrics=False,
                      env={"BENCH_CONCURRENCY": "4", "PYTHONPATH": str(ROOT)}, cwd=str(ROOT),
                      lifeline=LIFELINE).start()
    try:
        time.sleep(2.0)  # imported, connected, waiting on its bells
        start = time.time() + 1.0
        items = [(datetime.fromtimestamp(start + random.random() * seconds, UTC), {"i": i}) for i in range(n)]
        for k in range(0, n, 1000):
            st.client.schedule_many(items[k:k + 1000], queue="bench")
        while time.time() < start:
            time.sleep(0.005)
        c0 = cpu_seconds(proc.pid)
        deadline = time.monotonic() + seconds + 60
        while st.counter("acked") - acked0 < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker at {rate} jobs/s: {st.counter('acked') - acked0} of {n} acked")
            time.sleep(0.05)
        return (cpu_seconds(proc.pid) - c0) / n * 1e6
    finally:
        proc.stop()


def worker_rounds(rounds: int, seconds: float) -> dict[str, Any]:
    got: dict[int, list[float]] = {r: [] for r in RATES}
    with Stack() as st:
        st.start_schedulers(2)
        for k in range(rounds):
            order = list(RATES) if k % 2 == 0 else list(reversed(RATES))
            for rate in order:
                got[rate].append(_worker_cpu_per_job(st, rate, seconds))
    out: dict[str, Any] = {f"{r}_jobs_per_s_us_per_job": _spread(v) for r, v in got.items()}
    top = statistics.median(got[max(RATES)])
    out["over_busiest"] = {f"{r}_jobs_per_s": round(statistics.median(v) / top, 2) for r, v in got.items()}
    return out


def run(quick: bool) -> dict[str, Any]:
    """Both measurements (``quick``: fewer rounds and shorter windows, for a smoke test)."""
    from bench.stack import redis_args
    from scheduler.shell.servers import RedisServer

    rounds = 1 if quick else 5
    with RedisServer(extra_args=redis_args(aof=False)) as srv:
        rt = roundtrip_rounds(srv.url, rounds, 200 if quick else 2000)
    wk = worker_rounds(1 if quick else 3, 3.0 if quick else 10.0)
    return {"bench": "idle_cost", "machine": machine(), "rounds": rounds, "roundtrip": rt, "worker": wk,
            "foreign_load": os.getloadavg()}


if __name__ == "__main__":
    emit(run("--quick" in sys.argv[1:]))
