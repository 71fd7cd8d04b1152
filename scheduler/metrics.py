"""Prometheus metrics of the scheduler tier. One registry per process object (so tests can run
several replicas in one interpreter). Label sets of rare events are pre-initialised so they read 0
instead of being absent."""
from __future__ import annotations

import argparse
import errno
import ipaddress
import logging
import re
import reprlib
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer

from .health import Health, wsgi_app
from .protocol.errors import ConfigError, ZschedError
from .protocol.registry import RegistrySnapshot
from .protocol.replies import StatsReply

log = logging.getLogger("zsched.metrics")

# Firing lateness is usually a few ms; herds and failovers push it to seconds.
LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
TICK_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)


class SchedulerMetrics:
    """Metrics a scheduler replica exports about the partitions it owns and its ownership."""

    def __init__(self, replica: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.replica = replica
        self.partitions_owned = Gauge("zsched_partitions_owned", "Partitions this replica owns now",
                                      ["replica"], registry=r)
        self.ownership_changes = Counter("zsched_ownership_changes_total",
                                         "Partitions acquired or released by this replica",
                                         ["replica", "change"], registry=r)
        self.lease_refresh_failures = Counter("zsched_lease_refresh_failures_total",
                                              "etcd lease keepalives that failed", ["replica"], registry=r)
        self.leases_lost = Counter("zsched_scheduler_leases_lost_total",
                                   "etcd leases this replica lost (expired before refresh)", ["replica"], registry=r)
        self.epoch_refusals = Counter("zsched_epoch_refusals_total",
                                      "Ticks/reaps refused by Redis because a newer owner acted",
                                      ["replica"], registry=r)
        # An epoch conflict is not a hand-over: etcd still names this replica as the partition's
        # owner with exactly the refused epoch, so Redis has seen an epoch etcd never handed out
        # since (etcd restored from a snapshot or replaced). Counted apart from epoch_refusals so
        # the "stale replica" alert does not point operators at GC pauses.
        self.epoch_conflicts = Counter("zsched_epoch_conflicts_total",
                                       "Ticks refused by Redis while etcd still names this replica as the owner "
                                       "with that epoch (etcd history restored or replaced); every retry counts",
                                       ["replica"], registry=r)
        self.epoch_conflict_partitions = Gauge("zsched_epoch_conflict_partitions",
                                               "Owned partitions stuck in an epoch conflict now (nothing "
                                               "fires there until 'zsched epochs reset')", ["replica"], registry=r)
        self.coalescing_partitions = Gauge("zsched_coalescing_partitions",
                                           "Owned partitions whose hand-off lead is widened now (busy with "
                                           "spread traffic: --coalesce-lead)", ["replica"], registry=r)
        self.deadline_pauses = Counter("zsched_ownership_deadline_pauses_total",
                                       "Times ticking stopped because ownership could not be confirmed in time",
                                       ["replica"], registry=r)
        self.fired = Counter("zsched_scheduler_fired_total", "Jobs this replica moved to ready", ["replica"],
                             registry=r)
        self.reaped = Counter("zsched_scheduler_reaped_total", "Expired leases this replica reaped",
                              ["replica"], registry=r)
        self.firing_lateness = Histogram("zsched_firing_lateness_seconds",
                                         "Time a job landed in ready minus its run_at", ["replica"],
                                         buckets=LATENESS_BUCKETS, registry=r)
        self.tick_duration = Histogram("zsched_tick_duration_seconds", "Round trip of one tick(+reap) call",
                                       ["replica"], buckets=TICK_BUCKETS, registry=r)
        self.redis_errors = Counter("zsched_scheduler_redis_errors_total", "Failed Redis calls", ["replica"],
                                    registry=r)
        self.rate_limited = Counter("zsched_rate_limited_total",
                                    "Due jobs held back by a queue rate limit", ["replica", "queue"], registry=r)
        for m in (self.lease_refresh_failures, self.leases_lost, self.epoch_refusals, self.epoch_conflicts,
                  self.deadline_pauses, self.fired, self.reaped, self.redis_errors):
            m.labels(replica)
        for change in ("acquired", "released", "lost"):
            self.ownership_changes.labels(replica, change)
        self.partitions_owned.labels(replica).set(0)
        self.epoch_conflict_partitions.labels(replica).set(0)
        self.partitions = Gauge("zsched_partitions", "Partition count of the namespace (fixed at its first use)",
                                ["namespace"], registry=r)

    def observe_lateness(self, values_ms: Iterable[int]) -> None:
        h = self.firing_lateness.labels(self.replica)
        for v in values_ms:
            h.observe(max(0, v) / 1000.0)


class CannotListen(ZschedError, OSError):
    """``/metrics`` cannot listen on the address asked for (not an address of this machine, a
    privileged port...): this machine's set-up. The message names the address and the fix;
    ``zsched`` reports it as one line, exit 4."""


class PortInUse(CannotListen):
    """The ``/metrics`` address is taken (another process listens on it): the message names the
    address and the fix. ``zsched`` reports it as one line, exit 4."""


PORT_RANGE = (1, 65535)  # 0 would be a port the OS picks and nobody knows to scrape
# a host name (RFC 1123 labels) or an IP address: checked before any lookup, so a port or a URL given
# as the host ("0.0.0.0:9100", "http://...") is refused as what it is, not as a failed DNS query
_HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def check_port(port: object, name: str = "metrics_port") -> int:
    """``port`` if it is a whole number from 1 to 65535, else ValueError naming ``name``."""
    lo, hi = PORT_RANGE
    if isinstance(port, bool) or not isinstance(port, int) or not lo <= port <= hi:
        raise ValueError(f"{name} must be a TCP port number from {lo} to {hi}, got {reprlib.repr(port)}")
    return port


def check_host(host: object, name: str = "metrics_host") -> str:
    """``host`` if it is an IP address or a host name (not looked up here), else ValueError."""
    if isinstance(host, str):
        try:
            ipaddress.ip_address(host)
            return host
        except ValueError:
            if _HOST_NAME.fullmatch(host) and len(host) <= 253:
                return host
    raise ValueError(f"{name} must be an IP address or a host name of this machine (e.g. 127.0.0.1, 0.0.0.0 "
                     f"for every interface), without a port, got {host!r}")


def port_arg(text: str) -> int:
    """``--metrics-port`` as an argparse type: refused before anything starts (exit 2)."""
    try:
        return check_port(int(text))
    except ValueError:
        lo, hi = PORT_RANGE
        raise argparse.ArgumentTypeError(f"expected a TCP port number from {lo} to {hi}, got {text!r}") from None


def host_arg(text: str) -> str:
    """``--metrics-host`` as an argparse type: refused before anything starts (exit 2)."""
    try:
        return check_host(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address or a host name of this machine (e.g. "
                                         f"127.0.0.1), without a port, got {text!r}") from None


def serve(registry: CollectorRegistry, port: int, host: str = "127.0.0.1", health: Health | None = None) -> Any:
    """Expose ``/metrics`` (and with ``health`` also ``/livez`` and ``/readyz``, see
    :mod:`scheduler.health`) on a thread of its own; loopback unless the operator asks for another
    address. Returns the HTTP server (:func:`stop_serving` stops it). ValueError for a port or host that
    is no address; :class:`PortInUse` when the port is taken, :class:`CannotListen` for another
    refusal."""
    where = metrics_url(check_host(host), check_port(port)).removeprefix("http://").removesuffix("/metrics")
    app = make_wsgi_app(registry)
    if health is not None:
        app = wsgi_app(health, app)
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
        httpd: Any = make_server(host, port, app, server_class, handler_class=_QuietHandler)
    except socket.gaierror as exc:  # a well-formed name that does not resolve: a typo, most likely
        raise ConfigError(f"metrics host {host!r} is not known here ({exc.strerror}); set --metrics-host to an "
                          "address of this machine, e.g. 127.0.0.1") from None
    except OSError as exc:
        failed: CannotListen
        if exc.errno == errno.EADDRINUSE:
            failed = PortInUse(f"metrics port {port} on {host} is already in use (another process listens on it); "
                               "choose a free one with --metrics-port, or stop the other process")
        else:
            failed = CannotListen(f"cannot serve metrics on {where}: {exc.strerror or exc} (choose an address of "
                                  "this machine with --metrics-host, and a port above 1023 unless running as root)")
        failed.errno = exc.errno
        raise failed from exc
    # no poll timeout: the serving thread sleeps in its selector until a request comes, where
    # socketserver's default wakes it (and takes the GIL) twice a second for nothing, in every
    # idle worker and replica; stop_serving wakes it when the process stops
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": None}, name="metrics-http",
                     daemon=True).start()
    # debug: the process names the address in its start-up line, so a start-up that fails after
    # this (bad credentials...) prints its one error line and nothing else
    log.debug("metrics on %s", metrics_url(host, port))
    return httpd


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape or probe on stderr."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def stop_serving(server: Any | None) -> None:
    """Stop a server :func:`serve` returned (None: nothing to stop), at once, from any thread (the
    caller's thread waits a millisecond or so, not for a poll). Its thread sleeps in its selector
    with no timeout and looks for a stop request only when it wakes: shutting the listening socket
    down wakes it (the accept that follows fails and is ignored). Where the platform refuses that
    for a listening socket, connections to the server's own address wake it until the stop request
    is seen."""
    if server is None:
        return
    try:
        server.socket.shutdown(socket.SHUT_RDWR)
    except OSError:
        stopping = threading.Thread(target=server.shutdown, name="metrics-http-stop", daemon=True)
        stopping.start()
        while stopping.is_alive():
            _knock(server.server_address)
            stopping.join(0.05)
    else:
        server.shutdown()
    server.server_close()


def _knock(address: Any) -> None:
    """Connect to a server's own address and hang up: its selector wakes (wildcard addresses are
    reached through loopback)."""
    host, port = address[0], address[1]
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    try:
        with socket.create_connection((host, port), timeout=1.0):
            pass
    except OSError:  # closed meanwhile, or not reachable that way: the next knock or the join decides
        pass


def metrics_url(host: str, port: int) -> str:
    """``http://HOST:PORT/metrics`` (an IPv6 address in brackets), for log lines."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


# Counters the Lua scripts keep per partition in the 'c' hash (field "EVENT:QUEUE"); the owner of
# a partition exports them, so operators scrape the scheduler tier, not every producer.
JOB_EVENTS = ("scheduled", "fired", "acked", "failed", "retried", "dead", "misfired", "cancelled",
              "expired", "requeued", "purged", "released", "rescheduled", "ratelimited", "dropped")
STATES = ("scheduled", "ready", "running", "dead")


@dataclass(frozen=True, slots=True)
class _Exported:
    stats: StatsReply
    oldest_due_age: float  # seconds, 0 when nothing is due


class PartitionStatsCollector:
    """Exports the Redis-kept counters and depths of the partitions this replica owns, labelled by
    partition: when a partition moves to another replica its series continue there, and
    ``sum by (queue)`` never counts a partition twice."""

    def __init__(self, namespace: str = "", due_soon_horizon: float | None = None) -> None:
        """``due_soon_horizon``: the seconds ``zsched_queue_due_soon`` looks ahead (the stats are
        read with it, :meth:`update`); None exports no such series."""
        self.namespace = namespace
        self.due_soon_horizon = due_soon_horizon
        self._stats: dict[int, _Exported] = {}

    def update(self, partition: int, stats: StatsReply, now_ms: int) -> None:
        """Export ``stats`` (read when Redis's clock said ``now_ms``) for ``partition``."""
        earliest = stats.earliest_due_ms
        age = max(0.0, (now_ms - earliest) / 1000.0) if earliest is not None else 0.0
        self._stats[partition] = _Exported(stats, age)

    def forget(self, partition: int) -> None:
        """Stop exporting ``partition`` (another replica owns it now)."""
        self._stats.pop(partition, None)

    def partitions(self) -> list[int]:
        """The partitions exported now."""
        return list(self._stats)

    def collect(self) -> Iterator[Metric]:
        """Called by the registry on every scrape."""
        events = CounterMetricFamily("zsched_jobs", "Job events by queue (kept in Redis per partition, "
                                     "exported by the partition's owner)", labels=["event", "queue", "partition"])
        depth = GaugeMetricFamily("zsched_jobs_depth", "Jobs per state and queue in the partitions this "
                                  "replica owns (state=held: due jobs waiting for a rate-limit token, also "
                                  "counted in scheduled)", labels=["state", "queue", "partition"])
        age = GaugeMetricFamily("zsched_oldest_due_age_seconds",
                                "Age of the oldest due-but-not-fired timer per owned partition (0 when none)",
                                labels=["partition"])
        paused = GaugeMetricFamily("zsched_queue_paused", "1 while the queue is paused (zsched queue pause: workers "
                                   "claim none of its jobs, due jobs wait in ready), per owned partition",
                                   labels=["queue", "partition"])
        since = GaugeMetricFamily("zsched_queue_paused_since_seconds", "When the queue's pause started (unix "
                                  "time); 0 when it is not paused", labels=["queue", "partition"])
        for p, exported in sorted(self._stats.items()):
            ps = str(p)
            st = exported.stats
            queues = set(st.ready) | set(st.paused)
            for f in list(st.gauges) + list(st.counters):
                queues.add(f.split(":", 1)[1])
            queues.discard("?")
            for q in sorted(queues):
                for ev in JOB_EVENTS:
                    events.add_metric([ev, q, ps], st.counters.get(f"{ev}:{q}", 0))
                depth.add_metric(["scheduled", q, ps], st.gauges.get(f"s:{q}", 0))
                depth.add_metric(["ready", q, ps], st.ready.get(q, 0))
                depth.add_metric(["running", q, ps], st.gauges.get(f"a:{q}", 0))
                depth.add_metric(["dead", q, ps], st.gauges.get(f"d:{q}", 0))
                # due but held back by a rate limit (included in "scheduled")
                depth.add_metric(["held", q, ps], st.gauges.get(f"h:{q}", 0))
                paused.add_metric([q, ps], 1 if q in st.paused else 0)
                since.add_metric([q, ps], st.paused.get(q, 0) / 1000.0)
            age.add_metric([ps], exported.oldest_due_age)
        yield events
        yield depth
        yield age
        yield paused
        yield since
        if self.due_soon_horizon is not None:
            yield self._due_soon()

    def _due_soon(self) -> Metric:
        """Per queue, over the owned partitions (so ``sum by (queue)`` over the replicas counts
        each partition once): what KEDA scales the workers on (docs/operations.md, Kubernetes)."""
        fam = GaugeMetricFamily("zsched_queue_due_soon", f"Jobs ready now or due within {self.due_soon_horizon:g}s "
                                "(zsched scheduler --due-soon-horizon), per queue, in the partitions this replica "
                                "owns; due jobs held by a rate limit not counted", labels=["namespace", "queue"])
        total: dict[str, float] = {}
        for exported in self._stats.values():
            for q, n in exported.stats.due_soon_by_queue().items():
                total[q] = total.get(q, 0.0) + n
        total.pop("?", None)
        for q, n in sorted(total.items()):
            fam.add_metric([self.namespace, q], round(n))
        return fam


class WorkerRegistryCollector:
    """The worker registry (:mod:`scheduler.protocol.registry`) as metrics. One replica exports it
    for the whole namespace, the owner of partition 0 (``scheduler/tier/worker_registry.py``), so
    no sum counts a worker twice, and a worker that was killed still counts (as gone) although it
    cannot be scraped. Labels are queues, never workers: the series do not grow with restarts.

    Only serving workers count (one that is stopping takes no new jobs). A queue whose last worker
    went reads 0 for :attr:`KEEP_S` instead of vanishing; nothing is exported before the first read
    or while this replica does not own partition 0 (:meth:`clear`)."""

    KEEP_S = 3600.0

    def __init__(self, namespace: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.namespace = namespace
        self.clock = clock
        self._snap: RegistrySnapshot | None = None
        self._seen: dict[str, float] = {}  # queue -> when a serving worker last served it

    def update(self, snap: RegistrySnapshot) -> None:
        """Export ``snap`` from now on."""
        now = self.clock()
        for w in snap.serving:
            for q in w.record.queues:
                self._seen[q] = now
        self._seen = {q: t for q, t in self._seen.items() if now - t < self.KEEP_S}
        self._snap = snap

    def clear(self) -> None:
        """Export nothing (another replica owns partition 0 now, so it exports the registry)."""
        self._snap = None
        self._seen.clear()

    @property
    def exporting(self) -> bool:
        """Whether a read is exported now."""
        return self._snap is not None

    def collect(self) -> Iterator[Metric]:
        """Called by the registry on every scrape."""
        snap = self._snap
        if snap is None:
            return
        workers = GaugeMetricFamily("zsched_workers", "Live worker processes serving the queue (from the worker "
                                    "registry; a process serving several queues counts under each)", labels=["queue"])
        slots = GaugeMetricFamily("zsched_worker_slots", "Handler slots of the live workers serving the queue: "
                                  "busy = running this queue's jobs, free = idle (shared with the workers' other "
                                  "queues)", labels=["queue", "state"])
        for q, s in snap.by_queue(also=self._seen).items():
            workers.add_metric([q], s.workers)
            slots.add_metric([q, "busy"], s.busy)
            slots.add_metric([q, "free"], s.free)
        total = snap.totals()
        procs = GaugeMetricFamily("zsched_worker_processes", "Live worker processes of the namespace, each once "
                                  "(from the worker registry)", labels=["namespace"])
        procs.add_metric([self.namespace], total.workers)
        capacity = GaugeMetricFamily("zsched_worker_capacity", "Handler slots of every live worker process, each "
                                     "once: busy or free", labels=["namespace", "state"])
        capacity.add_metric([self.namespace, "busy"], total.busy)
        capacity.add_metric([self.namespace, "free"], total.free)
        yield workers
        yield slots
        yield procs
        yield capacity


def scrape_histogram(port: int, name: str, host: str = "127.0.0.1", timeout: float = 2.0) -> dict[float, float]:
    """Cumulative bucket counts (le -> count) of histogram ``name`` on a /metrics endpoint, summed
    over label sets (used by ``zsched dev`` and the benchmarks)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    out: dict[float, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == name:
            for smp in fam.samples:
                if smp.name.endswith("_bucket"):
                    le = float(smp.labels["le"])
                    out[le] = out.get(le, 0.0) + smp.value
    return out


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets, sorted by le. A quantile
    that falls in the +Inf bucket is, as there, the highest finite bound: :func:`past_top` tells."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * ((rank - prev_c) / max(c - prev_c, 1e-9))
        prev_le, prev_c = le, c
    return prev_le


def past_top(buckets: list[tuple[float, float]], q: float) -> bool:
    """Whether the ``q`` quantile of cumulative (le, count) buckets, sorted by le, lies past the
    highest finite bound: :func:`bucket_quantile` then gives that bound, a floor, not an estimate."""
    if not buckets or buckets[-1][1] <= 0 or buckets[-1][0] != float("inf") or len(buckets) < 2:
        return False
    return buckets[-2][1] < q * buckets[-1][1]
