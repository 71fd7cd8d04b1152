"""Worker counters (``WorkerStats``), the per-job metrics hook, and a minimal Prometheus exporter.

Counters are plain ints bumped on the event loop thread (no locks, no per-job allocation); an
exporter reads them at scrape time, so metrics cost nothing per job.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from scheduler.health import Health

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
    poison: undecodable record or payload, or no handler for the queue. notified: ready
    notifications received for the queue (what a worker is woken by; fan-out shows here).
    claims: claim calls answered by Redis; claims_empty: those that found no job. skipped: handler
    let a :class:`~workers.effects.EffectSkipped` escape (another attempt had recorded the job's
    effects): acked like a return, counted here as well as in ``acked``.
    """

    claimed: int = 0
    acked: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    lease_lost: int = 0
    released: int = 0
    poison: int = 0
    notified: int = 0
    claims: int = 0
    claims_empty: int = 0
    skipped: int = 0

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __add__(self, other: WorkerStats) -> WorkerStats:
        return WorkerStats(*(getattr(self, n) + getattr(other, n) for n in self.names()))

    @classmethod
    def total(cls, items: Iterable[WorkerStats]) -> WorkerStats:
        out = cls()
        for s in items:
            out = out + s
        return out


class WorkerMetrics(Protocol):
    """Optional per-job hook (``Worker(metrics=...)``), called on the event loop; keep it cheap and
    non-blocking. ``outcome`` is one of: ``ok``, ``skipped``, ``failed``, ``timeout``, ``retry``, ``permanent``,
    ``released``."""

    def job_started(self, job: Job) -> None: ...

    def job_finished(self, job: Job, outcome: str, seconds: float) -> None: ...


_DOCS = {
    "claimed": "Jobs claimed from ready lists",
    "acked": "Jobs acknowledged (handler returned, ack accepted)",
    "failed": "Handler failures (exceptions and timeouts, not Retry)",
    "retried": "Jobs scheduled for another attempt",
    "dead": "Jobs dead-lettered",
    "lease_lost": "Outcomes or heartbeats refused because the lease was lost",
    "released": "Jobs handed back to ready at shutdown",
    "poison": "Poison jobs (undecodable, or no handler)",
    "notified": "Ready notifications received",
    "claims": "Claim calls answered by Redis",
    "claims_empty": "Claim calls answered with no job",
    "skipped": "Jobs acked because their effects were already recorded by another attempt (EffectSkipped)",
}


# End-to-end lateness is usually milliseconds; retries and backlogs push it to minutes.
_LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)
_DURATION_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_RTT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1)


class PrometheusHistograms:
    """Per-job histograms, fed through the :class:`WorkerMetrics` hook: end-to-end lateness
    (handler start minus the attempt's due time), handler duration, and Redis round trips of the
    claim and outcome (ack/fail/extend/release) pipelines."""

    def __init__(self, namespace: str, queues: Iterable[str], registry: Any) -> None:
        from prometheus_client import Histogram

        self.ns = namespace
        self.lateness = Histogram("zsched_end_to_end_lateness_seconds",
                                  "Handler start minus the time the job became due", ["namespace", "queue"],
                                  buckets=_LATENESS_BUCKETS, registry=registry)
        self.duration = Histogram("zsched_handler_duration_seconds", "Handler run time", ["namespace", "queue"],
                                  buckets=_DURATION_BUCKETS, registry=registry)
        self.rtt = Histogram("zsched_redis_roundtrip_seconds",
                             "Redis round trip of a worker pipeline: op=claim (claims, with outcomes riding "
                             "along) or op=ack (outcome flush: ack/fail/extend/release)", ["namespace", "op"],
                             buckets=_RTT_BUCKETS, registry=registry)
        self._lat = {q: self.lateness.labels(namespace, q) for q in queues}
        self._dur = {q: self.duration.labels(namespace, q) for q in queues}
        self._rtt = {op: self.rtt.labels(namespace, op) for op in ("claim", "ack")}

    def job_started(self, job: Job) -> None:
        import time as _t

        h = self._lat.get(job.queue)
        if h is not None:
            h.observe(max(0.0, _t.time() - job.due_ms / 1000.0))

    def job_finished(self, job: Job, outcome: str, seconds: float) -> None:
        h = self._dur.get(job.queue)
        if h is not None:
            h.observe(seconds)

    def roundtrip(self, op: str, seconds: float) -> None:
        self._rtt[op].observe(seconds)


class Tee:
    """Calls several :class:`WorkerMetrics` hooks (the user's and the built-in histograms)."""

    def __init__(self, *hooks: Any) -> None:
        self.hooks = [h for h in hooks if h is not None]

    def job_started(self, job: Job) -> None:
        for h in self.hooks:
            h.job_started(job)

    def job_finished(self, job: Job, outcome: str, seconds: float) -> None:
        for h in self.hooks:
            h.job_finished(job, outcome, seconds)


def start_metrics_server(port: int, namespace: str, by_queue: Callable[[], dict[str, WorkerStats]],
                         running: Callable[[], int], concurrency: Callable[[], int],
                         addr: str = "127.0.0.1", histograms: Callable[[Any], Any] | None = None,
                         health: Health | None = None) -> Any:
    """Serve ``/metrics`` on ``addr:port`` from a private registry (and with ``health`` the probes
    ``/livez`` and ``/readyz``, :mod:`scheduler.health`): ``zsched_worker_<name>_total``
    counters labelled by namespace and queue (every served queue present from the start), plus
    ``zsched_worker_running`` and ``zsched_worker_concurrency`` gauges. Returns the HTTP server
    (:func:`scheduler.metrics.stop_serving` stops it) or None when prometheus_client is missing; raises
    :class:`scheduler.metrics.PortInUse` when the port is taken."""
    try:
        from prometheus_client import CollectorRegistry
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        from scheduler.metrics import serve
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
    registry.register(_Collector())
    if histograms is not None:
        histograms(registry)
    return serve(registry, port, addr, health)  # PortInUse when the port is taken
