"""How the console's templates show times: the absolute UTC time in a ``<time>`` element (its
``datetime`` attribute is what console.js turns into the viewer's own zone on hover) followed by
the time relative to the page's rendering ("in 3h", "5m ago"), which needs no script. The markup
is the ``when`` macro of templates/present.html; these are its filters."""
from __future__ import annotations

import time
from datetime import UTC, datetime

from .. import admin


def relative(value: datetime | int | float, now: float | None = None) -> str:
    """``value`` (a datetime or epoch ms) relative to ``now`` (epoch s; default the clock now):
    ``in 3h``, ``5m10s ago``, ``now``."""
    at = value.timestamp() if isinstance(value, datetime) else value / 1000
    return admin.human_delta(at - (time.time() if now is None else now))


def picker(value: datetime) -> str:
    """``value`` in UTC as a ``datetime-local`` field holds it (``2026-05-01T09:30:00``): the
    reschedule picker's starting value; console.js shows it in the viewer's zone."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
