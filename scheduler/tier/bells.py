"""The doorbells a partition's owner rings on Redis Cluster (scheduler/protocol/bells.py says
why the scripts cannot ring them there): the queues a ``tick`` fired into, the rings other
scripts of its partitions relay over the wake channel ("r MEMBER QUEUE", "b MEMBER QUEUE" for
a burst bell), and, on taking a
partition, every queue whose ready list already has jobs (a relay sent while nobody owned the
partition was lost). Off a cluster the scripts ring the bells themselves and this is not used.

Rings go out in the background: the firing loop never waits for one, and a failed ring is
logged at debug level only (the workers' safety-net sweep finds those jobs). The rings asked for in
one event-loop turn go together, one ``ZADD`` per bell (``bells.ring_many``): the ticks of a grid
step come back together (``TickBatcher``), and a sleeper then takes several of their burst rings in
one wake-up, as on one server, where the step's ticks run in one ``MULTI``. Rung one per partition,
each woke a worker of its own: a burst woke every partition's worth of cold processes."""
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
        self._pending: list[bells.Ring] = []  # asked for in this event-loop turn: rung at its end

    def ring(self, queues: Iterable[tuple[str, bool]], member: bytes | str, score_ms: float | None = None) -> None:
        """Ring the bell of each (queue, burst) of ``queues`` (its burst bell when burst) with
        ``member`` (a partition number, or ``P:resume``), together with the other rings asked for
        in this event-loop turn (the module docstring)."""
        rings = [(q, member, score_ms, burst) for q, burst in queues]
        if rings and not self._pending:
            # after the callbacks already scheduled: the other partitions' runners woken by the
            # same round trip of ticks ask for theirs first
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending += rings

    def _flush(self) -> None:
        rings, self._pending = self._pending, []
        if rings:
            self._spawn(bells.ring_many(self.redis, self.ks, rings))

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
        # a list that waited for an owner may hold many: every idle worker hears it
        self.ring([(name, True) for name, depth in zip(names, depths) if depth], str(partition))

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
