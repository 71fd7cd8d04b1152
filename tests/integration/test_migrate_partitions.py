"""zsched migrate-partitions: every job moves to ``h % N`` in the state it had, nothing is lost or
doubled, an interrupted run resumes, and producers, workers and the tier meet the layout fence.
Real redis-server (and a real 3-master cluster where marked)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from scheduler import Client, JobState, LayoutChanged
from scheduler.protocol.errors import ConfigError
from scheduler.protocol.ids import decode_id, partition_of
from scheduler.shell.admin import BadInput
from scheduler.shell.migrate import Migration, NotFinished, read_state
from scheduler.shell.servers import scheduler_proc
from scheduler.testing.transitions import Ops
from tests.support.helpers import on_both_backends, snapshot, tombstones
from tests.support.waits import wait_for, wait_until
from tests.support.workers import read_runs, spawn_worker, wait_worker_ready, write_app

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def populate(c: Client, ops: Ops, *, scheduled: int = 2000) -> dict[str, Any]:
    """A namespace with jobs in every state a migration must carry."""
    now = time.time()
    out: dict[str, Any] = {}
    out["scheduled"] = c.schedule_many([(now + 3600 + i, {"i": i}) for i in range(scheduled)])
    out["keyed"] = [c.schedule(now + 7200, f"k{i}", key=f"order-{i}") for i in range(40)]
    out["ready"] = c.schedule_many([(timedelta(0), i) for i in range(120)], queue="rq")
    out["retrying"] = c.schedule_many([(timedelta(0), i) for i in range(20)], queue="fq", max_attempts=3)
    for job in ops.claim("fq", 100):  # failed once: back in the timers with a last error
        ops.fail(job, "f", delay_ms=3_600_000)
    out["dead"] = c.schedule_many([(timedelta(0), i) for i in range(30)], queue="dq", max_attempts=1)
    for job in ops.claim("dq", 100):
        ops.fail(job, "p")
    out["done"] = c.schedule_many([(timedelta(0), i) for i in range(25)], queue="okq")
    for job in ops.claim("okq", 100):
        ops.ack(job)
    c.set_rate_limit("slow", 0.001, burst=1)
    out["held"] = c.schedule_many([(timedelta(0), i) for i in range(15)], queue="slow")
    c.add_cron("nightly", "0 3 * * *", {"report": True}, queue="cronq")
    return out


def states(c: Client, ids: list[str]) -> dict[str, JobState | None]:
    got = c.get_many(ids)
    return {j: (info.state if info else None) for j, info in got.items()}


def assert_moved(r: redis.Redis, before: Client, after: Client, jobs: dict[str, Any],
                 live: dict[str, Any], done: dict[str, str]) -> None:
    """After the migration the new-count client sees exactly the same jobs in the same states,
    each where its id says (snapshot checks every structure and gauge)."""
    assert snapshot(r, after) == live
    assert tombstones(r, after) == done
    ids = [j for group in jobs.values() for j in group]
    looked_up = states(after, ids)
    assert all(s is not None for s in looked_up.values()), [j for j, s in looked_up.items() if s is None][:5]
    for group in jobs.values():
        for jid in group:
            p = partition_of(decode_id(jid), after.keyspace.partitions)
            assert after.calls.locate(jid)[1] == p
    ks = after.keyspace
    for p in range(ks.partitions):
        assert not r.exists(ks.key(p, "mo")), f"outbox of partition {p} left behind"
        assert r.hget(ks.key(p, "meta"), "layout") == str(ks.partitions).encode()


@pytest.mark.parametrize("new_count", [7, 2])
@on_both_backends
def test_every_job_moves_in_its_state_to_its_new_partition(backend_url: str, new_count: int) -> None:
    c = Client.from_url(backend_url, namespace="mig", partitions=4).connect()
    stale = Client.from_url(backend_url, namespace="mig").connect()  # a producer that read the old count
    ops = Ops(c)
    jobs = populate(c, ops)
    ops.tick_all()  # the rate-limited queue's due jobs go to its held set
    r: Any = c.redis
    live, done = snapshot(r, c), tombstones(r, c)
    assert {"scheduled", "ready", "dead"} <= set(live.values()) and set(done.values()) == {"done"}
    before_states = states(c, [j for g in jobs.values() for j in g])

    report = Migration(c, new_count).run()
    assert report.moved > 0 and report.skipped == 0 and (report.old, report.new) == (4, new_count)

    after = Client.from_url(backend_url, namespace="mig").connect()
    assert after.keyspace.partitions == new_count and read_state(after) == (new_count, None, None)
    assert_moved(r, c, after, jobs, live, done)
    assert states(after, [j for g in jobs.values() for j in g]) == before_states
    # keys and crons came along: scheduling with a live key returns the existing job
    assert after.schedule(time.time() + 7200, "again", key="order-3") == jobs["keyed"][3]
    [cron] = after.crons()
    assert cron.name == "nightly" and after.get(cron.pending_id) is not None
    # every ready job can be claimed in the new layout, once
    claimed = Ops(after).claim("rq", 1000)
    assert sorted(j.raw_id.hex() for j in claimed) == sorted(jobs["ready"])
    if new_count < 4:  # partitions beyond the new count keep only their meta (the fence)
        old_ks = c.keyspace
        for p in range(new_count, 4):
            left = [k for k in old_ks.partition_keys(p) + [old_ks.key(p, "crons"), old_ks.ready(p, "rq")]
                    if r.exists(k)]
            assert left == [old_ks.key(p, "meta")]
    # the old-count client follows by itself (it did not pin partitions=) ...
    assert stale.keyspace.partitions == 4
    jid = stale.schedule(time.time() + 60, "late producer")
    assert stale.keyspace.partitions == new_count and after.get(jid).state is JobState.SCHEDULED
    # ... a process pinned to the old count is told what to do
    with pytest.raises(ConfigError, match=f"has {new_count} partitions.*migrate-partitions"):
        Client.from_url(backend_url, namespace="mig", partitions=4).connect()
    # a worker or replica still on the old count is refused, not sent to the wrong partition
    with pytest.raises(redis.ResponseError, match=f"now has {new_count} partitions, this process uses 4"):
        ops.claim("rq", 1)
    for cl in (c, after, stale):
        cl.close()


def test_100k_jobs_survive_a_kill_9_and_an_interrupted_round(redis_url: str) -> None:
    """100 000 jobs, 4 -> 16 partitions: the CLI is killed with SIGKILL mid-move, then a run
    fails between migrate_out and migrate_in (its outboxes hold the jobs), then a run finishes:
    every job exactly once, in its state, where its id says."""
    ns = "big"
    c = Client.from_url(redis_url, namespace=ns, partitions=4).connect()
    now = time.time()
    ids: list[str] = []
    for s in range(0, 100_000, 20_000):
        ids += c.schedule_many([(now + 3600 + (s + i) % 5000, s + i) for i in range(20_000)])
    ready = c.schedule_many([(timedelta(0), i) for i in range(2000)], queue="rq")
    r: Any = c.redis
    live = snapshot(r, c)
    assert len(live) == 102_000

    env = {**os.environ, "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "scheduler", "migrate-partitions", "--redis", redis_url, "--namespace", ns,
           "--to", "16", "--batch", "20"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = r.zcard(c.keyspace.key(0, "t"))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and r.zcard(c.keyspace.key(0, "t")) == first:  # until jobs move
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    assert read_state(c) == (4, 4, 16), "the kill landed after the migration finished: not an interruption"
    with pytest.raises(LayoutChanged) as refused:
        c.schedule(timedelta(0), "during")
    assert refused.value.migrating

    # the killed run's lock stands: a new run waits for it to expire, or takes over when told to
    with pytest.raises(BadInput, match="--takeover"):
        Migration(c, 16).run()
    # a run whose delivery fails: migrate_out filled the outboxes, migrate_in never ran
    m = Migration(c, 16, batch=500, takeover=True)
    orig = c.transport.call_many

    def broken(calls: Any, **kw: Any) -> Any:
        if calls and calls[0][0] == "migrate_in":
            raise redis.ConnectionError("simulated crash between migrate_out and migrate_in")
        return orig(calls, **kw)

    c.transport.call_many = broken  # type: ignore[method-assign]
    with pytest.raises(redis.ConnectionError):
        m.run()
    c.transport.call_many = orig  # type: ignore[method-assign]
    outboxes = sum(r.hlen(c.keyspace.key(p, "mo")) for p in range(4))
    assert outboxes > 0

    report = Migration(c, 16).run()
    assert report.resumed and report.moved > 0
    after = Client.from_url(redis_url, namespace=ns).connect()
    assert after.keyspace.partitions == 16
    assert snapshot(r, after) == live
    got = states(after, ids + ready)
    assert sum(1 for s in got.values() if s is JobState.SCHEDULED) == 100_000
    assert sum(1 for s in got.values() if s is JobState.READY) == 2000
    counts = [r.zcard(after.keyspace.key(p, "t")) for p in range(16)]
    assert sum(counts) == 100_000 and min(counts) > 100_000 / 16 * 0.9, counts
    # run again: nothing to do
    assert Migration(after, 16).run().moved == 0
    c.close()
    after.close()


def test_running_jobs_finish_where_they_run_and_their_retry_moves(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="run", partitions=2).connect()
    ops = Ops(c)
    ids = c.schedule_many([(timedelta(0), i) for i in range(40)], queue="w", max_attempts=3)
    running = ops.claim("w", 40)
    assert len(running) == 40
    result: dict[str, Any] = {}
    said: list[str] = []
    t = threading.Thread(target=lambda: result.update(report=Migration(c, 5, wait_running=30,
                                                                       progress=said.append).run()))
    t.start()
    wait_until(lambda: any("40 job(s) still running" in line for line in said), 10,
               what=lambda: f"the migration to say it waits for the running jobs: {said}")
    assert t.is_alive(), "the migration must wait for the running jobs"
    for i, job in enumerate(running):  # ack/fail are outside the fence
        assert int(ops.ack(job) if i % 2 else ops.fail(job, "f", delay_ms=600_000)) == 1
    t.join(30)
    assert not t.is_alive() and result["report"].moved > 0
    after = Client.from_url(redis_url, namespace="run").connect()
    got = states(after, ids)
    assert sorted(str(s) for s in got.values()) == sorted(["done"] * 20 + ["scheduled"] * 20)
    c.close()
    after.close()


def test_a_job_running_past_the_wait_stops_the_run_with_a_way_forward(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="stuck", partitions=2).connect()
    ops = Ops(c)
    c.schedule(timedelta(0), "long", queue="w", lease=600)
    [job] = ops.claim("w", 1)
    with pytest.raises(NotFinished, match="still running.*run the same command again"):
        Migration(c, 3, wait_running=0.3).run()
    with pytest.raises(LayoutChanged):
        c.get(job.raw_id.hex())
    assert ops.ack(job) == 1
    assert Migration(c, 3).run().resumed
    after = Client.from_url(redis_url, namespace="stuck").connect()
    assert after.get(job.raw_id.hex()).state is JobState.DONE
    c.close()
    after.close()


def test_cli_reports_and_refuses_a_different_target_mid_migration(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="cli", partitions=2).connect()
    c.schedule_many([(time.time() + 60, i) for i in range(100)])
    env = {**os.environ, "PYTHONPATH": ROOT}
    base = [sys.executable, "-m", "scheduler", "migrate-partitions", "--redis", redis_url, "--namespace", "cli"]
    c.redis.hset(c.keyspace.config_key, mapping={"migrate_to": 8, "migrate_from": 2})
    # refused by the argument parser, whatever the namespace's state: it runs alongside the others
    no_count = subprocess.Popen(base + ["--to", "0"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    out = subprocess.run(base + ["--to", "4"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--to 8" in out.stderr, out.stderr
    out = subprocess.run(base + ["--to", "8", "--json"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"to": 8' in out.stdout and '"resumed": true' in out.stdout
    out = subprocess.run(base + ["--to", "8"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "nothing to do" in out.stdout
    _, err = no_count.communicate(timeout=60)
    assert no_count.returncode == 2 and "partition count" in err
    c.close()


async def test_a_running_stack_pauses_for_a_migration_and_runs_every_job_once_after_restarts(
        redis_url: str, etcd_endpoint: str, tmp_path: Path) -> None:
    """Real replicas and workers: jobs due before, during and after the migration each run once,
    never early; the old-count processes log what to do; restarted ones use the new count."""
    ns = "live"
    Client.from_url(redis_url, namespace=ns, partitions=4).connect().close()
    client = Client.from_url(redis_url, namespace=ns).connect()  # adopts 4; not pinned, so it follows
    write_app(tmp_path)
    replica = scheduler_proc(redis_url, etcd_endpoint, ns, "s0", ttl=2.0).start()
    worker = spawn_worker(tmp_path, redis_url, "--namespace", ns)
    procs = [replica, worker]
    try:
        await wait_worker_ready(worker)
        t0 = time.time() + 0.5
        due = dict(zip(client.schedule_many([(t0 + i * 0.01, {"i": i}) for i in range(400)]),
                       [t0 + i * 0.01 for i in range(400)]))
        await wait_for(lambda: len([r for r in read_runs(tmp_path) if r[0] == "END"]) >= 50, 20,
                       what="the first jobs to run")
        out = subprocess.run([sys.executable, "-m", "scheduler", "migrate-partitions", "--redis", redis_url,
                              "--namespace", ns, "--to", "8"], env={**os.environ, "PYTHONPATH": ROOT},
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert "restart the scheduler replicas and workers" in out.stdout
        later = client.schedule_many([(time.time() + 0.2 + i * 0.01, {"after": i}) for i in range(100)])
        assert client.keyspace.partitions == 8  # the producer followed by itself
        due.update({j: time.time() for j in later})
        # "migrating" refusals come first, while the move runs; "changed ... restart it" once it is done
        await wait_for(lambda: "restart it" in replica.output() and "ZSCHED_LAYOUT" in worker.output(), 20,
                       what="the old-count processes to be refused and told to restart")
        for p in procs:
            p.stop()
        replica = scheduler_proc(redis_url, etcd_endpoint, ns, "s1", ttl=2.0).start()
        worker = spawn_worker(tmp_path, redis_url, "--namespace", ns)
        procs = [replica, worker]
        await wait_for(lambda: len({r[1] for r in read_runs(tmp_path) if r[0] == "END"}) >= 500, 30,
                       what="every job to run after the restart")
        starts = [r for r in read_runs(tmp_path) if r[0] == "START"]
        assert sorted(r[1] for r in starts) == sorted(due), "each job ran exactly once"
        first = {r[1]: r[4] for r in starts if r[1] in due and r[1] not in later}
        assert all(first[j] >= due[j] - 0.001 for j in first), "a job ran before its time"
    finally:
        for p in procs:
            p.stop()
        client.close()


def test_a_second_run_at_the_same_time_is_refused(redis_url: str) -> None:
    """Two runs would deliver the same outbox twice: the second is refused while the first holds
    the namespace's lock, and may go once it is gone."""
    c = Client.from_url(redis_url, namespace="lock", partitions=2).connect()
    c.schedule_many([(time.time() + 60, i) for i in range(50)])
    held = c.redis.lock("{lock}:migrate-lock", timeout=60, blocking=False)
    assert held.acquire()
    with pytest.raises(BadInput, match="another zsched migrate-partitions is running"):
        Migration(c, 4).run()
    assert read_state(c) == (2, None, None), "a refused run changes nothing"
    held.release()
    assert Migration(c, 4).run().moved > 0
    assert not c.redis.exists("{lock}:migrate-lock")
    c.close()


def test_the_dev_view_keeps_counting_queues_after_a_migration(redis_url: str) -> None:
    """``zsched dev``'s view read its partition count once; after migrate-partitions its stats
    call met the layout fence. It re-reads the count and counts the same jobs."""
    from types import SimpleNamespace

    from scheduler.shell.dev_view import View

    c = Client.from_url(redis_url, namespace="devmig", partitions=4).connect()
    c.schedule_many([(time.time() + 3600, i) for i in range(30)], queue="later")
    c.schedule_many([(timedelta(0), i) for i in range(12)], queue="now")
    Ops(c).tick_all()
    view = View(SimpleNamespace(redis_url=redis_url, ns="devmig"))  # type: ignore[arg-type]
    before, _ = view.queue_counts()
    assert view.client.keyspace.partitions == 4
    Migration(c, 6).run()
    after, held = view.queue_counts()
    assert view.client.keyspace.partitions == 6
    assert after == before and held == 0
    assert after["later"]["scheduled"] == 30 and after["now"]["ready"] == 12
