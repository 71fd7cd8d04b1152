"""Exceptions a handler raises to choose what happens to its job."""
from __future__ import annotations

import contextlib
import math
import reprlib
from datetime import timedelta


class Retry(Exception):
    """Raise from a handler to run the job again after ``delay`` seconds (or a timedelta).

    The attempt counts like a failure against ``max_attempts`` (it was a claim), but the error is
    recorded as a requested retry, not a failure. ``delay=None`` uses the job's exponential
    backoff with full jitter, as for an ordinary exception.
    """

    def __init__(self, delay: float | timedelta | None = None, message: str = "") -> None:
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        if delay is not None:
            seconds = math.nan
            if isinstance(delay, (int, float)) and not isinstance(delay, bool):
                with contextlib.suppress(OverflowError):  # an int beyond any float is no finite delay either
                    seconds = float(delay)
            if not math.isfinite(seconds):
                raise TypeError(f"Retry delay must be a finite number of seconds or a timedelta, "
                                f"got {reprlib.repr(delay)}")
            delay = max(0.0, seconds)
        self.delay: float | None = delay
        self.message = message
        super().__init__(message or (f"retry requested in {delay:g} s" if delay is not None else "retry requested"))


class PermanentError(Exception):
    """Raise from a handler when retrying cannot help (bad input, ...): the job is dead-lettered now,
    with this error as its last error, whatever attempts remain."""
