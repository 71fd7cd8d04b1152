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
from collections.abc import Iterable, Sequence

from scheduler.protocol.replies import Claimed

ALPHA = 0.1  # weight of a new sample in the moving averages (about the last 10 samples)
WARM_UP = 8  # handlers of a queue run before its allowance is more than 0
SHARE = 0.5  # of a round trip that jobs past the handler slots may wait for one
# how long a claim's early jobs may wait for this worker's handlers past their due time, at most
# (DuePace.claim_size): the default burst lead (zsched scheduler --burst-lead), so that a burst
# handed off that far ahead is not spread over more workers than its jobs need (20 ms measured
# 29-35 ms handler p99 at 16 workers, batched, against 8-11 ms with 50)
EARLY_WAIT_S = 0.050
# early jobs a claim may take past its handler slots before the queue's handlers are measured:
# the prefetch allowance's default until 2026-12-05, so the first claims take what they took then
UNMEASURED_EARLY = 32
# A bell wait takes up to TAKE_MAX rings (Doorbell.take_many), one per RING_JOBS jobs the worker has
# room for (rings_to_take): a tick step's burst rings one bell member per partition, about 19 jobs
# each in `bench fanout`'s batched shape, and each ring taken alone woke a cold worker of its own.
TAKE_MAX = 4
RING_JOBS = 32
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

    def extra(self, queue: str, hold: int, within: float = 0.0) -> int:
        """Due jobs of ``queue`` a claim may take past its handler slots, at most ``hold`` (its
        prefetch slots): as many as the handlers start within half a claim round trip, or
        ``within`` seconds if longer; 0 until measured, and for handlers slower than that."""
        if hold <= 0 or not self.measured(queue):
            return 0
        mean, rt = self.handler_s[queue], self.round_trip_s
        assert rt is not None  # measured
        expected = self.concurrency * max(rt * SHARE, within) / max(mean, 1e-6)
        return max(0, min(hold, int(expected)))

    def claim_size(self, queue: str, asked: int, handler: int, held: int = 0) -> int:
        """How many of the ``asked`` jobs (``handler`` of them on handler slots, the rest on
        prefetch slots) a claim of ``queue`` asks for: the handler slots and :meth:`extra`, at
        least 1. A job handed off ahead of its due time needs a handler of this worker when it
        comes due, as a due job does: a claim limited by the prefetch slots alone took 150 jobs
        of 100 ms handlers that one worker ran 4 at a time for almost 4 s while others idled.
        Early jobs may wait longer for a handler than due ones (:data:`EARLY_WAIT_S`): they are
        usually a burst's, and the other way to run them, waking more workers, costs each job
        more (a cold process per partition). ``held``: the jobs already on this worker's prefetch
        slots, which count against that: a worker with free handler slots keeps taking rings, and
        its held jobs piled up (16 workers' handler lateness p99 29-35 ms against 11-12 ms). What
        a claim leaves in the ready list it rings the bell for, so an idle worker takes it."""
        if not self.measured(queue):
            room = UNMEASURED_EARLY - held
        else:
            room = self.extra(queue, asked - handler + held, EARLY_WAIT_S) - held
        return min(asked, max(1, handler + max(0, room)))

    def measured(self, queue: str) -> bool:
        """Whether :meth:`extra` has the measurements it needs for ``queue`` (:data:`WARM_UP` runs)."""
        return self.round_trip_s is not None and self.runs.get(queue, 0) >= WARM_UP

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


def rings_to_take(pace: DuePace, queues: Iterable[str], free: int, hold: int, held: int = 0) -> int:
    """How many rings one bell wait may take, 1 to :data:`TAKE_MAX`: one per :data:`RING_JOBS` jobs
    the worker can take in its next round trip, its ``free`` handler slots and the part of its
    ``hold`` free prefetch slots that its handlers' pace lets a claim fill beside the ``held``
    jobs already there (:meth:`DuePace.claim_size`).
    Rings taken beyond that would wait for this worker's slots while another worker has room; so
    a worker whose handlers are slow, or not yet measured, takes one at a time. The rings of one
    wait come from one bell, of any of ``queues``: the slowest queue decides."""
    room = free + min((pace.extra(q, hold + held, EARLY_WAIT_S) for q in queues), default=0) - held
    return max(1, min(TAKE_MAX, room // RING_JOBS))


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
