"""Lingering acks (``Worker(ack_linger=)``, ``zsched worker --ack-linger``) against a real
redis-server, with in-process workers and the tier's stand-in: the acks of jobs of one partition
that finish apart land in one ``ack`` call, and a stopping worker does not wait for the linger.

Each ``ack`` call reads the server's clock once and stamps every job it finishes with it
(``finished_at``): jobs finished by one call share it to the millisecond, jobs finished by calls
100 ms apart do not."""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

import pytest

from scheduler import Client, JobState
from scheduler.shell import admin
from tests.support.waits import wait_for
from tests.support.workers import TierStandIn, serving
from workers import Job, Worker

GAP_MS = 100  # between two handlers' ends: far more than a round trip, far less than the linger


def _client(redis_url: str, ns: str) -> Client:
    return Client.from_url(redis_url, namespace=ns, partitions=1).connect()  # one partition: one ack call


@pytest.mark.parametrize("linger", [0.0, 0.6])
async def test_acks_of_jobs_that_finish_apart_share_one_call_only_with_a_linger(
        redis_url: str, linger: float, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zsched.worker")
    ns = f"linger{int(linger * 1000)}"
    client = _client(redis_url, ns)
    ended: list[float] = []
    worker = Worker.from_url(redis_url, namespace=ns, concurrency=8, shutdown_grace=5.0, ack_linger=linger)

    @worker.handler("default")
    async def handle(job: Job) -> None:
        await asyncio.sleep(job.payload["ms"] / 1000)
        ended.append(time.monotonic())

    try:
        async with TierStandIn(redis_url, namespace=ns), serving(worker):
            ids = client.schedule_many([(timedelta(0), {"ms": i * GAP_MS}) for i in range(3)])

            def done() -> bool:
                return all(i is not None and i.state is JobState.DONE for i in client.get_many(ids).values())

            await wait_for(done, 10, what="the jobs to be done")
            # Redis applies the ack before the worker reads its reply (the client's blocking reads
            # here hold the loop the worker's coroutine runs on), so the count follows a moment later.
            await wait_for(lambda: worker.stats.acked == 3, 5, what="the worker to count its 3 acks")
            doc = admin.workers_doc(admin.read_registry(client), ns)  # what `zsched workers --json` prints
            assert [w["ack_linger_ms"] for w in doc["workers"]] == [round(linger * 1000)]
        finished = {info.finished_at for info in client.get_many(ids).values() if info is not None}
    finally:
        client.close()
    assert max(ended) - min(ended) >= 2 * GAP_MS / 1000 * 0.9  # they did finish apart
    serving_line = next(r.getMessage() for r in caplog.records if "worker serving" in r.getMessage())
    assert ("acks linger up to 600 ms" in serving_line) == bool(linger), serving_line  # the start-up line says so
    if linger:
        assert len(finished) == 1, finished  # one call: the first ack waited for the others
    else:
        assert len(finished) > 1, finished  # each ack went on its own


async def test_a_stopping_worker_sends_its_lingering_acks_at_once(redis_url: str) -> None:
    """The linger (1 s, the longest; a 600 s lease does not shorten it) must not hold the shutdown:
    the ack of a job that just finished goes as soon as the worker starts to stop, while another
    handler still runs in its grace period, and the job is done, not left running until its lease
    expires."""
    ns = "lingerstop"
    client = _client(redis_url, ns)
    ended: list[str] = []
    worker = Worker.from_url(redis_url, namespace=ns, concurrency=2, shutdown_grace=5.0, ack_linger=1.0)

    @worker.handler("default")
    async def handle(job: Job) -> None:
        await asyncio.sleep(job.payload["s"])
        ended.append(job.id)

    try:
        async with TierStandIn(redis_url, namespace=ns):
            async with serving(worker):
                slow = client.schedule(timedelta(0), {"s": 3.0}, lease=600)
                fast = client.schedule(timedelta(0), {"s": 0}, lease=600)
                await wait_for(lambda: ended == [fast], 10, what="the fast job's handler to end")
                assert client.get(fast).state is JobState.RUNNING  # its ack lingers
                stopping = asyncio.create_task(worker.stop())
                t0 = time.monotonic()
                await wait_for(lambda: client.get(fast).state is JobState.DONE, 5, what="the lingering ack")
                acked_after = time.monotonic() - t0
                assert ended == [fast] and client.get(slow).state is JobState.RUNNING  # still in its grace
                await stopping
            assert ended == [fast, slow]
        states = {jid: info.state for jid, info in client.get_many([fast, slow]).items() if info is not None}
    finally:
        client.close()
    assert states == {fast: JobState.DONE, slow: JobState.DONE} and worker.stats.acked == 2
    assert acked_after < 0.5, acked_after  # not the linger's 1 s
