"""The console's view of the worker processes: the workers page (``/workers``) and, on the
overview, which queues have jobs waiting and no live worker to run them. Both come from one read
of the worker registry (:mod:`scheduler.protocol.registry`), the one ``zsched workers`` makes, sent
with no pruning: a page view never writes, so a ``--read-only`` console may use a read-only
Redis user."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from ...client import Client
from ...protocol.registry import QueueWorkers, RegistrySnapshot, WorkerEntry
from .. import admin


@dataclass(frozen=True)
class RunningJob:
    """One job a worker's handler runs, as the workers page shows it."""

    id: str
    queue: str
    started: datetime
    ran_s: float


@dataclass(frozen=True)
class WorkerRow:
    """One live worker process on the workers page (times by Redis's clock)."""

    entry: WorkerEntry
    state: str
    heartbeat_age_s: float
    uptime_s: float
    jobs: list[RunningJob]

    @property
    def unnamed(self) -> int:
        """Running handlers whose job the record does not name (it names the longest-running)."""
        return max(0, self.entry.record.busy - len(self.jobs))


@dataclass
class Fleet:
    """One read of the registry, or the reason it could not be read (``error``)."""

    now: datetime | None = None
    workers: list[WorkerRow] = field(default_factory=list)
    queues: dict[str, QueueWorkers] = field(default_factory=dict)
    totals: QueueWorkers = field(default_factory=QueueWorkers)
    unreadable: list[str] = field(default_factory=list)
    error: str | None = None

    def serves(self, queue: str) -> bool:
        """Whether a live worker that is not stopping serves ``queue``."""
        return self.queues.get(queue, QueueWorkers()).workers > 0


def _ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _row(w: WorkerEntry, now_ms: int) -> WorkerRow:
    jobs = [RunningJob(j.id, j.queue, _ms(w.job_started_ms(j)), max(0.0, (now_ms - w.job_started_ms(j)) / 1000))
            for j in w.record.current]
    return WorkerRow(w, admin.worker_state(w), max(0.0, (now_ms - w.last_ms) / 1000),
                     max(0.0, (now_ms - w.started_ms) / 1000), jobs)


def from_snapshot(snap: RegistrySnapshot) -> Fleet:
    """The page's rows from one registry read."""
    return Fleet(_ms(snap.now_ms), [_row(w, snap.now_ms) for w in snap.workers], snap.by_queue(), snap.totals(),
                 snap.unreadable)


def read_fleet(client: Client) -> Fleet:
    """The live workers now; a Fleet with ``error`` set when the registry cannot be read (an ACL
    user without its keys), so a page still renders and says why."""
    try:
        return from_snapshot(admin.read_registry(client, prune=0))
    except admin.Refused as exc:
        return Fleet(error=str(exc))


@dataclass(frozen=True)
class Unserved:
    """A queue with jobs to run (ready, or due and held by its rate limit) and no live worker
    serving it. ``paused``: the queue is paused as well, so nothing would run anyway: the overview
    says so instead of warning."""

    queue: str
    waiting: int
    paused: bool
    ready: int = 0  # of ``waiting``, those in the ready list (the rest are held: the scheduled list)


def unserved(fleet: Fleet, counts: dict[str, dict[str, int]], paused: set[str]) -> dict[str, Unserved]:
    """Per queue name, the queues whose due jobs no live worker serves (none when the registry could
    not be read: no warning is better than a false one; the overview shows the read's error)."""
    if fleet.error is not None:
        return {}
    out = {}
    for q, c in counts.items():
        waiting = c.get("ready", 0) + c.get("held", 0)
        if waiting and not fleet.serves(q):
            out[q] = Unserved(q, waiting, q in paused, c.get("ready", 0))
    return out
