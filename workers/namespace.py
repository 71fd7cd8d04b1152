"""The worker's view of its namespace: the connection that reads its partition count and
settings at start (retrying while Redis is down), and the loop that follows the settings a worker
applies itself, the tombstone TTL its acks pass (``Client.set_tombstone_ttl``): read again every
:data:`SETTINGS_INTERVAL` seconds, one small read per worker whatever its load, so a change
reaches every worker within that interval."""
from __future__ import annotations

import asyncio
import logging
import warnings
from typing import Any

from scheduler.client import AsyncClient
from scheduler.redisio.connection import permanent_failure
from scheduler.redisio.errors import REDIS_ERRORS

from .lifecycle import Lifecycle
from .options import WorkerOptions
from .turns import Turns
from .wire import Outage

log = logging.getLogger("zsched.worker")

SETTINGS_INTERVAL = 5.0  # seconds between two reads of the namespace settings


async def connect(redis: Any, options: WorkerOptions, life: Lifecycle) -> AsyncClient | None:
    """A client of the namespace, connected (its partition count and settings read), or None when
    the worker was stopped while Redis was unreachable. Bad credentials or a missing TLS file
    raise at once: retrying cannot help."""
    outage = Outage("startup")
    while True:
        try:
            with warnings.catch_warnings(action="ignore", category=DeprecationWarning):  # WorkerOptions said it
                client = AsyncClient(redis, namespace=options.namespace, partitions=options.partitions,
                                     max_payload_bytes=options.max_payload_bytes, tombstone_ttl=options.tombstone_ttl,
                                     sharded_pubsub=options.sharded_pubsub)
            await client.connect()
            break
        except REDIS_ERRORS as exc:
            if permanent_failure(exc):
                raise
            if await life.wait_stop(outage.failed(exc)):
                return None
    outage.ok()
    return client


async def follow_settings(client: AsyncClient, interval: float | None = None, turns: Turns | None = None) -> None:
    """Until cancelled: read the settings every ``interval`` seconds and apply a change to
    ``client.calls`` (which the worker's outbox builds its acks with); ``interval`` defaults to
    :data:`SETTINGS_INTERVAL`, read when the loop starts. With ``turns``, each read may come up
    to its window early, on an idle turn, and go ahead of a bell wait in its write (:mod:`.turns`)."""
    every = SETTINGS_INTERVAL if interval is None else interval
    key = client.keyspace.config_key

    def ride() -> list[tuple[Any, ...]]:
        return [("HGETALL", key)]

    while True:
        if turns is None:
            await asyncio.sleep(every)
            ridden = None
        else:  # the read may ride on a bell wait (workers/turns.py)
            ridden = await turns.sleep(every, ride)
        try:
            if await client.reload_settings(config_of(ridden)):
                log.info("tombstone TTL now %g s (the namespace's setting)", client.calls.tomb_ms / 1000)
        except REDIS_ERRORS:
            pass  # the claim and outcome loops log the outage; the last known TTL stays meanwhile


def config_of(ridden: list[Any] | None) -> dict[Any, Any] | None:
    """The config hash from a ridden ``HGETALL``'s replies (a flat list in RESP2, a map in RESP3),
    or None when it did not ride or came back refused (the read is then made as usual, and its
    error handled there)."""
    if not ridden or isinstance(ridden[0], Exception):
        return None
    reply = ridden[0]
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[::2], reply[1::2]))
