"""A worker's ``/livez`` and ``/readyz`` (served next to ``/metrics``, see :mod:`scheduler.health`).

Ready means: started (connected to Redis, subscribed to its queues' doorbells and swept once:
``Lifecycle.ready``), Redis answers now, and no stop was asked for. The probes answer from the
moment ``serve()`` starts, before Redis is reached, so a worker waiting for Redis is live (its
loop turns) but not ready, and Kubernetes does not restart it for an outage it cannot fix.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from scheduler.health import Health, Verdict

from .lifecycle import Lifecycle


class WorkerProbes:
    """The health of one ``serve()``: :meth:`start` on its loop, :meth:`stop` when it ends."""

    def __init__(self, life: Lifecycle, redis: Any, queues: Sequence[str], health: Health | None = None) -> None:
        self.life = life
        self.redis = redis
        self.queues = list(queues)
        self.health = health or Health()
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> Verdict:
        """The readiness check (run by :meth:`Health.run` every second)."""
        if self.life.stop_requested.is_set():
            return Verdict(False, "stopping: no new claims, running handlers finishing")
        if not self.life.ready.is_set():
            return Verdict(False, "starting: connecting to Redis, subscribing to the queues' doorbells")
        await self.redis.ping()
        return Verdict(True, f"Redis answers; claiming jobs of {', '.join(self.queues)}")

    def start(self) -> None:
        """Stamp the heartbeat and judge readiness from now on (a task on the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self.health.run(self.check), name="health")

    def stop(self) -> None:
        """Stop judging (``/livez`` then fails after ``stale_after``: the server stops with it)."""
        if self._task is not None:
            self._task.cancel()
