"""A worker's ``/livez`` and ``/readyz`` (served next to ``/metrics``, see :mod:`scheduler.health`).

Ready means: started (connected to Redis, subscribed to its queues' doorbells and swept once:
``Lifecycle.ready``), Redis answers, and no stop was asked for. "Redis answers" is the reply to the
listen loop's bell wait (an idle worker sends one every ``BELL_WAIT`` seconds anyway) or to a round
trip of claims, when one came within :data:`ANSWER_FRESH_S`, else a ``PING``
(``Lifecycle.redis_answered``): a fleet of idle workers sends Redis no PING for its probes, and a
Redis that stalls is still seen within that window plus the check's timeout.
The probes answer from the moment ``serve()`` starts, before Redis is reached, so a worker waiting
for Redis is live (its loop turns) but not ready, and Kubernetes does not restart it for an outage
it cannot fix.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from scheduler.health import CHECK_REUSE_S, Health, Verdict

from .doorbell import BELL_WAIT
from .lifecycle import Lifecycle

# A bell wait answered this recently (seconds) stands for a PING: one full wait, and the age a
# verdict may have when a probe reuses it, so an idle worker's readiness never needs a PING of its own.
ANSWER_FRESH_S = BELL_WAIT + CHECK_REUSE_S


class WorkerProbes:
    """The health of one ``serve()``: :meth:`start` on its loop, :meth:`stop` when it ends."""

    def __init__(self, life: Lifecycle, redis: Any, queues: Sequence[str], health: Health | None = None) -> None:
        self.life = life
        self.redis = redis
        self.queues = list(queues)
        self.health = health or Health()
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> Verdict:
        """The readiness check (run on the loop when a probe asks, at most once a second)."""
        if self.life.stop_requested.is_set():
            return Verdict(False, "stopping: no new claims, running handlers finishing")
        if not self.life.ready.is_set():
            return Verdict(False, "starting: connecting to Redis, subscribing to the queues' doorbells")
        if time.monotonic() - self.life.redis_answered > ANSWER_FRESH_S:
            await self.redis.ping()
        return Verdict(True, f"Redis answers; claiming jobs of {', '.join(self.queues)}")

    def start(self) -> None:
        """Answer the probes from now on (a task on the running loop, idle between probes)."""
        self._task = asyncio.get_running_loop().create_task(self.health.run(self.check), name="health")

    def stop(self) -> None:
        """Stop answering (the probes then fail at once: the server stops with it)."""
        if self._task is not None:
            self._task.cancel()
