"""Queue names are interned per partition (2 bytes in every record); names of queues that are
empty and idle are retired, so a namespace can use any number of queue names over time."""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
import redis

from scheduler import Client, JobOptions
from scheduler.protocol.tick import Retention, tick_call
from scheduler.testing.transitions import Ops
from tests.support.helpers import PAST, snapshot
from tests.support.waits import wait_until


def _tick(ops: Ops, idle_ms: int, n: int = 1) -> None:
    calls = [tick_call(ops.calls, 0, 0, 1000, {}, Retention(queue_idle_ms=idle_ms)) for _ in range(n)]
    ops.transport.call_many(calls)


def _schedule_to(c: Client, names: list[str], at: float = PAST) -> list[str]:
    core = c.calls
    calls: list[Any] = []
    for name in names:
        opts = JobOptions(queue=name, max_attempts=1, lease=30.0, misfire="run_late", misfire_grace=None,
                          backoff=None, jitter=0.0)
        call, _pos = core.prepare([(at, "x")], opts)
        calls += call
    ids: list[str] = []
    for s in range(0, len(calls), 1000):
        for reply in c.transport.call_many(calls[s:s + 1000]):
            ids += [bytes.hex(r) for r in core.schedule_reply(reply)[0]]
    return ids


# A partition hands out 65 535 fresh queue indexes (the 'next' counter of its q hash), then reuses
# retired ones once they have cooled (lua/_lib.lua, queue_index). A fresh index is the same
# increment every time, so the test starts the counter where 58 035 names, used and retired long
# ago, would have left it: its 15 000 names spend the last 7 500 fresh indexes, cross the 65 535
# mark in the middle of a round and take retired indexes for the other 7 500 (70 000 names from
# zero took 4 465, at almost five times the cost).
FRESH_LEFT = 7_500
ROUNDS, PER_ROUND = 3, 5000
Q, QFREE = "{qn:0}:q", "{qn:0}:qfree"


def _all_retired_cooled(r: redis.Redis) -> bool:
    """Every retired index may be taken again: queue_index takes one whose score (reusable from,
    ms) is not after the server clock in whole seconds (with the 1 ms retirement time of these
    ticks, within a second of its retirement)."""
    return int(r.zcount(QFREE, "-inf", int(r.time()[0]) * 1000)) == int(r.zcard(QFREE))


def test_more_queue_names_over_time_than_a_partition_can_index_do_not_break_scheduling(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="qn", partitions=1)
    ops = Ops(c)
    r = redis.Redis.from_url(redis_url)
    r.hset(Q, "next", 65_535 - FRESH_LEFT)
    total = 0
    for rnd in range(ROUNDS):
        if rnd:  # from the second round on, names take retired indexes: wait for them to cool, not for a time
            wait_until(lambda: _all_retired_cooled(r), 5, what="the retired queue indexes to cool")
        names = [f"q{rnd}-{i}" for i in range(PER_ROUND)]
        ids = _schedule_to(c, names)
        total += len(ids)
        # each job names its own queue, through a fresh index or a reused one
        infos = c.get_many(ids)
        assert [infos[j].queue for j in ids] == names
        cancel = [ops.calls.cancel_call(j) for j in ids]
        for s in range(0, len(cancel), 1000):
            c.transport.call_many(cancel[s:s + 1000])
        while r.hlen(Q) > 3 * 1000:  # n:, i:, u: per live name; retire most of this round
            _tick(ops, idle_ms=1, n=200)
    assert total == ROUNDS * PER_ROUND
    assert r.hget(Q, "next") == b"65535", "the fresh indexes were not all spent: no index was reused"
    # a retired name works again at once (a new index), and nothing is left in a wrong state
    again = c.schedule(timedelta(0), "back", queue="q0-1")
    assert c.get(again).queue == "q0-1"
    assert c.stats()["q0-1"]["ready"] == 1
    assert set(snapshot(r, c)) == {again}
    c.close()


def test_only_empty_idle_queues_are_retired_with_their_counters(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="qr", partitions=1)
    ops = Ops(c)
    r = redis.Redis.from_url(redis_url)
    c.schedule(time.time() + 3600, "later", queue="waiting")
    c.schedule(timedelta(0), "x", queue="deadq")
    (dying,) = ops.claim("deadq", 1)
    assert ops.fail(dying, kind="p") == 2  # a dead job keeps its queue's name
    done = c.schedule(timedelta(0), "x", queue="gone")
    ops.ack(ops.claim("gone", 1)[0])
    assert c.get(done).queue == "gone"
    before = r.hgetall("{qr:0}:c")
    assert b"acked:gone" in before
    _tick(ops, idle_ms=0)  # 0 = never retire
    assert r.hexists("{qr:0}:q", "n:gone")
    time.sleep(0.05)
    _tick(ops, idle_ms=10, n=5)
    q = r.hgetall("{qr:0}:q")
    assert b"n:gone" not in q, "an empty idle queue keeps its name"
    assert b"n:waiting" in q and b"n:deadq" in q, "a queue with jobs lost its name"
    c_after = r.hgetall("{qr:0}:c")
    assert not any(k.endswith(b":gone") for k in c_after) and b"scheduled:waiting" in c_after
    assert "gone" not in c.stats()
    c.close()


def test_queue_retirement_setting(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="qs", partitions=1)
    assert c.queue_retirement() == 86400.0
    c.set_queue_retirement(3600)
    assert c.queue_retirement() == 3600.0
    c.set_queue_retirement(None)
    assert c.queue_retirement() is None
    with pytest.raises(ValueError):
        c.set_queue_retirement(-1)
    c.close()
