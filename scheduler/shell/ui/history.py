"""The overview's last-hour charts: per queue, jobs fired, acked, failed and dead per minute, read
from the per-partition minute hashes the scripts keep (:mod:`scheduler.protocol.history`) and drawn
as inline SVG on the server (no script, no library, no CDN: the page's CSP allows neither).

The console reads a finished minute once and keeps it (a minute no script writes to any more
does not change); only the current and the previous minute are read again on each refresh, so a
refresh costs two HGETALLs per partition, pipelined, after the first page's 60."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ...client import Client
from ...protocol import history
from ...protocol.history import KINDS, MINUTES, QueueHistory

WIDTH, HEIGHT = 600, 110   # the SVG's box, px
LEFT, BOTTOM, TOP = 44, 16, 6  # room for the y labels, the x labels, the top line
RIGHT = WIDTH - 4
STEP = (RIGHT - LEFT) / MINUTES  # px per minute
GEOMETRY = {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": RIGHT, "top": TOP, "base": HEIGHT - BOTTOM,
            "middle": (LEFT + RIGHT) / 2, "step": STEP}
"""The frame the template draws around the lines (templates/history.html)."""


class HistoryCache:
    """Finished minutes' hashes per partition, read once; thread-safe (pages render in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done: dict[tuple[int, int], dict[Any, Any]] = {}

    def read(self, client: Client, now_ms: int) -> tuple[int, dict[str, QueueHistory]]:
        """The window's first minute and the per-queue history of the hour up to ``now_ms``."""
        ks = client.keyspace
        current = history.minute_of(now_ms)
        first = current - MINUTES + 1
        with self._lock:
            for key in [k for k in self._done if k[1] < first]:
                del self._done[key]  # out of the window: memory stays at one hour
            known = dict(self._done)
        wanted = [(p, m) for p in range(ks.partitions) for m in range(first, current + 1)
                  if (p, m) not in known or m >= current - 1]
        pipe = client.redis.pipeline(transaction=False)
        for p, m in wanted:
            pipe.hgetall(history.minute_key(ks, p, m))
        replies = pipe.execute() if wanted else []
        fresh = dict(zip(wanted, replies, strict=True))
        with self._lock:
            for (p, m), reply in fresh.items():
                if m < current - 1:  # no script files a count under a minute that has passed
                    self._done[(p, m)] = reply
        known.update(fresh)
        return first, history.merge(first, MINUTES, ((m, h) for (_p, m), h in known.items()))


@dataclass
class Chart:
    """One queue's chart, ready for the template: polyline points per kind, the y scale's top,
    and per minute its column's x and a hover text."""

    queue: str
    top: int
    lines: dict[str, str]
    totals: dict[str, int]
    columns: list[tuple[float, str]]


def nice_top(peak: int) -> int:
    """The y axis's top: the peak rounded up to 1, 2 or 5 times a power of ten (at least 1)."""
    top = 1
    while True:
        for m in (1, 2, 5):
            if top * m >= peak:
                return top * m
        top *= 10


def chart(h: QueueHistory) -> Chart:
    """Geometry of ``h``'s chart in the :data:`WIDTH` x :data:`HEIGHT` box."""
    top = nice_top(h.peak())
    span = HEIGHT - BOTTOM - TOP

    def y(v: int) -> str:
        return f"{TOP + span - v * span / top:.1f}"

    lines = {k: " ".join(f"{LEFT + (i + 0.5) * STEP:.1f},{y(v)}" for i, v in enumerate(h.series[k])) for k in KINDS}
    columns = []
    for i in range(MINUTES):
        at = datetime.fromtimestamp((h.first_minute + i) * 60, tz=UTC).strftime("%H:%M UTC")
        text = f"{at}: " + ", ".join(f"{k} {h.series[k][i]}" for k in KINDS)
        columns.append((LEFT + i * STEP, text))
    return Chart(h.queue, top, lines, {k: h.total(k) for k in KINDS}, columns)


def charts(cache: HistoryCache, client: Client, now_ms: int, queues: list[str]) -> list[Chart]:
    """A chart per queue of ``queues`` (the overview's, in its order) and per queue that only the
    last hour still names (retired or renamed since), each with its hour's counts."""
    first, per_queue = cache.read(client, now_ms)
    empty = {k: [0] * MINUTES for k in KINDS}
    order = list(queues) + sorted(set(per_queue) - set(queues))
    return [chart(per_queue.get(q) or QueueHistory(q, first, {k: list(v) for k, v in empty.items()}))
            for q in order]
