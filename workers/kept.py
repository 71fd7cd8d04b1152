"""A connection one loop keeps between its round trips (the doorbell's bell waits and role checks).

A worker waits on the bells once per ring when it is not busy, so that path is on every job's way:
through redis-py's pool, retry wrapper and command book-keeping it cost about as much as the claim
and the ack together. Here the loop keeps one connection of the pool, each shape of round trip is
packed once, and the replies are read straight off the connection. One server or a Sentinel
master only; a cluster client routes its commands itself.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import ResponseError

from scheduler.redisio.batch import pack
from scheduler.redisio.transport_async import checkout, drop_and_release, send_packed

Ahead = tuple[Sequence[tuple[Any, ...]], "asyncio.Future[list[Any] | None]"]
"""Commands sent ahead of a round trip's own, and the future their replies go to
(:meth:`workers.turns.Turns.rides`)."""


class KeptConnection:
    """One connection of ``pool`` (a non-cluster ``redis.asyncio`` pool), kept by one loop: no
    two round trips use it at once."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._held: Any | None = None
        self._packed: dict[str, list[bytes]] = {}

    async def exchange(self, shape: str | None, commands: Callable[[], Sequence[tuple[Any, ...]]],
                       replies: int, ahead: Sequence[Ahead] = ()) -> list[Any]:
        """Send ``commands()`` in one write (packed once per ``shape``; None: packed each time,
        for commands whose arguments vary) and read ``replies`` replies. An error reply comes back
        as its :class:`~redis.exceptions.ResponseError`, the others read all the same, so the
        connection stays in step. Raises the client's errors; a failed or cancelled round trip
        closes the connection (its replies may be half read), and the next one takes a new one.

        ``ahead``: other commands, each group with its future, sent first in the same write. Redis
        answers them before it runs ``commands()`` (a blocking wait: before it blocks), and each
        future gets its group's replies as soon as they are read, one per command. A group whose
        replies were not all read when the round trip failed gets None (its owner then sends the
        commands itself: they must be the same when applied twice).

        Before each round trip the kept connection is probed as the pool probes its own (one the
        server closed, e.g. after a restart, reconnects). A probe that fails gives it back to the
        pool, so it is let go of first: keeping it would share it with the pool's next caller (and
        a second give-back fails: seen as a KeyError from the pool in a Sentinel failover). A
        Sentinel client's connection turns a READONLY reply (its server became a replica) into a
        connection error, as for any command."""
        pool = self.pool
        held, self._held = self._held, None
        try:
            conn = await checkout(pool, held)
        except BaseException:
            _settle(ahead)
            raise
        try:
            packed = self._packed.get(shape) if shape is not None else None
            if packed is None:
                packed = conn.pack_commands(list(commands()))
                if shape is not None:
                    self._packed[shape] = packed
            if ahead:
                packed = pack(conn, [c for cmds, _fut in ahead for c in cmds]) + list(packed)
            await send_packed(conn, packed)
            for cmds, fut in ahead:
                got = await self._read(conn, len(cmds))
                if not fut.done():
                    fut.set_result(got)
            out = await self._read(conn, replies)
        except BaseException:
            _settle(ahead)
            await asyncio.shield(drop_and_release(pool, conn))
            raise
        self._held = conn
        return out

    @staticmethod
    async def _read(conn: Any, replies: int) -> list[Any]:
        out: list[Any] = []
        for _ in range(replies):
            try:
                out.append(await conn.read_response())
            except ResponseError as exc:
                out.append(exc)
        return out

    async def release(self) -> None:
        """Give the kept connection back to the pool (its loop has ended)."""
        conn, self._held = self._held, None
        if conn is not None:
            await self.pool.release(conn)


def _settle(ahead: Sequence[Ahead]) -> None:
    """The round trip failed: the groups still waiting for their replies get None."""
    for _cmds, fut in ahead:
        if not fut.done():
            fut.set_result(None)
