"""The doorbells a partition's owner rings on Redis Cluster (scheduler/protocol/bells.py says
why the scripts cannot ring them there): the queues a ``tick`` fired into, the rings other
scripts of its partitions relay over the wake channel ("r MEMBER QUEUE", "b MEMBER QUEUE" for
a burst bell), and, on taking a
partition, every queue whose ready list already has jobs (a relay sent while nobody owned the
partition was lost). Off a cluster the scripts ring the bells themselves and this is not used.

Rings go out in the background: the firing loop never waits for one, and a failed ring is
logged at debug level only (the workers' safety-net sweep finds those jobs)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine, Iterable
from typing import Any

from ..protocol import bells
from ..protocol.keys import Keyspace
from ..redisio.errors import REDIS_ERRORS
from ..redisio.transport_async import lost_in_transit

log = logging.getLogger("zsched.scheduler")


class BellRinger:
    """Rings bells on ``redis`` (the replica's asyncio client) for the partitions this replica owns."""

    def __init__(self, redis: Any, ks: Keyspace) -> None:
        self.redis = redis
        self.ks = ks
        self._tasks: set[asyncio.Task[None]] = set()

    def ring(self, queues: Iterable[tuple[str, bool]], member: bytes | str, score_ms: float | None = None) -> None:
        """Ring the bell of each (queue, burst) of ``queues`` (its burst bell when burst) with
        ``member`` (a partition number, or ``P:resume``)."""
        for q, burst in queues:
            self._spawn(bells.ring(self.redis, self.ks, q, member, score_ms, burst))

    def relay(self, data: bytes, owned: Iterable[int]) -> bool:
        """Ring the bell a relay message names if this replica owns its partition; True when
        ``data`` was a relay message (rung or not)."""
        if not bells.is_relay(data):
            return False
        try:
            p, member, queue, burst = bells.parse_relay(data)
        except ValueError as exc:
            log.warning("ignoring a malformed ring relay: %s", exc)
            return True
        if p in owned:
            self.ring([(queue, burst)], member)
        return True

    def ring_waiting(self, partition: int) -> None:
        """On taking ``partition``: ring every queue whose ready list there holds jobs."""
        self._spawn(self._ring_waiting(partition))

    async def _ring_waiting(self, partition: int) -> None:
        names = [f[2:].decode() for f in await self.redis.hkeys(self.ks.key(partition, "q"))
                 if f.startswith(b"n:")]
        if not names:
            return
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.llen(self.ks.ready(partition, name))
        depths = await pipe.execute()
        for name, depth in zip(names, depths):
            if depth:  # a list that waited for an owner may hold many: every idle worker hears it
                await bells.ring(self.redis, self.ks, name, str(partition), burst=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(_quietly(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@lost_in_transit
async def _ringing(coro: Coroutine[Any, Any, None]) -> None:
    await coro


async def _quietly(coro: Coroutine[Any, Any, None]) -> None:
    try:
        await _ringing(coro)
    except REDIS_ERRORS as exc:
        log.debug("ringing a doorbell failed (the workers' sweep finds those jobs): %s", exc)
