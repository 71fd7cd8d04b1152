"""Bench worker: a handler that records (job id, due ms, handler start) per job and writes them to
$BENCH_RECORD when the worker exits, then returns at once or, with $BENCH_HANDLER_MS, after
sleeping that long (``asyncio.sleep``: a handler waiting on I/O, not using CPU).
``zsched worker bench.handlers:worker``"""
from __future__ import annotations

import asyncio
import atexit
import os
import time

from workers import Job, Worker

worker = Worker(queues=["bench"], concurrency=int(os.environ.get("BENCH_CONCURRENCY", "16")))
_records: list[tuple[str, int, float]] = []
HANDLER_S = float(os.environ.get("BENCH_HANDLER_MS", "0")) / 1000.0


@worker.handler("bench")
async def noop(job: Job) -> None:
    _records.append((job.id, job.due_ms, time.time()))
    if HANDLER_S > 0:
        await asyncio.sleep(HANDLER_S)


def _dump() -> None:
    path = os.environ.get("BENCH_RECORD")
    if path:
        with open(path, "w") as f:
            for jid, due, start in _records:
                f.write(f"{jid} {due} {start:.6f}\n")


atexit.register(_dump)
