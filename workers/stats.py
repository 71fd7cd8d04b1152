"""Worker counters (``WorkerStats``), the per-job metrics hook, and a minimal Prometheus exporter.

Counters are plain ints bumped on the event loop thread (no locks, no per-job allocation); an
exporter reads them at scrape time, so metrics cost nothing per job.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Protocol

if TYPE_CHECKING:
    from .job import Job

log = logging.getLogger("zsched.worker")


@dataclass(slots=True)
class WorkerStats:
    """Counters of one worker (per queue, or summed over queues by ``Worker.stats``).

    claimed: jobs taken from ready lists. acked: handler returned and Redis accepted the ack.
    failed: handler raised or timed out (not counting ``Retry``). retried: Redis scheduled another
    attempt (failure with attempts left, or ``Retry``). dead: dead-lettered (attempts spent,
    ``PermanentError``, poison). lease_lost: an ack/fail/extend/release was refused because the
    lease was no longer ours (counted once per attempt). released: handed back at shutdown.
    poison: undecodable record or payload, or no handler for the queue.
    """

    claimed: int = 0
    acked: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    lease_lost: int = 0
    released: int = 0
    poison: int = 0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __add__(self, other: "WorkerStats") -> "WorkerStats":
        return WorkerStats(*(getattr(self, n) + getattr(other, n) for n in self.names()))

    @classmethod
    def total(cls, items: Iterable["WorkerStats"]) -> "WorkerStats":
        out = cls()
        for s in items:
            out = out + s
        return out


class WorkerMetrics(Protocol):
    """Optional per-job hook (``Worker(metrics=...)``), called on the event loop; keep it cheap and
    non-blocking. ``outcome`` is one of: ``ok``, ``failed``, ``timeout``, ``retry``, ``permanent``,
    ``released``."""

    def job_started(self, job: "Job") -> None: ...

    def job_finished(self, job: "Job", outcome: str, seconds: float) -> None: ...


_DOCS = {
    "claimed": "Jobs claimed from ready lists",
    "acked": "Jobs acknowledged (handler returned, ack accepted)",
    "failed": "Handler failures (exceptions and timeouts, not Retry)",
    "retried": "Jobs scheduled for another attempt",
    "dead": "Jobs dead-lettered",
    "lease_lost": "Outcomes or heartbeats refused because the lease was lost",
    "released": "Jobs handed back to ready at shutdown",
    "poison": "Poison jobs (undecodable, or no handler)",
}


def start_metrics_server(port: int, namespace: str, by_queue: Callable[[], dict[str, WorkerStats]],
                         running: Callable[[], int], concurrency: Callable[[], int],
                         addr: str = "127.0.0.1") -> Any:
    """Serve ``/metrics`` on ``addr:port`` from a private registry: ``zsched_worker_<name>_total``
    counters labelled by namespace and queue (every served queue present from the start), plus
    ``zsched_worker_running`` and ``zsched_worker_concurrency`` gauges. Returns the HTTP server
    (call ``.shutdown()`` to stop) or None when prometheus_client is missing."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    except ImportError:  # pragma: no cover - it is a declared dependency
        log.warning("--metrics-port given but prometheus_client is not installed; metrics disabled")
        return None

    class _Collector:
        def collect(self) -> Iterator[Any]:
            snap = by_queue()
            for name in WorkerStats.names():
                fam = CounterMetricFamily(f"zsched_worker_{name}", _DOCS[name], labels=["namespace", "queue"])
                for q, st in sorted(snap.items()):
                    fam.add_metric([namespace, q], getattr(st, name))
                yield fam
            g = GaugeMetricFamily("zsched_worker_running", "Handlers running now", labels=["namespace"])
            g.add_metric([namespace], running())
            yield g
            c = GaugeMetricFamily("zsched_worker_concurrency", "Concurrency limit", labels=["namespace"])
            c.add_metric([namespace], concurrency())
            yield c

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())  # type: ignore[arg-type]
    res = start_http_server(port, addr=addr, registry=registry)
    server = res[0] if isinstance(res, tuple) else None
    log.info("metrics on http://%s:%d/metrics", addr, port)
    return server
