"""Cron schedules end to end: real scheduler tier (in-process), real etcd and redis-server."""
from __future__ import annotations

import asyncio
import math
import time
from datetime import timedelta

import pytest
import redis

from scheduler import Client, JobOptions, JobState, ScriptArgumentError
from scheduler.protocol.ids import partition_for_key
from scheduler.redisio.connection import SyncRedis, sync_redis
from scheduler.testing.transitions import Ops
from tests.integration.test_scheduler_tier import settled, start_replica, stop_replica
from tests.support.helpers import on_both_backends, snapshot
from tests.support.waits import wait_for, wait_for_time

NS = "tier"  # the replicas of test_scheduler_tier use this namespace


def cron_jobs(r: SyncRedis, client: Client, name: str) -> dict[str, str]:
    """State of every live job that is an occurrence of cron ``name``."""
    out = {}
    for jid, state in snapshot(r, client).items():
        info = client.get(jid)
        if info.key and info.key.startswith(f"cron:{name}:"):
            out[jid] = state
    return out


def fired_count(r: redis.Redis, client: Client, queue: str) -> int:
    """How many jobs of ``queue`` the tier fired so far (the partitions' event counters)."""
    keys = [client.keyspace.key(p, "c") for p in range(client.keyspace.partitions)]
    return sum(int(r.hget(k, f"fired:{queue}") or 0) for k in keys)


def fired_occurrences(client: Client, queue: str) -> list:
    ops = Ops(client)
    return sorted((j for j in ops.claim(queue, 1000)), key=lambda j: j.record.cron_nominal_ms)


@on_both_backends
async def test_cron_fires_every_occurrence_on_time_with_one_pending(backend_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(backend_url, namespace=NS, partitions=4).connect()
    r = sync_redis(backend_url)
    proc, task = await start_replica(backend_url, etcd_endpoint, "solo")
    try:
        await settled(etcd_endpoint, [proc], 4)
        client.add_cron("tick", "* * * * * *", {"n": 1}, queue="cron")
        t_end = time.time() + 3.3
        while time.time() < t_end:
            states = cron_jobs(r, client, "tick")
            assert list(states.values()).count("scheduled") == 1, f"exactly one pending: {states}"
            await asyncio.sleep(0.1)
        runs = fired_occurrences(client, "cron")
        assert 3 <= len(runs) <= 4
        nominals = [j.record.cron_nominal_ms for j in runs]
        assert all(b - a == 1000 for a, b in zip(nominals, nominals[1:])), nominals
        assert all(n % 1000 == 0 for n in nominals)
        # fired at its nominal time: the due time recorded when it landed in ready is the fire time
        assert all(j.due_ms == j.record.cron_nominal_ms for j in runs)
        assert all(j.record.cron_missed == 0 for j in runs)
        assert [c.name for c in client.crons()] == ["tick"]
    finally:
        await stop_replica(proc, task)


async def test_outage_across_three_occurrences_run_late_coalesces_skip_drops(redis_url: str,
                                                                             etcd_endpoint: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=4).connect()
    r = redis.Redis.from_url(redis_url)
    client.add_cron("late", "* * * * * *", "L", queue="late")
    client.add_cron("skip", "* * * * * *", "S", queue="skip", misfire="skip", misfire_grace=0.3)
    t_added = time.time()
    # no scheduler tier: 3 occurrences (each second) pass unfired, past skip's grace
    await wait_for_time(math.ceil(t_added) + 2 + 0.3 + 0.05)
    proc, task = await start_replica(redis_url, etcd_endpoint, "solo")
    try:
        await settled(etcd_endpoint, [proc], 4)
        await asyncio.sleep(0.3)
        runs = fired_occurrences(client, "late")
        # exactly one catch-up run stands for the missed occurrences; a regular occurrence may
        # already have followed it if a second boundary passed meanwhile
        catch_up = [j for j in runs if j.record.cron_missed > 0]
        assert len(catch_up) == 1 and catch_up[0].record.cron_missed >= 2, [
            (j.record.cron_nominal_ms, j.record.cron_missed) for j in runs]
        assert runs[0] is catch_up[0], "the catch-up run comes first"
        assert len(runs) <= 2
        early_skips = [j for j in fired_occurrences(client, "skip")
                       if j.record.cron_nominal_ms < catch_up[0].record.cron_nominal_ms]
        assert early_skips == [], "skip fires none of the missed occurrences"
        misfired = sum(int(r.hget(client.keyspace.key(p, "c"), "misfired:skip") or 0) for p in range(4))
        assert misfired >= 3
        late0, skip0 = fired_count(r, client, "late"), fired_count(r, client, "skip")
        await wait_for(lambda: (fired_count(r, client, "late") >= late0 + 2
                                and fired_count(r, client, "skip") >= skip0 + 2),
                       5, what="both crons to fire twice more, on schedule")
        late_runs = fired_occurrences(client, "late")
        skip_runs = fired_occurrences(client, "skip")
        assert len(late_runs) >= 2 and len(skip_runs) >= 2
        assert all(j.record.cron_missed == 0 for j in late_runs + skip_runs)
        for name in ("late", "skip"):
            assert list(cron_jobs(r, client, name).values()).count("scheduled") == 1
    finally:
        await stop_replica(proc, task)


async def test_exhausted_occurrence_table_is_refilled_by_the_owner(redis_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=4).connect()
    r = redis.Redis.from_url(redis_url)
    client.add_cron("short", "* * * * * *", None, queue="short")
    ck = client.keyspace.key(partition_for_key("short", 4), "cron:short")
    r.hset(ck, mapping={"times": b"", "fires": b""})  # as after a very long outage
    proc, task = await start_replica(redis_url, etcd_endpoint, "solo")
    try:
        await settled(etcd_endpoint, [proc], 4)
        await wait_for(lambda: fired_count(r, client, "short") >= 2, 5, what="the cron to fire twice")
        runs = fired_occurrences(client, "short")
        assert len(runs) >= 2, "the cron kept firing after its table ran out"
        assert len(r.hget(ck, "times")) // 6 >= 16
        assert list(cron_jobs(r, client, "short").values()).count("scheduled") == 1
    finally:
        await stop_replica(proc, task)


def test_replace_remove_and_refused_cancel(redis_url: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=4).connect()
    r = redis.Redis.from_url(redis_url)
    first = client.add_cron("digest", "0 9 * * *", {"v": 1}, queue="emails", tz="America/New_York",
                            misfire="skip", misfire_grace=600, jitter=60)
    info = client.get(first)
    assert info.state is JobState.SCHEDULED and info.payload == {"v": 1}
    local = info.run_at.astimezone(__import__("zoneinfo").ZoneInfo("America/New_York"))
    assert (local.hour, local.minute) == (9, 0) and local.second + local.microsecond / 1e6 <= 60
    assert not client.cancel(first), "a cron's pending occurrence cannot be cancelled alone"
    second = client.add_cron("digest", "30 8 * * *", {"v": 2}, queue="emails", tz="America/New_York")
    assert client.get(first).state is JobState.CANCELLED
    assert client.get(second).payload == {"v": 2}
    [c] = client.crons()
    assert (c.name, c.expression, c.tz, c.queue, c.pending_id) == ("digest", "30 8 * * *", "America/New_York",
                                                                    "emails", second)
    assert client.remove_cron("digest") and not client.remove_cron("digest")
    assert client.get(second).state is JobState.CANCELLED
    assert client.crons() == [] and snapshot(r, client) == {}


@pytest.mark.parametrize("kwargs,words", [
    (dict(expression="61 * * * *"), "invalid"),
    (dict(tz="Mars/Base"), "unknown time zone"),
    (dict(name="bad:name"), "cron name"),
    (dict(misfire="sometimes"), "misfire"),
    (dict(expression="0 0 30 2 *"), "never fires"),
])
def test_invalid_crons_write_nothing(redis_url: str, kwargs: dict, words: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=4).connect()
    r = redis.Redis.from_url(redis_url)
    before = r.dbsize()
    args = dict(name="c", expression="* * * * *", payload=None)
    args.update(kwargs)
    name, expr, payload = args.pop("name"), args.pop("expression"), args.pop("payload")
    with pytest.raises(ValueError, match=words):
        client.add_cron(name, expr, payload, **args)
    assert r.dbsize() == before


async def test_handler_sees_the_nominal_time_of_a_cron_occurrence(redis_url: str, etcd_endpoint: str) -> None:
    from tests.support.workers import serving
    from workers import Worker
    client = Client.from_url(redis_url, namespace=NS, partitions=4).connect()
    seen = []
    w = Worker.from_url(redis_url, namespace=NS)

    @w.handler("nominal")
    async def handle(job):
        seen.append((job.cron_nominal, job.cron_missed, job.key))

    proc, task = await start_replica(redis_url, etcd_endpoint, "solo")
    try:
        await settled(etcd_endpoint, [proc], 4)
        client.add_cron("nom", "* * * * * *", None, queue="nominal")
        async with serving(w):
            await wait_for(lambda: len(seen) >= 2, 5, what="two occurrences")
        nominal, missed, key = seen[0]
        assert nominal is not None and nominal.microsecond == 0 and missed == 0
        assert key == f"cron:nom:{int(nominal.timestamp() * 1000)}"
    finally:
        await stop_replica(proc, task)


def test_cron_keys_cannot_be_taken_over_by_a_producer(redis_url: str) -> None:
    """A producer passing ``cron:NAME:<next nominal>`` as its key must not capture the cron's next
    occurrence (the cron would stop): the client refuses the key space, the script too, and a
    foreign job holding such a key (old data, a hand edit) is not adopted as the occurrence."""
    client = Client.from_url(redis_url, namespace="cronkey", partitions=1).connect()
    ops = Ops(client)
    client.add_cron("every", "* * * * * *", {"n": 1}, queue="cq")
    (cron,) = client.crons()
    nominal = int(cron.next_nominal.timestamp() * 1000)
    with pytest.raises(ValueError, match="reserved"):
        client.schedule(timedelta(seconds=60), "hijack", key=f"cron:every:{nominal + 1000}")
    core = client.calls
    opts = JobOptions(queue="cq", max_attempts=1, lease=30.0, misfire="run_late", misfire_grace=None,
                      backoff=None, jitter=0.0)
    name, keys, args = core.prepare_one(timedelta(seconds=60), "hijack", None, opts)
    args = list(args)
    args[-1] = f"cron:every:{nominal + 1000}"
    with pytest.raises(ScriptArgumentError, match="reserved for cron occurrences"):
        client.transport.call(name, keys, args)
    assert ops.claim("cq", 10) == []  # nothing was written by the refused call
    # a foreign job already holding the next occurrence's key (written before the rule existed)
    foreign = client.schedule(time.time() + 3600, "foreign", queue="other")
    r = redis.Redis.from_url(redis_url)
    r.hset("{cronkey:0}:k", f"cron:every:{nominal + 1000}", bytes.fromhex(foreign))
    time.sleep(max(0.0, nominal / 1000 - time.time()) + 0.05)
    assert ops.tick_all() >= 1  # fires the pending occurrence and schedules the next one
    (after,) = client.crons()
    assert after.pending_id != foreign, "the cron adopted a job that is not its occurrence"
    info = client.get(after.pending_id)
    assert info is not None and info.key == f"cron:every:{nominal + 1000}" and info.queue == "cq"
    assert client.get(foreign).state is JobState.SCHEDULED  # the foreign job is left alone
    r.close()
    client.close()
