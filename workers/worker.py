"""The worker runtime: claims ready jobs, runs handlers, reports outcomes with fenced Lua scripts.

One asyncio loop runs four cooperating tasks; all state lives on the loop thread (no locks):

* ``pubsub``: blocks on ``NS:ready:QUEUE`` messages (payload: a partition number) and marks that
  (queue, partition) as a claim candidate. (Re)subscribing triggers a full sweep.
* ``claim``: whenever there are free slots and candidates, one pipelined round trip of ``claim``
  calls, never asking for more jobs than free slots (so concurrency is exact). A safety-net sweep
  marks every (queue, partition) as a candidate when nothing else happened for ``idle_sweep`` s.
* ``flush``: outcomes (ack, fail, extend, release) are queued per partition and sent together,
  one pipelined round trip, after ~1 ms or as soon as a batch is big; at most one in flight.
* ``heartbeat``: extends the lease of each running job every lease/3.

Redis errors never kill the worker: each task logs once per outage and retries with capped,
jittered backoff; undelivered outcomes stay queued (the job keeps its lease until it expires).
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import random
import signal
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from scheduler.client import AsyncClient
from scheduler.protocol import codec, config
from scheduler.protocol.calls import error_arg
from scheduler.protocol.connection import async_redis
from scheduler.protocol.errors import PayloadError
from scheduler.protocol.ids import encode_id
from scheduler.protocol.keys import validate_name
from scheduler.protocol.replies import Claimed, backoff_delay_ms, parse_claim
from scheduler.protocol.transport import AsyncScriptTransport, RetryPolicy
from scheduler.runtime import settle_gc

from .errors import PermanentError, Retry
from .job import Job
from .stats import PrometheusHistograms, Tee, WorkerMetrics, WorkerStats, start_metrics_server

log = logging.getLogger("zsched.worker")

Handler = Callable[[Job], Any]

# Tuning constants (see docs/workers.md, "Tuning").
CLAIM_CHUNK = 16        # max jobs asked from one (queue, partition) known to be busy, per round trip
FLUSH_DELAY = 0.001     # outcomes wait this long to share a round trip...
FLUSH_BIG = 200         # ...unless this many are queued
CALL_BATCH = 200        # outcomes per script call (bounded work per EVALSHA)
CLAIM_RECEIPT_MS = 30_000  # how long Redis keeps a claim's receipt for a re-send after a lost reply
PUBSUB_PING = 30.0      # idle pub/sub connection health check
BACKOFF_BASE, BACKOFF_CAP = 0.05, 5.0
DRAIN_TIMEOUT = 10.0    # at shutdown, how long to keep trying to deliver outcomes
_REDIS_ERRORS = (RedisError, OSError, asyncio.TimeoutError)
# Transport retries only before a call reaches Redis (connect failures, a restart in progress):
# outcomes and claims that may have run are never re-sent by the transport; the worker's own
# loops re-send them knowing a refusal may then mean "already applied" (see _Run.uncertain).
WORKER_RETRY = RetryPolicy(budget=0.5, attempts=4)

_RUNNING, _DONE, _RELEASED = 0, 1, 2


@dataclass(frozen=True, slots=True)
class _Handler:
    fn: Handler
    is_async: bool
    timeout: float | None


class _Run:
    """Book-keeping of one claimed attempt."""

    __slots__ = ("job", "p", "queue", "raw_id", "token", "lease_s", "rec", "handler", "stats", "task",
                 "next_hb", "hb_pending", "lost", "state", "uncertain", "t0")

    def __init__(self, p: int, queue: str, c: Claimed, handler: _Handler | None, stats: WorkerStats,
                 t0: float) -> None:
        self.p = p
        self.queue = queue
        self.raw_id = c.raw_id
        self.token = c.token
        self.rec = c.record
        self.lease_s = (c.record.lease_ms if c.record else codec.DEFAULT_LEASE_MS) / 1000.0
        self.handler = handler
        self.stats = stats
        self.task: asyncio.Future[Any] | None = None
        self.t0 = t0
        # The claim was sent at t0, so Redis's deadline is at least t0 + lease: extending at
        # lease/3 from t0 leaves two thirds of the lease as margin for a slow round trip.
        self.next_hb = t0 + self.lease_s / 3.0
        self.hb_pending = False
        self.lost = False
        self.state = _RUNNING
        self.uncertain = False  # re-sent after a connection error: a refusal may mean "applied"
        self.job: Job | None = None


class _Outage:
    """Logs a Redis outage once (then every 30 s), recovery once, and computes capped backoff."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failures = 0
        self.since = 0.0
        self.last_log = 0.0

    def failed(self, exc: BaseException) -> float:
        now = time.monotonic()
        if self.failures == 0:
            self.since = now
            self.last_log = now
            log.warning("%s: Redis unavailable (%s: %s); retrying with backoff", self.what, type(exc).__name__, exc)
        elif now - self.last_log > 30:
            self.last_log = now
            log.warning("%s: Redis still unavailable after %.0f s (%s: %s)", self.what, now - self.since,
                        type(exc).__name__, exc)
        self.failures += 1
        return min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(self.failures - 1, 20)) * random.uniform(0.5, 1.0)

    def ok(self) -> None:
        if self.failures:
            log.info("%s: Redis reachable again after %.1f s", self.what, time.monotonic() - self.since)
            self.failures = 0


def _type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__}.{t.__qualname__}"


def _short_tb(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-8))


def _check_positive(name: str, value: object, *, allow_none: bool = False, integer: bool = False) -> Any:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise TypeError(f"{name} must be {'an int' if integer else 'a number'}, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


class Worker:
    """Runs handlers for jobs of one namespace. At-least-once: a job runs again if its worker dies
    or its lease is lost; ``job.id`` and ``job.fence`` let handlers make that harmless.

    ``queues``: queues to serve (default: those with handlers; a served queue without a handler
    dead-letters its jobs as ``NoHandler``). ``concurrency``: exact limit of handlers running at
    once (sync handlers run in a thread pool of that size). ``handler_timeouts``: seconds per queue
    (overrides ``@handler(timeout=...)``); a timeout counts as a failure. ``shutdown_grace``:
    seconds running handlers get to finish after the first SIGTERM/SIGINT before their jobs are
    handed back. ``tombstone_ttl``: seconds a finished job stays visible as ``done``.
    ``metrics``: optional :class:`~workers.stats.WorkerMetrics` hook. ``metrics_port``: serve
    Prometheus metrics on 127.0.0.1:PORT. ``idle_sweep``: seconds between safety-net sweeps when
    idle (stretched so a sweep costs at most ~16 claims/s with many partitions and queues).
    ``redis_kwargs``: extra arguments for ``redis.asyncio.Redis.from_url``.
    """

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        namespace: str | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int = 16,
        handler_timeouts: Mapping[str, float] | None = None,
        shutdown_grace: float = 30.0,
        tombstone_ttl: float = 3600.0,
        max_payload_bytes: int = codec.DEFAULT_MAX_PAYLOAD,
        partitions: int | None = None,
        metrics: WorkerMetrics | None = None,
        metrics_port: int | None = None,
        idle_sweep: float = 2.0,
        redis_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self._handlers: dict[str, _Handler] = {}
        self.redis_url: str | None = None
        self.namespace: str | None = None
        self.queues: list[str] | None = None
        self.concurrency = 16
        self.handler_timeouts: dict[str, float] = {}
        self.shutdown_grace = 30.0
        self.metrics_port: int | None = None
        self.metrics_host = "127.0.0.1"  # loopback unless the operator asks for more
        self.configure(redis_url=redis_url, namespace=namespace, queues=queues, concurrency=concurrency, handler_timeouts=handler_timeouts,
                       shutdown_grace=shutdown_grace, metrics_port=metrics_port)
        self.tombstone_ttl = float(tombstone_ttl)
        if isinstance(max_payload_bytes, bool) or not isinstance(max_payload_bytes, int) or max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be a positive int, got {max_payload_bytes!r}")
        self.max_payload_bytes = max_payload_bytes
        self.partitions = partitions
        self.metrics = metrics
        self.idle_sweep = float(_check_positive("idle_sweep", idle_sweep))
        self.redis_kwargs = dict(redis_kwargs or {})
        self._serving = False
        self._qstats: dict[str, WorkerStats] = {}
        self._running: set[_Run] = set()
        self._stop_requested: asyncio.Event | None = None
        self._stopped: asyncio.Event | None = None
        self._ready_evt: asyncio.Event | None = None
        self._threads_busy = 0
        self._threads_lock = threading.Lock()
        self._mhook: Any = metrics        # the user's hook, teed with the histograms when exporting
        self._hist: PrometheusHistograms | None = None

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
        handler_timeouts: Mapping[str, float] | None = None,
        shutdown_grace: float | None = None,
        metrics_port: int | None = None,
        metrics_host: str | None = None,
    ) -> Worker:
        """Change settings before the worker starts (the CLI uses this for its overrides); ``None``
        leaves a setting unchanged."""
        if getattr(self, "_serving", False):
            raise RuntimeError("configure() must be called before the worker starts")
        if redis_url is not None:
            self.redis_url = config.redis_url(redis_url)
        if namespace is not None:
            self.namespace = config.namespace(namespace)
        if queues is not None:
            if isinstance(queues, str):
                raise TypeError("queues must be a list of queue names, not a str")
            qs = [validate_name("queue", q) for q in queues]
            if not qs:
                raise ValueError("queues must name at least one queue")
            self.queues = list(dict.fromkeys(qs))
        if concurrency is not None:
            _check_positive("concurrency", concurrency, integer=True)
            self.concurrency = concurrency
        if metrics_host is not None:
            if not isinstance(metrics_host, str) or not metrics_host:
                raise ValueError(f"metrics_host must be an address like '127.0.0.1', got {metrics_host!r}")
            self.metrics_host = metrics_host
        if handler_timeouts is not None:
            for q, t in handler_timeouts.items():
                validate_name("queue", q)
                _check_positive(f"handler_timeouts[{q!r}]", t)
            self.handler_timeouts.update(handler_timeouts)
        if shutdown_grace is not None:
            if isinstance(shutdown_grace, bool) or not isinstance(shutdown_grace, (int, float)) \
                    or not math.isfinite(shutdown_grace) or shutdown_grace < 0:
                raise ValueError(f"shutdown_grace must be >= 0 seconds, got {shutdown_grace!r}")
            self.shutdown_grace = float(shutdown_grace)
        if metrics_port is not None:
            if isinstance(metrics_port, bool) or not isinstance(metrics_port, int) or not 0 <= metrics_port <= 65535:
                raise ValueError(f"metrics_port must be a TCP port number, got {metrics_port!r}")
            self.metrics_port = metrics_port
        return self

    def handler(self, queue: str, *, timeout: float | None = None) -> Callable[[Handler], Handler]:
        """Decorator: register the handler of ``queue`` (one per queue). ``async def`` handlers run
        on the worker's event loop; plain functions run in a thread pool. ``timeout`` in seconds
        (a timeout counts as a failure)."""
        validate_name("queue", queue)
        _check_positive("timeout", timeout, allow_none=True)

        def register(fn: Handler) -> Handler:
            if not callable(fn):
                raise TypeError(f"handler for queue {queue!r} must be callable, got {type(fn).__name__}")
            if queue in self._handlers:
                raise ValueError(f"queue {queue!r} already has a handler ({self._handlers[queue].fn!r}); "
                                 "one handler per queue")
            is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
            self._handlers[queue] = _Handler(fn, is_async, float(timeout) if timeout is not None else None)
            return fn

        return register

    # -- introspection --------------------------------------------------------------------------
    @property
    def stats(self) -> WorkerStats:
        """Counters summed over queues (a snapshot)."""
        return WorkerStats.total(self._qstats.values())

    def stats_by_queue(self) -> dict[str, WorkerStats]:
        """Counters per served queue (snapshots)."""
        return {q: WorkerStats(**s.as_dict()) for q, s in self._qstats.items()}

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
        while self._ready_evt is None or not self._ready_evt.is_set():
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("worker not ready")
            if self._ready_evt is None or not self._serving:
                await asyncio.sleep(0.005)  # serve() has not started yet
                continue
            async with asyncio.timeout(None if deadline is None else max(0.0, deadline - time.monotonic())):
                await self._ready_evt.wait()

    # -- lifecycle ------------------------------------------------------------------------------
    def run(self) -> None:
        """Serve until SIGTERM/SIGINT (graceful: see ``shutdown_grace``); a second signal exits at once."""
        asyncio.run(self.serve(handle_signals=True))
        if self._threads_busy:
            # A sync handler we released is still running in a thread: Python would wait for it at
            # exit. Its job is already back in ready, so leave now.
            log.warning("%d sync handler thread(s) still running after shutdown; exiting without waiting",
                        self._threads_busy)
            logging.shutdown()
            os._exit(0)

    async def stop(self) -> None:
        """Graceful shutdown (as on SIGTERM); returns once ``serve()`` has finished."""
        if not self._serving or self._stop_requested is None or self._stopped is None:
            return
        self._stop_requested.set()
        await self._stopped.wait()

    async def serve(self, *, handle_signals: bool = False) -> None:
        """Run the worker on the current event loop until ``stop()`` (or a signal, with
        ``handle_signals=True``: first SIGTERM/SIGINT graceful, second exits the process)."""
        if self._serving:
            raise RuntimeError("this Worker is already serving")
        queues = list(self.queues) if self.queues is not None else list(self._handlers)
        if not queues:
            raise ValueError("no queues to serve: register a handler with @worker.handler(queue) or pass queues=[...]")
        for q in queues:
            if q not in self._handlers:
                log.warning("queue %r has no handler on this worker: its jobs will be dead-lettered as NoHandler", q)
        self._serving = True
        self._loop = asyncio.get_running_loop()
        self._stop_requested = asyncio.Event()
        self._stopped = asyncio.Event()
        self._ready_evt = asyncio.Event()
        self._init_state(queues)
        signals: list[int] = []
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    self._loop.add_signal_handler(sig, self._on_signal, sig)
                    signals.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):  # not main thread / platform
                    pass
        kw: dict[str, Any] = dict(socket_timeout=10.0, socket_connect_timeout=5.0, socket_keepalive=True)
        kw.update(self.redis_kwargs)
        self._redis = async_redis(config.redis_url(self.redis_url), **kw)
        self._transport = AsyncScriptTransport(self._redis, WORKER_RETRY)
        metrics_server = None
        tasks: list[asyncio.Task[Any]] = []
        self._pool: ThreadPoolExecutor | None = None
        try:
            if not await self._connect():
                return
            if any(not h.is_async for q, h in self._handlers.items() if q in self._qstats):
                self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="zsched-handler")
            self._mhook = self.metrics
            self._hist = None
            if self.metrics_port is not None:
                def add_histograms(registry: Any) -> None:
                    self._hist = PrometheusHistograms(self._ns, list(self._qstats), registry)
                    self._mhook = Tee(self.metrics, self._hist)

                metrics_server = start_metrics_server(
                    self.metrics_port, self._ns, self.stats_by_queue, lambda: len(self._running),
                    lambda: self.concurrency, addr=self.metrics_host, histograms=add_histograms)
            tasks = [
                self._loop.create_task(self._supervise("pubsub", self._pubsub_loop)),
                self._loop.create_task(self._supervise("claim", self._claim_loop)),
                self._loop.create_task(self._supervise("flush", self._flush_loop)),
                self._loop.create_task(self._supervise("heartbeat", self._heartbeat_loop)),
            ]
            settle_gc()
            log.info("worker serving namespace %r, queues %s, %d partitions, concurrency %d",
                     self._ns, ",".join(queues), self._P, self.concurrency)
            await self._stop_requested.wait()
            await self._shutdown(tasks)
        finally:
            try:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for sig in signals:
                    self._loop.remove_signal_handler(sig)
                if self._pool is not None:
                    self._pool.shutdown(wait=False, cancel_futures=True)
                if metrics_server is not None:
                    metrics_server.shutdown()
                    metrics_server.server_close()
                try:
                    await self._transport.close()
                    await self._redis.aclose()
                except Exception:
                    pass
            finally:
                self._serving = False
                self._stopped.set()
            s = self.stats
            log.info("worker stopped: claimed %d, acked %d, failed %d, retried %d, dead %d, released %d, "
                     "lease_lost %d, poison %d", s.claimed, s.acked, s.failed, s.retried, s.dead, s.released,
                     s.lease_lost, s.poison)

    def _on_signal(self, sig: int) -> None:
        assert self._stop_requested is not None
        if self._stop_requested.is_set():
            log.warning("second %s: exiting now; unfinished jobs run again after their leases expire",
                        signal.Signals(sig).name)
            logging.shutdown()
            os._exit(1)
        log.info("%s: stopping; running handlers have %.1f s to finish (signal again to exit at once)",
                 signal.Signals(sig).name, self.shutdown_grace)
        self._stop_requested.set()

    def _init_state(self, queues: list[str]) -> None:
        self._queues = queues
        self._qstats = {q: WorkerStats() for q in queues}
        self._specs: dict[str, _Handler | None] = {}
        for q in queues:
            h = self._handlers.get(q)
            t = self.handler_timeouts.get(q)
            if h is not None and t is not None:
                h = _Handler(h.fn, h.is_async, float(t))
            self._specs[q] = h
        self._free = self.concurrency
        self._stopping = False
        self._running = set()
        # claim candidates: queue -> {partition: generation of the last notification}
        self._cands: dict[str, dict[int, int]] = {q: {} for q in queues}
        self._hot: dict[str, set[int]] = {q: set() for q in queues}
        self._gen = 0
        self._qrot = 0
        self._prot: dict[str, int] = {q: 0 for q in queues}
        self._claim_wake = asyncio.Event()
        # Claim request ids: a claim whose reply was lost is re-sent with the same id and Redis
        # answers from its receipt (lua/claim.lua) instead of stranding the jobs until their lease
        # expires. The last answered id per (queue, partition) lets the next claim drop its receipt.
        self._rid_prefix = os.urandom(6).hex()
        self._rid_n = 0
        self._last_rid: dict[tuple[str, int], str] = {}
        self._lost_claims: list[tuple[str, int, int, int, str]] | None = None
        self._last_sweep = time.monotonic()  # the first sweep follows the pub/sub subscription
        # outbox: partition -> items
        self._o_ack: defaultdict[int, list[_Run]] = defaultdict(list)
        self._o_fail: defaultdict[int, list[tuple[_Run, str, int, bytes]]] = defaultdict(list)
        self._o_ext: defaultdict[int, list[_Run]] = defaultdict(list)
        self._o_rel: defaultdict[int, list[_Run]] = defaultdict(list)
        self._o_n = 0
        self._flushing = False
        self._flush_wake = asyncio.Event()
        self._hb_wake = asyncio.Event()
        self._hb_next = math.inf

    async def _connect(self) -> bool:
        """Resolve the namespace's partition count (retrying while Redis is down); False if stopped."""
        outage = _Outage("startup")
        while True:
            try:
                client = AsyncClient(self._redis, namespace=self.namespace, partitions=self.partitions,
                                     max_payload_bytes=self.max_payload_bytes, tombstone_ttl=self.tombstone_ttl)
                await client.connect()
                break
            except _REDIS_ERRORS as exc:
                if await self._wait_stop(outage.failed(exc)):
                    return False
        outage.ok()
        core = client.core
        self._core = core
        self._ns = core.ks.namespace
        self._P = core.ks.partitions
        self._tomb_ms = core.tomb_ms
        self._chan_prefix = core.ks.ready_channel_prefix.encode()
        return True

    async def _wait_stop(self, delay: float) -> bool:
        """Sleep ``delay`` s; True at once if a stop was requested (so backoff never delays shutdown)."""
        assert self._stop_requested is not None
        if self._stop_requested.is_set():
            return True
        try:
            async with asyncio.timeout(delay):
                await self._stop_requested.wait()
            return True
        except TimeoutError:
            return False

    async def _supervise(self, name: str, fn: Callable[[], Awaitable[None]]) -> None:
        """Keep a loop alive: a bug in one iteration is logged and the loop restarts after a pause."""
        while True:
            try:
                await fn()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("worker %s loop crashed; restarting in 1 s", name)
                await asyncio.sleep(1.0)

    # -- Redis calls ----------------------------------------------------------------------------
    async def _exec(self, calls: Sequence[tuple[str, list[str], list[Any]]], lane: str) -> list[Any]:
        """Run script calls in one round trip (the claim and flush loops each have at most one in
        flight). Per-call errors come back as exception objects (one bad partition does not hide
        the others' results); connection errors raise, and nothing that may have reached Redis is
        re-sent by the transport: the caller's loop does that, marking outcomes uncertain."""
        return await self._transport.call_many(calls, resend=False, raise_on_error=False, lane=lane)

    # -- candidates & claiming ------------------------------------------------------------------
    def _notify(self, queue: str, p: int) -> None:
        cands = self._cands.get(queue)
        if cands is None or not 0 <= p < self._P:
            return
        self._gen += 1
        cands[p] = self._gen
        self._claim_wake.set()

    def _mark_all(self) -> None:
        """Full sweep: every (queue, partition) may have ready jobs."""
        self._gen += 1
        g = self._gen
        for q in self._queues:
            c = self._cands[q]
            for p in range(self._P):
                c[p] = g
        self._last_sweep = time.monotonic()
        self._claim_wake.set()

    def _plan(self) -> list[tuple[str, int, int, int]]:
        """Spread the free slots over candidates: queues in rotating order, interleaved, and each
        queue's partitions from a rotating offset, so no queue or partition starves. A candidate
        whose last claim came back full gets up to CLAIM_CHUNK slots (several jobs per call); one
        only known from a notification gets its fair share of the slots left (it may hold a
        single job: slots it does not use are free again after the round trip)."""
        free = self._free
        qs = [q for q in self._queues if self._cands[q]]
        if not qs or free <= 0:
            return []
        k = self._qrot % len(qs)
        self._qrot += 1
        P = self._P
        orders = []
        for q in qs[k:] + qs[:k]:
            off = self._prot[q]
            orders.append((q, sorted(self._cands[q], key=lambda p: (p - off) % P)))
        seq: list[tuple[str, int]] = []
        longest = max(len(o) for _, o in orders)
        for i in range(longest):
            for q, order in orders:
                if i < len(order):
                    seq.append((q, order[i]))
        plan: list[tuple[str, int, int, int]] = []
        left = len(seq)
        for q, p in seq:
            if free <= 0:
                break
            # Busy: a big batch. Unknown depth: a fair share of what is left (1 each when there
            # are more candidates than slots, so every notified partition gets probed).
            n = min(free, CLAIM_CHUNK if p in self._hot[q] else max(1, free // left))
            left -= 1
            plan.append((q, p, n, self._cands[q][p]))
            free -= n
            self._prot[q] = (p + 1) % P
        return plan

    async def _claim_loop(self) -> None:
        outage = _Outage("claim")
        loop_time = time.monotonic
        # The safety-net sweep costs one claim per (queue, partition): keep it under ~16 calls/s
        # per worker, however many partitions and queues (notifications do the real work).
        every = self.idle_sweep * max(1.0, len(self._queues) * self._P / 32)
        while not self._stopping or self._lost_claims is not None:
            lost = self._lost_claims
            if lost is None and (self._free <= 0 or not any(self._cands[q] for q in self._queues)):
                self._claim_wake.clear()
                wait = self._last_sweep + every * random.uniform(0.8, 1.0) - loop_time()
                if wait <= 0:
                    if self._free > 0:
                        self._mark_all()  # safety net: a lost notification costs at most ~one sweep period
                        continue
                    wait = every
                try:
                    async with asyncio.timeout(wait):
                        await self._claim_wake.wait()
                except TimeoutError:
                    pass
                continue
            if lost is not None:
                plan = lost  # the same request ids: Redis answers from the receipts; slots still reserved
            else:
                plan = []
                for q, p, n, gen in self._plan():
                    self._rid_n += 1
                    plan.append((q, p, n, gen, f"{self._rid_prefix}{self._rid_n:x}"))
                self._free -= sum(item[2] for item in plan)  # slots are taken before the round trip
            # Outcomes waiting for the flush loop ride along (one round trip instead of two); they
            # go first, so a job failed with no delay is back in ready before the claims run.
            calls, meta = self._take_outbox()
            k = len(calls)
            call = self._core.call
            calls += [call("claim", p, q, n, rid, CLAIM_RECEIPT_MS, self._last_rid.get((q, p), ""))
                      for q, p, n, _, rid in plan]
            t0 = loop_time()
            try:
                replies = await self._exec(calls, "claim")
                if self._hist is not None:
                    self._hist.roundtrip("claim", loop_time() - t0)
            except _REDIS_ERRORS as exc:
                self._requeue(meta)
                if self._stopping:  # give up: those jobs are reaped when their leases expire
                    self._free += sum(item[2] for item in plan)
                    self._lost_claims = None
                    return
                self._lost_claims = plan  # the claims may have run: ask again with the same ids
                if await self._wait_stop(outage.failed(exc)):
                    continue  # one last re-send so claimed jobs are released now, not reaped later
                self._mark_all()  # anything may have become ready meanwhile
                continue
            self._lost_claims = None
            outage.ok()
            if k:
                self._apply_outcomes(meta, replies[:k])
            for (q, p, n, gen, rid), reply in zip(plan, replies[k:]):
                self._last_rid[(q, p)] = rid
                if isinstance(reply, Exception):
                    self._free += n
                    self._cands[q].pop(p, None)  # back with the next notification or sweep
                    log.error("claim on partition %d queue %r failed: %s", p, q, reply)
                    continue
                _, jobs = parse_claim(reply)
                got = len(jobs)
                self._free += n - got
                cands = self._cands[q]
                if got == n:
                    self._hot[q].add(p)
                else:
                    self._hot[q].discard(p)
                    if cands.get(p) == gen:  # no notification since we asked: that list is empty
                        del cands[p]
                if got:
                    self._start_jobs(q, p, jobs, t0)

    def _start_jobs(self, q: str, p: int, jobs: list[Claimed], t0: float) -> None:
        stats = self._qstats[q]
        stats.claimed += len(jobs)
        spec = self._specs[q]
        limit = self.max_payload_bytes
        create_task = self._loop.create_task
        metrics = self._mhook
        for c in jobs:
            r = _Run(p, q, c, spec, stats, t0)
            if self._stopping:
                # Claimed while we were stopping: hand it straight back (no attempt spent).
                self._free += 1
                r.state = _RELEASED
                self._queue_release(r)
                continue
            rec = c.record
            if rec is None:
                self._poison(r, "PoisonJob", f"job record cannot be decoded: {c.decode_error}")
                continue
            if spec is None:
                self._poison(r, "NoHandler", f"no handler registered for queue {q!r} on this worker")
                continue
            try:
                payload = codec.unpack_payload(rec.payload_bytes, limit)
            except PayloadError as exc:
                self._poison(r, "PoisonJob", f"payload cannot be decoded: {exc}")
                continue
            job = Job(c.raw_id, q, payload, rec.key, rec.attempt, rec.max_attempts, c.due_ms, c.token, r.lease_s)
            if rec.cron_nominal_ms is not None:
                job._cron_ms, job.cron_missed = rec.cron_nominal_ms, rec.cron_missed
            r.job = job
            self._running.add(r)
            if metrics is not None:
                try:
                    metrics.job_started(job)
                except Exception:
                    log.exception("metrics.job_started failed")
            r.task = create_task(self._run_async(r) if spec.is_async else self._run_sync(r))
            if r.next_hb < self._hb_next:
                self._hb_wake.set()

    def _poison(self, r: _Run, etype: str, message: str) -> None:
        self._free += 1
        r.stats.poison += 1
        r.state = _DONE
        log.error("poison job %s on queue %r (partition %d): %s: %s; dead-lettering it",
                  encode_id(r.raw_id), r.queue, r.p, etype, message)
        self._queue_fail(r, "p", 0, error_arg(etype, message))

    # -- running handlers -----------------------------------------------------------------------
    async def _run_async(self, r: _Run) -> None:
        spec = r.handler
        assert spec is not None and r.job is not None
        try:
            if spec.timeout is None:
                await spec.fn(r.job)
            else:
                try:
                    async with asyncio.timeout(spec.timeout) as cm:
                        await spec.fn(r.job)
                except TimeoutError:
                    if cm.expired():
                        self._finish_timeout(r)
                        return
                    raise
        except asyncio.CancelledError:
            if r.state == _RELEASED:
                return  # shutdown handed the job back; nothing to report
            self._finish_exc(r, _CancelledByOther())
            raise
        except BaseException as exc:  # noqa: BLE001 - even SystemExit from a handler is just a failure
            self._finish_exc(r, exc)
        else:
            self._finish_ok(r)

    async def _run_sync(self, r: _Run) -> None:
        spec = r.handler
        assert spec is not None and r.job is not None and self._pool is not None
        fut = self._loop.run_in_executor(self._pool, self._call_sync, spec.fn, r.job)
        try:
            if spec.timeout is None:
                await fut
            else:
                try:
                    await asyncio.wait_for(asyncio.shield(fut), spec.timeout)
                except TimeoutError:
                    if fut.done():
                        fut.result()  # it finished at the deadline: use its own outcome
                    else:
                        # A thread cannot be interrupted: report the timeout now (so the retry is
                        # scheduled) but keep the slot until the thread returns, so the limit stays exact.
                        self._finish_timeout(r, keep_slot=True)
                        fut.add_done_callback(self._thread_done_late)
                        return
        except asyncio.CancelledError:
            if r.state == _RELEASED:
                return
            self._finish_exc(r, _CancelledByOther())
            raise
        except BaseException as exc:  # noqa: BLE001
            self._finish_exc(r, exc)
        else:
            self._finish_ok(r)

    def _call_sync(self, fn: Handler, job: Job) -> Any:
        with self._threads_lock:
            self._threads_busy += 1
        try:
            return fn(job)
        finally:
            with self._threads_lock:
                self._threads_busy -= 1

    def _thread_done_late(self, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled():
            fut.exception()  # retrieve it: the outcome was already reported as a timeout
        self._release_slot()

    def _release_slot(self) -> None:
        self._free += 1
        self._claim_wake.set()

    def _end(self, r: _Run, outcome: str, keep_slot: bool = False) -> None:
        r.state = _DONE
        self._running.discard(r)
        r.task = None  # no reference cycles: finished jobs are freed by refcounting, not the GC
        if not keep_slot:
            self._free += 1
            self._claim_wake.set()
        if self._mhook is not None:
            try:
                self._mhook.job_finished(r.job, outcome, time.monotonic() - r.t0)  # type: ignore[arg-type]
            except Exception:
                log.exception("metrics.job_finished failed")

    def _finish_ok(self, r: _Run) -> None:
        if r.state != _RUNNING:
            return
        self._end(r, "ok")
        if r.lost:
            return  # refused for sure (tokens only grow): already counted and logged
        self._o_ack[r.p].append(r)
        self._o_n += 1
        self._flush_wake.set()

    def _finish_timeout(self, r: _Run, keep_slot: bool = False) -> None:
        if r.state != _RUNNING:
            return
        spec = r.handler
        assert spec is not None and spec.timeout is not None
        self._end(r, "timeout", keep_slot)
        r.stats.failed += 1
        msg = f"handler for queue {r.queue!r} did not finish within {spec.timeout:g} s"
        self._report_failure(r, "f", self._backoff_ms(r), error_arg("HandlerTimeout", msg), "HandlerTimeout", msg)

    def _finish_exc(self, r: _Run, exc: BaseException) -> None:
        if r.state != _RUNNING:
            return
        if isinstance(exc, Retry):
            self._end(r, "retry")
            delay = self._backoff_ms(r) if exc.delay is None else int(exc.delay * 1000)
            log.debug("job %s (queue %r, attempt %d) asked for a retry in %.3g s", encode_id(r.raw_id), r.queue,
                      r.rec.attempt if r.rec else 0, delay / 1000)
            self._report_failure(r, "r", delay, error_arg("Retry", str(exc)), None, None)
            return
        kind, outcome = ("p", "permanent") if isinstance(exc, PermanentError) else ("f", "failed")
        self._end(r, outcome)
        r.stats.failed += 1
        etype, msg = _type_name(exc), str(exc)
        self._report_failure(r, kind, self._backoff_ms(r) if kind == "f" else 0,
                             error_arg(etype, msg, _short_tb(exc)), etype, msg)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("job %s handler traceback", encode_id(r.raw_id), exc_info=exc)

    def _backoff_ms(self, r: _Run) -> int:
        rec = r.rec
        assert rec is not None
        return backoff_delay_ms(rec.attempt, rec.backoff_base_ms, rec.backoff_cap_ms)

    def _report_failure(self, r: _Run, kind: str, delay_ms: int, err: bytes, etype: str | None,
                        msg: str | None) -> None:
        job = r.job
        if etype is not None and job is not None:
            last = kind == "p" or job.attempt >= job.max_attempts
            log.warning("job %s (queue %r, attempt %d/%d) failed: %s: %s; %s", job.id, r.queue, job.attempt,
                        job.max_attempts, etype, msg,
                        "dead-lettering it" if last else f"retry in {delay_ms / 1000:.3g} s")
        if r.lost:
            return
        self._queue_fail(r, kind, delay_ms, err)

    # -- outbox ---------------------------------------------------------------------------------
    def _queue_fail(self, r: _Run, kind: str, delay_ms: int, err: bytes) -> None:
        self._o_fail[r.p].append((r, kind, max(0, int(delay_ms)), err))
        self._o_n += 1
        self._flush_wake.set()

    def _queue_release(self, r: _Run) -> None:
        self._o_rel[r.p].append(r)
        self._o_n += 1
        self._flush_wake.set()

    def _lease_lost(self, r: _Run, what: str) -> None:
        if r.uncertain:
            log.info("%s of job %s was refused after a connection error: it was either applied before the "
                     "connection dropped or the lease had expired", what, encode_id(r.raw_id))
            return
        if r.lost:
            return
        r.lost = True
        if r.job is not None:
            r.job._lost = True
        r.stats.lease_lost += 1
        log.warning("job %s (queue %r): %s refused, the lease was lost (expired or taken over); the job "
                    "may run again elsewhere", encode_id(r.raw_id), r.queue, what)

    async def _flush_loop(self) -> None:
        outage = _Outage("outcomes")
        while True:
            if not self._o_n:
                self._flush_wake.clear()
                await self._flush_wake.wait()
                continue
            if self._o_n < FLUSH_BIG:
                await asyncio.sleep(FLUSH_DELAY)  # let more outcomes join this round trip
            calls, meta = self._take_outbox()
            if not calls:
                continue  # the claim loop took them along with its claims
            self._flushing = True
            try:
                t_flush = time.perf_counter()
                results = await self._exec(calls, "flush")
                if self._hist is not None:
                    self._hist.roundtrip("ack", time.perf_counter() - t_flush)
            except _REDIS_ERRORS as exc:
                self._requeue(meta)
                self._flushing = False
                if self._stopping and self._drain_deadline < time.monotonic():
                    return
                await asyncio.sleep(outage.failed(exc))
                continue
            self._flushing = False
            outage.ok()
            self._apply_outcomes(meta, results)

    def _take_outbox(self) -> tuple[list[tuple[str, list[str], list[Any]]], list[tuple[str, list[Any]]]]:
        """Empty the outbox into script calls (and the items each call carries)."""
        if not self._o_n:
            return [], []
        ext, fails, acks, rels = self._o_ext, self._o_fail, self._o_ack, self._o_rel
        self._o_ext, self._o_fail, self._o_ack, self._o_rel = (defaultdict(list), defaultdict(list),
                                                                 defaultdict(list), defaultdict(list))
        self._o_n = 0
        return self._build_outcome_calls(ext, fails, acks, rels)

    def _apply_outcomes(self, meta: list[tuple[str, list[Any]]], results: Sequence[Any]) -> None:
        for (kind, items), res in zip(meta, results):
            if isinstance(res, Exception):
                log.error("%s script failed (will retry): %s", kind, res)
                self._requeue([(kind, items)])
                self._flush_wake.set()
                continue
            self._apply_results(kind, items, res)

    def _build_outcome_calls(self, ext: dict[int, list[_Run]], fails: dict[int, list[tuple[_Run, str, int, bytes]]],
                             acks: dict[int, list[_Run]], rels: dict[int, list[_Run]]
                             ) -> tuple[list[tuple[str, list[str], list[Any]]], list[tuple[str, list[Any]]]]:
        call = self._core.call
        calls: list[tuple[str, list[str], list[Any]]] = []
        meta: list[tuple[str, list[Any]]] = []
        # Extends first: a job may have finished since its heartbeat was queued.
        for p, runs in ext.items():
            runs = [r for r in runs if r.state == _RUNNING and not r.lost]
            for s in range(0, len(runs), CALL_BATCH):
                chunk = runs[s:s + CALL_BATCH]
                args: list[Any] = []
                for r in chunk:
                    args += (r.raw_id, r.token, 0)
                calls.append(call("extend", p, *args))
                meta.append(("extend", chunk))
        for p, items in fails.items():
            for s in range(0, len(items), CALL_BATCH // 2):
                chunk = items[s:s + CALL_BATCH // 2]
                args = []
                for r, kind, delay, err in chunk:
                    args += (r.raw_id, r.token, kind, delay, err)
                calls.append(call("fail", p, *args))
                meta.append(("fail", chunk))
        for name, src in (("ack", acks), ("release", rels)):
            for p, runs in src.items():
                for s in range(0, len(runs), CALL_BATCH):
                    chunk = runs[s:s + CALL_BATCH]
                    args = [self._tomb_ms] if name == "ack" else []
                    for r in chunk:
                        args.append(r.raw_id)
                        args.append(r.token)
                    calls.append(call(name, p, *args))
                    meta.append((name, chunk))
        return calls, meta

    def _requeue(self, meta: list[tuple[str, list[Any]]]) -> None:
        """Put outcomes back after a failed round trip (the job keeps its lease meanwhile)."""
        if meta:
            self._flush_wake.set()
        for kind, items in meta:
            for it in items:
                r = it[0] if kind == "fail" else it
                r.uncertain = True
                if kind == "extend":
                    if r.state == _RUNNING:
                        self._o_ext[r.p].append(r)
                        self._o_n += 1
                elif kind == "fail":
                    self._o_fail[r.p].append(it)
                    self._o_n += 1
                elif kind == "ack":
                    self._o_ack[r.p].append(r)
                    self._o_n += 1
                else:
                    self._o_rel[r.p].append(r)
                    self._o_n += 1

    def _apply_results(self, kind: str, items: list[Any], res: list[Any]) -> None:
        if kind == "ack":
            for r, code in zip(items, res):
                if code == 1:
                    r.stats.acked += 1
                else:
                    self._lease_lost(r, "ack")
        elif kind == "fail":
            for (r, kind, _d, _e), code in zip(items, res):
                if code == 1:
                    r.stats.retried += 1
                elif code == 2:
                    r.stats.dead += 1
                    if kind == "r":  # failures and poison were logged when they happened
                        log.warning("job %s (queue %r) asked for a retry but its attempts are spent; dead-lettered",
                                    encode_id(r.raw_id), r.queue)
                else:
                    self._lease_lost(r, "fail")
        elif kind == "extend":
            for r, deadline in zip(items, res):
                r.hb_pending = False
                if not deadline:
                    self._lease_lost(r, "lease extension")
        else:
            for r, code in zip(items, res):
                if code == 1:
                    r.stats.released += 1
                else:
                    self._lease_lost(r, "release")

    # -- heartbeat ------------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        while True:
            if not self._running:
                self._hb_next = math.inf
                self._hb_wake.clear()
                await self._hb_wake.wait()
                continue
            now = time.monotonic()
            nxt = math.inf
            queued = False
            for r in self._running:
                if r.lost:
                    continue
                if r.next_hb <= now:
                    r.next_hb = now + r.lease_s / 3.0
                    if not r.hb_pending:
                        r.hb_pending = True
                        self._o_ext[r.p].append(r)
                        self._o_n += 1
                        queued = True
                if r.next_hb < nxt:
                    nxt = r.next_hb
            if queued:
                self._flush_wake.set()
            self._hb_next = nxt
            self._hb_wake.clear()
            if nxt == math.inf:
                continue
            try:
                async with asyncio.timeout(max(0.005, nxt - time.monotonic())):
                    await self._hb_wake.wait()
            except TimeoutError:
                pass

    # -- pub/sub --------------------------------------------------------------------------------
    async def _pubsub_loop(self) -> None:
        outage = _Outage("pubsub")
        channels = [self._core.ks.ready_channel(q) for q in self._queues]
        prefix = self._chan_prefix
        plen = len(prefix)
        notify = self._notify
        while not self._stopping:
            ps = self._redis.pubsub()
            try:
                await ps.subscribe(*channels)
                # Wait for every confirmation before sweeping, or a job landing between the
                # sweep and the subscription would wait for the next safety-net sweep.
                confirmed = 0
                async with asyncio.timeout(10):
                    while confirmed < len(channels):
                        msg = await ps.get_message(timeout=5)
                        if msg is None:
                            continue
                        if msg["type"] == "subscribe":
                            confirmed += 1
                        elif msg["type"] == "message":
                            with contextlib.suppress(ValueError):  # malformed: the sweep below covers it
                                notify(msg["channel"][plen:].decode(), int(msg["data"]))
                outage.ok()
                self._mark_all()
                assert self._ready_evt is not None
                self._ready_evt.set()
                ping_sent = 0.0
                while True:
                    msg = await ps.get_message(timeout=PUBSUB_PING)
                    if msg is None:
                        if ping_sent:
                            raise ConnectionError(f"no PONG on the pub/sub connection within {PUBSUB_PING:g} s")
                        await ps.ping()
                        ping_sent = time.monotonic()
                        continue
                    t = msg["type"]
                    if t == "message":
                        ch = msg["channel"]
                        if ch.startswith(prefix):
                            try:
                                notify(ch[plen:].decode(), int(msg["data"]))
                            except ValueError:
                                log.warning("ignoring malformed ready message %r on %r", msg["data"], ch)
                    elif t == "pong":
                        ping_sent = 0.0
            except _REDIS_ERRORS as exc:
                delay = outage.failed(exc)
            finally:
                try:
                    await ps.aclose()
                except Exception:
                    pass
            if await self._wait_stop(delay):
                return

    # -- shutdown -------------------------------------------------------------------------------
    async def _shutdown(self, tasks: list[asyncio.Task[Any]]) -> None:
        pubsub_t, claim_t, flush_t, hb_t = tasks
        self._stopping = True
        self._drain_deadline = time.monotonic() + self.shutdown_grace + DRAIN_TIMEOUT
        self._claim_wake.set()
        pubsub_t.cancel()
        # The claim loop finishes its round trip (jobs it gets are released at once), then exits.
        await asyncio.wait([claim_t], timeout=10)
        claim_t.cancel()
        running = [r for r in self._running if r.task is not None]
        if running:
            log.info("waiting up to %.1f s for %d running handler(s)", self.shutdown_grace, len(running))
            await asyncio.wait([r.task for r in running], timeout=self.shutdown_grace)  # type: ignore[misc]
        left = [r for r in self._running if r.state == _RUNNING]
        if left:
            log.warning("handing %d unfinished job(s) back to ready (no attempt spent)", len(left))
            for r in left:
                r.state = _RELEASED
                self._running.discard(r)
                if not r.lost:
                    self._queue_release(r)
                if self._mhook is not None and r.job is not None:
                    try:
                        self._mhook.job_finished(r.job, "released", time.monotonic() - r.t0)
                    except Exception:
                        log.exception("metrics.job_finished failed")
                if r.task is not None:
                    r.task.cancel()
            await asyncio.wait([r.task for r in left if r.task is not None], timeout=1.0)
        # Deliver every queued outcome (acks of finished jobs, releases) before leaving.
        hb_t.cancel()
        deadline = time.monotonic() + DRAIN_TIMEOUT
        self._drain_deadline = deadline
        while (self._o_n or self._flushing) and time.monotonic() < deadline and not flush_t.done():
            self._flush_wake.set()
            await asyncio.sleep(0.005)
        if self._o_n or self._flushing:
            log.error("could not deliver %d outcome(s) before exiting; those jobs run again after their leases "
                      "expire", self._o_n)


class _CancelledByOther(Exception):
    """A handler task was cancelled by something other than the worker's own shutdown."""

    def __str__(self) -> str:
        return "handler task was cancelled"
