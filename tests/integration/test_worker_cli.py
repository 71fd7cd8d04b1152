"""Real ``zsched worker MODULE:ATTR`` processes (handler module in a temp dir, cwd on sys.path)."""
from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest

from scheduler import Client, JobState
from tests.support.waits import wait_for
from tests.support.workers import TierStandIn, read_runs, spawn_worker, wait_worker_ready, write_app


@pytest.fixture
def client(redis_url: str):
    c = Client.from_url(redis_url)
    yield c
    c.close()


async def test_three_worker_processes_run_each_job_once(redis_url: str, client: Client, tmp_path: Path) -> None:
    write_app(tmp_path)
    procs = [spawn_worker(tmp_path, redis_url, "--concurrency", "8", env={"FAST_SECONDS": "0.003"})
             for _ in range(3)]
    try:
        for p in procs:
            await wait_worker_ready(p)
        async with TierStandIn(redis_url):
            ids = client.schedule_many([(timedelta(0), {"i": i}) for i in range(200)])
            ids += client.schedule_many([(time.time() + random.uniform(0.1, 1.0), {"i": i}) for i in range(200)])
            ids += client.schedule_many([(timedelta(0), i) for i in range(60)], queue="sync")
            await wait_for(lambda: sum(1 for r in read_runs(tmp_path) if r[0] == "END") >= len(ids), 20,
                           what="all jobs to run")
            await asyncio.sleep(0.3)  # a duplicate would show up here
        runs = read_runs(tmp_path)
        starts = Counter(r[1] for r in runs if r[0] == "START")
        ends = Counter(r[1] for r in runs if r[0] == "END")
        assert set(starts) == set(ids) and set(ends) == set(ids)
        assert max(starts.values()) == 1 and max(ends.values()) == 1
        per_pid = Counter(r[3] for r in runs if r[0] == "END")
        assert set(per_pid) == {p.pid for p in procs}, per_pid  # every process took a share
        await wait_for(lambda: sum(p.metric("zsched_worker_acked_total") for p in procs) == len(ids), 5,
                       what="acks in /metrics")
        assert sum(p.metric("zsched_worker_claimed_total") for p in procs) == len(ids)
        assert client.get(ids[-1]).state is JobState.DONE
    finally:
        codes = [p.term(15) if p.alive else p.proc.returncode for p in procs]
    assert codes == [0, 0, 0], [p.tail() for p in procs]


async def test_sigterm_under_load_finishes_or_hands_back_every_job(redis_url: str, client: Client,
                                                                   tmp_path: Path) -> None:
    write_app(tmp_path)
    p1 = spawn_worker(tmp_path, redis_url, "--concurrency", "8", "--shutdown-grace", "0.15",
                      env={"FAST_SECONDS": "0.3"})
    p2 = None
    try:
        await wait_worker_ready(p1)
        ids = client.schedule_many([(timedelta(0), {"i": i}) for i in range(80)])
        def in_flight() -> bool:  # progress made, and handlers running right now (so SIGTERM catches some)
            runs = read_runs(tmp_path)
            ended = {r[1] for r in runs if r[0] == "END"}
            return len(ended) >= 16 and bool({r[1] for r in runs if r[0] == "START"} - ended)

        await wait_for(in_flight, 10, interval=0.005, what="progress with handlers running")
        t = time.monotonic()
        assert p1.term(10) == 0, p1.tail()
        assert time.monotonic() - t < 5
        assert "handing" in p1.output() and "unfinished job(s) back to ready" in p1.output(), p1.tail()
        first = read_runs(tmp_path)
        done1 = {r[1] for r in first if r[0] == "END"}
        released = {r[1] for r in first if r[0] == "START"} - done1
        assert released

        p2 = spawn_worker(tmp_path, redis_url, "--concurrency", "32")
        await wait_for(lambda: {r[1] for r in read_runs(tmp_path) if r[0] == "END"} >= set(ids), 15,
                       what="the rest to run")
        await asyncio.sleep(0.2)
        runs = read_runs(tmp_path)
        ends = Counter(r[1] for r in runs if r[0] == "END")
        assert set(ends) == set(ids) and max(ends.values()) == 1  # nothing lost, nothing finished twice
        second = [r for r in runs if r[3] == p2.pid and r[0] == "START"]
        assert not ({r[1] for r in second} & done1)
        assert released <= {r[1] for r in second}
        assert all(r[2] == 1 for r in second if r[1] in released)  # released: no attempt spent
    finally:
        for p in (p1, p2):
            if p is not None and p.alive:
                p.term(10)


async def test_cli_overrides_namespace_queues_concurrency(redis_url: str, tmp_path: Path) -> None:
    write_app(tmp_path)
    other = Client.from_url(redis_url, namespace="other")
    proc = spawn_worker(tmp_path, redis_url, "--namespace", "other", "--queues", "sync", "--concurrency", "2",
                        env={"FAST_SECONDS": "0.05"})
    try:
        await wait_worker_ready(proc)
        ids = other.schedule_many([(timedelta(0), i) for i in range(6)], queue="sync")
        skipped = other.schedule(timedelta(0), {"i": 1}, queue="default")  # not served: --queues sync
        await wait_for(lambda: proc.metric("zsched_worker_acked_total", namespace="other", queue="sync") == 6, 10,
                       what="acks")
        assert proc.metric("zsched_worker_concurrency") == 2
        assert proc.metric("zsched_worker_poison_total", queue="sync") == 0  # pre-initialised series
        assert all(other.get(j).state is JobState.DONE for j in ids)
        assert other.get(skipped).state is JobState.READY
        runs = read_runs(tmp_path)
        # concurrency 2 with 50 ms handlers: never more than 2 overlapping runs
        events = sorted((r[4], 1 if r[0] == "START" else -1) for r in runs)
        cur = peak = 0
        for _, d in events:
            cur += d
            peak = max(peak, cur)
        assert peak <= 2
    finally:
        assert proc.term(10) == 0, proc.tail()
        other.close()


def test_cli_reports_bad_app_spec(tmp_path: Path) -> None:
    write_app(tmp_path)

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "scheduler", "worker", *args], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={"RUN_LOG_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})

    # (the other spec errors are unit-tested on load_worker; here: exit code and message of the CLI)
    # the invocations at once: each is a Python start-up, and none depends on another
    runs = [(("nosuchmodule:worker",), "cannot import module 'nosuchmodule'"),
            (("wapp:LOG_DIR",), "expected a workers.Worker"),
            (("wapp:worker", "--concurrency", "0"), "positive integer"),
            (("wapp:worker", "--ack-linger", "1500"), "expected milliseconds from 0 to 1000, got '1500'")]
    for (args, needle), proc in [(run, start(*run[0])) for run in runs]:
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 2, (args, out, err)
        assert needle in err, (args, err)


async def test_second_signal_exits_at_once(redis_url: str, client: Client, tmp_path: Path) -> None:
    write_app(tmp_path)
    proc = spawn_worker(tmp_path, redis_url, "--shutdown-grace", "30")
    try:
        await wait_worker_ready(proc)
        jid = client.schedule(timedelta(0), {"slow": True}, lease=30)
        await wait_for(lambda: read_runs(tmp_path), 5, what="slow job to start")
        proc.signal(signal.SIGTERM)
        await wait_for(lambda: "waiting up to 30.0 s" in proc.output(), 5, what="graceful shutdown to begin")
        assert proc.alive  # still inside its grace period
        t = time.monotonic()
        proc.signal(signal.SIGINT)
        assert proc.wait(5) == 1
        assert time.monotonic() - t < 3
        assert "exiting now" in proc.output()
        # Not released: it stays leased and runs again when the lease expires (kill -9 semantics).
        assert client.get(jid).state is JobState.RUNNING
    finally:
        if proc.alive:
            proc.kill()
