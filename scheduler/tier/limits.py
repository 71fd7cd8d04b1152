"""What a partition's owner passes to ``tick`` besides the batch: rate-limit tokens and retention.

:class:`TokenLedger` is one partition's bookkeeping of its rate-limited queues: how many due jobs
each holds back (so it asks the queue's token bucket, ``lua/ratelimit.lua``, for that many) and
the tokens granted but not spent (returned to the bucket with the next request).
:func:`retention_args` turns the namespace's dead-letter retention and queue retirement settings
into the tick's housekeeping arguments. The firing loop (:mod:`.runner`) and the test kit
(:mod:`scheduler.testing`, on its fake clock) both use them, so both pass ``tick`` the same values.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..protocol.call import Call
from ..protocol.keys import Keyspace
from ..protocol.tick import QueueTokens, Retention, parse_ratelimit, ratelimit_call

__all__ = ["TokenLedger", "retention_args"]

Limits = Mapping[str, tuple[float, float]]  # queue -> (jobs per second, burst)


def retention_args(max_dead: int | None, dead_ttl: float | None, queue_idle: float | None,
                   partitions: int) -> Retention:
    """Tick's housekeeping arguments from the namespace config (``Client.set_dead_retention``:
    ``max_dead`` jobs, ``dead_ttl`` seconds; ``Client.set_queue_retirement``: ``queue_idle``
    seconds; None = no such rule). The dead-letter cap is split evenly over the partitions."""
    per_partition = -(-max_dead // partitions) if max_dead else 0
    idle = int(queue_idle * 1000) if queue_idle else 0
    return Retention(int(dead_ttl * 1000) if dead_ttl else 0, per_partition, idle)


class TokenLedger:
    """Rate-limit tokens of one partition: ask the buckets (:meth:`requests`, :meth:`grants`),
    hand the grants to ``tick`` (:meth:`tick_tokens`), record what it held and spent
    (:meth:`account`)."""

    def __init__(self, keyspace: Keyspace, partition: int) -> None:
        self.keyspace = keyspace
        self.partition = partition
        self.held: dict[str, int] = {}     # rate-limited queue -> due jobs held in this partition
        self.refund: dict[str, int] = {}   # tokens granted but not used, returned next time

    def requests(self, limits: Limits) -> tuple[list[str], list[Call]]:
        """The queues to ask tokens for (those holding jobs here, or with tokens to give back) and
        their ``ratelimit`` calls, in the same order. Queues no longer limited are forgotten:
        ``tick`` releases what they hold without tokens."""
        for q in [q for q in self.held if q not in limits]:
            del self.held[q]
        want = [q for q in limits if self.held.get(q, 0) > 0 or self.refund.get(q, 0) > 0]
        return want, [ratelimit_call(self.keyspace, q, limits[q][0], limits[q][1], self.partition,
                                     self.held.get(q, 0), self.refund.pop(q, 0)) for q in want]

    def grants(self, want: Sequence[str], replies: Sequence[Any]) -> tuple[dict[str, int], float]:
        """The replies of :meth:`requests`' calls as queue -> tokens granted, and the seconds until
        a token is available for a holding queue that got none (inf when there is none)."""
        grants: dict[str, int] = {}
        wait = float("inf")
        for q, reply in zip(want, replies):
            grant = parse_ratelimit(reply)
            grants[q] = grant.granted
            if grant.granted == 0 and self.held.get(q, 0) > 0:
                wait = min(wait, grant.wait_ms / 1000.0)
        return grants, wait

    @staticmethod
    def tick_tokens(limits: Limits, grants: Mapping[str, int]) -> dict[str, int]:
        """``tick``'s tokens argument: every limited queue, with what it was granted (0 if nothing)."""
        return {q: grants.get(q, 0) for q in limits}

    def account(self, queues: Sequence[QueueTokens], grants: Mapping[str, int]) -> bool:
        """Record what a tick held back and did not spend (refunded next time); True when a
        rate-limited queue still holds due jobs in this partition."""
        held_any = False
        for q in queues:
            self.held[q.queue] = q.held
            held_any = held_any or q.held > 0
            unused = grants.get(q.queue, 0) - q.used
            if unused > 0:
                self.refund[q.queue] = self.refund.get(q.queue, 0) + unused
        return held_any
