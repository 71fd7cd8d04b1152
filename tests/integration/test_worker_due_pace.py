"""A claim takes due jobs past its handler slots, onto prefetch slots, only as many as the worker's
handlers are expected to start within half a claim's round trip (workers/pace.py): a burst of due
jobs with quick handlers goes in a few claims instead of one per ``concurrency`` jobs, every job
runs once, never early and never past the concurrency; with slow handlers claims take no more
due jobs than free handler slots, as before. Real Redis, real workers; the jobs are made ready
at once by ``schedule_many`` of due jobs (no scheduler tier needed)."""
from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest

from scheduler import Client
from tests.support.waits import wait_for
from tests.support.workers import serving
from workers import Job, Worker
from workers.pace import WARM_UP, DuePace

CONCURRENCY = 2


class Record:
    """What the handlers saw: each job's start against its due time, and the most running at once."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}  # job id -> start minus due time, ms (Redis's clock ~ ours)
        self.runs: dict[str, int] = {}
        self.now = 0
        self.most = 0

    def enter(self, job: Job) -> None:
        self.started[job.id] = time.time() * 1000 - job.due_ms
        self.runs[job.id] = self.runs.get(job.id, 0) + 1
        self.now += 1
        self.most = max(self.most, self.now)


def _worker(url: str, ns: str, seconds: float, rec: Record) -> Worker:
    w = Worker.from_url(url, namespace=ns, queues=["q"], concurrency=CONCURRENCY, partitions=1)

    @w.handler("q")
    async def handle(job: Job) -> None:
        rec.enter(job)
        try:
            if seconds:
                await asyncio.sleep(seconds)
        finally:
            rec.now -= 1

    return w


async def _burst(w: Worker, client: Client, rec: Record, n: int) -> int:
    """``n`` jobs due now, made ready at once; the claims the worker took for them."""
    before = w.stats.claims
    acked = w.stats.acked
    ids = client.schedule_many([(timedelta(0), i) for i in range(n)], queue="q")
    await wait_for(lambda: w.stats.acked >= acked + n, 30, what=f"{n} jobs acked")
    assert all(rec.runs.get(i) == 1 for i in ids), "a job ran twice or not at all"
    return w.stats.claims - before


@pytest.mark.parametrize("allowance", ["none", "all"])
async def test_due_jobs_past_the_handler_slots_wait_on_prefetch_slots_once_each_never_early(
        redis_url: str, allowance: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # the allowance pinned (its estimate from real times is the next test's): the claims, the slots
    # and the held jobs' start with real Redis
    monkeypatch.setattr(DuePace, "extra", (lambda self, q, hold, within=0.0: 0) if allowance == "none" else
                        (lambda self, q, hold, within=0.0: hold))
    ns = f"pace-{allowance}"
    rec = Record()
    w = _worker(redis_url, ns, 0.0, rec)
    client = Client.from_url(redis_url, namespace=ns, partitions=1).connect()
    try:
        async with serving(w):
            claims = await _burst(w, client, rec, 60)
    finally:
        client.close()
    if allowance == "none":
        assert claims >= 60 // CONCURRENCY  # CONCURRENCY due jobs per claim at most
    else:
        assert claims <= 8  # up to 34 slots (2 handler + 32 prefetch) per claim: 2-4 claims
    assert rec.most <= CONCURRENCY
    assert min(rec.started.values()) >= -5  # never before the due time (a few ms: two clocks' reads)


async def test_quick_handlers_take_more_due_jobs_per_claim_and_slow_ones_no_more_than_their_slots(
        redis_url: str) -> None:
    rec = Record()
    quick = _worker(redis_url, "pace-quick", 0.0, rec)
    client = Client.from_url(redis_url, namespace="pace-quick", partitions=1).connect()
    try:
        async with serving(quick):
            await _burst(quick, client, rec, 2 * WARM_UP)  # the handlers' and the claims' times
            claims = await _burst(quick, client, rec, 60)
    finally:
        client.close()
    assert claims < 60 // CONCURRENCY, claims  # some claim took due jobs past its handler slots

    rec = Record()
    slow = _worker(redis_url, "pace-slow", 0.1, rec)  # 100 ms: far beyond half a round trip
    client = Client.from_url(redis_url, namespace="pace-slow", partitions=1).connect()
    try:
        async with serving(slow):
            await _burst(slow, client, rec, WARM_UP)
            claims = await _burst(slow, client, rec, 8)
    finally:
        client.close()
    assert claims >= 8 // CONCURRENCY  # no more due jobs per claim than free handler slots
    assert rec.most <= CONCURRENCY
