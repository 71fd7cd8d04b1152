"""The worker: claims ready jobs, runs handlers, reports outcomes with fenced Lua scripts.

:class:`Worker` holds the settings (:mod:`.options`) and the handlers (:mod:`.registry`); each
``serve()`` assembles the parts that do the work, all on one asyncio loop (no locks):

* the **fetch strategy** (:mod:`.fetch`) learns which partitions have ready jobs and claims them
  into free slots (:mod:`.slots`), as planned by the pure **claim planner** (:mod:`.planner`);
* the **runner** (:mod:`.runner`) runs a handler per claimed job and turns what it did into an
  outcome;
* the **outbox** (:mod:`.outbox`) batches acks, fails, lease extensions and releases into round
  trips (:mod:`.wire`), and the **heartbeats** (:mod:`.heartbeat`) queue the extensions;
* the **presence** (:mod:`.presence`) keeps this process's record in the namespace's worker
  registry (``zsched workers``);
* :mod:`.lifecycle` holds the stop state and the signal handling.

Redis errors never kill the worker: each loop logs once per outage and retries with capped,
jittered backoff; undelivered outcomes stay queued (the job keeps its lease until it expires).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.client import AsyncClient
from scheduler.metrics import metrics_url, stop_serving
from scheduler.protocol import codec, config
from scheduler.protocol.ids import encode_id
from scheduler.redisio.connection import async_redis
from scheduler.redisio.transport import AsyncScriptTransport
from scheduler.runtime import entry_point_logging, loop_name, run, settle_gc

from . import options
from .attempt import Attempt
from .fetch import DoorbellFetch, Fetch, FetchContext
from .health import WorkerProbes
from .heartbeat import Heartbeats
from .lifecycle import Lifecycle, supervise
from .namespace import connect, follow_settings
from .options import WorkerOptions, redis_options_arg
from .outbox import Outbox
from .presence import Presence, base_record
from .registry import Handler, HandlerRegistry, HandlerSpec
from .runner import HandlerRunner, ThreadCount
from .slots import Slots
from .stats import PrometheusHistograms, Tee, WorkerMetrics, WorkerStats, start_metrics_server
from .wire import WORKER_RETRY, sender

log = logging.getLogger("zsched.worker")

FetchFactory = Callable[[FetchContext], Fetch]


def _lease_lost(r: Attempt, what: str) -> None:
    """Redis refused an outcome or heartbeat of ``r``: its lease is gone (or, after a re-send, the
    first send was applied). tests/chaos/history.py parses these two messages."""
    if r.uncertain:
        log.info("%s of job %s was refused after a connection error: it was either applied before the "
                 "connection dropped or the lease had expired", what, encode_id(r.raw_id))
        return
    if r.lost:
        return
    r.lost = True
    if r.job is not None:
        r.job.mark_lease_lost()
    r.stats.lease_lost += 1
    log.warning("job %s (queue %r): %s refused, the lease was lost (expired or taken over); the job "
                "may run again elsewhere", encode_id(r.raw_id), r.queue, what)


@dataclass(slots=True)
class _Crew:
    """The parts of one ``serve()`` and the tasks running their loops."""

    slots: Slots
    outbox: Outbox
    runner: HandlerRunner
    fetch: Fetch
    tasks: dict[str, asyncio.Task[None]]
    metrics_server: Any
    presence: Presence

    async def close(self) -> None:
        await self.presence.leave()  # first: the record goes while the connection is still open
        for t in self.tasks.values():
            t.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        self.runner.close()
        stop_serving(self.metrics_server)


class Worker:
    """Runs handlers for jobs of one namespace. At-least-once: a job runs again if its worker dies
    or its lease is lost; ``job.id`` and ``job.fence`` let handlers make that harmless.

    ``queues``: queues to serve (default: those with handlers; a served queue without a handler
    dead-letters its jobs as ``NoHandler``). ``concurrency``: exact limit of handlers running at
    once (sync handlers run in a thread pool of that size). ``prefetch``: how many jobs handed off
    ahead of their due time (``zsched scheduler --handoff-lead``) may wait for it on top of
    ``concurrency`` (default ``DEFAULT_PREFETCH``, a ceiling: workers/pace.py; 0: in handler
    slots); due jobs are only ever claimed into free handler slots. ``handler_timeouts``: seconds
    per queue (overrides ``@handler(timeout=...)``); a timeout counts as a failure.
    ``shutdown_grace``: seconds running handlers get after the first SIGTERM/SIGINT.
    ``drain_timeout``: seconds a stopping worker keeps retrying the outcomes it could not deliver
    (Redis unreachable) before it exits without them (default 10; their jobs run again once their
    leases expire). ``tombstone_ttl``: deprecated (the namespace's is followed:
    ``Client.set_tombstone_ttl``); given, it overrides it for this worker's acks. ``metrics``:
    optional :class:`~workers.stats.WorkerMetrics` hook. ``metrics_port``: serve Prometheus metrics
    on 127.0.0.1:PORT. ``idle_sweep``: seconds between safety-net sweeps when idle (stretched so a
    sweep costs at most ~16 claims/s with many partitions and queues). ``redis_options``: extra
    redis-py connection arguments, as for ``Client.from_url`` (the worker takes a URL, not a client:
    it makes its clients inside its own event loop; ``redis_kwargs`` is the deprecated old name).
    ``sharded_pubsub``: the Redis Cluster layout (the partitions' owners ring the doorbells for the
    scripts, Redis >= 7); None (default): exactly when the URL is a Redis Cluster's. It must match
    the producers' and the scheduler replicas' layout, or the worker hears no rings and finds jobs
    only by its ``idle_sweep``. ``registry_interval``: seconds between refreshes of this process's
    record in the namespace's worker registry (``zsched workers``; default 5): a worker that stops
    refreshing (killed) drops out of the live list 3 intervals after its last refresh.
    ``one_listener``: of the workers serving the same queues only one waits on the doorbells, the
    others sleep until it fills up or a burst comes (default True; False: every idle worker waits on
    them; docs/scaling.md "Adding workers"). ``ack_linger``: seconds (0-1, default 0) an ack may wait,
    at most a tenth of its lease, to share a script call (workers/outbox.py). ``fetch``: how jobs are fetched: a
    :class:`~workers.fetch.Fetch` subclass (or any callable taking a
    :class:`~workers.fetch.FetchContext` and returning a ``Fetch``); default
    :class:`~workers.fetch.DoorbellFetch`. The settings are in :attr:`options`.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        namespace: str | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int = options.DEFAULT_CONCURRENCY,
        prefetch: int | None = None,
        handler_timeouts: Mapping[str, float] | None = None,
        shutdown_grace: float = options.DEFAULT_SHUTDOWN_GRACE,
        drain_timeout: float = options.DEFAULT_DRAIN_TIMEOUT,
        tombstone_ttl: float | None = None,
        max_payload_bytes: int = codec.DEFAULT_MAX_PAYLOAD,
        partitions: int | None = None,
        metrics: WorkerMetrics | None = None,
        metrics_port: int | None = None,
        idle_sweep: float = options.DEFAULT_IDLE_SWEEP,
        redis_options: Mapping[str, Any] | None = None,
        fetch: FetchFactory = DoorbellFetch,
        sharded_pubsub: bool | None = None,
        registry_interval: float | None = None,
        redis_kwargs: Mapping[str, Any] | None = None,
        one_listener: bool | None = None,
        ack_linger: float | None = None,
    ) -> None:
        redis_options = redis_options_arg(redis_options, redis_kwargs)
        # None leaves the first group at its default, as configure() does.
        base = WorkerOptions(tombstone_ttl=tombstone_ttl, max_payload_bytes=max_payload_bytes,
                             partitions=partitions, idle_sweep=idle_sweep, redis_options=redis_options or {},
                             sharded_pubsub=sharded_pubsub).updated(registry_interval=registry_interval)
        self.options: WorkerOptions = base.updated(
            redis_url=redis_url, namespace=namespace, queues=queues, concurrency=concurrency, prefetch=prefetch,
            handler_timeouts=handler_timeouts, shutdown_grace=shutdown_grace, metrics_port=metrics_port,
            drain_timeout=drain_timeout, one_listener=one_listener, ack_linger=ack_linger)
        if not callable(fetch):
            raise TypeError(f"fetch must be a Fetch subclass or factory, got {type(fetch).__name__}")
        self.fetch = fetch
        self.metrics = metrics
        self._handlers = HandlerRegistry()
        self._serving = False
        self._life: Lifecycle | None = None
        self._qstats: dict[str, WorkerStats] = {}
        self._running: set[Attempt] = set()
        self._threads = ThreadCount()
        self._presence: Presence | None = None

    @classmethod
    def from_url(cls, url: str | None = None, **kwargs: Any) -> Worker:
        """A worker for the Redis at ``url`` (default: ZSCHED_REDIS_URL, else redis://127.0.0.1:6379/0).
        Nothing connects before ``run()``/``serve()``, so this is safe at import time."""
        return cls(url, **kwargs)

    # -- configuration --------------------------------------------------------------------------
    def configure(
        self,
        *,
        redis_url: str | None = None,
        namespace: str | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
        prefetch: int | None = None,
        handler_timeouts: Mapping[str, float] | None = None,
        shutdown_grace: float | None = None,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
        registry_interval: float | None = None,
        drain_timeout: float | None = None,
        one_listener: bool | None = None,
        ack_linger: float | None = None,
    ) -> Worker:
        """Change settings before the worker starts (the CLI uses this for its overrides); ``None``
        leaves a setting unchanged."""
        if self._serving:
            raise RuntimeError("configure() must be called before the worker starts")
        self.options = self.options.updated(
            redis_url=redis_url, namespace=namespace, queues=queues, concurrency=concurrency, prefetch=prefetch,
            handler_timeouts=handler_timeouts, shutdown_grace=shutdown_grace, metrics_port=metrics_port,
            metrics_host=metrics_host, registry_interval=registry_interval, drain_timeout=drain_timeout,
            one_listener=one_listener, ack_linger=ack_linger)
        return self

    def handler(self, queue: str, *, timeout: float | None = None) -> Callable[[Handler], Handler]:
        """Decorator: register the handler of ``queue`` (one per queue). ``async def`` handlers run
        on the worker's event loop; plain functions run in a thread pool. ``timeout`` in seconds
        (a timeout counts as a failure)."""
        return self._handlers.decorator(queue, timeout=timeout)

    # The settings, read-only (change them with configure(); the mappings refuse changes too).
    @property
    def redis_url(self) -> str | None:
        return self.options.redis_url

    @property
    def namespace(self) -> str | None:
        return self.options.namespace

    @property
    def queues(self) -> list[str] | None:
        return list(self.options.queues) if self.options.queues is not None else None

    @property
    def concurrency(self) -> int:
        return self.options.concurrency

    @property
    def prefetch(self) -> int:
        """Early jobs that may wait on top of :attr:`concurrency` (:attr:`WorkerOptions.prefetch_slots`)."""
        return self.options.prefetch_slots

    @property
    def handler_timeouts(self) -> Mapping[str, float]:
        return self.options.handler_timeouts

    @property
    def shutdown_grace(self) -> float:
        return self.options.shutdown_grace

    @property
    def tombstone_ttl(self) -> float | None:
        return self.options.tombstone_ttl

    @property
    def max_payload_bytes(self) -> int:
        return self.options.max_payload_bytes

    @property
    def partitions(self) -> int | None:
        return self.options.partitions

    @property
    def metrics_port(self) -> int | None:
        return self.options.metrics_port

    @property
    def metrics_host(self) -> str:
        return self.options.metrics_host

    @property
    def idle_sweep(self) -> float:
        return self.options.idle_sweep

    @property
    def redis_options(self) -> Mapping[str, Any]:
        return self.options.redis_options

    @property
    def sharded_pubsub(self) -> bool | None:
        return self.options.sharded_pubsub

    @property
    def registry_interval(self) -> float:
        """Seconds between refreshes of this worker's record in the worker registry."""
        return self.options.registry_interval

    @property
    def worker_id(self) -> str | None:
        """This ``serve()``'s id in the worker registry (``host-pid-random``, as ``zsched workers``
        shows it); None until it has connected, and after it has stopped."""
        return self._presence.id if self._serving and self._presence is not None else None

    # -- introspection --------------------------------------------------------------------------
    @property
    def stats(self) -> WorkerStats:
        """Counters summed over queues (a snapshot)."""
        return WorkerStats.total(self._qstats.values())

    def stats_by_queue(self) -> dict[str, WorkerStats]:
        """Counters per served queue (snapshots)."""
        return {q: WorkerStats(**s.as_dict()) for q, s in self._qstats.items()}

    def handler_specs(self) -> dict[str, HandlerSpec | None]:
        """The handler of each queue this worker serves, as ``serve()`` runs them (``handler_timeouts``
        applied; None: no handler, its jobs are dead-lettered as ``NoHandler``). Used by
        :mod:`scheduler.testing` to run them in-process. ValueError when there is no queue to serve."""
        return self._handlers.for_queues(self._queues_to_serve(), self.options.handler_timeouts)

    @property
    def running(self) -> int:
        """Handlers running now."""
        return len(self._running)

    @property
    def serving(self) -> bool:
        """True between the start and the end of ``serve()``."""
        return self._serving

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the worker is subscribed to its queues' notifications and has swept once
        (from then on a newly ready job is picked up within milliseconds). Raises TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._life is None or not self._life.ready.is_set():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("worker not ready")
            if self._life is None or not self._serving:
                await asyncio.sleep(0.005)  # serve() has not started yet
                continue
            async with asyncio.timeout(None if deadline is None else max(0.0, deadline - time.monotonic())):
                await self._life.ready.wait()

    # -- lifecycle ------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until SIGTERM/SIGINT (graceful: see ``shutdown_grace``); a second signal exits at once.
        An entry point: unless the application configured logging, zsched's own lines (started,
        stopped, Redis unreachable) go to stderr (:func:`scheduler.runtime.entry_point_logging`)."""
        entry_point_logging()
        run(self.serve(handle_signals=True))
        if self._threads.busy:
            # A sync handler we released is still running in a thread: Python would wait for it at
            # exit. Its job is already back in ready, so leave now.
            log.warning("%d sync handler thread(s) still running after shutdown; exiting without waiting",
                        self._threads.busy)
            logging.shutdown()
            os._exit(0)

    async def stop(self) -> None:
        """Graceful shutdown (as on SIGTERM); returns once ``serve()`` has finished."""
        if not self._serving or self._life is None:
            return
        self._life.stop_requested.set()
        await self._life.stopped.wait()

    async def serve(self, *, handle_signals: bool = False) -> None:
        """Run the worker on the current event loop until ``stop()`` (or a signal, with
        ``handle_signals=True``: first SIGTERM/SIGINT graceful, second exits the process)."""
        if self._serving:
            raise RuntimeError("this Worker is already serving")
        queues = self._queues_to_serve()
        record = base_record(queues, self.concurrency, self.prefetch, self.registry_interval, self.options.ack_linger)
        self._serving = True
        life = self._life = Lifecycle()
        self._qstats = {q: WorkerStats() for q in queues}
        self._running = set()
        loop = asyncio.get_running_loop()
        signals = life.install_signals(loop, self.shutdown_grace) if handle_signals else []
        kw: dict[str, Any] = dict(socket_timeout=10.0, socket_connect_timeout=5.0, socket_keepalive=True)
        kw.update(self.options.redis_options)
        redis = async_redis(config.redis_url(self.redis_url), **kw)
        transport = AsyncScriptTransport(redis, WORKER_RETRY)
        crew: _Crew | None = None
        client: AsyncClient | None = None
        failed_to_start = False
        probes = WorkerProbes(life, redis, queues)  # /livez and /readyz answer while Redis is still down
        exported: tuple[Any, PrometheusHistograms | None, Any] = (self.metrics, None, None)
        try:
            try:
                exported = self._export_metrics(config.namespace(self.options.namespace), queues, probes)
                if (client := await connect(redis, self.options, life)) is None:
                    return  # stopped while waiting for Redis
                calls = client.calls
                presence = self._presence = Presence(calls.ks, transport, record, self._running, self._qstats, life)
                crew = self._assemble(loop, queues, client, redis, transport, life, presence, exported)
            except Exception:
                failed_to_start = True  # bad credentials, the metrics port taken...: its error says it all
                raise
            settle_gc()
            port, linger = self.metrics_port, self.options.ack_linger
            extra = ("" if port is None else f", metrics on {metrics_url(self.metrics_host, port)}") + (
                f", acks linger up to {linger * 1000:g} ms" if linger else "")
            log.info("worker serving namespace %r, queues %s, %d partitions, concurrency %d, event loop %s%s, "
                     "registry id %s", calls.ks.namespace, ",".join(queues), calls.ks.partitions, self.concurrency,
                     loop_name(loop), extra, presence.id)
            await life.stop_requested.wait()
            await self._shutdown(crew, life)
        finally:
            try:
                probes.stop()
                if crew is not None:
                    await crew.close()
                else:
                    stop_serving(exported[2])
                life.remove_signals(loop, signals)
                with contextlib.suppress(Exception):
                    await transport.close()
                    if client is not None:
                        await client.transport.close()
                    await redis.aclose()
            finally:
                self._serving = False
                life.stopped.set()
            s = self.stats
            if not failed_to_start:
                log.info("worker stopped: claimed %d, acked %d, failed %d, retried %d, dead %d, released %d, "
                         "lease_lost %d, poison %d", s.claimed, s.acked, s.failed, s.retried, s.dead, s.released,
                         s.lease_lost, s.poison)

    def _queues_to_serve(self) -> list[str]:
        queues = self.queues if self.queues is not None else list(self._handlers)
        if not queues:
            raise ValueError("no queues to serve: register a handler with @worker.handler(queue) or pass queues=[...]")
        for q in queues:
            if q not in self._handlers:
                log.warning("queue %r has no handler on this worker: its jobs will be dead-lettered as NoHandler", q)
        return queues

    def _assemble(self, loop: asyncio.AbstractEventLoop, queues: list[str], client: AsyncClient, redis: Any,
                  transport: AsyncScriptTransport, life: Lifecycle, presence: Presence,
                  exported: tuple[Any, PrometheusHistograms | None, Any]) -> _Crew:
        """Make the parts of this serve() and start their loops (``exported``: :meth:`_export_metrics`'s)."""
        calls = client.calls
        hook, hist, server = exported
        send = sender(transport)
        roundtrip = hist.roundtrip if hist is not None else None
        slots = Slots(self.concurrency, self.prefetch)
        outbox = Outbox(calls, _lease_lost, self.options.ack_linger)
        heartbeats = Heartbeats(self._running, outbox)
        runner = HandlerRunner(
            loop=loop, specs=self._handlers.for_queues(queues, self.options.handler_timeouts), qstats=self._qstats,
            running=self._running, slots=slots, outbox=outbox, heartbeats=heartbeats, life=life, metrics=hook,
            max_payload_bytes=self.max_payload_bytes, threads=self._threads, concurrency=self.concurrency,
            namespace=calls.ks.namespace)
        fetch = self.fetch(FetchContext(
            queues=tuple(queues), partitions=calls.ks.partitions, calls=calls, redis=redis, send=send, slots=slots,
            outbox=outbox, dispatch=runner.dispatch, life=life, idle_sweep=self.idle_sweep, roundtrip=roundtrip,
            stats=self._qstats, one_listener=self.options.one_listener))
        if not isinstance(fetch, Fetch):
            raise TypeError(f"fetch returned a {type(fetch).__name__}, expected a workers.fetch.Fetch")

        async def flush() -> None:
            await outbox.run(send, life, roundtrip, runner.quiet)

        loops = (("doorbell", fetch.listen_loop), ("claim", fetch.claim_loop), ("flush", flush), ("heartbeat",
                 heartbeats.run), ("settings", functools.partial(follow_settings, client, turns=life.turns)))
        tasks = {name: loop.create_task(supervise(name, fn)) for name, fn in loops}
        presence.start()
        return _Crew(slots, outbox, runner, fetch, tasks, server, presence)

    def _export_metrics(self, ns: str, queues: list[str],
                        probes: WorkerProbes) -> tuple[Any, PrometheusHistograms | None, Any]:
        """The per-job hook (the user's, teed with the histograms when exporting), the histograms,
        and the /metrics server with the probes (None without ``metrics_port``; serve() stops it)."""
        if self.metrics_port is None:
            return self.metrics, None, None
        probes.start()
        made: list[PrometheusHistograms] = []

        def add_histograms(registry: Any) -> None:
            made.append(PrometheusHistograms(ns, queues, registry))

        server = start_metrics_server(
            self.metrics_port, ns, self.stats_by_queue, lambda: len(self._running),
            lambda: self.concurrency, addr=self.metrics_host, histograms=add_histograms, health=probes.health)
        if not made:  # prometheus_client missing: no server, no histograms
            return self.metrics, None, server
        return Tee(self.metrics, made[0]), made[0], server

    async def _shutdown(self, crew: _Crew, life: Lifecycle) -> None:
        """Stop claiming, give running handlers ``shutdown_grace`` s, hand back the jobs of those
        still running, then deliver every queued outcome (acks of finished jobs, releases)."""
        life.stopping = True
        life.drain_deadline = time.monotonic() + self.shutdown_grace + self.options.drain_timeout
        crew.slots.wake.set()
        crew.outbox.wake.set()  # lingering acks go now, not at their due time
        crew.tasks["doorbell"].cancel()
        # The claim loop finishes its round trip (jobs it gets are released at once), then exits.
        claim_t = crew.tasks["claim"]
        await asyncio.wait([claim_t], timeout=10)
        claim_t.cancel()
        running = crew.runner.tasks()
        if running:
            log.info("waiting up to %.1f s for %d running handler(s)", self.shutdown_grace, len(running))
            await asyncio.wait(running, timeout=self.shutdown_grace)
        cancelled = crew.runner.hand_back()
        if cancelled:
            await asyncio.wait(cancelled, timeout=1.0)
        crew.tasks["heartbeat"].cancel()
        await crew.outbox.drain(crew.tasks["flush"], life, self.options.drain_timeout)

