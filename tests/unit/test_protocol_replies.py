"""Typed replies (scheduler/protocol/replies.py) and jobs() cursors (listing.py), without Redis."""
from __future__ import annotations

import pytest

from scheduler.protocol.listing import decode_cursor, encode_cursor
from scheduler.protocol.replies import merge_stats, parse_error, parse_schedule, parse_stats


def test_schedule_reply() -> None:
    reply = [1_700_000_000_123, 1, 2, b"a" * 15, b"b" * 15, b"c" * 15]
    ids, misfired, now = parse_schedule(reply)
    assert ids == [b"a" * 15, b"b" * 15, b"c" * 15] and misfired == [1] and now == 1_700_000_000_123


def test_error_blob_is_nul_separated_text() -> None:
    err = parse_error(b"1700000000000\0ValueError\0bad value\0Traceback ...")
    assert err is not None and (err.type, err.message, err.traceback) == ("ValueError", "bad value", "Traceback ...")
    assert err.at is not None and err.at.year == 2023
    assert parse_error(None) is None and parse_error(b"") is None
    short = parse_error(b"x\0T")  # a tombstone's cut error: no message, no traceback
    assert short is not None and (short.at, short.type, short.message) == (None, "T", "")


def test_stats_reply_and_merge() -> None:
    a = parse_stats([[b"s:q", b"2", b"h:q", b"1", b"a:q", b"1", b"d:r", b"4"], [b"fired:q", b"9"],
                     [b"q", 3, b"r", 0], b"1700000000000", 2, 1, 4, b"7"])
    b = parse_stats([[b"s:q", b"1"], [], [b"q", 1], -1, 1, 0, 0, b"0"])
    assert a.gauges["h:q"] == 1 and a.counters == {"fired:q": 9} and a.ready == {"q": 3, "r": 0}
    assert (a.earliest_due_ms, a.timers, a.in_flight, a.dead, a.epoch) == (1_700_000_000_000, 2, 1, 4, 7)
    assert b.earliest_due_ms is None
    assert a.queues() == {"q": {"scheduled": 2, "ready": 3, "running": 1, "dead": 0},
                          "r": {"scheduled": 0, "ready": 0, "running": 0, "dead": 4}}
    assert merge_stats([a, b])["q"] == {"scheduled": 3, "ready": 4, "running": 1, "dead": 0}


def test_cursor_round_trip_and_refusals() -> None:
    pos = b"t1700000000000," + b"\x01" * 15
    cur = encode_cursor("scheduled", "q", None, pos)  # a watermark, in every partition
    assert decode_cursor(cur, "scheduled", "q", 4) == (None, pos)
    with pytest.raises(ValueError, match="not 'ready' in 'q'"):
        decode_cursor(cur, "ready", "q", 4)
    with pytest.raises(ValueError, match="listing of an older zsched, partition by partition"):
        decode_cursor(encode_cursor("scheduled", "q", 3, pos), "scheduled", "q", 4)
    ready = b"r5," + b"\x01" * 15
    assert decode_cursor(encode_cursor("ready", "q", 3, ready), "ready", "q", 4) == (3, ready)
    with pytest.raises(ValueError, match="partition '3'"):
        decode_cursor(encode_cursor("ready", "q", 3, ready), "ready", "q", 2)
    with pytest.raises(ValueError, match=r"partition '\*'"):
        decode_cursor(encode_cursor("ready", "q", None, ready), "ready", "q", 2)
    with pytest.raises(ValueError, match="position is malformed"):
        decode_cursor(encode_cursor("ready", "q", 0, b"r0," + b"\x01" * 15), "ready", "q", 1)
    with pytest.raises(ValueError, match="non-empty string"):
        decode_cursor("", "ready", "q", 1)
