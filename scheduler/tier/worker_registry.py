"""The worker registry's metrics (``zsched_workers``, ``zsched_worker_slots``, ...): read by the
replica that owns partition 0, every :data:`READ_INTERVAL` seconds.

One exporter per namespace keeps every sum right without a ``max by`` over replicas (during a hand-over of
partition 0 the old owner stops at once, the new one starts within a read), and it needs no
worker to be scraped: a killed worker is counted as gone. Each read is one small script call
(``lua/registry_read.lua``, which also deletes a bounded number of dead records), whatever the
number of partitions or jobs.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from redis.exceptions import ResponseError

from ..metrics import WorkerRegistryCollector
from ..protocol.keys import Keyspace
from ..protocol.masking import mask_secrets
from ..protocol.registry import parse_read, read_call
from ..redisio.batch import not_run
from ..redisio.errors import REDIS_ERRORS
from ..redisio.transport import AsyncScriptTransport

log = logging.getLogger("zsched.scheduler")

READ_INTERVAL = 5.0  # seconds; workers refresh their records every 5 s by default
EXPORTER_PARTITION = 0


class RegistryExport:
    """Reads the registry into ``collector`` while ``owns(EXPORTER_PARTITION)``; exports nothing
    otherwise. Tell it of every change of ownership (:meth:`partition_changed`)."""

    def __init__(self, collector: WorkerRegistryCollector, transport: AsyncScriptTransport, ks: Keyspace,
                 owns: Callable[[int], bool], interval: float = READ_INTERVAL) -> None:
        self.collector = collector
        self.transport = transport
        self.ks = ks
        self.owns = owns
        self.interval = interval
        self.wake = asyncio.Event()
        self._refusal: str | None = None

    def partition_changed(self, partition: int) -> None:
        """``partition`` was acquired or released: stop exporting at once when partition 0 went,
        read at once when it came."""
        if partition != EXPORTER_PARTITION:
            return
        if not self.owns(partition):
            self.collector.clear()
        self.wake.set()

    async def read_once(self) -> None:
        """One read (when this replica owns partition 0; else clear what was exported)."""
        if not self.owns(EXPORTER_PARTITION):
            self.collector.clear()
            return
        try:
            snap = parse_read(await self.transport.call(*read_call(self.ks)))
        except ResponseError as exc:
            if not_run(exc):
                raise
            if self._refusal != str(exc):  # e.g. NOPERM: the replica's ACL user lacks the registry keys
                self._refusal = str(exc)
                log.warning("cannot read the worker registry (%s): the zsched_workers metrics keep their last values; "
                            "the replica's ACL user needs the keys %s and %s", mask_secrets(str(exc)),
                            self.ks.workers_key, self.ks.workers_live_key)
            return
        self._refusal = None
        if self.owns(EXPORTER_PARTITION):  # it may have moved while we read
            self.collector.update(snap)

    async def run(self, closing: Callable[[], bool]) -> None:
        """Read every ``interval`` (at once after an ownership change of partition 0) until
        ``closing()``. While Redis cannot be reached the metrics keep their last values (the
        replica's Redis error counter says why)."""
        while not closing():
            self.wake.clear()
            try:
                await self.read_once()
            except REDIS_ERRORS as exc:
                log.debug("worker registry read failed: %s", exc)
            try:
                await asyncio.wait_for(self.wake.wait(), self.interval)
            except TimeoutError:
                pass
