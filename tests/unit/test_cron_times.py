"""Cron occurrence times: expressions, time zones, DST forward and backward (no Redis needed)."""
from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduler.protocol.cron import occurrences, validate_expression, validate_tz, with_jitter


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def utc(*a: int) -> datetime:
    return datetime(*a, tzinfo=UTC)


def local(ms_: int, tz: str) -> str:
    return datetime.fromtimestamp(ms_ / 1000, tz=ZoneInfo(tz)).strftime("%Y-%m-%d %H:%M:%S %Z")


def test_minute_hourly_monthly() -> None:
    z = ZoneInfo("UTC")
    assert occurrences("*/15 * * * *", z, ms(utc(2026, 1, 1, 10, 7)), 3) == [
        ms(utc(2026, 1, 1, 10, 15)), ms(utc(2026, 1, 1, 10, 30)), ms(utc(2026, 1, 1, 10, 45))]
    assert occurrences("0 * * * *", z, ms(utc(2026, 1, 1, 23, 0)), 2) == [
        ms(utc(2026, 1, 2, 0, 0)), ms(utc(2026, 1, 2, 1, 0))]
    assert occurrences("0 0 1 * *", z, ms(utc(2026, 1, 15)), 3) == [
        ms(utc(2026, 2, 1)), ms(utc(2026, 3, 1)), ms(utc(2026, 4, 1))]
    # seconds field (6th) for short-interval schedules
    assert occurrences("* * * * * */10", z, ms(utc(2026, 1, 1, 0, 0, 1)), 2) == [
        ms(utc(2026, 1, 1, 0, 0, 10)), ms(utc(2026, 1, 1, 0, 0, 20))]


@pytest.mark.parametrize("tz,spring,fall", [
    ("America/New_York", (2026, 3, 8), (2026, 11, 1)),
    ("Europe/Berlin", (2026, 3, 29), (2026, 10, 25)),
])
def test_daily_at_nine_local_on_both_sides_of_dst(tz: str, spring: tuple, fall: tuple) -> None:
    z = ZoneInfo(tz)
    for day in (spring, fall):
        start = datetime(*day, 12, tzinfo=z) - timedelta(days=2)
        got = occurrences("0 9 * * *", z, ms(start), 4)
        assert [local(g, tz)[11:19] for g in got] == ["09:00:00"] * 4
        offsets = {datetime.fromtimestamp(g / 1000, tz=z).utcoffset() for g in got}
        assert len(offsets) == 2, "the run crosses the DST change"


def test_nonexistent_time_fires_once_at_the_transition() -> None:
    tz = "America/New_York"  # 2026-03-08 02:00 EST -> 03:00 EDT
    z = ZoneInfo(tz)
    got = occurrences("30 2 * * *", z, ms(utc(2026, 3, 7, 12)), 3)
    assert [local(g, tz) for g in got] == [
        "2026-03-08 03:00:00 EDT", "2026-03-09 02:30:00 EDT", "2026-03-10 02:30:00 EDT"]
    # every minute of the gap maps to the same instant: it must fire once, not 60 times
    got = occurrences("* 2-3 8 3 *", z, ms(utc(2026, 3, 8, 6, 58)), 3)
    assert [local(g, tz) for g in got] == ["2026-03-08 03:00:00 EDT", "2026-03-08 03:01:00 EDT",
                                           "2026-03-08 03:02:00 EDT"]


def test_ambiguous_time_fires_once() -> None:
    tz = "Europe/Berlin"  # 2026-10-25 03:00 CEST -> 02:00 CET: 02:30 happens twice
    z = ZoneInfo(tz)
    got = occurrences("30 2 * * *", z, ms(utc(2026, 10, 24, 12)), 2)
    assert [local(g, tz) for g in got] == ["2026-10-25 02:30:00 CEST", "2026-10-26 02:30:00 CET"]
    hourly = occurrences("0 * * * *", z, ms(utc(2026, 10, 24, 22, 30)), 5)
    walls = [local(g, tz)[11:16] for g in hourly]
    assert walls == ["01:00", "02:00", "03:00", "04:00", "05:00"], "the repeated hour fires once"


def test_jitter_spreads_within_window_and_keeps_order() -> None:
    nominals = [i * 60_000 for i in range(1, 200)]
    pairs = with_jitter(nominals, 60_000, random.Random(3))
    assert all(n <= f <= n + 60_000 for n, f in pairs)
    fires = [f for _, f in pairs]
    assert fires == sorted(fires)
    assert max(f - n for n, f in pairs) > 50_000


@pytest.mark.parametrize("expr", ["", "61 * * * *", "* * *", "every day", "0 25 * * *"])
def test_invalid_expressions(expr: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        validate_expression(expr)


def test_unknown_time_zone() -> None:
    with pytest.raises(ValueError, match="unknown time zone"):
        validate_tz("Mars/Olympus")


def test_expression_that_never_fires_yields_nothing() -> None:
    assert occurrences("0 0 30 2 *", ZoneInfo("UTC"), 0, 3) == []
