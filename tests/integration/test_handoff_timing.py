"""Jobs handed off ahead of their due time against a real redis-server, etcd and `zsched scheduler`:
the worker's Redis clock bound (workers/clock.py) is never below the true offset, jobs never start
before their due time by Redis's clock, and both processes run on uvloop or, with
``ZSCHED_UVLOOP=0``, on asyncio's own loop."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from scheduler import Client
from scheduler.protocol.ids import decode_id, run_at_of
from scheduler.shell.servers import scheduler_proc
from tests.support.helpers import on_both_backends
from tests.support.waits import wait_for
from tests.support.workers import read_runs, spawn_worker, wait_worker_ready, write_app
from workers import Job, Worker
from workers.clock import RedisClock

NS = "handoff"


@on_both_backends
async def test_the_clock_bound_is_never_below_redis_offset_and_no_job_starts_early(
        backend_url: str, etcd_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-process worker with a replica handing jobs off 50 ms ahead: every offset bound the
    worker maps due times with is at least this host's monotonic time minus Redis's clock (the
    same host clock here: CLOCK_REALTIME), and every job starts at or after its due time."""
    bounds: list[tuple[float, float]] = []  # (bound, a lower estimate of the true offset)
    kept: set[bool] = set()
    original = RedisClock.offset

    def offset(self: RedisClock, redis_s: float, sent: float, received: float) -> float:
        b = original(self, redis_s, sent, received)
        kept.add(self.keep)
        m = time.monotonic()
        bounds.append((b, m - time.time()))  # realtime read after: m - it <= the true offset
        return b

    monkeypatch.setattr(RedisClock, "offset", offset)
    client = Client.from_url(backend_url, namespace=NS, partitions=4).connect()
    replica = scheduler_proc(backend_url, etcd_endpoint, NS, "s0", ttl=2.0, extra=["--handoff-lead", "50"]).start()
    worker = Worker(redis_url=backend_url, namespace=NS, concurrency=8, prefetch=64)
    starts: dict[str, tuple[float, int]] = {}

    @worker.handler("default")
    async def record(job: Job) -> None:
        starts[job.id] = (time.time(), job.due_ms)

    task = asyncio.create_task(worker.serve())
    try:
        await worker.wait_ready(10)
        t0 = time.time() + 1.0
        jids = client.schedule_many([(t0 + i * 0.0025, {"i": i}) for i in range(400)])
        await wait_for(lambda: len(starts) >= 400, 20, what="all jobs to start")
        assert set(starts) == set(jids)
        early = [due - at * 1000 for at, due in starts.values() if at * 1000 < due]
        assert not early, f"{len(early)} job(s) started before their due time (ms early): {early[:5]}"
        assert all(due == run_at_of(decode_id(j)) for j, (_, due) in starts.items())
        assert bounds and all(b >= true for b, true in bounds), min(b - t for b, t in bounds)
        # one server: bounds are kept across claims; a cluster's nodes have clocks of their own
        assert kept == {not backend_url.startswith("redis+cluster://")}
    finally:
        await worker.stop()
        await asyncio.wait_for(task, 15)
        replica.stop()
        client.close()


@pytest.mark.parametrize("uvloop", ["1", "0"])
async def test_scheduler_and_worker_run_on_uvloop_or_asyncio(
        redis_url: str, etcd_endpoint: str, tmp_path: Path, uvloop: str) -> None:
    """`zsched scheduler` and `zsched worker` use uvloop unless ZSCHED_UVLOOP=0; either way jobs
    handed off ahead of their time run once each, none before its due time."""
    ns = f"loop{uvloop}"
    env: dict[str, Any] = {"ZSCHED_UVLOOP": uvloop}
    client = Client.from_url(redis_url, namespace=ns, partitions=4).connect()
    write_app(tmp_path)
    replica = scheduler_proc(redis_url, etcd_endpoint, ns, "s0", ttl=2.0, env=env,
                             extra=["--handoff-lead", "30"]).start()
    worker = spawn_worker(tmp_path, redis_url, "--namespace", ns, env=env)
    name = "uvloop" if uvloop == "1" else "asyncio"
    try:
        await wait_worker_ready(worker)
        t0 = time.time() + 0.8
        jids = client.schedule_many([(t0 + i * 0.004, {"i": i}) for i in range(100)])
        due_ms = {j: run_at_of(decode_id(j)) for j in jids}
        await wait_for(lambda: len([r for r in read_runs(tmp_path) if r[0] == "END"]) >= 100, 20,
                       what="all jobs to run")
        starts = [r for r in read_runs(tmp_path) if r[0] == "START"]
        assert sorted(r[1] for r in starts) == sorted(jids), "each job ran exactly once"
        assert all(r[4] * 1000 >= due_ms[r[1]] for r in starts), "a job started before its due time"
        assert f"event loop {name}" in worker.output()
        assert f"event loop: {name}" in replica.output()
    finally:
        for p in (worker, replica):
            p.stop()
        client.close()
