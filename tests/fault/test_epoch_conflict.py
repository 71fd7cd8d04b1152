"""Epoch conflicts of the scheduler tier, against real ``zsched scheduler`` processes, real etcd and a
real redis-server (all on loopback).

An epoch is the etcd create revision of a partition's ownership key; Redis keeps the highest one
seen per partition and refuses older ones. If etcd's revisions go back (restored snapshot, or a
brand-new etcd data dir), every epoch etcd hands out is older than Redis's: the owner's ticks are
refused. These tests replace etcd with an empty one for real and check that the tier does not spin
(a handful of refused calls, measured on the replica's /metrics and independently in Redis's
command statistics), says what happened and how to fix it, and recovers once the real
``zsched epochs reset`` CLI has run. The opposite rollback (Redis loses its newest epoch: restart
from an older RDB snapshot) must not disturb the current owner at all.

Evidence comes from Redis, etcd, each replica's /metrics and log, and the CLI's output; only
processes started here are signalled, by their PID.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from scheduler import Client, JobState
from scheduler.protocol.keys import Keyspace
from scheduler.shell.servers import ServerError, ZschedProc, etcd_put, etcd_request, scheduler_proc, stop_all
from tests.fault.test_scheduler_faults import etcd_owners, owned_by, tails, wait_settled
from tests.support.helpers import key_in
from tests.support.servers import EtcdServer, RedisServer
from tests.support.waits import wait_until

pytestmark = pytest.mark.fault

ROOT = Path(__file__).resolve().parents[2]
PARTS = 4
TTL = 2.0
WINDOW_S = 5.0  # observation window for "does not spin"


# --------------------------------------------------------------------------- helpers


def zsched_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """The real console script (as an operator runs it), stdin not a terminal."""
    exe = ROOT / ".venv" / "bin" / "zsched"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "scheduler"]
    return subprocess.run([*argv, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env={**os.environ})


def redis_epochs(r: redis.Redis, ks: Keyspace) -> dict[int, int]:
    return {p: int(r.hget(ks.key(p, "meta"), "epoch") or 0) for p in range(ks.partitions)}


def etcd_revision(endpoint: str) -> int:
    return int(etcd_request(endpoint, "/v3/kv/range", {"key": "AA=="})["header"]["revision"])


def evalsha_calls(srv: RedisServer) -> int:
    """Script calls Redis has executed since its start (INFO commandstats)."""
    text = srv.command("INFO", "commandstats").decode()
    m = re.search(r"^cmdstat_evalsha:calls=(\d+)", text, re.M)
    return int(m.group(1)) if m else 0


def start(url: str, etcd: str, ns: str, replica: str) -> ZschedProc:
    return scheduler_proc(url, etcd, ns, replica, ttl=TTL).start()


def wait_epochs_established(r: redis.Redis, ks: Keyspace, etcd: str, procs: list[ZschedProc]) -> dict[int, int]:
    """Every partition's owner has ticked: Redis holds exactly the epochs etcd handed out."""
    def ok() -> dict[int, int] | None:
        own = etcd_owners(etcd, ks.namespace)
        want = {p: e for p, (_, e) in own.items()}
        return want if len(want) == ks.partitions and redis_epochs(r, ks) == want else None

    try:
        return wait_until(ok, 5.0, 0.02, "Redis to hold the owners' epochs")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: Redis {redis_epochs(r, ks)}, etcd {etcd_owners(etcd, ks.namespace)}"
                             f"{tails(*procs)}") from None


def replace_etcd(srv: EtcdServer) -> None:
    """Stop etcd and start a brand-new one (empty data dir) on the same ports: its revisions start
    from 1 again, exactly what a restore to an older snapshot does to the revision counter."""
    srv.stop(keep=True)
    shutil.rmtree(srv.data_dir)
    srv.start()


# --------------------------------------------------------------------------- 1. etcd replaced


def test_etcd_replaced_conflict_backs_off_logs_the_fix_and_reset_recovers(fresh_redis: RedisServer,
                                                                          fresh_etcd: EtcdServer) -> None:
    ns, url, ep = "f-epoch", fresh_redis.url, fresh_etcd.endpoint
    client = Client.from_url(url, namespace=ns, partitions=PARTS).connect()
    ks = client.keyspace
    r = redis.Redis.from_url(url)
    # move etcd's revision counter well past what an empty etcd hands out, so the epochs Redis sees
    # now are newer than any the replacement etcd will hand out for a while
    for i in range(100):
        etcd_put(ep, "/test/filler", str(i))
    procs: list[ZschedProc] = []
    try:
        a = start(url, ep, ns, "a")
        procs.append(a)
        wait_settled(ep, ns, [a], ["a"], PARTS)
        old = wait_epochs_established(r, ks, ep, [a])
        assert min(old.values()) > 100, old
        assert a.term() == 0, tails(a)

        replace_etcd(fresh_etcd)
        assert etcd_revision(ep) < 10, "the replacement etcd is not empty"

        a2 = start(url, ep, ns, "a")
        procs.append(a2)
        wait_settled(ep, ns, [a2], ["a"], PARTS)
        new = {p: e for p, (_, e) in etcd_owners(ep, ns).items()}
        assert max(new.values()) < min(old.values()), (new, old)
        wait_until(lambda: a2.try_metric("zsched_epoch_conflict_partitions") == PARTS, 10.0, 0.05,
                   f"all {PARTS} partitions to be reported in conflict{tails(a2)}")

        # a job due in a moment in partition 0: it must not fire while the conflict lasts
        jid = client.schedule(time.time() + 0.3, {"n": 1}, key=key_in(0, PARTS, "conflict"))
        c0 = a2.metric("zsched_epoch_conflicts_total")
        e0 = evalsha_calls(fresh_redis)
        t0 = time.monotonic()
        # observation window: fail early if the replica spins, otherwise watch for WINDOW_S
        while time.monotonic() - t0 < WINDOW_S:
            assert a2.metric("zsched_epoch_conflicts_total") - c0 <= 4 * PARTS, f"refusals pile up{tails(a2)}"
            time.sleep(0.25)
        elapsed = time.monotonic() - t0
        conflicts = a2.metric("zsched_epoch_conflicts_total") - c0
        calls = evalsha_calls(fresh_redis) - e0
        log = a2.output()
        print(f"\netcd replaced: epochs in Redis {sorted(old.values())}, etcd now hands out {sorted(new.values())}; "
              f"over {elapsed:.1f}s: {conflicts:.0f} refused ticks in {PARTS} partitions "
              f"({a2.metric('zsched_epoch_conflicts_total'):.0f} in all), {calls} script calls seen by Redis")
        # backoff 1 s, 2 s, 4 s, ... (jitter only shortens a step): at most 3 refusals per
        # partition in any 5 s window after the first one; 4 leaves room for timing
        assert conflicts <= 4 * PARTS, f"{conflicts:.0f} refusals in {elapsed:.1f}s: spinning{tails(a2)}"
        # independent of the replica's own counting: each refused step is tick + reap (2 calls),
        # plus the stats refresh (one call per partition every 2 s): about 30; a spin is thousands
        assert calls <= 80, f"Redis saw {calls} script calls in {elapsed:.1f}s: spinning{tails(a2)}"
        assert a2.metric("zsched_epoch_conflicts_total") > 0
        # not mistaken for a hand-over: no partition was dropped and re-acquired
        assert a2.metric("zsched_epoch_refusals_total") == 0, tails(a2)
        assert a2.metric("zsched_ownership_changes_total", change="acquired") == PARTS, tails(a2)
        assert a2.metric("zsched_ownership_changes_total", change="lost") == 0, tails(a2)
        assert a2.metric("zsched_partitions_owned") == PARTS
        assert {p: e for p, (_, e) in etcd_owners(ep, ns).items()} == new, "ownership moved during the conflict"
        assert client.get(jid).state is JobState.SCHEDULED, "a job fired although every tick is refused"
        assert redis_epochs(r, ks) == old, "a refused tick changed the stored epoch"
        # one clear error per partition, naming the cause, the epochs and the fix
        errors = [ln for ln in log.splitlines() if "EPOCH CONFLICT" in ln]
        assert len(errors) == PARTS, f"expected one error per partition, got {len(errors)}{tails(a2)}"
        for p in range(PARTS):
            [line] = [ln for ln in errors if f"partition {p}:" in ln]
            assert " ERROR " in line and "etcd was restored or replaced" in line, line
            assert f"Redis has seen epoch {old[p]}" in line and f"refused epoch {new[p]}" in line, line
            assert f"zsched epochs reset --partition {p} --namespace {ns} --redis {url}" in line, line
        assert "Traceback" not in log, tails(a2, lines=80)

        # the operator's view: every partition marked CONFLICT
        show = zsched_cli("epochs", "show", "--redis", url, "--namespace", ns, "--etcd", ep, "--json")
        assert show.returncode == 0, show.stderr
        doc = json.loads(show.stdout)
        assert doc["conflicts"] == list(range(PARTS)), doc
        assert {row["partition"]: (row["epoch"], row["owner_epoch"]) for row in doc["partitions"]} == {
            p: (old[p], new[p]) for p in range(PARTS)}

        # the fix
        t_reset = time.monotonic()
        fix = zsched_cli("epochs", "reset", "--all", "--yes", "--redis", url, "--namespace", ns)
        assert fix.returncode == 0, fix.stderr
        assert f"reset {PARTS} of {PARTS} partition(s)" in fix.stdout, fix.stdout
        # at once: the reset publishes the partition and the backing-off runner retries on it
        wait_until(lambda: client.get(jid).state is JobState.READY, 5.0, 0.01,
                   f"the overdue job to fire after the reset{tails(a2)}")
        fired_after = time.monotonic() - t_reset
        wait_until(lambda: a2.metric("zsched_epoch_conflict_partitions") == 0, 3.0, 0.05,
                   f"the conflict gauge to return to 0{tails(a2)}")
        assert wait_epochs_established(r, ks, ep, [a2]) == new
        log = a2.output()
        assert log.count("epoch conflict resolved") == PARTS, tails(a2)
        assert a2.metric("zsched_epoch_refusals_total") == 0
        assert int(r.hget(ks.key(0, "c"), "fired:default") or 0) == 1, "the job fired more than once"
        # and the tier works normally again
        later = client.schedule(time.time() + 0.2, {"n": 2}, key=key_in(PARTS - 1, PARTS, "after"))
        wait_until(lambda: client.get(later).state is JobState.READY, 3.0, 0.01, "a new job to fire")
        print(f"etcd replaced: after 'zsched epochs reset --all' the overdue job fired in {fired_after:.3f}s")
    finally:
        stop_all(procs)
        client.close()


# --------------------------------------------------------------------------- 2. Redis rolled back


def test_redis_rollback_of_epochs_does_not_stall_the_current_owner(fresh_redis: RedisServer,
                                                                   fresh_etcd: EtcdServer) -> None:
    """Redis restarts from an RDB snapshot taken before a hand-over: its stored epochs go back to the
    previous owner's. The current owner's epochs are newer, so they are accepted (and raise the stored
    epoch again): no refusal, no conflict, firing resumes after the restart."""
    ns, url, ep = "f-redis-rollback", fresh_redis.url, fresh_etcd.endpoint
    client = Client.from_url(url, namespace=ns, partitions=PARTS).connect()
    ks = client.keyspace
    procs: list[ZschedProc] = []
    try:
        a = start(url, ep, ns, "a")
        procs.append(a)
        wait_settled(ep, ns, [a], ["a"], PARTS)
        r = redis.Redis.from_url(url)
        before = wait_epochs_established(r, ks, ep, [a])
        assert fresh_redis.command("SAVE") == "OK"
        r.set(f"{ns}-after-the-snapshot", 1)  # gone after the restart: the snapshot was loaded
        # hand-over: b starts, a leaves (SIGTERM revokes its lease), b owns every partition with
        # newer epochs and ticks them into Redis
        b = start(url, ep, ns, "b")
        procs.append(b)
        assert a.term() == 0, tails(a)
        wait_settled(ep, ns, [b], ["b"], PARTS)
        after = wait_epochs_established(r, ks, ep, [b])
        assert all(after[p] > before[p] for p in range(PARTS)), (before, after)
        # Redis loses everything since the snapshot: stop without saving, start on the same port and dir
        try:
            fresh_redis.command("SHUTDOWN", "NOSAVE")
        except (OSError, ServerError, ConnectionError):
            pass  # the server closes the connection as it exits
        wait_until(lambda: not fresh_redis.running, 5.0, 0.02, "redis-server to exit")
        t_down = time.monotonic()
        fresh_redis.start()
        r = redis.Redis.from_url(url)
        rolled = redis_epochs(r, ks)
        assert not r.exists(f"{ns}-after-the-snapshot"), "the restart did not load the older snapshot"
        # b retries Redis all along: a partition it ticked before this read holds its epoch again
        assert all(rolled[p] in (before[p], after[p]) for p in range(PARTS)), (rolled, before, after)
        ids = [client.schedule(time.time() + 0.3, {"p": p}, key=key_in(p, PARTS, "rb")) for p in range(PARTS)]
        # a runner retries Redis with a capped backoff (RunnerConfig.backoff_max)
        wait_until(lambda: all(client.get(i).state is JobState.READY for i in ids), 5.0, 0.02,
                   f"every partition to fire after Redis came back{tails(b)}")
        print(f"\nRedis rolled back to epochs {sorted(before.values())} under owner b with "
              f"{sorted(after.values())}: every partition fired {time.monotonic() - t_down:.2f}s after the restart")
        assert wait_epochs_established(r, ks, ep, [b]) == after
        assert b.metric("zsched_epoch_refusals_total") == 0, tails(b)
        assert b.metric("zsched_epoch_conflicts_total") == 0, tails(b)
        assert b.metric("zsched_epoch_conflict_partitions") == 0
        assert b.metric("zsched_ownership_changes_total", change="lost") == 0, tails(b)
        assert owned_by(etcd_owners(ep, ns), "b") == list(range(PARTS))
        assert "EPOCH CONFLICT" not in b.output()
    finally:
        stop_all(procs)
        client.close()
