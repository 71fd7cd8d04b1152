"""Ticks of several partitions in one round trip.

A replica owns several partitions, each fired by its own :class:`~.runner.PartitionRunner` task,
and each tick is a round trip to Redis. Under spread traffic (jobs due at their own moments) a
busy partition ticks about once per job, and the round trip's fixed cost in the replica (taking a
connection, packing, reading, releasing) was most of the replica's CPU per job. The runners wake
on a shared grid of instants (:data:`GRID_S`, within the hand-off lead, so no job is handed off
later than the lead minus the grid step) and send their calls through one :class:`TickBatcher`,
which sends every call submitted in one turn of the event loop as one pipelined round trip and
hands each runner its own replies. A runner whose calls failed gets their first error, as from the
transport, and the others are not affected; a round trip that fails as a whole fails them all.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ..protocol.call import Call
from ..redisio.transport import AsyncScriptTransport

GRID_S = 0.010
"""The step of the grid the runners' wake-ups are aligned to, at most half the hand-off lead: a job
is then handed off at least half the lead ahead of its due time (10-20 ms with the default 20 ms),
and the partitions due within one step share a round trip."""


def aligned_sleep(seconds: float, now: float, lead: float) -> float:
    """``seconds`` stretched so that the wake-up falls on the next point of the grid (``now``: the
    monotonic clock); unchanged without a hand-off lead, where a later tick would be a later job."""
    step = min(GRID_S, lead / 2)
    if step <= 0:
        return seconds
    wake = now + seconds
    return (-(-wake // step)) * step - now


class TickBatcher:
    """Sends the calls its callers submit in one event-loop turn as one round trip."""

    def __init__(self, transport: AsyncScriptTransport) -> None:
        self.transport = transport
        self._pending: list[tuple[list[Call], asyncio.Future[list[Any]]]] = []
        self.round_trips = 0  # for the tests and the benchmark: how many round trips carried ticks
        self.calls = 0

    async def call_many(self, calls: Sequence[Call]) -> list[Any]:
        """The replies of ``calls`` (raises the first error among them, as the transport does)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[Any]] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((list(calls), fut))
        return await fut

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.ensure_future(self._send(batch))
        task.add_done_callback(_consumed)

    async def _send(self, batch: list[tuple[list[Call], asyncio.Future[list[Any]]]]) -> None:
        flat = [c for calls, _ in batch for c in calls]
        self.round_trips += 1
        self.calls += len(flat)
        try:
            replies = await self.transport.call_many(flat, raise_on_error=False)
        except BaseException as exc:  # the round trip as a whole: every caller gets it
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        at = 0
        for calls, fut in batch:
            mine, at = replies[at:at + len(calls)], at + len(calls)
            if fut.done():  # its runner was cancelled meanwhile (a hand-over)
                continue
            error = next((r for r in mine if isinstance(r, BaseException)), None)
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(mine)


def _consumed(task: asyncio.Task[None]) -> None:
    """Retrieve the task's outcome (its callers already have it) so asyncio does not log it."""
    if not task.cancelled():
        task.exception()
