"""Demo handlers for ``zsched dev``: ``zsched worker scheduler.shell.demo:worker``.

* ``emails``: takes 5-50 ms, succeeds.
* ``flaky``: always fails; retried with backoff, then dead-lettered (see ``zsched dead list``).
* ``reports``: a herd of jobs due in the same second, drained by a rate limit.
"""
from __future__ import annotations

import asyncio
import random

from workers import Job, Worker

worker = Worker(queues=["emails", "flaky", "reports"], concurrency=32)


@worker.handler("emails")
async def send_email(job: Job) -> None:
    await asyncio.sleep(random.uniform(0.005, 0.05))


@worker.handler("flaky")
async def call_flaky_partner(job: Job) -> None:
    raise ConnectionError(f"partner API unreachable (attempt {job.attempt} of {job.max_attempts})")


@worker.handler("reports")
def build_report(job: Job) -> None:  # a sync handler runs in the worker's thread pool
    sum(i * i for i in range(2000))
