"""The worker's side of the doorbells: how it learns that a (queue, partition) has ready jobs.

Each queue has a bell, the sorted set ``{NS}:bell:QUEUE`` (:meth:`Keyspace.bell`): a script that
puts jobs in a partition's ready list rings it with the partition number (lua/_lib.lua ``ring``;
``P:resume`` when a paused queue is resumed there). A worker with a free handler slot and nothing
else to claim waits in ``BZPOPMIN`` on the bells of its queues, and Redis hands each member to
ONE waiting worker, the longest waiting: a ring costs one wake-up however many workers serve the
queue. A pub/sub message per ring reached every worker, and each answered with a claim, so the
work per job grew with the fleet (docs/architecture.md "Waking workers").

A bell holds a member until a worker takes it, so nothing is missed while no worker waits (all
busy, or none running yet); ringing a member that is there already changes nothing (``NX``), so a
bell holds at most two members per partition however many jobs wait. A worker that takes a member
it can no longer use (its slots filled meanwhile) rings it again for another worker.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from scheduler.protocol import bells
from scheduler.protocol.keys import Keyspace
from scheduler.redisio.connection import is_cluster
from scheduler.redisio.transport_async import checkout, drop_and_release

BELL_WAIT = 2.0  # seconds one BZPOPMIN waits before it is sent again (below any socket timeout we set)


class Doorbell:
    """The bells of ``queues`` on ``redis`` (the worker's asyncio client: one Redis, a Sentinel
    master or a cluster; every bell of a namespace carries the hash tag ``{NS}``, so one command
    waits on them all, on a cluster too)."""

    def __init__(self, redis: Any, ks: Keyspace, queues: Sequence[str], wait: float = BELL_WAIT) -> None:
        self.redis = redis
        self.ks = ks
        self.keys = [ks.bell(q) for q in queues]
        self.queue_of = {k.encode(): q for k, q in zip(self.keys, queues)}
        self.wait_s = _block_seconds(redis, wait)
        # One server (or a Sentinel master): the wait goes out on a connection this object keeps,
        # packed once, with no per-call pool checkout, retry wrapper or command book-keeping.
        # That path cost about as much as the claim and the ack together, once per job (a ring
        # per job when the workers are not busy). A cluster client routes it itself.
        self._pool = None if is_cluster(redis) else redis.connection_pool
        self._held: Any | None = None
        self._packed: list[bytes] | None = None

    async def take(self) -> tuple[str, bytes, float] | None:
        """Wait up to :attr:`wait_s` for a ring on any of the bells and take it: (queue, member,
        score), or None when nothing rang. Raises the client's errors (the caller backs off)."""
        if self._pool is None:
            reply = await self.redis.bzpopmin(self.keys, timeout=self.wait_s)
        else:
            reply = await self._wait()
        if reply is None:
            return None
        key, member, score = reply
        queue = self.queue_of.get(key if isinstance(key, bytes) else str(key).encode())
        if queue is None:  # not one of ours: cannot happen with the keys we asked for
            return None
        return queue, member if isinstance(member, bytes) else str(member).encode(), float(score)

    async def _wait(self) -> Any:
        """``BZPOPMIN`` on the kept connection (a new one after a failure): a failed or cancelled
        wait closes it, since its reply may be half read. A Sentinel client's connection turns a
        READONLY reply (its server became a replica) into a connection error, as for any command."""
        pool = self._pool
        conn, self._held = await checkout(pool, self._held), None
        try:
            if self._packed is None:
                self._packed = conn.pack_command("BZPOPMIN", *self.keys, self.wait_s)
            await conn.send_packed_command(self._packed, check_health=False)
            reply = await conn.read_response()
        except BaseException:
            await asyncio.shield(drop_and_release(pool, conn))
            raise
        self._held = conn
        return reply

    async def close(self) -> None:
        """Give the kept connection back to the pool (the listen loop has ended)."""
        conn, self._held = self._held, None
        if conn is not None and self._pool is not None:
            await self._pool.release(conn)

    async def take_waiting(self, count: int) -> list[tuple[str, bytes, float]]:
        """Take up to ``count`` rings waiting on each of the bells now, without blocking: (queue,
        member, score), oldest first. For a worker that stayed busy: a ring still in a bell is one
        no idle worker was there to take."""
        pipe = self.redis.pipeline(transaction=False)
        for k in self.keys:
            pipe.zpopmin(k, count)
        replies = await pipe.execute()
        out = [(self.queue_of[k.encode()], m if isinstance(m, bytes) else str(m).encode(), float(score))
               for k, reply in zip(self.keys, replies) for m, score in reply]
        out.sort(key=lambda r: r[2])
        return out

    async def sweep_turns(self, queues: Sequence[str], period: float, token: str) -> list[str]:
        """Which of ``queues`` this worker sweeps this period: those whose turn it took (``SET NX``
        of :meth:`Keyspace.sweep_turn` for ``period`` s). The workers of a queue take turns, so a
        queue is swept about once per period whatever their number."""
        pipe = self.redis.pipeline(transaction=False)
        ms = max(1, round(period * 1000))
        for q in queues:
            pipe.set(self.ks.sweep_turn(q), token, nx=True, px=ms)
        taken = await pipe.execute()
        return [q for q, ok in zip(queues, taken) if ok]

    async def ring(self, queue: str, member: bytes | str, score: float | None = None) -> None:
        """Ring ``queue``'s bell with ``member`` (a partition number, or ``P:resume``), keeping an
        earlier ring of the same member (NX). ``score``: when it was first rung (ms), to put back
        a member this worker took and could not use; default now."""
        await bells.ring(self.redis, self.ks, queue, member, score)


def _block_seconds(redis: Any, wait: float) -> float:
    """How long one BZPOPMIN may block: ``wait``, or less when the client's socket timeout (URL
    ``socket_timeout=``) is shorter: a read that outlasts it fails as a timeout instead of
    returning empty. A cluster client keeps its settings per node: ours use the default (10 s)."""
    pool = getattr(redis, "connection_pool", None)
    timeout = (getattr(pool, "connection_kwargs", None) or {}).get("socket_timeout")
    if isinstance(timeout, int | float) and timeout > 0:
        return max(0.1, min(wait, timeout / 2))
    return wait
