"""``zsched stats``: per-queue and per-partition counts from the ``stats`` script, and the partition
owners from etcd."""
from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any

from ...client import Client
from ...protocol.masking import mask_secrets
from ...protocol.registry import QueueWorkers
from ...protocol.replies import merge_stats, parse_stats
from .errors import Refused
from .jobs import redis_now_ms
from .output import iso
from .workers import read_registry

_STATES = ("scheduled", "ready", "running", "dead")


@dataclass
class PartitionStats:
    """One partition: owner replica (None: unknown or none), epoch, earliest due timer, counts."""

    partition: int
    owner: str | None
    epoch: int
    earliest_due_ms: int | None
    scheduled: int = 0
    ready: int = 0
    running: int = 0
    dead: int = 0


@dataclass
class StatsReport:
    """The whole report: per-queue counts, per-partition rows, and where the owners came from."""

    namespace: str
    now_ms: int
    queues: dict[str, dict[str, int]]
    partitions: list[PartitionStats]
    owners_source: str          # "etcd", "unavailable" (etcd did not answer) or "not configured"
    owners_error: str | None = None
    etcd_endpoints: str | None = None
    totals: dict[str, int] = field(default_factory=dict)
    # from the worker registry: per queue (every queue of ``queues`` too), the serving workers
    workers: dict[str, QueueWorkers] = field(default_factory=dict)
    workers_error: str | None = None  # why the registry could not be read (an ACL refusal), else None
    paused: set[str] = field(default_factory=set)  # queues paused in some partition

    def without_workers(self) -> list[tuple[str, int]]:
        """(queue, ready jobs) for every queue with ready jobs and no serving worker, by name;
        empty when the registry could not be read (then nothing is known)."""
        if self.workers_error is not None:
            return []
        return [(q, c["ready"]) for q, c in sorted(self.queues.items())
                if c["ready"] > 0 and self.workers.get(q, QueueWorkers()).workers == 0]


def read_owner_records(endpoints: str, namespace: str, *, timeout: float = 1.5) -> dict[int, tuple[str, int]]:
    """Partition -> (replica id, create revision = the owner's epoch) from etcd (keys
    ``/zsched/NS/owners/P``). Raises on any failure (unreachable, timeout, auth); bounded by about
    ``2 * timeout`` seconds in total."""
    return {p: (replica, epoch) for p, (replica, epoch, _lease)
            in read_owner_leases(endpoints, namespace, timeout=timeout).items()}


def read_owner_leases(endpoints: str, namespace: str, *, timeout: float = 1.5) -> dict[int, tuple[str, int, int]]:
    """Partition -> (replica id, epoch, etcd lease id of the owner key); see
    :func:`read_owner_records`."""
    from ...coord import EtcdCoordinator  # grpc loads only for the commands that talk to etcd

    async def run() -> dict[int, tuple[str, int, int]]:
        coord = EtcdCoordinator.from_endpoints(endpoints, timeout=timeout)
        try:
            await coord.connect(timeout=timeout)
            prefix = f"/zsched/{namespace}/owners/"
            kvs, _rev = await coord.get_prefix(prefix, timeout=timeout)
        finally:
            await coord.close()
        out: dict[int, tuple[str, int, int]] = {}
        for kv in kvs:
            rest = kv.key[len(prefix):]
            if rest.isdigit():
                out[int(rest)] = (kv.value.decode("utf-8", "replace"), kv.create_revision, kv.lease)
        return out

    async def bounded() -> dict[int, tuple[str, int, int]]:
        return await asyncio.wait_for(run(), timeout * 2 + 0.5)

    return asyncio.run(bounded())


def etcd_failure(exc: BaseException) -> str:
    """Why reading the owners from etcd failed, for a warning or ``owners_error``: the error's type
    and message, masked (it is shown, and a message may quote the endpoints)."""
    return mask_secrets(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)


def read_owners(endpoints: str, namespace: str, *, timeout: float = 1.5) -> dict[int, str]:
    """Partition -> replica id from etcd; see :func:`read_owner_records`."""
    return {p: rec[0] for p, rec in read_owner_records(endpoints, namespace, timeout=timeout).items()}


def collect_stats(client: Client, *, etcd_endpoints: str | None = None, etcd_timeout: float = 1.5) -> StatsReport:
    """Per-queue and per-partition counts (the ``stats`` script on every partition, one round
    trip), earliest due timer per partition, partition owners from etcd when endpoints are
    given, and the serving workers per queue from the worker registry. An unreachable etcd does
    not fail the report (``owners_source`` is ``unavailable``), nor does a registry Redis refuses
    to this user (``workers_error``)."""
    replies = [parse_stats(r) for r in client.transport.call_many(client.calls.stats_calls())]
    now = redis_now_ms(client)
    owners: dict[int, str] = {}
    source, err = "not configured", None
    if etcd_endpoints:
        try:
            owners = read_owners(etcd_endpoints, client.keyspace.namespace, timeout=etcd_timeout)
            source = "etcd"
        except Exception as exc:  # noqa: BLE001 - any etcd failure degrades to "unknown"
            source, err = "unavailable", etcd_failure(exc)
    out: list[PartitionStats] = []
    for p, stats in enumerate(replies):
        per_queue = stats.queues().values()
        counts = {s: sum(q[s] for q in per_queue) for s in _STATES}
        out.append(PartitionStats(p, owners.get(p), stats.epoch, stats.earliest_due_ms, **counts))
    totals = {s: sum(getattr(ps, s) for ps in out) for s in _STATES}
    queues = merge_stats(replies)
    rep = StatsReport(client.keyspace.namespace, now, queues, out, source, err, etcd_endpoints, totals,
                      paused={q for st in replies for q in st.paused})
    try:
        rep.workers = read_registry(client).by_queue(also=queues)
    except Refused as exc:  # an ACL user without the registry keys: the counts still stand
        rep.workers_error = mask_secrets(str(exc))
    return rep


def stats_doc(rep: StatsReport) -> dict[str, Any]:
    """The report as one JSON document (``zsched stats --json``)."""
    return {
        "namespace": rep.namespace,
        "now": iso(rep.now_ms),
        "partition_count": len(rep.partitions),
        "queues": rep.queues,
        "totals": rep.totals,
        "owners_source": rep.owners_source,
        "owners_error": rep.owners_error,
        "partitions": [
            {"partition": ps.partition, "owner": ps.owner, "epoch": ps.epoch,
             "earliest_due": iso(ps.earliest_due_ms), "earliest_due_ms": ps.earliest_due_ms,
             "scheduled": ps.scheduled, "ready": ps.ready, "running": ps.running, "dead": ps.dead}
            for ps in rep.partitions
        ],
        "workers": {q: asdict(w) for q, w in rep.workers.items()},
        "workers_error": rep.workers_error,
        "without_workers": [{"queue": q, "ready": n} for q, n in rep.without_workers()],
    }
