"""Redis's clock on this host's monotonic clock, for starting jobs handed off ahead of their due
time at that time and never before it.

Each claim's reply carries Redis's clock (``now_us``, read by the script). Redis read it somewhere
between the moment the claim was sent (``sent``) and the moment its reply arrived (``received``),
both on this host's monotonic clock, so the offset ``monotonic - redis`` lies in
``[sent - redis, received - redis]``. The upper end is a safe mapping (a job timed with it can
only start late, by at most the round trip); it is as loose as the round trip, which at 1 000 jobs/s
on a busy host is often milliseconds (the reply waits in the socket while the loop is busy).

:class:`RedisClock` keeps the tightest upper bound seen recently instead: the smallest
``received - redis`` of earlier claims, each grown by the largest rate difference the two clocks
may have (:data:`MAX_RATE_DIFF`) over the time since it was measured, so it stays an upper bound
of the offset as long as the clocks' rates differ by no more than that. On one host (the Redis
server and the worker on the same machine) they differ by nothing: both clocks are the same
kernel clock, slewed alike. A bound is used for at most :data:`MAX_AGE` seconds, and dropped at
once when a claim *proves* the offset grew past it (its ``sent - redis`` is above the bound: Redis's
clock was stepped back, or another server answered), when a claim fails (a failover to another
server starts with an error), and in a Redis Cluster (nodes have clocks of their own and a
partition moves between them without an error) it is never kept across claims at all.
"""
from __future__ import annotations

MAX_RATE_DIFF = 500e-6
"""The largest rate difference assumed between Redis's clock and this host's monotonic clock
(500 ppm: the most NTP's kernel discipline slews a clock; on one host the difference is 0)."""

MAX_AGE = 1.0
"""Seconds a tighter bound from an earlier claim is used for."""


class RedisClock:
    """The offset ``monotonic - redis`` (seconds), as a bound that is never below the true one."""

    __slots__ = ("keep", "_best")

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        """False: use each claim's own bound only (Redis Cluster)."""
        self._best: tuple[float, float] | None = None  # (offset bound, monotonic when measured)

    def offset(self, redis_s: float, sent: float, received: float) -> float:
        """The offset to map the due times of a claim onto the monotonic clock: sent at ``sent``,
        answered at ``received`` (monotonic seconds) with Redis's clock ``redis_s`` (seconds)."""
        hi = received - redis_s
        best = self._best
        if best is not None:
            bound, at = best
            age = received - at
            aged = bound + MAX_RATE_DIFF * age
            # still tighter, not older than MAX_AGE, and consistent with this claim (Redis read its
            # clock no earlier than `sent`: a bound below sent - redis_s is proven wrong)
            if aged < hi and age <= MAX_AGE and sent - redis_s <= aged:
                return aged
        if self.keep:
            self._best = (hi, received)
        return hi

    def forget(self) -> None:
        """Drop the kept bound (after a failed claim: the next answer may come from another server)."""
        self._best = None
