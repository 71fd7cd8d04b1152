"""``zsched scheduler``: one replica of the scheduler tier.

Glue between the pieces: the etcd :class:`Ownership` decides which partitions this replica owns;
for each one a :class:`PartitionRunner` fires due jobs; a pub/sub listener wakes runners when a
producer schedules a job earlier than the partition's current earliest timer. With sharded pub/sub
(Redis Cluster) the listener SSUBSCRIBEs to every partition's wake and epoch-reset channels, each
on the node that owns the partition, and to the namespace's config channel.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..client import AsyncClient
from ..coord import Coordinator, CoordinatorUnavailable
from ..health import CHECK_REUSE_S, STALE_AFTER_S, Health, Verdict
from ..metrics import (
    PartitionStatsCollector,
    SchedulerMetrics,
    WorkerRegistryCollector,
    metrics_url,
    serve,
    stop_serving,
)
from ..protocol import config
from ..protocol.masking import mask_secrets
from ..protocol.replies import parse_stats
from ..redisio.connection import async_redis, permanent_failure
from ..redisio.errors import REDIS_ERRORS
from ..redisio.pubsub import ChannelsPending, Subscription, subscription
from ..redisio.transport import AsyncScriptTransport, RedisRetry
from ..runtime import loop_name, run, settle_gc, stop_signals
from .bells import BellRinger
from .coalesce import IdleGrid, TickBatcher
from .namespace_config import NamespaceConfig
from .ownership import Ownership, default_replica_id
from .runner import PartitionRunner, RunnerConfig
from .worker_registry import RegistryExport

log = logging.getLogger("zsched.scheduler")

TIER_RETRY = RedisRetry(budget=0.5, attempts=4)


@dataclass
class SchedulerConfig:
    """A replica's settings (``zsched scheduler`` builds it from its arguments and the environment).

    ``ignore_deadline`` switches the local ownership deadline off, so that only the epoch fence
    stops a replica that froze past its lease: a knob for tests of that fence, never for production.
    """

    redis_url: str = field(default_factory=config.redis_url)
    etcd_endpoints: str = field(default_factory=config.etcd_endpoints)
    namespace: str = field(default_factory=config.namespace)
    partitions: int | None = None
    replica_id: str = field(default_factory=default_replica_id)
    lease_ttl: float = 5.0
    metrics_port: int | None = None
    metrics_host: str = config.DEFAULT_METRICS_HOST
    tombstone_ttl: float | None = None  # deprecated: the namespace's (Client.set_tombstone_ttl) is followed
    redis_timeout: float = 5.0   # socket timeout of every Redis call (a stall longer than this is retried)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    ignore_deadline: bool = False
    # sharded pub/sub (SSUBSCRIBE per partition, Redis >= 7): None = when the URL is a cluster's
    # (AsyncClient's sharded_pubsub); the CLI keeps it automatic
    sharded_pubsub: bool | None = None
    # zsched_queue_due_soon counts the jobs ready or due within this many seconds (KEDA scales on it)
    due_soon_horizon: float = 30.0
    live_stale_after: float = STALE_AFTER_S  # /livez fails once the event loop stalls this long


class SchedulerProcess:
    """A scheduler replica. ``await run()`` until ``stop()`` (or SIGTERM/SIGINT via :func:`main`)."""

    def __init__(self, cfg: SchedulerConfig, coord: Coordinator | None = None) -> None:
        self.cfg = cfg
        self.metrics = SchedulerMetrics(cfg.replica_id)
        self.partition_stats = PartitionStatsCollector(cfg.namespace, cfg.due_soon_horizon)
        self.metrics.registry.register(self.partition_stats)
        # the worker registry as metrics, while this replica owns partition 0 (worker_registry.py)
        self.worker_registry = WorkerRegistryCollector(cfg.namespace)
        self.metrics.registry.register(self.worker_registry)
        # The socket timeout bounds a call on a stalled Redis; the epoch fences a call that lands late.
        self.redis = async_redis(cfg.redis_url, health_check_interval=10, socket_timeout=cfg.redis_timeout)
        self.client = AsyncClient(self.redis, namespace=cfg.namespace, partitions=cfg.partitions,
                                  tombstone_ttl=cfg.tombstone_ttl, sharded_pubsub=cfg.sharded_pubsub)
        # Short retries only: a firing loop must get back to checking its ownership deadline, and it
        # backs off itself. Re-sending tick/reap/cron_fill is safe (epoch-fenced; transport.RESEND).
        self.transport = AsyncScriptTransport(self.redis, TIER_RETRY)
        self.batcher = TickBatcher(self.transport)  # the partitions' ticks that wake together: one round trip
        self.grid = IdleGrid()  # the partitions' idle checks and reap turns: one wake-up
        # TLS material comes from files named in the environment (URLs carry user:password and https)
        from ..coord import EtcdCoordinator  # gRPC loads only in a process that runs the tier

        self.coord = coord or EtcdCoordinator.from_endpoints(
            cfg.etcd_endpoints, **config.etcd_tls()._asdict())
        self.runners: dict[int, PartitionRunner] = {}
        self.metrics.coalescing_partitions.labels(cfg.replica_id).set_function(
            lambda: sum(1 for r in self.runners.values() if r.lead.widened))  # read at each scrape
        self.ringer: BellRinger | None = None  # set once the layout is known (_start)
        # owned partitions whose epoch Redis refuses although etcd says they are ours (epoch
        # conflict) -> the newest epoch Redis has seen; exported as zsched_epoch_conflict_partitions
        self.conflicts: dict[int, int] = {}
        # partition -> Redis's epoch when its conflict was last logged: one error per partition per
        # outage (an outage is identified by the epoch that blocks it: refusals do not change it)
        self._conflict_reported: dict[int, int] = {}
        self.ownership: Ownership | None = None
        # rate limits, retention
        self.settings = NamespaceConfig(self.redis, self.client, self._limits_changed, TIER_RETRY)
        self._closing = False
        # the wake-up subscription is up: while it is not, producers' wake-ups are lost and each
        # partition ticks on every wake-up of its loop (PartitionRunner's ``listening``)
        self._listening = False
        self._stop = asyncio.Event()
        self._wake_task: asyncio.Task[None] | None = None
        self._config_task: asyncio.Task[None] | None = None
        self._stats_task: asyncio.Task[None] | None = None
        self._registry_task: asyncio.Task[None] | None = None
        self.health = Health(stale_after=cfg.live_stale_after)  # /livez, /readyz next to /metrics
        self._health_task: asyncio.Task[None] | None = None
        self._http: Any = None  # the /metrics, /livez and /readyz server, stopped with the replica
        self.registry_export: RegistryExport | None = None

    @property
    def replica_id(self) -> str:
        """This replica's name in etcd."""
        return self.cfg.replica_id

    async def run(self) -> None:
        """Connect, take a share of the partitions and fire them until :meth:`stop`; then hand
        them over (lease revoked) and close the connections. While Redis or etcd cannot be
        reached at start-up it retries (logging why) and a stop ends it at once; bad credentials,
        unreadable TLS files or a metrics port in use raise."""
        try:
            started = await self._start()
        except BaseException:
            await self._close_connections()
            raise
        if not started:
            await self._close_connections()
            log.info("scheduler replica %s stopped during start-up", self.replica_id)
            return
        await self._stop.wait()
        await self._shutdown()

    async def _start(self) -> bool:
        """Everything before firing; False when a stop came first."""
        if self.cfg.metrics_port is not None:  # first: a port in use is refused before anything connects
            self._http = serve(self.metrics.registry, self.cfg.metrics_port, self.cfg.metrics_host, self.health)
            self._health_task = asyncio.create_task(self.health.run(self.readiness), name="health")
        if not await self._retry("Redis", self.cfg.redis_url, self.client.connect):
            return False
        core = self.client.calls
        # on Redis Cluster the scripts cannot ring the doorbells (another slot): the owner does
        self.ringer = BellRinger(self.redis, core.ks) if core.ks.sharded else None
        if not await self._retry("etcd", self.cfg.etcd_endpoints, self.coord.connect):
            return False
        self.metrics.partitions.labels(self.cfg.namespace).set(core.ks.partitions)
        self.ownership = Ownership(
            self.coord, namespace=self.cfg.namespace, partitions=core.ks.partitions,
            replica_id=self.cfg.replica_id, ttl=self.cfg.lease_ttl, metrics=self.metrics,
            on_acquire=self._start_partition, on_release=self._stop_partition,
            ignore_deadline=self.cfg.ignore_deadline)
        await self.settings.load()
        self._wake_task = asyncio.create_task(self._wake_listener(), name="wake-listener")
        self._config_task = asyncio.create_task(self.settings.follow(lambda: self._closing), name="config-poller")
        self._stats_task = asyncio.create_task(self._stats_poller(), name="stats-poller")
        self.registry_export = RegistryExport(self.worker_registry, self.transport, core.ks, self.runners.__contains__)
        self._registry_task = asyncio.create_task(self.registry_export.run(lambda: self._closing),
                                                  name="worker-registry")
        # registering retries while etcd answers connect but not grant/put: a stop ends that too
        if not await self._unless_stopped(self.ownership.start()):
            await self._shutdown()  # the loops started above, and a lease granted before the stop
            return False
        settle_gc()
        # the event loop and the metrics address are named here, not as they are set up: a start-up
        # that fails prints its one error line and nothing else
        metrics = "" if self.cfg.metrics_port is None else \
            f", metrics on {metrics_url(self.cfg.metrics_host, self.cfg.metrics_port)}"
        log.info("scheduler replica %s up: namespace %s, %d partitions, lease ttl %.1fs, event loop: %s%s",
                 self.replica_id, self.cfg.namespace, core.ks.partitions, self.cfg.lease_ttl,
                 loop_name(asyncio.get_running_loop()), metrics)
        return True

    def stop(self) -> None:
        """Ask :meth:`run` to shut down (safe from a signal handler)."""
        self._stop.set()

    async def readiness(self) -> Verdict:
        """``/readyz``: Redis answers now and this replica takes part in the ownership protocol
        (registered in etcd, its lease confirmed recently enough to act on), not stopping."""
        own = self.ownership
        if self._stop.is_set():
            return Verdict(False, "stopping: handing its partitions over")
        if own is None or own.lease_id is None:
            return Verdict(False, "starting: connecting to Redis and etcd, registering in etcd")
        if not self.batcher.answered_within(self.cfg.runner.idle_check + CHECK_REUSE_S):  # else no PING
            await self.redis.ping()
        if not own.is_valid():
            return Verdict(False, f"etcd lease not confirmed for {-own.valid_for():.1f}s past its safety margin "
                                  "(etcd unreachable?): partitions do not fire")
        return Verdict(True, f"Redis answers; etcd lease valid for {own.valid_for():.1f}s; owns "
                             f"{len(own.owned)} of {own.partitions} partitions")

    async def _retry(self, what: str, where: str, connect: Callable[[], Awaitable[object]]) -> bool:
        """``connect()`` until it succeeds (True) or a stop is asked for (False, at once, even in
        the middle of an attempt). An outage is logged (``where``, the URL or endpoint list, and
        the error masked) and retried with backoff; what retrying cannot fix (bad credentials, a
        TLS file that cannot be read) is raised."""
        delay = 0.1
        while True:
            try:
                if not await self._unless_stopped(connect()):
                    return False
                return True
            except (*REDIS_ERRORS, CoordinatorUnavailable) as exc:
                if permanent_failure(exc):
                    raise
                # etcd's error names the endpoints and the fix already
                hint = " (is it running? check --redis / ZSCHED_REDIS_URL)" if what == "Redis" else ""
                log.error("cannot reach %s at %s: %s; retrying in %.1fs%s", what, mask_secrets(where),
                          mask_secrets(str(exc)), delay, hint)
            try:
                await asyncio.wait_for(self._stop.wait(), delay)
                return False
            except TimeoutError:
                delay = min(2.0, delay * 2)

    async def _unless_stopped(self, aw: Awaitable[object]) -> bool:
        """Await ``aw``; if a stop is asked for first, cancel it and return False."""
        work = asyncio.ensure_future(aw)
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if work.done():
            work.result()
            return True
        work.cancel()
        with contextlib.suppress(BaseException):
            await work
        return False

    async def _close_connections(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        await self._stop_http()
        with contextlib.suppress(Exception):
            await self.coord.close()
        with contextlib.suppress(Exception):
            await self.transport.close()
            await self.client.close()  # and the replica's Redis client

    async def _shutdown(self) -> None:
        t0 = time.monotonic()
        if self.ownership is not None:
            await self.ownership.shutdown()
        # a flag as well as cancel(): redis-py can turn a cancellation inside a command into a
        # connection error, which these loops survive by design; never wait on them for long
        self._closing = True
        for task in (self._wake_task, self._config_task, self._stats_task, self._registry_task, self._health_task):
            if task is not None:
                task.cancel()
                try:
                    await asyncio.wait_for(task, 2.0)
                except (asyncio.CancelledError, Exception):
                    pass
        await self.coord.close()
        await self.transport.close()
        await self.client.close()  # and the replica's Redis client
        await self._stop_http()
        log.info("scheduler replica %s stopped in %.3fs", self.replica_id, time.monotonic() - t0)

    async def _stop_http(self) -> None:
        http, self._http = self._http, None
        if http is not None:  # waits for the serving thread to see the stop: not on the loop
            await asyncio.to_thread(stop_serving, http)

    async def _start_partition(self, p: int, epoch: int) -> None:
        old = self.runners.pop(p, None)
        if old is not None:
            await old.stop()
        own = self.ownership
        assert own is not None
        core = self.client.calls
        runner = PartitionRunner(
            p, epoch, scripts=self.transport, core=core, metrics=self.metrics, config=self.cfg.runner,
            is_valid=lambda: own.owns(p, epoch), valid_for=own.valid_for, on_refused=self._refused,
            limits=lambda: self.settings.rate_limits, retention=self.settings.retention,
            check_conflict=self._check_conflict, on_conflict_resolved=self._conflict_resolved, ringer=self.ringer,
            batcher=self.batcher, listening=lambda: self._listening, grid=self.grid)
        self.runners[p] = runner
        runner.start()
        self._owners_changed(p)

    async def _stop_partition(self, p: int) -> None:
        self.partition_stats.forget(p)  # the new owner exports it now: never count it twice
        runner = self.runners.pop(p, None)
        self._owners_changed(p)
        if runner is not None:
            await runner.stop()
        self._set_conflict(p, None)  # not ours any more: not our conflict either

    def _owners_changed(self, p: int) -> None:
        if self.registry_export is not None:
            self.registry_export.partition_changed(p)

    async def _refused(self, p: int, current: int) -> None:
        # called from inside the runner's own task: do not await its stop(), just forget it
        self.runners.pop(p, None)
        self._owners_changed(p)
        self._set_conflict(p, None)
        if self.ownership is not None:
            await self.ownership.partition_refused(p, current)

    def _set_conflict(self, p: int, newest: int | None) -> None:
        if newest is None:
            self.conflicts.pop(p, None)
        else:
            self.conflicts[p] = newest
        self.metrics.epoch_conflict_partitions.labels(self.replica_id).set(len(self.conflicts))

    async def _check_conflict(self, p: int, epoch: int, current: int) -> bool:
        """Redis refused ``epoch`` for ``p`` (it has seen ``current``): an epoch conflict, or a
        hand-over? Only etcd can tell (see Ownership.still_owner)."""
        own = self.ownership
        if own is None or current <= epoch:
            return False
        if not await own.still_owner(p, epoch):
            return False  # a hand-over (or etcd did not answer): stop, reconcile decides as before
        runner = self.runners.get(p)
        if runner is None or runner.epoch != epoch:
            # released while we asked etcd (stop() is waiting for this runner): record nothing; the
            # runner's backoff returns at once since it is stopping
            return True
        self.metrics.epoch_conflicts.labels(self.replica_id).inc()
        self._set_conflict(p, current)
        if self._conflict_reported.get(p) != current:
            self._conflict_reported[p] = current
            log.error(
                "partition %d: EPOCH CONFLICT: Redis refused epoch %d although etcd still names this replica "
                "(%s) as the partition's owner with exactly that epoch. Likely cause: etcd was restored or "
                "replaced (its revisions went back); Redis has seen epoch %d, newer than any epoch etcd hands "
                "out now (or another scheduler tier with a different etcd uses this Redis namespace: check "
                "--etcd of every replica). Due jobs of this partition do NOT fire until this is fixed; this "
                "replica keeps the partition and retries with backoff up to %.0fs. Fix: zsched epochs reset "
                "--partition %d --namespace %s --redis %s (or --all for every partition; see 'Epoch conflict "
                "runbook' in docs/operations.md)",
                p, epoch, self.replica_id, current, self.cfg.runner.conflict_retry_max, p, self.cfg.namespace,
                mask_secrets(self.cfg.redis_url))
        else:
            log.debug("partition %d: epoch %d still refused (Redis has seen %d)", p, epoch, current)
        return True

    def _conflict_resolved(self, p: int, epoch: int, refused: int, seconds: float) -> None:
        self._conflict_reported.pop(p, None)
        self._set_conflict(p, None)
        log.info("partition %d: epoch conflict resolved: Redis accepted epoch %d again after %d refused "
                 "attempt(s) over %.1fs; firing resumed", p, epoch, refused, seconds)

    def _limits_changed(self) -> None:
        for runner in self.runners.values():  # a lifted limit releases held jobs at once
            runner.wake.set()

    async def _stats_poller(self, interval: float = 2.0) -> None:
        """Refresh the exported counters/depths of owned partitions (one pipelined round trip)."""
        core = self.client.calls
        while not self._closing:
            owned = sorted(self.runners)
            try:
                within = round(self.cfg.due_soon_horizon * 1000)  # zsched_queue_due_soon's horizon
                replies = await self.transport.call_many([core.stats_call(p, within) for p in owned]) if owned else []
                for p, reply in zip(owned, replies):
                    if p in self.runners:  # each aged by its own server's clock (the reply's)
                        stats = parse_stats(reply)
                        self.partition_stats.update(p, stats, stats.now_ms or int(time.time() * 1000))
            except REDIS_ERRORS as exc:
                log.debug("stats refresh failed: %s", exc)
            for p in self.partition_stats.partitions():
                if p not in self.runners:
                    self.partition_stats.forget(p)
            await asyncio.sleep(interval)

    async def _wake_listener(self) -> None:
        """Wake a partition's runner when a producer schedules a job before its earliest timer,
        reload the config when it changes, and retry a partition in an epoch conflict at once
        when an operator reset its epoch (``zsched epochs reset``). Sharded, it listens to every
        partition, not only the owned ones: the set stays right across ownership changes, and a
        wake-up is still one message per event (SPUBLISH reaches only the owning node)."""
        ks = self.client.keyspace
        config_channel = ks.config_channel.encode()
        epoch_channels = {ch.encode() for ch in ks.epoch_reset_channels()}
        channels = [*ks.wake_channels(), ks.config_channel, *ks.epoch_reset_channels()]
        delay = 0.1
        while not self._closing:
            pubsub = subscription(self.redis, ks.sharded, ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(channels)
                delay = 0.1
                self._listening = True
                for runner in list(self.runners.values()):  # we may have missed wake-ups while away,
                    runner.wake.set()  # and on a cluster the ring relays of jobs made ready then
                    if self.ringer is not None:
                        self.ringer.ring_waiting(runner.partition)
                while True:
                    msg = await pubsub.get_message(timeout=None)
                    if msg is None or msg["type"] != "message":
                        continue
                    if msg["channel"] == config_channel:
                        await self.settings.load()
                        continue
                    if self.ringer is not None and self.ringer.relay(msg["data"], self.runners):
                        continue  # a script of a partition of ours asks its owner to ring a bell
                    try:
                        target = self.runners.get(int(msg["data"]))
                    except (TypeError, ValueError):
                        continue
                    if target is not None and msg["channel"] in epoch_channels:
                        target.retry_now()
                    elif target is not None:
                        target.wake.set()
            except asyncio.CancelledError:
                await _close(pubsub)
                raise
            except Exception as exc:  # Redis errors, or anything unexpected: never stop listening
                self._listening = False
                # a cluster node still down: retried about once a second, said once when it broke
                level = logging.DEBUG if isinstance(exc, ChannelsPending) else logging.WARNING
                log.log(level, "wake-up subscription lost (%s: %s); resubscribing in %.1fs",
                        type(exc).__name__, exc, delay)
                await _close(pubsub)
                await asyncio.sleep(delay)
                delay = min(2.0, delay * 2)


async def _close(pubsub: Subscription) -> None:
    """Close a subscription whose connection may already be gone."""
    try:
        await pubsub.aclose()
    except Exception as exc:  # closing a broken connection: nothing left to clean up
        log.debug("closing the wake-up subscription: %s", exc)


def run_forever(cfg: SchedulerConfig) -> int:
    """Run a replica until SIGTERM/SIGINT (in any phase: also while it retries Redis or etcd at
    start-up); exit 0 after releasing ownership."""

    async def main() -> None:
        proc = SchedulerProcess(cfg)
        loop = asyncio.get_running_loop()

        def on_signal(sig: signal.Signals) -> None:
            log.info("%s: stopping (partitions are handed over)", sig.name)
            proc.stop()

        stop_signals(loop, on_signal)
        await proc.run()

    run(main())
    return 0
