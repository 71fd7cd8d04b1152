"""The worker registry: which worker processes of a namespace are alive, what they serve and how
busy they are (``zsched workers``, the WORKERS column of ``zsched stats``, the ``zsched_workers``
metrics). It is not job state: an entry says that a worker lives, nothing about any job.

Each ``Worker.serve()`` registers under a fresh id (``host-pid-random``) when it starts and
refreshes its record every ``registry_interval`` seconds (``lua/registry_beat.lua``). A record
counts as live for :data:`LIVENESS_INTERVALS` intervals after its last refresh, by Redis's clock:
a worker that was killed drops out of the live list by itself, and its record is deleted by the
next reader (``lua/registry_read.lua``) or the next refresh of any worker, a bounded number per
call. A graceful stop removes the record at once (``lua/registry_leave.lua``).

Keys (:attr:`.keys.Keyspace.workers_key`, :attr:`~.keys.Keyspace.workers_live_key`), both with the
hash tag ``{ns}`` (one cluster slot):

* ``{ns}:workers``: hash worker id -> ``LAST_MS:`` + the msgpack record, where LAST_MS is Redis's
  clock at the record's last refresh (written by the script, never by the worker);
* ``{ns}:workers:live``: sorted set worker id -> ms (Redis clock) until which the record is live.

The record is a msgpack map with short keys (a reader ignores keys it does not know and defaults
the ones it misses, so processes of different zsched versions share one registry):
``h`` host, ``p`` pid, ``q`` queues, ``c`` concurrency, ``pf`` prefetch, ``i`` refresh interval
ms, ``b`` handlers running (busy slots), ``r`` handlers running per queue (aligned with ``q``,
left out when none runs), ``hd`` jobs waiting on prefetch slots for their due time, ``n``
[claimed, acked] jobs since the start, ``up`` ms since the start by the worker's monotonic clock
(the start is LAST_MS - up, free of clock skew), ``s`` 1 while the worker stops (drains), ``v``
the zsched version, ``j`` the jobs whose handlers run, the :data:`MAX_CURRENT_JOBS` longest
running at most, each ``[id (15 bytes), queue index into q, ms it has run]`` (its start is LAST_MS
minus that, again free of skew; left out when none runs), ``al`` the ms an ack may wait for others
of its partition (``zsched worker --ack-linger``; left out when 0). At most
:data:`MAX_RECORD_BYTES` (the script refuses more).
"""
from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import msgpack

from .call import Call
from .errors import ZschedError
from .ids import ID_BYTES, encode_id
from .keys import Keyspace

MAX_RECORD_BYTES = 8192  # also in lua/registry_beat.lua
MAX_ID_BYTES = 200  # also in lua/registry_beat.lua
MAX_CURRENT_JOBS = 10
"""Running jobs a record names at most (the longest running): about 25 bytes each, so a refresh
stays one small write however large the worker's concurrency; ``busy`` counts them all."""
LIVENESS_INTERVALS = 3
"""A record is live until this many refresh intervals after its last refresh: one late or failed
refresh (a slow round trip, a failover) does not make a healthy worker look dead."""
MAX_INTERVAL_S = 3600.0  # the script's ttl limit (86 400 000 ms) is LIVENESS_INTERVALS times this and more
PRUNE_PER_BEAT = 4  # dead records a refresh deletes on the way: cleaning goes on with no reader
PRUNE_PER_READ = 100  # dead records a read deletes: bounded work per call, the rest go next time
_U64 = 2**64 - 1


class RecordTooLarge(ZschedError, ValueError):
    """A worker's record would be over :data:`MAX_RECORD_BYTES` (too many or too long queue names)."""


@lru_cache(maxsize=1)
def zsched_version() -> str:
    """The installed zsched's version, as a record carries it (``unknown`` when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zsched")
    except PackageNotFoundError:
        return "unknown"


def new_worker_id(host: str, pid: int) -> str:
    """A fresh id for one ``serve()``: ``host-pid-`` and 8 random hex digits (a pid is reused
    after a restart; the random part keeps the new process's record apart from the old one's)."""
    clean = "".join(ch if ch.isascii() and ch.isprintable() and not ch.isspace() else "_" for ch in host)[:64]
    return f"{clean or 'unknown'}-{pid}-{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class CurrentJob:
    """A job whose handler runs on a worker: its raw id, queue and how long it had run at the
    record's refresh (by the worker's monotonic clock)."""

    raw_id: bytes
    queue: str
    ran_s: float

    @property
    def id(self) -> str:
        """The job's public id."""
        return encode_id(self.raw_id)


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """What one worker process says about itself in the registry (see the module docstring)."""

    host: str
    pid: int
    queues: tuple[str, ...]
    concurrency: int
    prefetch: int
    interval_s: float
    busy: int = 0
    running: tuple[int, ...] = ()  # handlers running per queue, aligned with ``queues``; () when none
    held: int = 0
    claimed: int = 0
    acked: int = 0
    uptime_s: float = 0.0
    stopping: bool = False
    version: str = ""
    current: tuple[CurrentJob, ...] = ()  # the longest-running handlers' jobs, MAX_CURRENT_JOBS at most
    ack_linger_s: float = 0.0  # how long an ack may wait for others (Worker(ack_linger=...)); 0: never

    @property
    def free(self) -> int:
        """Handler slots not running a handler."""
        return max(0, self.concurrency - self.busy)

    def running_of(self, queue: str) -> int:
        """Handlers running jobs of ``queue``."""
        if not self.running:
            return 0
        try:
            return self.running[self.queues.index(queue)]
        except (ValueError, IndexError):
            return 0

    def worst_case(self) -> WorkerRecord:
        """This record with every number at its largest: if it fits, every refresh fits."""
        q = self.queues[-1] if self.queues else ""
        jobs = (CurrentJob(b"\xff" * ID_BYTES, q, 1e15),) * MAX_CURRENT_JOBS
        return WorkerRecord(self.host, self.pid, self.queues, self.concurrency, self.prefetch, self.interval_s,
                            _U64, (_U64,) * len(self.queues), _U64, _U64, _U64, 1e15, True, self.version, jobs,
                            self.ack_linger_s)


def encode_record(rec: WorkerRecord) -> bytes:
    """The record's bytes; :class:`RecordTooLarge` over :data:`MAX_RECORD_BYTES`."""
    doc: dict[str, Any] = {"h": rec.host, "p": rec.pid, "q": list(rec.queues), "c": rec.concurrency,
                           "pf": rec.prefetch, "i": round(rec.interval_s * 1000), "b": rec.busy, "hd": rec.held,
                           "n": [rec.claimed, rec.acked], "up": round(rec.uptime_s * 1000), "v": rec.version}
    if any(rec.running):
        doc["r"] = list(rec.running)
    if rec.stopping:
        doc["s"] = 1
    if rec.ack_linger_s > 0:
        doc["al"] = round(rec.ack_linger_s * 1000)
    if rec.current:
        index = {q: i for i, q in enumerate(rec.queues)}
        doc["j"] = [[j.raw_id, index.get(j.queue, 0), round(j.ran_s * 1000)] for j in rec.current[:MAX_CURRENT_JOBS]]
    data: bytes = msgpack.packb(doc, use_bin_type=True)
    if len(data) > MAX_RECORD_BYTES:
        raise RecordTooLarge(
            f"the worker's registry record would be {len(data)} bytes, over the {MAX_RECORD_BYTES}-byte limit "
            f"({len(rec.queues)} queues, {sum(len(q) for q in rec.queues)} characters of queue names): serve "
            "fewer queues per worker process")
    return data


def _typed(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = doc.get(key, default)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ValueError(f"registry record: {key!r} is a {type(value).__name__}")
    return value


def decode_record(data: bytes) -> WorkerRecord:
    """Read a record's bytes; ValueError when they are not a record (another format, damage)."""
    try:
        doc = msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several types for bad input
        raise ValueError(f"registry record is not msgpack: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"registry record is a {type(doc).__name__}, expected a map")
    queues = _typed(doc, "q", list, [])
    running = _typed(doc, "r", list, [])
    counts = _typed(doc, "n", list, [0, 0])
    if not all(isinstance(q, str) for q in queues) or not all(isinstance(n, int) for n in running + counts):
        raise ValueError("registry record: queues must be names and counts whole numbers")
    current = _current_jobs(_typed(doc, "j", list, []), queues)
    return WorkerRecord(
        host=_typed(doc, "h", str, "?"), pid=_typed(doc, "p", int, 0), queues=tuple(queues),
        concurrency=_typed(doc, "c", int, 0), prefetch=_typed(doc, "pf", int, 0),
        interval_s=_typed(doc, "i", int, 0) / 1000.0, busy=_typed(doc, "b", int, 0),
        running=tuple(running) if len(running) == len(queues) else (), held=_typed(doc, "hd", int, 0),
        claimed=counts[0] if counts else 0, acked=counts[1] if len(counts) > 1 else 0,
        uptime_s=_typed(doc, "up", int, 0) / 1000.0, stopping=bool(_typed(doc, "s", int, 0)),
        version=_typed(doc, "v", str, ""), current=current, ack_linger_s=_typed(doc, "al", int, 0) / 1000.0)


def _current_jobs(items: list[Any], queues: list[str]) -> tuple[CurrentJob, ...]:
    """The ``j`` entries of a record (see the module docstring); ValueError when malformed."""
    out = []
    for item in items[:MAX_CURRENT_JOBS]:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], bytes) and len(item[0]) == ID_BYTES
                and isinstance(item[1], int) and 0 <= item[1] < len(queues) and isinstance(item[2], int)):
            raise ValueError("registry record: a current job must be [15-byte id, queue index, ms]")
        out.append(CurrentJob(item[0], queues[item[1]], max(0, item[2]) / 1000.0))
    return tuple(out)


# -- calls -----------------------------------------------------------------------------------------
def _keys(ks: Keyspace) -> list[str]:
    return [ks.workers_key, ks.workers_live_key]


def beat_call(ks: Keyspace, worker_id: str, record: bytes, interval_s: float, prune: int = PRUNE_PER_BEAT) -> Call:
    """``registry_beat``: write ``record`` for ``worker_id``, live for :data:`LIVENESS_INTERVALS`
    times ``interval_s`` from Redis's now, deleting up to ``prune`` dead records of others."""
    ttl_ms = max(1, round(interval_s * LIVENESS_INTERVALS * 1000))
    return "registry_beat", _keys(ks), [worker_id, record, ttl_ms, prune]


def leave_call(ks: Keyspace, worker_id: str) -> Call:
    """``registry_leave``: remove ``worker_id``'s record (a graceful stop)."""
    return "registry_leave", _keys(ks), [worker_id]


def read_call(ks: Keyspace, prune: int = PRUNE_PER_READ) -> Call:
    """``registry_read``: the live records, deleting up to ``prune`` dead ones on the way."""
    return "registry_read", _keys(ks), [prune]


@dataclass(frozen=True, slots=True)
class WorkerEntry:
    """A live worker as read: its id, record, and the times by Redis's clock (epoch ms)."""

    id: str
    record: WorkerRecord
    last_ms: int  # the record's last refresh
    deadline_ms: int  # it counts as live until then

    @property
    def started_ms(self) -> int:
        """When the worker started (its last refresh minus its uptime then)."""
        return self.last_ms - round(self.record.uptime_s * 1000)

    def job_started_ms(self, job: CurrentJob) -> int:
        """When ``job``'s handler started, by Redis's clock (the refresh minus how long it had run)."""
        return self.last_ms - round(job.ran_s * 1000)


@dataclass(frozen=True, slots=True)
class QueueWorkers:
    """One queue's share of the serving workers. ``workers``: processes serving it; ``slots``
    their handler slots and ``free`` those not running a handler (a process serving several queues
    counts its slots under each: a free one takes a job of any of them); ``busy``: handlers running
    this queue's jobs (these add up across queues)."""

    workers: int = 0
    slots: int = 0
    busy: int = 0
    free: int = 0


@dataclass(frozen=True, slots=True)
class RegistrySnapshot:
    """One read of the registry: Redis's clock, the live workers (serving or stopping), the ids
    whose record could not be read, and how many dead records the read deleted."""

    now_ms: int
    workers: list[WorkerEntry]
    unreadable: list[str] = field(default_factory=list)
    pruned: int = 0

    @property
    def serving(self) -> list[WorkerEntry]:
        """The live workers that are not stopping: the ones that take new jobs."""
        return [w for w in self.workers if not w.record.stopping]

    def by_queue(self, also: Iterable[str] = ()) -> dict[str, QueueWorkers]:
        """Per queue (those the serving workers serve, plus ``also`` at zero), sorted by name."""
        acc: dict[str, list[int]] = {q: [0, 0, 0, 0] for q in also}
        for w in self.serving:
            rec = w.record
            for q in rec.queues:
                a = acc.setdefault(q, [0, 0, 0, 0])
                a[0] += 1
                a[1] += rec.concurrency
                a[2] += rec.running_of(q)
                a[3] += rec.free
        return {q: QueueWorkers(*acc[q]) for q in sorted(acc)}

    def totals(self) -> QueueWorkers:
        """Every serving worker once: processes, handler slots, busy and free."""
        live = self.serving
        return QueueWorkers(len(live), sum(w.record.concurrency for w in live), sum(w.record.busy for w in live),
                            sum(w.record.free for w in live))


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def parse_read(reply: Sequence[Any]) -> RegistrySnapshot:
    """Read a ``registry_read`` reply (layout in ``lua/registry_read.lua``); workers sorted by host,
    pid and id. A record that cannot be read is listed in ``unreadable``, never raised."""
    workers: list[WorkerEntry] = []
    unreadable: list[str] = []
    for i in range(2, len(reply) - 2, 3):
        wid, deadline, value = _text(reply[i]), int(float(reply[i + 1])), bytes(reply[i + 2])
        stamp, sep, data = value.partition(b":")
        try:
            if not sep or not stamp.isdigit():
                raise ValueError("registry value without its LAST_MS: prefix")
            workers.append(WorkerEntry(wid, decode_record(data), int(stamp), deadline))
        except ValueError:
            unreadable.append(wid)
    workers.sort(key=lambda w: (w.record.host, w.record.pid, w.id))
    return RegistrySnapshot(int(reply[0]), workers, sorted(unreadable), int(reply[1]))
