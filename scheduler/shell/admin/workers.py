"""``zsched workers`` and the WORKERS column of ``zsched stats``: the live worker processes of a
namespace, read from the worker registry (:mod:`scheduler.protocol.registry`)."""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

from redis.exceptions import NoPermissionError

from ...client import Client
from ...protocol.registry import PRUNE_PER_READ, QueueWorkers, RegistrySnapshot, WorkerEntry, parse_read, read_call
from .errors import Refused
from .output import iso


def read_registry(client: Client, prune: int = PRUNE_PER_READ) -> RegistrySnapshot:
    """The live workers (one script call; it also deletes up to ``prune`` dead records: 0 for a
    reader that must not write, like a ``--read-only`` console). :class:`~.errors.Refused` when this
    user's ACL lacks the registry keys."""
    ks = client.keyspace
    try:
        return parse_read(client.transport.call(*read_call(ks, prune)))
    except NoPermissionError as exc:
        raise Refused(f"Redis refused this user the worker registry ({exc}) (its ACL user needs read and write "
                      f"access to the keys {ks.workers_key} and {ks.workers_live_key}: see 'ACL users' in "
                      "docs/operations.md)") from exc


def listed(snap: RegistrySnapshot, queue: str | None = None) -> list[WorkerEntry]:
    """The live workers, or those serving ``queue``; sorted by host, pid and id."""
    return [w for w in snap.workers if queue is None or queue in w.record.queues]


def queue_summary(snap: RegistrySnapshot, queue: str | None = None) -> dict[str, QueueWorkers]:
    """Per queue the serving workers (see :class:`~scheduler.protocol.registry.QueueWorkers`): every
    queue they serve, or ``queue`` alone (at zero when none serves it)."""
    if queue is None:
        return snap.by_queue()
    return {queue: snap.by_queue(also=[queue])[queue]}


def worker_doc(w: WorkerEntry, now_ms: int) -> dict[str, Any]:
    """One live worker as JSON (times: ISO-8601 and epoch ms, by Redis's clock)."""
    r = w.record
    return {
        "id": w.id, "host": r.host, "pid": r.pid, "queues": list(r.queues), "state": worker_state(w),
        "concurrency": r.concurrency, "prefetch": r.prefetch, "busy": r.busy, "free": r.free, "held": r.held,
        "running": {q: r.running_of(q) for q in r.queues if r.running_of(q)},
        "claimed": r.claimed, "acked": r.acked, "ack_linger_ms": round(r.ack_linger_s * 1000),
        "version": r.version, "interval_s": r.interval_s,
        "last_heartbeat": iso(w.last_ms), "last_heartbeat_ms": w.last_ms,
        "heartbeat_age_s": round(max(0, now_ms - w.last_ms) / 1000.0, 3),
        "live_until": iso(w.deadline_ms), "live_until_ms": w.deadline_ms,
        "started": iso(w.started_ms), "started_ms": w.started_ms,
        "uptime_s": round(max(0, now_ms - w.started_ms) / 1000.0, 3),
        "current_jobs": [{"id": j.id, "queue": j.queue, "started": iso(w.job_started_ms(j)),
                          "started_ms": w.job_started_ms(j)} for j in r.current],
    }


def worker_state(w: WorkerEntry) -> str:
    """``serving``, or ``stopping`` while it drains (it claims nothing new)."""
    return "stopping" if w.record.stopping else "serving"


def workers_doc(snap: RegistrySnapshot, namespace: str, queue: str | None = None) -> dict[str, Any]:
    """The ``zsched workers --json`` document."""
    return {
        "namespace": namespace, "now": iso(snap.now_ms), "now_ms": snap.now_ms,
        "workers": [worker_doc(w, snap.now_ms) for w in listed(snap, queue)],
        "queues": {q: asdict(s) for q, s in queue_summary(snap, queue).items()},
        "totals": asdict(snap.totals()),
        "unreadable": snap.unreadable, "pruned": snap.pruned,
    }
