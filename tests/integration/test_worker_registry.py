"""The worker registry against a real redis-server (and a Redis Cluster, and etcd for the replicas
that export it): workers register, refresh, show their busy slots and leave; a killed worker drops
out after its timeout; a Redis that restarted empty gets the record back; ``zsched workers`` and
``zsched stats`` read it; the scheduler replica that owns partition 0 exports it as metrics.

In-process workers (``serving``) unless a test needs a process to kill; handlers block on events,
and every wait is for a state of the registry, never a fixed time."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from scheduler import Client
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.registry import (
    PRUNE_PER_BEAT,
    PRUNE_PER_READ,
    RegistrySnapshot,
    WorkerEntry,
    WorkerRecord,
    beat_call,
    encode_record,
    leave_call,
    parse_read,
    read_call,
    zsched_version,
)
from scheduler.redisio.connection import sync_redis
from scheduler.redisio.routing import slot_of
from scheduler.redisio.transport import ScriptTransport
from scheduler.shell.cli import main
from scheduler.tier import SchedulerConfig, SchedulerProcess
from tests.support.servers import RedisServer
from tests.support.waits import wait_for
from tests.support.workers import serving, spawn_worker, write_app
from workers import Job, Worker
from workers.options import DEFAULT_PREFETCH

NS = "reg"
KS = Keyspace(NS, 4)
FAST = 0.2  # registry interval of the tests' workers: a record is live for 0.6 s after a refresh


def read(url: str) -> RegistrySnapshot:
    """One ``registry_read`` on the raw keys (no namespace needed: also right after a restart)."""
    r = sync_redis(url)
    try:
        return parse_read(ScriptTransport(r).call(*read_call(KS)))
    finally:
        r.close()


def entry(url: str, worker_id: str | None) -> WorkerEntry | None:
    return next((w for w in read(url).workers if w.id == worker_id), None)


def worker(url: str, **kw: object) -> Worker:
    kw = {"namespace": NS, "partitions": 4, "registry_interval": FAST, "shutdown_grace": 5.0, **kw}
    return Worker.from_url(url, **kw)


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    c = Client.from_url(redis_url, namespace=NS, partitions=4).connect()
    yield c
    c.close()


async def cli(*args: str, url: str) -> int:
    """``zsched ARGS --redis URL --namespace reg`` in-process (in a thread: the workers keep running)."""
    return await asyncio.to_thread(main, [*args, "--redis", url, "--namespace", NS])


async def test_a_worker_registers_refreshes_shows_busy_slots_shows_stopping_and_leaves(
        redis_url: str, client: Client) -> None:
    w = worker(redis_url, queues=["emails", "idle"], concurrency=4)
    gate, two_running = asyncio.Event(), asyncio.Event()
    started: list[str] = []

    @w.handler("emails")
    async def handle(job: Job) -> None:
        started.append(job.id)
        if len(started) == 2:
            two_running.set()
        await gate.wait()

    async with serving(w):
        wid = w.worker_id
        snap = await wait_for(lambda: (s := read(redis_url)) and s.workers and s, 10, what="the worker's registration")
        first = snap.workers[0]
        rec = first.record
        assert first.id == wid and first.last_ms <= snap.now_ms < first.deadline_ms
        assert first.deadline_ms == first.last_ms + round(3 * FAST * 1000)  # live for 3 intervals
        assert (rec.host, rec.pid, rec.queues, rec.concurrency, rec.prefetch) == (
            socket.gethostname(), os.getpid(), ("emails", "idle"), 4, DEFAULT_PREFETCH)
        assert (rec.busy, rec.free, rec.stopping, rec.version, rec.interval_s) == (0, 4, False, zsched_version(), FAST)
        await wait_for(lambda: (e := entry(redis_url, wid)) and e.last_ms > first.last_ms, 10, what="a refresh")

        client.schedule_many([(timedelta(0), {"n": i}) for i in range(2)], queue="emails")
        await asyncio.wait_for(two_running.wait(), 10)
        busy = await wait_for(lambda: (e := entry(redis_url, wid)) and e.record.busy == 2 and e, 10,
                              what="a refresh showing the two running handlers")
        assert (busy.record.free, busy.record.running_of("emails"), busy.record.running_of("idle"),
                busy.record.claimed) == (2, 2, 0, 2)
        # the running jobs are named, with when their handlers started (by Redis's clock)
        assert sorted(j.id for j in busy.record.current) == sorted(started)
        assert all(j.queue == "emails" and first.last_ms <= busy.job_started_ms(j) <= busy.last_ms
                   for j in busy.record.current)

        # a stop is shown at once (not at the next interval) while the handlers still drain
        stopping = asyncio.create_task(w.stop())
        drained = await wait_for(lambda: (e := entry(redis_url, wid)) and e.record.stopping and e, 10,
                                 what="the record to say stopping")
        assert drained.record.busy == 2 and read(redis_url).serving == []
        gate.set()
        await asyncio.wait_for(stopping, 10)
    assert w.stats.acked == 2
    assert read(redis_url).workers == [] and w.worker_id is None
    r = sync_redis(redis_url)
    try:  # removed at once by the graceful stop, nothing left to expire
        assert r.hlen(KS.workers_key) == 0 and r.zcard(KS.workers_live_key) == 0
    finally:
        r.close()


async def test_zsched_workers_and_zsched_stats_show_the_live_workers_and_warn_of_an_unserved_queue(
        redis_url: str, client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    a = worker(redis_url, queues=["emails", "reports"], concurrency=3)
    b = worker(redis_url, queues=["emails"], concurrency=5)
    client.schedule_many([(timedelta(0), {"n": i}) for i in range(3)], queue="orphans")
    async with serving(a, b):
        ids = sorted([a.worker_id, b.worker_id])  # same host and pid: sorted by id
        await wait_for(lambda: sorted(w.id for w in read(redis_url).workers) == ids, 10, what="both workers")
        capsys.readouterr()
        assert (await cli("workers", url=redis_url)) == 0
        out = capsys.readouterr().out
        lines = out.splitlines()
        assert lines[0].startswith(f"namespace {NS}: 2 live worker(s), Redis time ")
        header = lines.index(next(line for line in lines if line.startswith("ID ")))
        assert lines[header].split() == ["ID", "HOST", "PID", "QUEUES", "CONCURRENCY", "BUSY", "FREE", "HEARTBEAT",
                                         "UPTIME", "STATE", "VERSION"]
        rows = [line.split() for line in lines[header + 1:header + 3]]
        assert [r[0] for r in rows] == ids
        row_a = rows[ids.index(a.worker_id)]
        assert row_a[1:7] == [socket.gethostname(), str(os.getpid()), "emails,reports", "3", "0", "3"]
        assert row_a[7] in ("now", "1s") and row_a[-2] == "serving"  # heartbeat "now" / "1s ago"
        summary = {r.split()[0]: r.split()[1:] for r in lines if r.split()[:1] in (["emails"], ["reports"])}
        assert summary == {"emails": ["2", "8", "0", "8"], "reports": ["1", "3", "0", "3"]}
        assert "counts its slots under each" in out

        assert (await cli("workers", "--json", url=redis_url)) == 0
        doc = json.loads(capsys.readouterr().out)
        assert [w["id"] for w in doc["workers"]] == ids
        assert doc["queues"] == {"emails": {"workers": 2, "slots": 8, "busy": 0, "free": 8},
                                 "reports": {"workers": 1, "slots": 3, "busy": 0, "free": 3}}
        wa = next(w for w in doc["workers"] if w["id"] == a.worker_id)
        assert (wa["pid"], wa["queues"], wa["state"], wa["concurrency"], wa["free"]) == (
            os.getpid(), ["emails", "reports"], "serving", 3, 3)
        assert wa["last_heartbeat_ms"] <= doc["now_ms"] < wa["live_until_ms"] and wa["uptime_s"] >= 0

        assert (await cli("workers", "--queue", "orphans", "--json", url=redis_url)) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["workers"] == [] and doc["queues"] == {"orphans": {"workers": 0, "slots": 0, "busy": 0, "free": 0}}

        assert (await cli("stats", url=redis_url)) == 0
        captured = capsys.readouterr()
        assert ("zsched: warning: queue orphans has 3 ready job(s) and no live worker" in captured.err
                and "emails" not in captured.err), captured.err
        rows = {line.split()[0]: line.split() for line in captured.out.splitlines() if line.split()}
        assert rows["QUEUE"][-1] == "WORKERS" and rows["orphans"][-1] == "0" and rows["emails"][-1] == "2"
        assert (await cli("stats", "--json", url=redis_url)) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["without_workers"] == [{"queue": "orphans", "ready": 3}] and doc["workers_error"] is None
        assert doc["workers"]["emails"] == {"workers": 2, "slots": 8, "busy": 0, "free": 8}


async def test_a_killed_worker_drops_out_after_its_timeout_and_the_next_reader_deletes_it(
        redis_url: str, client: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_app(tmp_path)
    proc = spawn_worker(tmp_path, redis_url, "--namespace", NS, "--registry-interval", "0.3")
    try:
        found = await wait_for(lambda: next((w for w in read(redis_url).workers if w.record.pid == proc.pid), None),
                               30, interval=0.05, what=f"the worker subprocess to register:\n{proc.tail()}")
        proc.kill()  # SIGKILL, by its pid: no goodbye
        last = entry(redis_url, found.id) or found  # its last refresh may have landed meanwhile
        gone = await wait_for(lambda: (s := read(redis_url)) and all(w.id != found.id for w in s.workers) and s,
                              10, interval=0.05, what="the killed worker to drop out")
        assert gone.now_ms >= last.deadline_ms  # not before its record's time was up
        assert gone.pruned == 1  # ...and the read that found it dead deleted it
        r = sync_redis(redis_url)
        try:
            assert not r.hexists(KS.workers_key, found.id) and r.zscore(KS.workers_live_key, found.id) is None
        finally:
            r.close()
        capsys.readouterr()
        assert (await cli("workers", url=redis_url)) == 0
        assert "no live worker" in capsys.readouterr().out
    finally:
        proc.kill()


def test_reads_and_refreshes_delete_dead_records_a_bounded_number_at_a_time(redis_url: str) -> None:
    r = sync_redis(redis_url)
    t = ScriptTransport(r)
    try:
        live = encode_record(WorkerRecord("h", 1, ("q",), 1, 0, 60.0))
        t.call(*beat_call(KS, "live", live, 60.0))
        for i in range(150):  # live for 3 ms; pruning nothing themselves
            t.call(*beat_call(KS, f"dead-{i}", live, 0.001, prune=0))
        last_deadline = max(score for wid, score in r.zrange(KS.workers_live_key, 0, -1, withscores=True)
                            if wid.startswith(b"dead-"))
        secs, usecs = r.time()
        while int(secs) * 1000 + int(usecs) // 1000 <= last_deadline:  # Redis's clock passes them
            secs, usecs = r.time()
        assert t.call(*beat_call(KS, "live", live, 60.0))[1] == PRUNE_PER_BEAT
        first = parse_read(t.call(*read_call(KS)))
        assert first.pruned == PRUNE_PER_READ and [w.id for w in first.workers] == ["live"]
        second = parse_read(t.call(*read_call(KS)))
        assert second.pruned == 150 - PRUNE_PER_BEAT - PRUNE_PER_READ
        assert r.hlen(KS.workers_key) == r.zcard(KS.workers_live_key) == 1
        # the keys expire a day (the longest liveness) after the last refresh of any worker
        assert 86_000_000 < r.pttl(KS.workers_key) <= 86_400_000 and 86_000_000 < r.pttl(KS.workers_live_key)
        assert t.call(*leave_call(KS, "live")) == 1 and t.call(*leave_call(KS, "live")) == 0
    finally:
        r.close()


async def test_a_redis_restarted_empty_gets_the_record_back_and_the_outage_is_logged_once(
        fresh_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "zsched.worker")
    w = worker(fresh_redis.url, queues=["emails"])
    async with serving(w):
        wid = w.worker_id
        await wait_for(lambda: entry(fresh_redis.url, wid), 10, what="the registration")
        fresh_redis.kill()

        def registry_lines(text: str) -> list[str]:
            return [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"worker registry: {text}")]

        await wait_for(lambda: registry_lines("Redis unavailable"), 10, what="the failed refresh to be logged")
        await asyncio.to_thread(fresh_redis.restart)  # no AOF: it comes back empty
        back = await wait_for(lambda: entry(fresh_redis.url, wid), 15, what="the record after the restart")
        assert back.record.queues == ("emails",) and w.serving
        await wait_for(lambda: registry_lines("Redis reachable again"), 10, what="the recovery to be logged")
        assert len(registry_lines("Redis unavailable")) == 1, registry_lines("")  # once per outage


def refusals(server: RedisServer, user: str) -> int:
    """How many times Redis refused ``user`` a key (its ACL LOG counts repeats in one entry)."""
    entries = server.command("ACL", "LOG")
    counts = [dict(zip(e[::2], e[1::2])) for e in entries]
    return sum(int(c[b"count"]) for c in counts if c.get(b"username") == user.encode() and c.get(b"reason") == b"key")


async def test_a_worker_whose_acl_user_lacks_the_registry_keys_runs_and_says_so_once(
        redis_server: RedisServer, redis_url: str, client: Client, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    user = f"reg-{os.getpid()}"
    # everything a worker of namespace "reg" needs except the registry keys
    redis_server.command("ACL", "SETUSER", user, "on", ">pw", "~{reg:*", "~{reg}:cfg", "&*", "+@all")
    url = redis_url.replace("redis://", f"redis://{user}:pw@")
    caplog.set_level(logging.INFO, "zsched.worker")
    try:
        w = worker(url, queues=["emails"])
        done = asyncio.Event()

        @w.handler("emails")
        async def handle(job: Job) -> None:
            done.set()

        async with serving(w):
            client.schedule(timedelta(0), {"n": 1}, queue="emails")
            await asyncio.wait_for(done.wait(), 10)  # the worker works
            refused = await wait_for(lambda: [r for r in caplog.records if "refused this worker's record" in
                                              r.getMessage()], 10, what="the refusal to be logged")
            assert "(NoPermissionError: " in refused[0].getMessage() and "{reg}:workers" in refused[0].getMessage()
            assert entry(redis_url, w.worker_id) is None
            await wait_for(lambda: refusals(redis_server, user) >= 3, 10, what="more refused refreshes")
            assert len([r for r in caplog.records if "refused this worker's record" in r.getMessage()]) == 1
            # the operator commands under the same user: workers refuses with the fix, stats still counts
            capsys.readouterr()
            assert await asyncio.to_thread(main, ["workers", "--redis", url, "--namespace", NS]) == 3
            err = capsys.readouterr().err
            assert "zsched: error: Redis refused this user the worker registry" in err and "{reg}:workers:live" in err
            assert await asyncio.to_thread(main, ["stats", "--redis", url, "--namespace", NS]) == 0
            out, err = capsys.readouterr()
            assert "the WORKERS column shows '?'" in err and "no live worker" not in err
            assert next(line.split() for line in out.splitlines() if line.startswith("emails"))[-1] == "?"
            assert "pw@" not in out + err  # (the password is masked everywhere)
            redis_server.command("ACL", "SETUSER", user, "~{reg}:workers*")  # granted while it runs
            await wait_for(lambda: entry(redis_url, w.worker_id), 10, what="the record once the keys are granted")
    finally:
        redis_server.command("ACL", "DELUSER", user)
        redis_server.command("ACL", "LOG", "RESET")


async def test_on_a_cluster_the_registry_is_one_slot_and_zsched_workers_reads_it(
        redis_cluster_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert slot_of(KS.workers_key) == slot_of(KS.workers_live_key)
    w = worker(redis_cluster_url, queues=["emails"], concurrency=2)
    async with serving(w):
        await wait_for(lambda: entry(redis_cluster_url, w.worker_id), 10, what="the registration on the cluster")
        capsys.readouterr()
        assert (await cli("workers", "--json", url=redis_cluster_url)) == 0
        doc = json.loads(capsys.readouterr().out)
        assert [x["id"] for x in doc["workers"]] == [w.worker_id]
        assert doc["queues"] == {"emails": {"workers": 1, "slots": 2, "busy": 0, "free": 2}}
    assert read(redis_cluster_url).workers == []


def _gauges(proc: SchedulerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    names = {"zsched_workers", "zsched_worker_slots", "zsched_worker_processes", "zsched_worker_capacity"}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for m in proc.metrics.registry.collect() if m.name in names for s in m.samples}


async def test_the_replica_owning_partition_0_exports_the_registry_and_hands_it_over(
        redis_url: str, etcd_endpoint: str, client: Client) -> None:
    procs = [SchedulerProcess(SchedulerConfig(redis_url=redis_url, etcd_endpoints=etcd_endpoint, namespace=NS,
                                              replica_id=f"r{i}", lease_ttl=2.0)) for i in range(2)]
    tasks = [asyncio.create_task(p.run()) for p in procs]
    w = worker(redis_url, queues=["emails", "idle"], concurrency=4)
    gate, running = asyncio.Event(), asyncio.Event()

    @w.handler("emails")
    async def handle(job: Job) -> None:
        running.set()
        await gate.wait()

    try:
        async with serving(w):
            client.schedule(timedelta(0), {"n": 1}, queue="emails")
            await asyncio.wait_for(running.wait(), 10)
            await wait_for(lambda: (e := entry(redis_url, w.worker_id)) and e.record.busy == 1, 10,
                           what="the busy slot in the registry")
            owner = await wait_for(lambda: next((p for p in procs if 0 in p.runners), None), 10,
                                   what="an owner of partition 0")
            other = procs[1 - procs.index(owner)]
            assert owner.registry_export is not None
            await owner.registry_export.read_once()
            got = _gauges(owner)
            assert got[("zsched_workers", (("queue", "emails"),))] == 1
            assert got[("zsched_worker_slots", (("queue", "emails"), ("state", "busy")))] == 1
            assert got[("zsched_worker_slots", (("queue", "emails"), ("state", "free")))] == 3
            assert got[("zsched_worker_slots", (("queue", "idle"), ("state", "busy")))] == 0
            assert got[("zsched_worker_processes", (("namespace", NS),))] == 1
            assert got[("zsched_worker_capacity", (("namespace", NS), ("state", "free")))] == 3
            assert _gauges(other) == {}  # exported once per namespace: sums are never doubled

            # partition 0 moves: the old owner stops exporting, the new one starts at once
            owner.stop()
            await asyncio.wait_for(tasks[procs.index(owner)], 10)
            await wait_for(lambda: _gauges(other).get(("zsched_workers", (("queue", "emails"),))) == 1, 15,
                           what="the new owner of partition 0 to export the registry")
            assert _gauges(owner) == {}
            gate.set()
        assert other.registry_export is not None
        await other.registry_export.read_once()  # the worker left: its queues read 0, not absent
        got = _gauges(other)
        assert got[("zsched_workers", (("queue", "emails"),))] == 0
        assert got[("zsched_worker_processes", (("namespace", NS),))] == 0
    finally:
        for p in procs:
            p.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
