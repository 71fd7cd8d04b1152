"""How the worker talks to Redis: its round trips, its retry policy, and how it rides out an outage.

The claim loop and the outcome loop each send one batch of script calls at a time, each on its
own *lane* of the transport (a connection kept between round trips). Redis errors never kill the
worker: each loop logs once per outage (:class:`Outage`) and retries with capped, jittered backoff.
"""
from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from scheduler.protocol.call import Call
from scheduler.protocol.errors import LayoutChanged, failure_kind
from scheduler.protocol.masking import mask_secrets
from scheduler.redisio.transport import AsyncScriptTransport, RedisRetry

log = logging.getLogger("zsched.worker")

# A worker's loops retry from 50 ms, doubling, at most a second apart (jittered: 0.5-1 s): after
# an outage ends (a restart, a failover) the worker claims and hears its bells again within about
# a second. With a 5 s cap a Redis Cluster failover left jobs on the healthy masters waiting up
# to 4 s after the cluster was back. A second apart, even a thousand workers retry at about
# 1 300 connection attempts/s: nothing a recovering Redis notices.
BACKOFF_BASE, BACKOFF_CAP = 0.05, 1.0
# The transport retries only before a call reaches Redis (connect failures, a restart in
# progress): outcomes and claims that may have run are never re-sent by the transport; the
# worker's own loops re-send them knowing a refusal may then mean "already applied" (see
# Attempt.uncertain, and the claim receipts of the fetch strategy).
WORKER_RETRY = RedisRetry(budget=0.5, attempts=4)

# One round trip: script calls and a lane name -> one reply (or exception object) per call.
Send = Callable[[Sequence[Call], str], Awaitable[list[Any]]]


def sender(transport: AsyncScriptTransport) -> Send:
    """The worker's round trip over ``transport``. Per-call errors come back as exception objects
    (one bad partition does not hide the others' results); connection errors raise, and nothing
    that may have reached Redis is re-sent by the transport: the caller's loop does that."""
    call_many = transport.call_many

    async def send(calls: Sequence[Call], lane: str) -> list[Any]:
        return await call_many(calls, resend=False, raise_on_error=False, lane=lane)

    return send


class Outage:
    """Logs a Redis outage once (then every 30 s), recovery once, and computes capped backoff."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.failures = 0
        self.since = 0.0
        self.last_log = 0.0
        self.kind = ""  # failure_kind() of the failure last logged

    def failed(self, exc: BaseException) -> float:
        """Count a failure; returns the seconds to wait before the next try."""
        now = time.monotonic()
        kind = failure_kind(exc)
        if self.failures == 0 or kind != self.kind:  # once per outage, and again when its kind changes
            if self.failures == 0:
                self.since = now
            self.last_log = now
            self.kind = kind
            if LayoutChanged.from_reply(exc) is not None:  # zsched migrate-partitions: not an outage
                log.error("%s: refused by the namespace's partition layout: %s", self.what, exc)
            else:
                log.warning("%s: Redis unavailable (%s: %s); retrying with backoff", self.what, type(exc).__name__,
                            mask_secrets(str(exc)))
        elif now - self.last_log > 30:
            self.last_log = now
            log.warning("%s: Redis still unavailable after %.0f s (%s: %s)", self.what, now - self.since,
                        type(exc).__name__, mask_secrets(str(exc)))
        self.failures += 1
        return float(min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(self.failures - 1, 20)) * random.uniform(0.5, 1.0))

    def ok(self) -> None:
        """A call went through: log the recovery if there was an outage."""
        if self.failures:
            log.info("%s: Redis reachable again after %.1f s", self.what, time.monotonic() - self.since)
            self.failures = 0
