"""The huey side: a ``RedisHuey`` with huey's defaults and one no-op task that records its start.

``huey_consumer bench.peers.huey_app.huey`` runs it (the URL from ``$PEER_REDIS_URL``); the bench
process builds its own instance on each server with :func:`make`. The task's registry name comes
from the function (``bench.peers.huey_app.noop``), so both sides agree on it."""
from __future__ import annotations

import datetime
import os
from typing import Any

from huey import RedisHuey

from bench.peers.records import REDIS_URL_ENV, mark_ready, record


def noop(payload: dict[str, Any], task: Any = None) -> None:
    """No-op handler: record (id, eta, start). huey keeps ``eta`` as a naive UTC datetime."""
    eta = task.eta.replace(tzinfo=datetime.UTC).timestamp() if task is not None and task.eta else 0.0
    record(task.id if task is not None else "?", eta)


def make(url: str) -> tuple[RedisHuey, Any]:
    """A ``RedisHuey`` named ``bench`` on ``url`` (defaults otherwise: results on, blocking BRPOP,
    utc) and the no-op task registered on it."""
    h = RedisHuey("bench", url=url)
    task = h.task(context=True)(noop)

    @h.on_startup()
    def ready() -> None:
        mark_ready()

    return h, task


huey, noop_task = make(os.environ.get(REDIS_URL_ENV, "redis://127.0.0.1:6379/0"))
