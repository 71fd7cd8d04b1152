"""The namespace settings a replica fires by: rate limits, dead-letter retention, queue retirement
and the tombstone TTL, stored in ``{ns}:cfg`` by ``Client.set_rate_limit`` and its siblings.

A replica reads them at start, again on every config notice (the pub/sub message the client sends
with each change) and every :data:`FOLLOW_S` as a safety net for a lost notice. A read is sent
again under the tier's retry after a transient error (the first read after a Redis restart meets a
pooled connection that died with the old server); a read that still fails keeps the last known
settings: a Redis outage must not turn the limits off.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from ..client import AsyncClient, parse_dead_retention, parse_queue_idle, parse_rate_limits
from ..protocol.tick import Retention
from ..redisio.batch import RedisRetry
from ..redisio.connection import AsyncRedis
from ..redisio.errors import REDIS_ERRORS
from ..redisio.transport_async import lost_in_transit, send_retried_async
from .limits import retention_args

log = logging.getLogger("zsched.scheduler")

FOLLOW_S = 5.0  # the safety net's period: changes normally arrive with their notice at once


class NamespaceConfig:
    """The settings last read from ``{ns}:cfg``; :meth:`load` reads them again, :meth:`follow` keeps
    reading them. ``on_limits_changed`` runs when the rate limits change (the partitions' runners
    wake, so that a lifted limit releases held jobs at once); ``retry`` bounds how long one read is
    sent again after transient errors."""

    def __init__(self, redis: AsyncRedis, client: AsyncClient, on_limits_changed: Callable[[], None],
                 retry: RedisRetry) -> None:
        self.redis = redis
        self.client = client
        self.retry = retry
        self.on_limits_changed = on_limits_changed
        self.rate_limits: dict[str, tuple[float, float]] = {}
        self.dead_retention: tuple[int | None, float | None] = (None, None)
        self.queue_idle: float | None = None  # until the config is read: retire nothing

    async def load(self) -> None:
        """Read the settings and apply every change (each one logged); on a Redis error log it and
        keep the last known ones."""
        try:
            cfg = await self._read()
        except REDIS_ERRORS as exc:
            log.warning("cannot read the namespace config (%s); keeping the last known one", exc)
            return
        if await self.client.reload_settings(cfg):
            log.info("tombstone TTL now %g s", self.client.calls.tomb_ms / 1000)
        retention = parse_dead_retention(cfg)
        if retention != self.dead_retention:
            log.info("dead-letter retention now max_dead=%s dead_ttl=%s", *retention)
            self.dead_retention = retention
        self.queue_idle = parse_queue_idle(cfg)
        limits = parse_rate_limits(cfg)
        if limits != self.rate_limits:
            log.info("rate limits now %s", limits or "none")
            self.rate_limits = limits
            self.on_limits_changed()

    async def _read(self) -> dict[bytes, bytes]:
        return await send_retried_async(self._hgetall, self.retry)

    @lost_in_transit  # a connection closed under the read (a failover) is an outage, not a crash
    async def _hgetall(self) -> dict[bytes, bytes]:
        # bytes: the tier's connection does not decode replies
        return cast("dict[bytes, bytes]", await self.redis.hgetall(self.client.keyspace.config_key))

    def retention(self) -> Retention:
        """Tick's housekeeping arguments (the dead-letter cap is split evenly over the partitions)."""
        return retention_args(*self.dead_retention, self.queue_idle, self.client.calls.ks.partitions)

    async def follow(self, closing: Callable[[], bool]) -> None:
        """Read the settings every :data:`FOLLOW_S` until ``closing()``."""
        while not closing():
            await asyncio.sleep(FOLLOW_S)
            await self.load()
