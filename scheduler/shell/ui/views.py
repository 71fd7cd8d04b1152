"""What the console's pages show, read through the client and the admin helpers the CLI uses."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ...client import Client
from ...protocol.models import JobInfo
from ...protocol.replies import StatsReply, parse_stats
from .. import admin
from ..admin.jobs import find_finished_by_key

STATES = ("scheduled", "held", "ready", "running", "dead")


@dataclass
class QueueRow:
    name: str
    counts: dict[str, int]
    fired_per_s: float | None = None
    acked_per_s: float | None = None
    paused_since: datetime | None = None


@dataclass
class PartitionRow:
    partition: int
    owner: str | None
    epoch: int
    lease: str
    earliest_due: datetime | None
    oldest_due_age: float
    counts: dict[str, int]


@dataclass
class Overview:
    namespace: str
    now: datetime
    queues: list[QueueRow]
    partitions: list[PartitionRow]
    owners_source: str
    owners_error: str | None = None
    totals: dict[str, int] = field(default_factory=dict)


class Rates:
    """Fired and acked per second per queue, from the Redis-kept counters of successive reads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[float, dict[str, int]] | None = None

    def update(self, counters: dict[str, int]) -> dict[str, float] | None:
        now = time.monotonic()
        with self._lock:
            last, self._last = self._last, (now, counters)
        if last is None or now - last[0] < 0.2:
            return None
        dt = now - last[0]
        return {k: max(0.0, (v - last[1].get(k, 0)) / dt) for k, v in counters.items()}


def _queue_counts(stats: list[StatsReply]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for st in stats:
        for q, counts in st.queues().items():
            row = out.setdefault(q, dict.fromkeys(STATES, 0))
            for s, n in counts.items():
                row[s] += n
        for f, n in st.gauges.items():
            kind, _, q = f.partition(":")
            if kind == "h":
                out.setdefault(q, dict.fromkeys(STATES, 0))["held"] += n
    out.pop("?", None)
    return out


def overview(client: Client, rates: Rates, etcd: str | None, etcd_timeout: float = 1.0) -> Overview:
    """Counts per queue and state, rates, oldest due age, partitions and their owners."""
    stats = [parse_stats(r) for r in client.transport.call_many(client.calls.stats_calls())]
    now_ms = admin.redis_now_ms(client)
    counters: dict[str, int] = {}
    for st in stats:
        for k, v in st.counters.items():
            counters[k] = counters.get(k, 0) + v
    per_s = rates.update(counters)
    paused = client.paused()
    counts = _queue_counts(stats)
    queues = []
    for q in sorted(set(counts) | set(paused)):
        row = QueueRow(q, counts.get(q, dict.fromkeys(STATES, 0)), paused_since=paused.get(q))
        if per_s is not None:
            row.fired_per_s, row.acked_per_s = per_s.get(f"fired:{q}", 0.0), per_s.get(f"acked:{q}", 0.0)
        queues.append(row)
    owners: dict[int, tuple[str, int, int]] = {}
    source, err = "not configured", None
    if etcd:
        try:
            owners = admin.read_owner_leases(etcd, client.keyspace.namespace, timeout=etcd_timeout)
            source = "etcd"
        except Exception as exc:  # noqa: BLE001 - any etcd failure shows owners as unknown
            source, err = "unavailable", admin.etcd_failure(exc)
    parts = []
    for p, st in enumerate(stats):
        owner = owners.get(p)
        per_state = dict.fromkeys(STATES, 0)
        for c in st.queues().values():
            for s, n in c.items():
                per_state[s] += n
        due = st.earliest_due_ms
        parts.append(PartitionRow(p, owner[0] if owner else None, owner[1] if owner else st.epoch,
                                  f"{owner[2]:x}" if owner and owner[2] else "-",
                                  datetime.fromtimestamp(due / 1000, tz=UTC) if due is not None else None,
                                  max(0.0, (now_ms - due) / 1000) if due is not None else 0.0, per_state))
    totals = {s: sum(q.counts.get(s, 0) for q in queues) for s in STATES}
    return Overview(client.keyspace.namespace, datetime.fromtimestamp(now_ms / 1000, tz=UTC), queues, parts,
                    source, err, totals)


FINISHED_SCANS = threading.Lock()
"""One search of a partition's tombstones at a time per console: pages need no login, so this
bounds what repeated look-ups of unknown keys can ask of Redis to one HSCAN walk at a time."""


def find_job(client: Client, text: str) -> tuple[JobInfo | None, bool]:
    """A job by its id, or else by its idempotency key: the live job holding it, or else the job
    that last finished with it while its tombstone lives; and whether the search was complete
    (False: the key's partition has more tombstones than a look-up reads)."""
    text = text.strip()
    try:
        info = client.get(text)
        if info is not None:
            return info, True
    except ValueError:
        pass  # not an id: try it as a key
    try:
        live = client.get_by_key(text)
        if live is not None:
            return live, True
        with FINISHED_SCANS:
            return find_finished_by_key(client, text)
    except ValueError:
        return None, True


FILL_CALLS = 8  # jobs() calls at most per console page of scheduled jobs (each bounded itself)


def jobs_page(client: Client, queue: str, state: str, limit: int, cursor: str | None, start: datetime | None,
              end: datetime | None) -> tuple[list[JobInfo], str | None, bool]:
    """One console page of a queue's jobs: (rows, next cursor, whether the run_at filter was applied
    to this page only). Scheduled jobs are ordered by run_at, so the range is pushed into the read
    and the page is topped up (at most FILL_CALLS reads) until it is full or the listing ends. Other
    states have no run_at order: their fetched page is filtered, so it may come back short."""
    if state != "scheduled":
        rows, nxt = admin.list_jobs(client, queue, state, limit, cursor)
        return [r for r in rows if in_range(r.run_at, start, end)], nxt, start is not None or end is not None
    out: list[JobInfo] = []
    for _ in range(FILL_CALLS):
        rows, cursor = admin.list_jobs(client, queue, state, limit - len(out), cursor, start, end)
        out += rows
        if cursor is None or len(out) >= limit:
            break
    return out, cursor, False


def in_range(at: datetime | None, start: datetime | None, end: datetime | None) -> bool:
    """Whether ``at`` lies in [start, end] (open ends where None)."""
    if start is None and end is None:
        return True
    if at is None:
        return False
    return (start is None or at >= start) and (end is None or at <= end)
