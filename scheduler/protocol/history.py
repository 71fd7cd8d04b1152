"""The last hour per minute: the per-queue counts of jobs fired, acked, failed and dead that the
scripts keep per partition and minute (``tally`` and ``flush_bumps`` in lua/_lib.lua), and how a
reader sums them over the partitions into one series per queue and kind.

Layout: ``{ns:p}:hist:M`` is a hash for minute ``M`` (Redis server ms // 60 000) of partition
``p``, fields ``KIND:QUEUE`` -> count, written by the same atomic script as the transition it
counts (one HINCRBY per field and call). The hash carries the partition's hash tag, so it lives in
the partition's Redis Cluster slot, and expires :data:`TTL_S` seconds after it last gained a field:
a partition holds about 62 of them, whatever the job rate (bounded memory, no trimming pass).
Summing per queue over partitions happens in the reader, like the counters (``c``).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .keys import Keyspace

KINDS = ("fired", "acked", "failed", "dead")
"""The transitions counted per minute: ``fired`` (due -> ready), ``acked`` (a handler returned),
``failed`` (a handler raised: each failed attempt, retried or not; not a requested Retry), ``dead``
(attempts spent, a PermanentError, an expired last lease, a corrupt record)."""
MINUTES = 60
"""Minutes a chart shows, the current one included."""
TTL_S = 3720
"""How long a minute's hash outlives its last new field (lua/_lib.lua HISTORY_TTL_S): the hour the
chart shows and two minutes of slack for a reader whose minute is a little behind."""
MINUTE_MS = 60_000


def minute_of(ms: int) -> int:
    """The minute number (Redis ms // 60 000) the scripts file a count under."""
    return ms // MINUTE_MS


def minute_key(keyspace: Keyspace, partition: int, minute: int) -> str:
    """The hash of ``partition``'s counts in ``minute``."""
    return keyspace.key(partition, f"hist:{minute}")


@dataclass
class QueueHistory:
    """One queue's counts per minute, oldest first, ``first_minute`` the minute of index 0:
    ``series[kind][i]`` the count of ``kind`` (one of :data:`KINDS`) in minute ``first_minute + i``."""

    queue: str
    first_minute: int
    series: dict[str, list[int]]

    def total(self, kind: str) -> int:
        return sum(self.series[kind])

    def peak(self) -> int:
        """The largest count of any kind in any minute (0 for a quiet hour)."""
        return max((max(s) for s in self.series.values()), default=0)


def merge(first_minute: int, minutes: int, hashes: Iterable[tuple[int, Mapping[bytes | str, bytes | str]]]
          ) -> dict[str, QueueHistory]:
    """Sum the per-partition minute hashes (``(minute, HGETALL reply)`` pairs, any partition,
    any order) into one :class:`QueueHistory` per queue named in them, covering ``minutes`` minutes
    from ``first_minute``. Fields of another kind, or minutes outside the window, are ignored."""
    out: dict[str, QueueHistory] = {}
    for minute, fields in hashes:
        i = minute - first_minute
        if not 0 <= i < minutes:
            continue
        for raw, value in fields.items():
            name = raw.decode() if isinstance(raw, bytes) else raw
            kind, _, queue = name.partition(":")
            if kind not in KINDS or not queue:
                continue
            row = out.get(queue)
            if row is None:
                row = out[queue] = QueueHistory(queue, first_minute, {k: [0] * minutes for k in KINDS})
            row.series[kind][i] += int(value)
    return out
