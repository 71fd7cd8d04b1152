"""The partition owner's script calls and replies (scheduler/protocol/tick.py): hand-made replies
laid out as the lua/*.lua headers say, then the real scripts on fakeredis, so a change of a
script's reply layout that the parser does not follow fails here."""
from __future__ import annotations

import re
import time
from datetime import timedelta

import fakeredis
import pytest

from scheduler import Client
from scheduler.protocol import bells
from scheduler.protocol.calls import Calls
from scheduler.protocol.codes import EPOCH_REFUSED, CronFillCode
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.replies import StatsReply, parse_stats
from scheduler.protocol.scripts import library_source
from scheduler.protocol.tick import (
    CRON_FIELDS,
    CronFillReply,
    EpochRefused,
    QueueTokens,
    ReapReply,
    Retention,
    TickReply,
    TokenGrant,
    cron_fill_call,
    cron_key,
    crons_key,
    parse_cron_fill,
    parse_cron_table,
    parse_ratelimit,
    parse_reap,
    parse_tick,
    ratelimit_call,
    reap_call,
    tick_call,
)
from scheduler.redisio.transport import ScriptTransport
from tests.support.helpers import raw_call

NS = "tk"


def calls(partitions: int = 1) -> Calls:
    return Calls(Keyspace(NS, partitions), max_payload_bytes=1 << 20, tombstone_ttl=60.0)


# --------------------------------------------------------------------------- hand-made replies


def test_every_fenced_reply_reads_a_refusal_the_same_way() -> None:
    assert EPOCH_REFUSED == CronFillCode.EPOCH_REFUSED == -1
    for parse in (parse_tick, parse_reap, parse_cron_fill):
        assert parse([-1, 42]) == EpochRefused(42)


def test_tick_reply_with_limits_crons_drops_and_lateness() -> None:
    raw_id = b"\x01" * 10
    reply = [7, 1500, 1000,
             2, b"mail", 3, 4, 1, b"sms", 0, 0, 0,
             1, b"nightly",
             1, raw_id, b"mail",
             2, b"mail", b"1", b"sms", b"0",
             1520,
             5, 0, 12]
    assert parse_tick(reply) == TickReply(
        moved=7, next_due_ms=1500, now_ms=1000,
        queues=[QueueTokens("mail", 3, 4, 1), QueueTokens("sms", 0, 0, 0)],
        crons_to_refill=["nightly"], dropped_dead=[(raw_id, "mail")], to_ring=[("mail", True), ("sms", False)],
        burst_due_ms=1520, lateness_ms=[5, 0, 12])


def test_idle_tick_reply_has_no_next_due() -> None:
    tick = parse_tick([0, -1, 1000, 0, 0, 0, 0, -1])
    assert isinstance(tick, TickReply)
    assert (tick.moved, tick.next_due_ms, tick.queues, tick.crons_to_refill, tick.dropped_dead, tick.to_ring,
            tick.burst_due_ms, tick.lateness_ms) == (0, None, [], [], [], [], None, [])


def test_reap_ratelimit_cron_fill_and_stats_replies() -> None:
    assert parse_reap([2, 5000, 4000]) == ReapReply(2, 5000, 4000)
    assert parse_reap([0, -1, 4000]) == ReapReply(0, None, 4000)
    assert parse_ratelimit([3, 0]) == TokenGrant(3, 0)
    assert parse_cron_fill([0]) == CronFillReply(CronFillCode.CHANGED, None)
    assert parse_cron_fill([1, b"id"]) == CronFillReply(CronFillCode.FILLED, b"id")
    stats = parse_stats([[b"s:q", 4, b"a:q", 1], [b"fired:q", 9], [b"q", 2], -1, 4, 1, 0, 17])
    assert stats == StatsReply({"s:q": 4, "a:q": 1}, {"fired:q": 9}, {"q": 2}, None, 4, 1, 0, 17)


def test_calls_carry_the_arguments_in_the_header_order() -> None:
    c = calls(2)
    name, keys, args = tick_call(c, 1, 9, 100, {"mail": 3, "sms": 0}, Retention(1000, 50, 0), 20)
    assert name == "tick" and list(keys) == c.ks.partition_keys(1)
    assert list(args)[3:] == [9, 100, c.tomb_ms, 2, "mail", 3, "sms", 0, 1000, 50, 0, 20, 1]
    assert list(reap_call(c, 1, 9, 10)[2])[3:] == [9, 10]
    assert ratelimit_call(c.ks, "mail", 5.0, 10.0, 1, 4, 2) == ("ratelimit", [c.ks.bucket("mail")],
                                                                 [5.0, 10.0, 1, 4, 2])
    assert list(cron_fill_call(c, 1, 9, "n", b"3", [(10, 11), (20, 20)])[2])[3:] == [9, "n", b"3", 2, 10, 11, 20, 20]
    assert list(c.stats_call(0)[2]) == list(raw_call(c, "stats", 0)[2])


def test_cron_table_reads_what_a_refill_needs() -> None:
    times = (1000).to_bytes(6, "big") + (2000).to_bytes(6, "big")
    table = parse_cron_table([b"\x80", b"3", b"pid", b"1500", times])
    assert table is not None
    assert (table.version, table.pending, table.upcoming, table.last_planned_ms, table.spec()) == (
        b"3", True, 2, 2000, {})
    idle = parse_cron_table([b"\x80", b"3", None, None, None])
    assert idle is not None and (idle.pending, idle.upcoming, idle.last_planned_ms) == (False, 0, None)
    assert parse_cron_table([None, None, None, None, None]) is None


# --------------------------------------------------------------------------- the real scripts


@pytest.fixture
def redis() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def test_tick_and_reap_replies_of_the_real_scripts(redis: fakeredis.FakeRedis) -> None:
    client = Client(redis, namespace=NS, partitions=1)
    # due soon enough not to slow the test, late enough that a loaded machine (the first call also
    # compiles the script) still stores it as a timer rather than as ready at once: 30 ms did not
    # (CI saw it land in ready and the tick move nothing)
    due = time.time() + 0.5
    client.schedule(due, {"n": 1})
    client.schedule(timedelta(hours=1), {"n": 2})
    assert client.stats()["default"]["scheduled"] == 2  # both timers, none ready yet
    time.sleep(max(0.0, due - time.time()) + 0.02)
    c, t = calls(), ScriptTransport(redis)
    replies = t.call_many([tick_call(c, 0, 5, 100, {}, Retention()), reap_call(c, 0, 5, 100)])
    tick, reap = parse_tick(replies[0]), parse_reap(replies[1])
    assert isinstance(tick, TickReply) and isinstance(reap, ReapReply)
    assert tick.moved == 1 and len(tick.lateness_ms) == 1 and tick.lateness_ms[0] >= 0
    assert tick.next_due_ms is not None and tick.next_due_ms - tick.now_ms > 3_500_000
    assert (reap.reaped, reap.next_deadline_ms) == (0, None)
    # an older epoch is refused by every fenced script, naming the newest
    assert parse_tick(t.call_many([tick_call(c, 0, 4, 100, {}, Retention())])[0]) == EpochRefused(5)
    assert parse_reap(t.call_many([reap_call(c, 0, 4, 100)])[0]) == EpochRefused(5)
    stats = parse_stats(t.call_many([c.stats_call(0)])[0])
    assert stats.epoch == 5 and stats.ready == {"default": 1} and stats.gauges.get("s:default") == 1
    assert stats.earliest_due_ms == tick.next_due_ms and stats.timers == 1


def test_ratelimit_reply_of_the_real_script(redis: fakeredis.FakeRedis) -> None:
    c, t = calls(), ScriptTransport(redis)
    grant = parse_ratelimit(t.call_many([ratelimit_call(c.ks, "mail", 10.0, 3.0, 0, 5, 0)])[0])
    assert grant.granted == 3
    empty = parse_ratelimit(t.call_many([ratelimit_call(c.ks, "mail", 10.0, 3.0, 0, 5, 0)])[0])
    assert empty.granted == 0 and 0 < empty.wait_ms <= 100


def test_cron_table_and_cron_fill_replies_of_the_real_scripts(redis: fakeredis.FakeRedis) -> None:
    client = Client(redis, namespace=NS, partitions=1)
    client.add_cron("every-minute", "* * * * *", None)
    c, t = calls(), ScriptTransport(redis)
    assert redis.smembers(crons_key(c.ks, 0)) == {b"every-minute"}
    table = parse_cron_table(redis.hmget(cron_key(c.ks, 0, "every-minute"), *CRON_FIELDS))
    assert table is not None and table.pending and table.upcoming > 0 and table.spec()["expr"] == "* * * * *"
    assert table.last_planned_ms is not None
    after = table.last_planned_ms + 60_000
    filled = parse_cron_fill(t.call_many([cron_fill_call(c, 0, 2, "every-minute", table.version,
                                                         [(after, after)])])[0])
    assert isinstance(filled, CronFillReply) and filled.status is CronFillCode.FILLED and filled.pending_id
    stale = parse_cron_fill(t.call_many([cron_fill_call(c, 0, 2, "every-minute", b"%d" % (int(table.version) + 1),
                                                        [(after + 60_000, after + 60_000)])])[0])
    assert stale == CronFillReply(CronFillCode.CHANGED, None)
    refused = t.call_many([cron_fill_call(c, 0, 1, "every-minute", table.version, [(after, after)])])[0]
    assert parse_cron_fill(refused) == EpochRefused(2)


def test_the_burst_score_reads_the_burst_ring_th_timer() -> None:
    """burst_score (lua/_lib.lua) sends the rank as text (a Lua number argument costs Redis a
    %.17g formatting): the text must stay BURST_RING - 1."""
    lib = library_source()
    ring = re.search(r"^local BURST_RING = (\d+)$", lib, re.M)
    rank = re.search(r"^local BURST_RANK = '(\d+)'", lib, re.M)
    assert ring and rank and int(rank.group(1)) == int(ring.group(1)) - 1


def test_the_scripts_and_the_tier_take_the_same_burst_span() -> None:
    """bursty (lua/_lib.lua) rings the burst bell for BURST_RING jobs due within BURST_SPAN_MS, and
    the owner's look_ahead expects a burst by the same span (scheduler/protocol/bells.py)."""
    span = re.search(r"^local BURST_SPAN_MS = (\d+)$", library_source(), re.M)
    assert span and int(span.group(1)) == bells.BURST_SPAN_MS
