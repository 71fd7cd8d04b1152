"""Converting the ``at`` argument to epoch milliseconds, with clear errors for bad input."""
from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

MIN_MS = 0
MAX_MS = 253402300799999  # 9999-12-31T23:59:59.999Z


def to_ms(at: object, *, name: str = "at", now: float | None = None) -> int:
    """``at`` as epoch ms: an aware datetime, a timedelta from now, or epoch seconds (int/float)."""
    if isinstance(at, datetime):
        if at.tzinfo is None or at.tzinfo.utcoffset(at) is None:
            raise ValueError(
                f"{name} is a naive datetime ({at.isoformat()}); expected a timezone-aware datetime, "
                "e.g. datetime.now(timezone.utc) + timedelta(hours=4)"
            )
        secs = at.timestamp()
    elif isinstance(at, timedelta):
        secs = (time.time() if now is None else now) + at.total_seconds()
    elif isinstance(at, bool) or not isinstance(at, (int, float)):
        raise TypeError(
            f"{name} must be an aware datetime, a timedelta (from now) or epoch seconds (int/float), "
            f"got {type(at).__name__}"
        )
    else:
        secs = float(at)
        if not math.isfinite(secs):
            raise ValueError(f"{name} must be a finite number of epoch seconds, got {at!r}")
    ms = int(round(secs * 1000))
    if ms < MIN_MS or ms > MAX_MS:
        raise ValueError(f"{name} must be between 1970-01-01 and 9999-12-31 UTC, got {secs!r} epoch seconds")
    return ms


def ms_to_datetime(ms: int | float | None) -> datetime | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)
