"""The claim planner: which (queue, partition) to claim from, and how many jobs, given the free slots.

Pure: no I/O, no clock, no event loop. The fetch strategy feeds it notifications and claim
results and asks it for a plan before each claim round trip.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from scheduler.protocol.calls import CLAIM_MAX

CLAIM_CHUNK = 16  # max jobs asked from one (queue, partition) known to be busy, per round trip

# One claim of a plan: (queue, partition, jobs to ask for, generation of the candidate mark).
Step = tuple[str, int, int, int]


class ClaimPlanner:
    """Claim candidates and fairness state of one worker.

    ``candidates[queue]`` maps each partition that may hold ready jobs to the generation of the
    notification (or sweep) that marked it; ``hot[queue]`` holds the partitions whose last claim
    came back full. Queues are served in rotating order and each queue's partitions from a
    rotating offset, so no queue or partition starves. ``paused[queue]`` holds the partitions whose
    last claim said the queue is paused (lua/pause.lua): ready notifications for them are ignored
    (no claim is sent) until a resume notification or the next full sweep. ``first`` holds the
    (queue, partition)s notified with ``first=True`` (rings a busy worker took from the bell):
    the next plan serves them before the rotation.
    """

    def __init__(self, queues: Sequence[str], partitions: int, chunk: int = CLAIM_CHUNK) -> None:
        self.queues = list(queues)
        self.partitions = partitions
        self.chunk = chunk
        self.candidates: dict[str, dict[int, int]] = {q: {} for q in queues}
        self.hot: dict[str, set[int]] = {q: set() for q in queues}
        self.paused: dict[str, set[int]] = {q: set() for q in queues}
        self.first: list[tuple[str, int]] = []
        self.gen = 0
        self._qrot = 0
        self._prot: dict[str, int] = {q: 0 for q in queues}

    def notify(self, queue: str, p: int, resumed: bool = False, first: bool = False) -> bool:
        """Partition ``p`` of ``queue`` has ready jobs (``resumed``: the queue was resumed there;
        ``first``: the next plan serves it before the other candidates). False (ignored) for a
        queue this worker does not serve, a partition out of range, or one where the queue is
        paused (unless this is its resume)."""
        cands = self.candidates.get(queue)
        if cands is None or not 0 <= p < self.partitions:
            return False
        paused = self.paused[queue]
        if p in paused:
            if not resumed:
                return False
            paused.discard(p)
        self.gen += 1
        cands[p] = self.gen
        if first:
            self.first.append((queue, p))
        return True

    def mark_all(self) -> None:
        """Full sweep: every (queue, partition) may have ready jobs."""
        self.mark(self.queues)

    def mark(self, queues: Sequence[str]) -> None:
        """Sweep of ``queues``: every partition of each may have ready jobs."""
        self.gen += 1
        g = self.gen
        for q in queues:
            self.paused[q].clear()  # probe paused partitions again: a resume message may be lost
            c = self.candidates[q]
            for p in range(self.partitions):
                c[p] = g

    def has_candidates(self) -> bool:
        """True when some (queue, partition) is worth a claim."""
        return any(self.candidates[q] for q in self.queues)

    def plan(self, free: int) -> list[Step]:
        """Spread ``free`` slots over the candidates: queues in rotating order, interleaved, and each
        queue's partitions from a rotating offset. A candidate whose last claim came back full gets
        up to ``chunk`` slots (several jobs per call); one only known from a notification gets its
        fair share of the slots left (it may hold a single job: slots it does not use are free
        again after the round trip). The jobs asked for never add up to more than ``free``."""
        qs = [q for q in self.queues if self.candidates[q]]
        if not qs or free <= 0:
            return []
        k = self._qrot % len(qs)
        self._qrot += 1
        P = self.partitions
        orders = []
        for q in qs[k:] + qs[:k]:
            off = self._prot[q]
            orders.append((q, sorted(self.candidates[q], key=lambda p: (p - off) % P)))
        seq: list[tuple[str, int]] = []
        longest = max(len(o) for _, o in orders)
        for i in range(longest):
            for q, order in orders:
                if i < len(order):
                    seq.append((q, order[i]))
        if self.first:  # the rings a busy worker took from the bell (they waited longest) go first
            front = [x for x in dict.fromkeys(self.first) if x[1] in self.candidates[x[0]]]
            self.first.clear()
            taken = set(front)
            seq = front + [x for x in seq if x not in taken]
        plan: list[Step] = []
        left = len(seq)
        for q, p in seq:
            if free <= 0:
                break
            # Busy: a big batch. Unknown depth: a fair share of what is left (1 each when there
            # are more candidates than slots, so every notified partition gets probed).
            n = min(free, CLAIM_MAX, self.chunk if p in self.hot[q] else max(1, free // left))
            left -= 1
            plan.append((q, p, n, self.candidates[q][p]))
            free -= n
            self._prot[q] = (p + 1) % P
        if len(plan) > 1:  # a one-claim plan (spread traffic's usual) already moved on past its partition
            planned = Counter(q for q, _, _, _ in plan)
            for q, order in orders:
                # Every candidate planned (a sweep, usually): the offset would come back to where
                # this plan started, and the first claims, the ones the handler slots go to (Slots.
                # reserve_many), would be the same partitions at every sweep. Start one further on.
                if len(order) > 1 and planned[q] == len(order):
                    self._prot[q] = (order[0] + 1) % P
        return plan

    def claimed(self, queue: str, p: int, asked: int, gen: int, got: int) -> None:
        """A claim of ``asked`` jobs planned at generation ``gen`` returned ``got``. A full reply
        makes the partition hot; a short one means its ready list is empty now, so it stops being a
        candidate unless a notification came after the claim was planned."""
        if got == asked:
            self.hot[queue].add(p)
            return
        self.hot[queue].discard(p)
        cands = self.candidates[queue]
        if cands.get(p) == gen:
            del cands[p]

    def failed(self, queue: str, p: int) -> None:
        """A claim on ``p`` failed: drop the candidate until the next notification or sweep."""
        self.candidates[queue].pop(p, None)

    def paused_at(self, queue: str, p: int) -> None:
        """A claim on ``p`` found ``queue`` paused: no claims there until it is resumed (or the next
        full sweep), so a paused queue costs no round trips."""
        self.candidates[queue].pop(p, None)
        self.hot[queue].discard(p)
        self.paused[queue].add(p)


def ready_message(data: bytes | str) -> tuple[int, bool]:
    """A doorbell member: ``P`` (jobs landed in partition P's ready list) or ``P:resume``
    (lua/resume.lua) -> (partition, resumed). ValueError when malformed."""
    try:
        return int(data), False  # the common message: no parsing beyond int()
    except ValueError:
        pass
    text = data.decode() if isinstance(data, bytes) else data
    part, sep, what = text.partition(":")
    if sep and what != "resume":
        raise ValueError(f"unknown ready message {text!r}")
    return int(part), bool(sep)
