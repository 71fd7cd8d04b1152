"""Cron schedules: validation and occurrence times (croniter + zoneinfo), shared by the client
(add_cron) and the scheduler tier (refilling a cron's table of upcoming occurrences).

Wall-clock semantics: "0 9 * * *" in America/New_York fires at 09:00 local time on both sides of a
DST change. Cron expressions are evaluated on naive local wall time and each wall time is mapped
to one instant: an ambiguous time (fall back) fires once, at its first instance; a nonexistent
time (spring forward) fires once, at the first valid instant after the gap (the transition).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

LOOKAHEAD = 32  # occurrences kept in Redis after the pending one; Lua consumes them while firing
MAX_JITTER_S = 86_400


@dataclass(frozen=True)
class CronInfo:
    """A cron as ``client.crons()`` reports it."""

    name: str
    expression: str
    tz: str
    queue: str
    misfire: str
    misfire_grace: float | None
    jitter: float
    next_fire: datetime | None        # when the pending occurrence fires (jitter applied)
    next_nominal: datetime | None     # the nominal time of the pending occurrence
    last_fired: datetime | None
    pending_id: str | None
    payload: Any = None
    paused: datetime | None = None    # when the cron was paused (client.pause_cron); None: active
    missed: int = 0                   # occurrences not run at their time (outages): coalesced or skipped


def validate_expression(expr: object) -> str:
    if not isinstance(expr, str):
        raise TypeError(f"cron expression must be a str, got {type(expr).__name__}")
    if not croniter.is_valid(expr):
        raise ValueError(
            f"cron expression {expr!r} is invalid: expected 5 fields 'minute hour day month weekday' "
            "(e.g. '0 9 * * *') or 6 with seconds last (e.g. '* * * * * */10')"
        )
    return expr


def validate_tz(tz: object) -> ZoneInfo:
    if not isinstance(tz, str) or not tz:
        raise TypeError(f"tz must be an IANA time zone name like 'Europe/Berlin', got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {tz!r}: expected an IANA name like 'UTC', 'Europe/Berlin', "
                         "'America/New_York'") from None


def _instant(wall: datetime, zone: ZoneInfo) -> datetime:
    """The one instant a local wall time stands for (see module docstring)."""
    first = wall.replace(tzinfo=zone, fold=0)
    if first.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall:
        return first.astimezone(UTC)
    # nonexistent: the transition instant lies between the two readings of the wall time
    lo = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    hi = first.astimezone(UTC)
    if lo > hi:
        lo, hi = hi, lo
    after = hi.astimezone(zone).utcoffset()
    while (hi - lo) > timedelta(seconds=1):
        mid = lo + (hi - lo) / 2
        if mid.astimezone(zone).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return hi.replace(microsecond=0)


def occurrences(expr: str, zone: ZoneInfo, after_ms: int, count: int) -> list[int]:
    """The next ``count`` nominal times (epoch ms) strictly after ``after_ms``."""
    after = datetime.fromtimestamp(after_ms / 1000, tz=UTC)
    it = croniter(expr, after.astimezone(zone).replace(tzinfo=None))
    out: list[int] = []
    last = after_ms
    guard = 0
    while len(out) < count:
        guard += 1
        if guard > count * 10 + 1000:
            break  # an expression that matches (almost) never, e.g. Feb 30
        try:
            wall = it.get_next(datetime)
        except CroniterBadDateError:
            break  # matches no date at all, e.g. Feb 30
        ms = int(_instant(wall, zone).timestamp() * 1000)
        if ms <= last:
            continue  # before 'after', or a second wall time mapped to the same instant
        out.append(ms)
        last = ms
    return out


def with_jitter(nominals: list[int], jitter_ms: int, rng: random.Random | None = None) -> list[tuple[int, int]]:
    """(nominal, fire) pairs: fire uniform in [nominal, nominal + jitter], kept ascending."""
    r = rng or random
    pairs = []
    prev_fire = -1
    for n in nominals:
        fire = n + (r.randint(0, jitter_ms) if jitter_ms else 0)
        fire = max(fire, prev_fire)  # fires stay in order, so Lua can consume the table in order
        pairs.append((n, fire))
        prev_fire = fire
    return pairs
