"""End to end with every real process: redis-server, etcd, `zsched scheduler` replicas and
`zsched worker` processes. Jobs scheduled for the next seconds run once each, at their time, on a
single redis-server and on a 3-master Redis Cluster."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from scheduler import Client, JobState
from scheduler.protocol.ids import decode_id, run_at_of
from scheduler.shell.servers import scheduler_proc
from tests.support.helpers import on_both_backends
from tests.support.waits import wait_for
from tests.support.workers import read_runs, spawn_worker, wait_worker_ready, write_app

NS = "e2e"


@on_both_backends
@pytest.mark.parametrize("n_workers", [1, 3])
async def test_jobs_for_the_next_seconds_run_once_each_at_their_time(
        backend_url: str, etcd_endpoint: str, tmp_path: Path, n_workers: int) -> None:
    client = Client.from_url(backend_url, namespace=NS, partitions=8).connect()
    write_app(tmp_path)
    replicas = [scheduler_proc(backend_url, etcd_endpoint, NS, f"s{i}", ttl=2.0).start() for i in range(2)]
    workers = [spawn_worker(tmp_path, backend_url, "--namespace", NS) for _ in range(n_workers)]
    try:
        for w in workers:
            await wait_worker_ready(w)
        t0 = time.time() + 1.0
        due = {jid: at for jid, at in zip(
            client.schedule_many([(t0 + i * 0.01, {"i": i}) for i in range(300)]),
            [t0 + i * 0.01 for i in range(300)])}
        await wait_for(lambda: len([r for r in read_runs(tmp_path) if r[0] == "END"]) >= 300, 20,
                       what="all jobs to run")
        time.sleep(0.3)
        starts = [r for r in read_runs(tmp_path) if r[0] == "START"]
        assert sorted(r[1] for r in starts) == sorted(due), "each job ran exactly once"
        lateness = sorted(r[4] - due[r[1]] for r in starts)
        assert lateness[0] >= -0.001, f"a job started {-lateness[0]:.4f}s before its run_at"
        assert lateness[len(lateness) // 2] < 0.05 and lateness[-1] < 0.5, lateness[-5:]
        # With several workers, which process ran them is not asserted: 100 no-op jobs a second
        # never fill the listener (workers/doorbell.py), which keeps spread traffic on one warm
        # process; tests/integration/test_doorbells.py shows it handing on when it is full.
        assert all(client.get(j).state is JobState.DONE for j in list(due)[:20])
    finally:
        for p in workers + replicas:
            p.stop()


@on_both_backends
async def test_jobs_handed_off_ahead_of_time_never_start_before_their_due_time(
        backend_url: str, etcd_endpoint: str, tmp_path: Path) -> None:
    """With a hand-off lead of 200 ms the tier puts jobs in the ready list well before they are
    due and the worker claims them at once: each still starts at its due time by Redis's clock
    (the same host clock here), never a microsecond before, and soon after it."""
    client = Client.from_url(backend_url, namespace=NS, partitions=4).connect()
    write_app(tmp_path)
    replica = scheduler_proc(backend_url, etcd_endpoint, NS, "s0", ttl=2.0, extra=["--handoff-lead", "200"]).start()
    worker = spawn_worker(tmp_path, backend_url, "--namespace", NS, "--concurrency", "64")
    try:
        await wait_worker_ready(worker)
        t0 = time.time() + 1.0
        jids = client.schedule_many([(t0 + i * 0.003, {"i": i}) for i in range(200)])
        due_ms = {j: run_at_of(decode_id(j)) for j in jids}
        await wait_for(lambda: len([r for r in read_runs(tmp_path) if r[0] == "END"]) >= 200, 20,
                       what="all jobs to run")
        starts = {r[1]: r[4] for r in read_runs(tmp_path) if r[0] == "START"}
        assert set(starts) == set(jids)
        early = {j: due_ms[j] - starts[j] * 1000 for j in jids if starts[j] * 1000 < due_ms[j]}
        assert not early, f"{len(early)} job(s) started before their due time (ms early): {list(early.values())[:5]}"
        late = sorted(starts[j] * 1000 - due_ms[j] for j in jids)
        # Soon after: well within the lead (a job held for it twice, or waiting for a sweep, would
        # be 200 ms or more late). Not tighter: a loaded 2-core CI host with a cluster's 3 nodes
        # stretched the median to 46 ms once, where an idle one gives a millisecond or two.
        assert late[len(late) // 2] < 100, f"median lateness {late[len(late) // 2]:.2f} ms: the hand-off did not help"
    finally:
        for p in (worker, replica):
            p.stop()


@on_both_backends
async def test_worker_killed_mid_job_is_rerun_once_by_the_real_scheduler_tier(
        backend_url: str, etcd_endpoint: str, tmp_path: Path) -> None:
    client = Client.from_url(backend_url, namespace=NS, partitions=4).connect()
    write_app(tmp_path)
    replica = scheduler_proc(backend_url, etcd_endpoint, NS, "s0", ttl=2.0).start()
    victim = spawn_worker(tmp_path, backend_url, "--namespace", NS, env={"SLOW_SECONDS": "30"})
    try:
        await wait_worker_ready(victim)
        slow = client.schedule(time.time() + 0.3, {"slow": True}, lease=1.0)
        others = client.schedule_many([(time.time() + 0.3, {"i": i}) for i in range(20)])
        await wait_for(lambda: any(r[1] == slow and r[0] == "START" for r in read_runs(tmp_path)), 10,
                       what="the slow job to start")
        await wait_for(lambda: sum(1 for r in read_runs(tmp_path) if r[0] == "END") >= 20, 10, what="others")
        victim.signal(signal.SIGKILL)
        victim.wait(5)
        t_kill = time.time()
        rescuer = spawn_worker(tmp_path, backend_url, "--namespace", NS)
        await wait_worker_ready(rescuer)
        await wait_for(lambda: any(r[1] == slow and r[0] == "END" for r in read_runs(tmp_path)), 15,
                       what="the slow job to run again after its lease expired")
        runs = [r for r in read_runs(tmp_path) if r[1] == slow and r[0] == "START"]
        assert [r[2] for r in runs] == [1, 2], "ran once more, as attempt 2"
        assert runs[1][4] - t_kill < 1.0 + 2.0, "reaped by the scheduler tier soon after the lease expired"
        assert sorted(r[1] for r in read_runs(tmp_path) if r[0] == "START" and r[1] in others) == sorted(others)
        await wait_for(lambda: client.get(slow).state is JobState.DONE, 5, what="the rerun's ack")
        rescuer.stop()
    finally:
        for p in (victim, replica):
            p.stop()
