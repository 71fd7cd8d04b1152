"""How the console's templates show times: the absolute UTC time in a ``<time>`` element (its
``datetime`` attribute is what console.js turns into the viewer's own zone on hover) followed by
the time relative to the page's rendering ("in 3h", "5m ago"), which needs no script."""
from __future__ import annotations

import time
from datetime import UTC, datetime

from markupsafe import Markup, escape

from .. import admin


def when(value: datetime | int | float | None, now: float | None = None) -> Markup:
    """``value`` (a datetime or epoch ms; None shows ``-``) as ``<time>`` plus its relative time,
    relative to ``now`` (epoch s; default the clock now)."""
    stamp = admin.iso(value)
    if stamp is None or value is None:
        return Markup("-")
    at = value.timestamp() if isinstance(value, datetime) else value / 1000
    rel = admin.human_delta(at - (time.time() if now is None else now))
    return Markup('<time datetime="{0}" class="when">{0}</time> <span class="rel">{1}</span>').format(
        escape(stamp), escape(rel))


def picker(value: datetime) -> str:
    """``value`` in UTC as a ``datetime-local`` field holds it (``2026-05-01T09:30:00``): the
    reschedule picker's starting value; console.js shows it in the viewer's zone."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
