"""``python -m bench kit``: what the in-process test kit (scheduler.testing on fakeredis) costs.

Two shapes of 1 000 schedule -> run -> ack cycles, each the median of ``runs`` fresh stacks:

- ``batch``: 1 000 ``schedule`` calls (one job each, due now), then one ``run_due`` that runs a
  no-op handler 1 000 times and acks them (claims and acks batched as a worker's are);
- ``one_by_one``: 1 000 times ``schedule`` one job, ``run_due`` (tick, reap, claim, handler,
  ack, and the tick and claim that find nothing more), as a unit test that checks each step does.

Also the cost of creating a stack (a fresh in-memory Redis, the client connected) and of one
``advance`` over an hour with a cron every 15 minutes. Prints JSON; never a timed assertion.
"""
from __future__ import annotations

import statistics
import time
from datetime import timedelta
from typing import Any

from scheduler.testing import TestStack
from workers import Job, Worker


def _worker() -> Worker:
    worker = Worker()

    @worker.handler("q")
    def noop(job: Job) -> None:
        pass

    return worker


def batch(n: int) -> dict[str, float]:
    worker = _worker()
    with TestStack() as stack:
        t0 = time.perf_counter()
        for i in range(n):
            stack.client.schedule(timedelta(0), i, queue="q")
        t1 = time.perf_counter()
        report = stack.run_due(worker)
        t2 = time.perf_counter()
    assert report.count("acked") == n
    return {"total_s": t2 - t0, "schedule_s": t1 - t0, "run_due_s": t2 - t1}


def one_by_one(n: int) -> dict[str, float]:
    worker = _worker()
    with TestStack() as stack:
        t0 = time.perf_counter()
        acked = 0
        for i in range(n):
            stack.client.schedule(timedelta(0), i, queue="q")
            acked += stack.run_due(worker).count("acked")
        total = time.perf_counter() - t0
    assert acked == n
    return {"total_s": total}


def setup_and_cron() -> dict[str, float]:
    worker = _worker()
    t0 = time.perf_counter()
    stack = TestStack()
    t1 = time.perf_counter()
    stack.client.add_cron("c", "*/15 * * * *", None, queue="q")
    runs = stack.advance(hours=1, worker=worker)
    t2 = time.perf_counter()
    stack.close()
    assert len(runs) == 4
    return {"new_stack_s": t1 - t0, "cron_hour_s": t2 - t1}


def _median(results: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in results), 4) for k in results[0]}


def run(quick: bool = False, n: int = 1000) -> dict[str, Any]:
    runs = 3 if quick else 5
    b = _median([batch(n) for _ in range(runs)])
    o = _median([one_by_one(n) for _ in range(runs)])
    s = _median([setup_and_cron() for _ in range(runs)])
    return {"cycles": n, "runs": runs,
            "batch": {**b, "per_cycle_us": round(b["total_s"] / n * 1e6, 1)},
            "one_by_one": {**o, "per_cycle_us": round(o["total_s"] / n * 1e6, 1)},
            "setup": s}


if __name__ == "__main__":
    from bench import common

    common.emit({"kit": run()})
