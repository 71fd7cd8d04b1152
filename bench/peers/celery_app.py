"""The Celery side: an app with Celery's defaults on a Redis broker and one no-op task that records
its start. ``celery -A bench.peers.celery_app worker`` runs it (the URL from ``$PEER_REDIS_URL``);
the bench process builds its own app on each server with :func:`make`, with the same task name."""
from __future__ import annotations

import datetime
import os
from typing import Any

from celery import Celery
from celery.signals import worker_ready

from bench.peers.records import REDIS_URL_ENV, mark_ready, record

TASK_NAME = "bench.peers.noop"


def noop(self: Any, payload: dict[str, Any]) -> None:
    """No-op handler: record (id, eta, start). Celery passes ``eta`` as an ISO 8601 string in UTC."""
    eta = self.request.eta
    if isinstance(eta, str):
        eta = datetime.datetime.fromisoformat(eta)
    record(self.request.id, eta.timestamp() if eta else 0.0)


def make(url: str) -> tuple[Celery, Any]:
    """A Celery app on the Redis broker ``url``, every other setting at its default (no result
    backend, json, prefetch multiplier 4, acks on receipt), and the no-op task."""
    app = Celery("bench_peers", broker=url)
    task = app.task(bind=True, name=TASK_NAME)(noop)
    return app, task


@worker_ready.connect
def on_ready(**_: Any) -> None:
    mark_ready()


app, noop_task = make(os.environ.get(REDIS_URL_ENV, "redis://127.0.0.1:6379/0"))
