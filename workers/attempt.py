"""The book-keeping of one claimed attempt of a job, shared by the runner, the outbox and the heartbeats."""
from __future__ import annotations

import asyncio
from typing import Any

from scheduler.protocol import codec
from scheduler.protocol.replies import Claimed

from .job import Job
from .registry import HandlerSpec
from .stats import WorkerStats

# Attempt.state
RUNNING, DONE, RELEASED = 0, 1, 2


class Attempt:
    """One claimed attempt: where it lives (partition, queue), its lease (token, length, next
    heartbeat) and how far it got. Plain slots: one is made per job on the hot path."""

    __slots__ = ("job", "p", "queue", "raw_id", "token", "lease_s", "rec", "handler", "stats", "task",
                 "next_hb", "hb_pending", "lost", "state", "uncertain", "t0", "held", "started", "executing",
                 "span")

    def __init__(self, p: int, queue: str, c: Claimed, handler: HandlerSpec | None, stats: WorkerStats,
                 t0: float) -> None:
        self.p = p
        self.queue = queue
        self.raw_id = c.raw_id
        self.token = c.token
        self.rec = c.record
        self.lease_s = (c.record.lease_ms if c.record else codec.DEFAULT_LEASE_MS) / 1000.0
        self.handler = handler
        self.stats = stats
        self.task: asyncio.Future[Any] | None = None
        self.t0 = t0
        self.started = t0  # when its handler started (monotonic): the claim, or its due time if held
        self.executing = False  # its handler runs now (counted in HandlerRunner.executing)
        # The claim was sent at t0, so Redis's deadline is at least t0 + lease: extending at
        # lease/3 from t0 leaves two thirds of the lease as margin for a slow round trip.
        self.next_hb = t0 + self.lease_s / 3.0
        self.hb_pending = False
        self.lost = False
        self.state = RUNNING
        self.uncertain = False  # re-sent after a connection error: a refusal may mean "applied"
        self.job: Job | None = None
        self.held = False  # on a prefetch slot (handed off ahead of its time), not a handler slot yet
        self.span: Any = None  # the attempt's OpenTelemetry span while its handler runs (workers/runner.py)
