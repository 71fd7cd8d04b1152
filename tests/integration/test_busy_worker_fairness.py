"""A worker that always has something to claim in one partition still serves the queue's other
partitions (workers/fetch.py ``BELL_NEGLECT_S``): it waits on the bells only when it has nothing
to claim, so with no idle worker about, the rings of the other partitions stayed in the bell and
their jobs waited for as long as the busy partition kept it busy (a fault test saw a reaped job
wait over 60 s behind jobs retried in other partitions). It now takes the rings left in the bell
after half a second without listening, and sweeps on its period while busy too, for rings lost."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis.asyncio as aioredis

from scheduler import Client
from scheduler.protocol import bells
from scheduler.protocol.keys import Keyspace
from tests.support.helpers import key_in, keys_in
from tests.support.ui import namespace_client
from tests.support.waits import wait_for
from tests.support.workers import serving
from workers import Job, Retry, Worker
from workers import fetch as fetch_module
from workers.doorbell import Doorbell

NS = "busyfair"
PARTS = 2
HOT_JOBS = 8       # each retried at once, forever: partition 0 is never empty while they run
HOT_RUN_S = 0.05   # per hot attempt: 8 jobs over 2 slots stay within max_attempts for ~50 s


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    yield from namespace_client(redis_url, NS, partitions=PARTS)


def busy_worker(url: str, hot_runs: list[float], cold_runs: list[float], idle_sweep: float) -> Worker:
    w = Worker.from_url(url, namespace=NS, queues=["q"], concurrency=2, idle_sweep=idle_sweep, shutdown_grace=2.0)

    @w.handler("q")
    async def handle(job: Job) -> None:
        if job.payload == "hot":
            hot_runs.append(time.monotonic())
            await asyncio.sleep(HOT_RUN_S)
            raise Retry(0)  # back on partition 0's ready list before the next claim
        cold_runs.append(time.monotonic())

    return w


async def run_cold_job_beside_hot_ones(client: Client, url: str, idle_sweep: float) -> float:
    """Keep the worker busy on partition 0, then make one job ready on partition 1: how long it
    waited. The hot jobs are still there and running after it ran: the worker never ran out of
    hot claims (it would have waited on the bell then, and found the cold job the usual way)."""
    hot_runs: list[float] = []
    cold_runs: list[float] = []
    async with serving(busy_worker(url, hot_runs, cold_runs, idle_sweep)):
        for k in keys_in(0, PARTS, "hot", HOT_JOBS):
            client.schedule(timedelta(0), "hot", queue="q", key=k, max_attempts=255)
        await wait_for(lambda: len(hot_runs) >= 20, 10, what="the hot jobs to keep the worker busy")
        t0 = time.monotonic()
        client.schedule(timedelta(0), "cold", queue="q", key=key_in(1, PARTS, "cold"))
        await wait_for(lambda: cold_runs, 10, what="the job on the other partition to run")
        after = len(hot_runs) + 3
        await wait_for(lambda: len(hot_runs) >= after, 10, what="the hot jobs to go on running")
        assert client.stats()["q"].get("dead", 0) == 0  # all 8 hot jobs still cycling on partition 0
    return cold_runs[0] - t0


async def test_a_worker_kept_busy_by_one_partition_takes_the_rings_left_for_the_others(
        client: Client, redis_url: str) -> None:
    waited = await run_cold_job_beside_hot_ones(client, redis_url, idle_sweep=600.0)  # no sweep
    assert waited < fetch_module.BELL_NEGLECT_S + 1.5, waited


async def test_a_busy_worker_sweeps_on_its_period_so_a_lost_ring_costs_one_period(
        client: Client, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def nothing_waiting(self: Doorbell, count: int) -> list[tuple[str, bytes, float]]:
        return []  # as if the ring were lost: only the sweep can find the job
    monkeypatch.setattr(Doorbell, "take_waiting", nothing_waiting)
    waited = await run_cold_job_beside_hot_ones(client, redis_url, idle_sweep=1.0)
    assert waited < 1.0 + 1.5, waited


async def test_the_rings_waiting_in_the_bells_are_taken_oldest_first_at_most_count_per_bell(redis_url: str) -> None:
    r = aioredis.Redis.from_url(redis_url)
    ks = Keyspace("bellwait", PARTS)
    bell = Doorbell(r, ks, ["a", "b"])
    try:
        await r.delete(ks.bell("a"), ks.bell("b"))
        for queue, member, at in [("a", "1", 30), ("b", "0", 10), ("a", "0", 20), ("b", "1:resume", 40)]:
            await bells.ring(r, ks, queue, member, at)
        assert await bell.take_waiting(1) == [("b", b"0", 10.0), ("a", b"0", 20.0)]
        assert await bell.take_waiting(5) == [("a", b"1", 30.0), ("b", b"1:resume", 40.0)]
        assert await bell.take_waiting(5) == []
    finally:
        await r.aclose()
