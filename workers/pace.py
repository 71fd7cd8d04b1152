"""How many due jobs a claim may take beyond its free handler slots.

A claim takes due jobs only into handler slots, so that a due job never waits in one worker's
prefetch while another worker has a free slot. With handlers that finish in less than a claim's
round trip that rule costs a round trip per ``concurrency`` jobs: a burst claimed after its due
time goes four jobs per claim at the default concurrency, each claim a wake-up of its own, and a
lone worker ran a 300-job burst in 66 claims (``bench fanout``, batched).

So a claim may take as many more due jobs, onto its prefetch slots, as the worker's handlers are
expected to start within half a claim's round trip: ``concurrency x round trip / 2 / handler
time``, from the mean handler time of the claim's queue and the mean claim round trip (moving
averages). Such a job waits on a prefetch slot for a handler slot of this worker, which it gets
sooner than any claim, this worker's or another's, could hand it one; for handlers slower than
``concurrency`` half round trips the allowance is 0 and the rule is as before. Until a queue has had
:data:`WARM_UP` handlers run there is no allowance. :func:`held_slots` puts a claim's jobs on
its slots.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from scheduler.protocol.replies import Claimed

ALPHA = 0.1  # weight of a new sample in the moving averages (about the last 10 samples)
WARM_UP = 8  # handlers of a queue run before its allowance is more than 0
SHARE = 0.5  # of a round trip that jobs past the handler slots may wait for one
SLOW_AFTER = 2  # handlers of a queue run before it may be judged slow (DuePace.slow): the safe side
SLOW_MARGIN = 4  # slow: handlers this many times slower than the allowance's threshold (a no-op never is)


class DuePace:
    """Moving averages of the handlers' run times (per queue) and of the claims' round trips, and
    the extra due jobs a claim may take (:meth:`extra`)."""

    __slots__ = ("concurrency", "handler_s", "runs", "round_trip_s")

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.handler_s: dict[str, float] = {}
        self.runs: dict[str, int] = {}
        self.round_trip_s: float | None = None

    def ran(self, queue: str, seconds: float) -> None:
        """A handler of ``queue`` ran for ``seconds`` (from its start to its end, whatever the outcome)."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        n = self.runs.get(queue, 0)
        self.runs[queue] = n + 1
        mean = self.handler_s.get(queue)
        self.handler_s[queue] = seconds if mean is None else mean + ALPHA * (seconds - mean)

    def claimed(self, seconds: float) -> None:
        """A claim round trip took ``seconds``."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        rt = self.round_trip_s
        self.round_trip_s = seconds if rt is None else rt + ALPHA * (seconds - rt)

    def extra(self, queue: str, hold: int) -> int:
        """Due jobs of ``queue`` a claim may take past its handler slots, at most ``hold`` (its
        prefetch slots): 0 until measured, and for handlers slower than ``concurrency`` half
        round trips."""
        mean, rt = self.handler_s.get(queue), self.round_trip_s
        if hold <= 0 or mean is None or rt is None or self.runs.get(queue, 0) < WARM_UP:
            return 0
        expected = self.concurrency * rt * SHARE / max(mean, 1e-6)
        return max(0, min(hold, int(expected)))

    def slow(self, queue: str) -> bool:
        """Whether ``queue``'s handlers are known to be slow: :data:`SLOW_MARGIN` times slower than
        ``concurrency`` half claim round trips (the threshold past which :meth:`extra` gives
        nothing), about 8 round trips at the default concurrency. A worker's handler slots then
        fill faster than one claim after another can feed them. False until measured
        (:data:`SLOW_AFTER` runs: judging too soon only costs wake-ups, too late costs lateness, so
        fewer than :data:`WARM_UP`)."""
        mean, rt = self.handler_s.get(queue), self.round_trip_s
        if mean is None or rt is None or self.runs.get(queue, 0) < SLOW_AFTER:
            return False
        return mean > SLOW_MARGIN * self.concurrency * rt * SHARE


def held_slots(jobs: Sequence[Claimed], now_ms: int, handler: int, hold: int) -> list[bool]:
    """Which of a claim's jobs go on its ``hold`` prefetch slots rather than its ``handler`` slots.
    Jobs due by the claim's Redis time ``now_ms`` take handler slots; due jobs past those (the
    allowance of :class:`DuePace`, or a re-sent claim answered from its receipt) wait on prefetch
    slots for a handler; jobs handed off ahead of their time take prefetch slots, the latest
    first, and any past those take the handler slots left (and wait there)."""
    held = [False] * len(jobs)
    due = [c.due_ms <= now_ms for c in jobs]
    over = sum(due) - handler  # due jobs with no handler slot
    for i in range(len(jobs) - 1, -1, -1):
        if hold <= 0:
            break
        if not due[i] or over > 0:
            held[i] = True
            hold -= 1
            if due[i]:
                over -= 1
    return held
