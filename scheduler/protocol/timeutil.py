"""Converting the ``at`` argument to epoch milliseconds, with clear errors for bad input."""
from __future__ import annotations

import math
import reprlib
import time
from datetime import UTC, datetime, timedelta

MIN_MS = 0
MAX_MS = 253402300799999  # 9999-12-31T23:59:59.999Z
MIN_EPOCH_S = 1_000_000_000  # 2001-09-09T01:46:40Z: a job's time given as a smaller number is refused
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

At = datetime | timedelta | int | float
"""A job's time: an aware datetime, a timedelta from now (Redis's clock), or epoch seconds."""
_US = timedelta(microseconds=1)


def to_ms(at: object, *, name: str = "at", now: float | None = None) -> int:
    """``at`` as epoch ms: an aware datetime, a timedelta from now, or epoch seconds (int/float).

    TypeError for another type; ValueError for a naive datetime and for any time outside
    1970-01-01 .. 9999-12-31 UTC, whatever its size (inf, nan, 1e308, a 400-digit int, the largest
    timedelta, datetime.min in a zone east of UTC): never OverflowError."""
    if isinstance(at, datetime):
        if at.tzinfo is None or at.tzinfo.utcoffset(at) is None:
            raise ValueError(
                f"{name} is a naive datetime ({at.isoformat()}); expected a timezone-aware datetime, "
                "e.g. datetime.now(timezone.utc) + timedelta(hours=4)"
            )
        # whole microseconds: a float timestamp rounds datetime.max up into year 10000
        us = (at - _EPOCH) // _US
        if not MIN_MS * 1000 <= us < (MAX_MS + 1) * 1000:
            raise _out_of_range(name, at.isoformat())
        return min((us + 500) // 1000, MAX_MS)
    if isinstance(at, timedelta):
        secs = (time.time() if now is None else now) + at.total_seconds()
    elif isinstance(at, bool) or not isinstance(at, (int, float)):
        raise TypeError(
            f"{name} must be an aware datetime, a timedelta (from now) or epoch seconds (int/float), "
            f"got {type(at).__name__}"
        )
    else:
        if isinstance(at, float) and not math.isfinite(at):
            raise ValueError(f"{name} must be a finite number of epoch seconds, got {at!r}")
        try:
            secs = float(at)
        except OverflowError:  # an int too large for a float is out of range as surely as 1e308
            secs = math.inf if at > 0 else -math.inf
    ms = secs * 1000  # finite seconds may still overflow here (1e308): compare before int()
    if not MIN_MS <= ms < MAX_MS + 1:
        # reprlib: a 400-digit int is not quoted whole
        raise _out_of_range(name, f"now + {at!r}" if isinstance(at, timedelta) else f"{reprlib.repr(at)} epoch seconds")
    return min(int(round(ms)), MAX_MS)


def job_time_ms(at: object, *, name: str = "at", now: float | None = None) -> int:
    """:func:`to_ms` for the time a job runs at (``schedule``, ``reschedule``, ``requeue``), which
    also refuses epoch seconds below 1e9, before 2001-09-09 (:data:`MIN_EPOCH_S`): ``schedule(30, ...)`` meant "in
    30 seconds" and ran at once, being 1970-01-01T00:00:30Z. A duration is a timedelta; "now" is
    ``timedelta(0)``; a datetime is taken whatever its year."""
    ms = to_ms(at, name=name, now=now)
    if not isinstance(at, datetime | timedelta) and ms < MIN_EPOCH_S * 1000:
        what = "timedelta(0) for now" if ms == 0 else \
            f"timedelta(seconds={reprlib.repr(at)}) for \"in {reprlib.repr(at)} seconds\", timedelta(0) for now"
        raise ValueError(f"{name}={reprlib.repr(at)} is epoch seconds, i.e. {ms_to_datetime(ms):%Y-%m-%dT%H:%M:%SZ}; "
                         f"numbers below 1e9 (2001-09-09) are refused as likely durations: pass {what}")
    return ms


def _out_of_range(name: str, given: str) -> ValueError:
    return ValueError(f"{name} must be between 1970-01-01 and 9999-12-31 UTC, got {given}")


def ms_to_datetime(ms: int | float | None) -> datetime | None:
    """Epoch ms as an aware UTC datetime (None stays None); exact, where a float timestamp is off
    by microseconds in far years."""
    if ms is None:
        return None
    return _EPOCH + timedelta(milliseconds=ms)
