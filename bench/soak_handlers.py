"""Soak worker: several queues, ~5 % of jobs fail (half retried, then dead), a cron queue.
``zsched worker bench.soak_handlers:worker``; tombstones kept 60 s (the soak's TTL)."""
from __future__ import annotations

import os

from workers import Job, PermanentError, Worker

QUEUES = ["emails", "webhooks", "reports", "billing", "cron"]
worker = Worker(queues=QUEUES, concurrency=int(os.environ.get("BENCH_CONCURRENCY", "32")),
                tombstone_ttl=float(os.environ.get("SOAK_TOMBSTONE_TTL", "60")))


async def handle(job: Job) -> None:
    p = job.payload if isinstance(job.payload, dict) else {}
    if p.get("fail") == "permanent":
        raise PermanentError("soak: this job always fails")
    if p.get("fail") == "retry" and job.attempt < 2:
        raise RuntimeError("soak: fails once, then succeeds")


for _q in QUEUES:
    worker.handler(_q)(handle)
