"""Dead letters do not grow forever: ``max_dead`` / ``dead_ttl`` drop the oldest, count and log
every drop; and a dead job's idempotency key is free again (the documented key rule)."""
from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

import pytest
import redis

from scheduler import Client, JobState
from scheduler.protocol.calls import error_arg
from scheduler.protocol.codes import FailKind
from scheduler.protocol.tick import Retention, tick_call
from scheduler.protocol.transitions import Failure, fail_call
from scheduler.testing.transitions import Ops
from tests.integration.test_scheduler_tier import NS, settled, start_replica, stop_replica
from tests.support.helpers import snapshot


def kill(client: Client, ops: Ops, n: int, queue: str = "q", key: str | None = None) -> list[str]:
    """Schedule ``n`` due jobs, claim and fail them permanently: they are dead, oldest first."""
    if key is None:
        ids = client.schedule_many([(timedelta(0), i) for i in range(n)], queue=queue)
    else:
        ids = [client.schedule(timedelta(0), "keyed", queue=queue, key=key)]
    for j in ops.claim(queue, n):
        failure = Failure(j.raw_id, j.token, FailKind.PERMANENT, 0, error_arg("E", "boom"))
        assert ops.send(fail_call(ops.calls, ops.partition(j.raw_id), [failure]))[0] == 2
        time.sleep(0.002)  # distinct death times: "oldest" is well defined
    return ids


def test_tick_drops_the_oldest_past_the_cap_and_reports_them(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="dr", partitions=1)
    ops = Ops(c)
    r = redis.Redis.from_url(redis_url)
    ids = kill(c, ops, 10)
    reply = ops.send(tick_call(ops.calls, 0, 0, 1000, {}, Retention(0, 3)))  # no rate limits; ttl 0, cap 3
    k = int(reply[5])
    dropped = [reply[6 + 2 * i] for i in range(k)]
    assert k == 7 and [bytes.hex(d) for d in dropped] == ids[:7]  # oldest first
    assert {reply[7 + 2 * i] for i in range(k)} == {b"q"}
    assert {j.id for j in c.dead(limit=100)} == set(ids[7:])
    assert int(r.hget("{dr:0}:c", "dropped:q")) == 7 and int(r.hget("{dr:0}:g", "d:q")) == 3
    assert all(c.get(j) is None for j in ids[:7])
    assert set(snapshot(r, c)) == set(ids[7:])  # bodies and errors went with them: nothing orphaned
    # a second tick finds nothing more to drop
    assert int(ops.send(tick_call(ops.calls, 0, 0, 1000, {}, Retention(0, 3)))[5]) == 0
    c.close()


def test_tick_drops_dead_jobs_older_than_the_ttl(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="drt", partitions=1)
    ops = Ops(c)
    old = kill(c, ops, 4)
    time.sleep(0.2)
    new = kill(c, ops, 2)
    reply = ops.send(tick_call(ops.calls, 0, 0, 1000, {}, Retention(150, 0)))  # ttl 150 ms, no cap
    assert int(reply[5]) == 4
    assert {j.id for j in c.dead(limit=100)} == set(new)
    assert all(c.get(j) is None for j in old)
    c.close()


def test_a_dead_jobs_key_is_free_again_and_a_requeue_takes_it_back_only_if_free(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="drk", partitions=2)
    ops = Ops(c)
    (dead,) = kill(c, ops, 1, key="order-7")
    assert c.get(dead).state is JobState.DEAD
    again = c.schedule(timedelta(hours=1), "second try", key="order-7")
    assert again != dead, "the key of a dead job must not point at it (nothing would run)"
    assert c.schedule(timedelta(hours=1), "dup", key="order-7") == again  # still idempotent while live
    assert c.requeue(dead)
    assert c.schedule(timedelta(hours=1), "dup", key="order-7") == again  # the live job keeps the key
    c.cancel(again)
    (dead2,) = kill(c, ops, 1, queue="q2", key="order-8")
    assert c.requeue(dead2)
    assert c.schedule(timedelta(hours=1), "dup", key="order-8") == dead2  # took its free key back
    c.close()


@pytest.mark.parametrize("setting", ["max_dead", "dead_ttl"])
async def test_the_tier_applies_the_namespace_retention_and_logs_every_drop(
        redis_url: str, etcd_endpoint: str, caplog: pytest.LogCaptureFixture, setting: str) -> None:
    c = Client.from_url(redis_url, namespace=NS, partitions=2)
    ops = Ops(c)
    caplog.set_level(logging.WARNING, logger="zsched.scheduler")
    proc, task = await start_replica(redis_url, etcd_endpoint, "ret")
    try:
        await settled(etcd_endpoint, [proc], 2)
        ids = kill(c, ops, 12)
        if setting == "max_dead":
            c.set_dead_retention(max_dead=4)  # 2 per partition
            assert c.dead_retention() == (4, None)
        else:
            c.set_dead_retention(dead_ttl=1)
            assert c.dead_retention() == (None, 1.0)
        deadline = time.monotonic() + 10
        want = 4 if setting == "max_dead" else 0
        while len(c.dead(limit=100)) > want:
            assert time.monotonic() < deadline, f"retention not applied: {len(c.dead(limit=100))} dead"
            await asyncio.sleep(0.05)
        def dropped() -> list[logging.LogRecord]:
            return [rec for rec in caplog.records if "dropped by the dead-letter retention" in rec.getMessage()]

        # the replica logs once it has read tick's reply, which may come a moment after Redis dropped them
        while len(dropped()) < 12 - want:
            assert time.monotonic() < deadline, f"{len(dropped())} drops logged, expected {12 - want}"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        assert len(dropped()) == 12 - want
        assert {rec.getMessage().split("dead job ", 1)[1].split()[0] for rec in dropped()} <= set(ids)
        stats = c.stats()["q"]
        assert stats["dead"] == want
        c.set_dead_retention()  # lifted
        assert c.dead_retention() == (None, None)
    finally:
        await stop_replica(proc, task)
        c.close()


def test_bad_retention_settings_are_refused(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="drb", partitions=1)
    for kw in ({"max_dead": 0}, {"max_dead": 1.5}, {"dead_ttl": 0}, {"dead_ttl": float("nan")}):
        with pytest.raises(ValueError):
            c.set_dead_retention(**kw)
    assert c.dead_retention() == (None, None)
    c.close()


def test_cli_dead_retention(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.shell.cli import main

    Client.from_url(redis_url, namespace="drc", partitions=1).connect().close()
    base = ["--redis", redis_url, "--namespace", "drc"]
    assert main(["dead", "retention", "--max", "1000", "--ttl", "7d", *base]) == 0
    out = capsys.readouterr().out
    assert "1000" in out and "7d" in out
    assert main(["dead", "retention", "--json", *base]) == 0
    assert '"max_dead": 1000' in capsys.readouterr().out
    assert main(["dead", "retention", "--no-max", *base]) == 0
    c = Client.from_url(redis_url, namespace="drc")
    assert c.dead_retention() == (None, 7 * 86400.0)
    c.close()
    assert main(["dead", "retention", "--max", "5", "--no-max", *base]) == 2
