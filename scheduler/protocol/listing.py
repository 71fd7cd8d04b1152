"""Paging through a queue's jobs in one state (``jobs()``, ``zsched job list``): the ``list``
script's calls and the opaque cursor that continues a listing.

Scheduled, running and dead jobs are listed in one order across every partition (run_at, lease
deadline, time of death): :class:`MergeWalk` asks every partition for its next jobs after one
shared watermark and merges the replies. Ready jobs are listed partition after partition in the
order workers claim them (:class:`ListWalk`): a ready list is a queue, not ordered by run_at."""
from __future__ import annotations

import base64
import math
from typing import Any, Protocol

from .call import Call
from .ids import ID_BYTES
from .keys import Keyspace, validate_name
from .models import JobInfo, JobState
from .replies import ListEntry, list_page
from .timeutil import to_ms


class Lister(Protocol):
    """What a listing needs of a namespace's :class:`~.calls.Calls` (which passes itself): its
    keyspace, payload limit and raw ``call``. A protocol, so this module does not import calls.py,
    which imports it."""

    ks: Keyspace
    max_payload: int

    def call(self, name: str, partition: int, *args: Any) -> Call:
        """The call of script ``name`` on ``partition`` with ``args`` after the common ones."""
        ...


LIST_STATES = ("scheduled", "ready", "running", "dead")  # what jobs() can list
LIST_MAX_LIMIT = 1000
LIST_ROUND_TRIPS = 16  # list script calls per jobs() page at most: a page may come back short
_PHASES = {"scheduled": "ht", "ready": "r", "running": "i", "dead": "d"}  # first byte of a position: lua/list.lua
_CURSOR_MAGIC = b"zs1"
MERGED = b"*"  # a cursor's partition field for a merged listing: its position holds in every partition
MERGED_STATES = ("scheduled", "running", "dead")  # listed in one order across partitions (MergeWalk)


def encode_cursor(state: str, queue: str, partition: int | None, position: bytes) -> str:
    """Where a listing continues, as an opaque URL-safe string (``partition`` None: a merged
    listing's watermark, which holds in every partition)."""
    part = MERGED if partition is None else str(partition).encode()
    raw = b"\0".join((_CURSOR_MAGIC, state.encode(), queue.encode(), part, position))
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: object, state: str, queue: str, partitions: int) -> tuple[int | None, bytes]:
    """A ``jobs()`` cursor -> (partition, or None for a merged listing's watermark, position);
    ValueError saying what is wrong."""
    def bad(why: str) -> ValueError:
        shown = cursor if not isinstance(cursor, str) or len(cursor) <= 80 else cursor[:77] + "..."
        return ValueError(f"cursor {shown!r} is not a valid jobs() cursor: {why}; pass the next_cursor "
                          "returned by the previous page of the same listing, or None to start")
    if not isinstance(cursor, str) or not cursor or len(cursor) > 400:
        raise bad("expected a non-empty string of at most 400 characters")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (ValueError, TypeError):
        raise bad("not base64") from None
    parts = raw.split(b"\0", 4)
    if len(parts) != 5 or parts[0] != _CURSOR_MAGIC:
        raise bad("not made by this client")
    c_state, c_queue = (x.decode("utf-8", "replace") for x in parts[1:3])
    c_part, pos = parts[3], parts[4]
    if (c_state, c_queue) != (state, queue):
        raise bad(f"it continues a listing of state {c_state!r} in queue {c_queue!r}, not {state!r} in {queue!r}")
    merged = state in MERGED_STATES
    if merged and c_part.isdigit():
        raise bad(f"it continues a listing of an older zsched, partition by partition; {state} jobs are now listed "
                  "in one order across partitions: start the listing again without a cursor")
    if (c_part != MERGED) if merged else (not c_part.isdigit() or int(c_part) >= partitions):
        raise bad(f"partition {c_part.decode('ascii', 'replace')!r} is not one of the namespace's {partitions}")
    if pos and not _position_ok(pos, state):
        raise bad("its position is malformed")
    return (None if merged else int(c_part)), pos


def _position_ok(pos: bytes, state: str) -> bool:
    """A position as lua/list.lua makes them: a phase letter, then ``score,id`` (or ``n,id``)."""
    if pos[:1].decode("latin-1") not in _PHASES[state]:
        return False
    if len(pos) == 1:
        return True
    if len(pos) < ID_BYTES + 3 or pos[-ID_BYTES - 1:-ID_BYTES] != b",":
        return False
    num = pos[1:-ID_BYTES - 1]
    try:
        val = float(num.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return False
    return math.isfinite(val) and (state != "ready" or (num.isdigit() and int(num) >= 1))


def run_at_range(state: str, start: Any, end: Any) -> list[str]:
    """The ``list`` script's optional run_at range arguments (ARGV 9, 10) from ``jobs()``'s
    ``run_at_from``/``run_at_to`` (aware datetimes or epoch seconds, None for an open end): ``[]``
    without a range. Only scheduled jobs are ordered by run_at (their sets are scored by it); a
    range with another state raises ValueError saying so."""
    if start is None and end is None:
        return []
    if state != "scheduled":
        raise ValueError(f"a run_at range is only supported for scheduled jobs (their timers are ordered by "
                         f"run_at), not {state!r}: filter the pages of that state yourself")
    lo = "" if start is None else str(to_ms(start, name="run_at_from"))
    hi = "" if end is None else str(to_ms(end, name="run_at_to"))
    return [lo, hi]


class ListWalk:
    """One ``jobs()`` page: walks the partitions in order from the cursor, one ``list`` script call
    at a time (each bounded by its scan budget), until the page is full, the partitions are done,
    or LIST_ROUND_TRIPS calls were made. ``run_at``: (from, to), inclusive, aware datetimes or
    epoch seconds, None for an open end: for scheduled jobs only, read as a range of their timer
    sets (pages stay full when enough jobs match); pass the same range with every page of a
    listing. The sync and async clients drive it and :class:`MergeWalk` the same way::

        while calls := walk.next_calls():
            walk.take_all(transport.call_many(calls))
        jobs, cursor = walk.result()
    """

    def __init__(self, calls: Lister, queue: str, state: str | JobState, limit: int, cursor: str | None,
                 run_at: tuple[Any, Any] = (None, None)) -> None:
        validate_name("queue", queue)
        st = state.value if isinstance(state, JobState) else state
        if st not in LIST_STATES:
            raise ValueError(f"state must be one of {', '.join(LIST_STATES)} (finished jobs are not listed: "
                             f"look them up by id with get()), got {state!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIST_MAX_LIMIT:
            raise ValueError(f"limit must be an integer from 1 to {LIST_MAX_LIMIT}, got {limit!r}")
        self.calls, self.queue, self.state, self.limit = calls, queue, st, limit
        self.range = run_at_range(st, *run_at)
        self.partition: int | None
        self.partition, self.position = (0, b"") if cursor is None else decode_cursor(cursor, st, queue,
                                                                                      calls.ks.partitions)
        self.budget = max(1000, 2 * limit)
        self.jobs: list[JobInfo] = []
        self.sent = 0

    def next_calls(self) -> list[Call]:
        """The next round of ``list`` calls (one here), or ``[]`` when the page is complete."""
        call = self.next_call()
        return [] if call is None else [call]

    def take_all(self, replies: list[Any]) -> None:
        """Take the replies of the calls :meth:`next_calls` returned."""
        for reply in replies:
            self.take(reply)

    def next_call(self) -> Call | None:
        """The next ``list`` call, or None when the page is complete."""
        if self.partition is None or len(self.jobs) >= self.limit or self.sent >= LIST_ROUND_TRIPS:
            return None
        self.sent += 1
        return self.calls.call("list", self.partition, self.state, self.queue, self.limit - len(self.jobs),
                               self.position, self.budget, *self.range)

    def take(self, reply: list[Any]) -> None:
        """Take the reply of the call :meth:`next_call` returned."""
        assert self.partition is not None
        page = list_page(reply, self.state, self.queue, self.calls.max_payload)
        self.jobs += page.jobs
        if page.position:
            self.position = page.position
        else:
            self.partition += 1
            self.position = b""
            if self.partition >= self.calls.ks.partitions:
                self.partition = None

    def result(self) -> tuple[list[JobInfo], str | None]:
        """(jobs, next cursor or None when the listing is complete)."""
        if self.partition is None:
            return self.jobs, None
        return self.jobs, encode_cursor(self.state, self.queue, self.partition, self.position)


_PHASE_RANK = {b"h": 0, b"t": 1, b"i": 0, b"d": 0}  # scheduled: held jobs (due, rate-limited) before timers
Key = tuple[int, int, bytes]  # (phase rank, score ms, raw id): a merged listing's order
_END: Key = (2, 0, b"")  # past every entry: a partition with nothing more


def _entry_key(state: str, e: ListEntry) -> Key:
    return (0 if e.held or state != "scheduled" else 1, e.score, e.raw_id)


def _position_key(pos: bytes) -> Key:
    """The order key of a position lua/list.lua returned or accepts: its phase, then score and id
    (a bare phase letter: that phase's start)."""
    rank = _PHASE_RANK[pos[:1]]
    if len(pos) == 1:
        return (rank, -1, b"")
    score, _, raw = pos[1:].partition(b",")
    return (rank, int(score), raw)


def _key_position(state: str, key: Key) -> bytes:
    """The position after ``key`` in every partition (the inverse of :func:`_position_key`)."""
    phase = ("t" if key[0] else "h") if state == "scheduled" else _PHASES[state]
    if key[1] < 0:
        return phase.encode()
    return phase.encode() + str(key[1]).encode() + b"," + key[2]


class MergeWalk:
    """One ``jobs()`` page of scheduled, running or dead jobs in one order across partitions: by
    run_at (held jobs, already due, first), lease deadline, time of death; ties by id.

    The cursor is a watermark: the last (score, id) listed, which lua/list.lua finds again in
    every partition's sorted set by binary search. A round asks every partition (one pipelined
    round trip) for up to the missing number of jobs after it, each call bounded by its scan
    budget, then merges. A partition's reply is complete up to its frontier: its last job when it
    returned as many as asked, its position when the budget ran out, nothing when it is done; only
    jobs at or before the lowest frontier are listed (a partition cut short may hold earlier ones),
    so the order is exact across pages. Rounds repeat until the page is full, every partition is
    done, or LIST_ROUND_TRIPS rounds were made. Work per page: partitions x page size entries at
    most, never the whole set. Jobs that stay put are listed once; a job that moves meanwhile may
    be missed or listed again in its new place, as in any paging over live data."""

    def __init__(self, calls: Lister, queue: str, state: str, limit: int, cursor: str | None,
                 run_at: tuple[Any, Any]) -> None:
        self.calls, self.queue, self.state, self.limit = calls, queue, state, limit
        self.range = run_at_range(state, *run_at)
        self.mark = b"" if cursor is None else decode_cursor(cursor, state, queue, calls.ks.partitions)[1]
        self.open = list(range(calls.ks.partitions))  # partitions with jobs after the watermark, maybe
        self.budget = max(1000, 2 * limit)
        self.jobs: list[JobInfo] = []
        self.rounds = 0
        self.done = False

    def next_calls(self) -> list[Call]:
        """The next round: one ``list`` call per partition not yet done, or ``[]``."""
        if self.done or len(self.jobs) >= self.limit or self.rounds >= LIST_ROUND_TRIPS:
            return []
        self.rounds += 1
        need = self.limit - len(self.jobs)
        return [self.calls.call("list", p, self.state, self.queue, need, self.mark, self.budget, *self.range)
                for p in self.open]

    def take_all(self, replies: list[Any]) -> None:
        """Merge one round's replies (in the order of :meth:`next_calls`'s calls)."""
        need = self.limit - len(self.jobs)
        frontier = _END
        found: list[tuple[Key, JobInfo]] = []
        still = []
        for p, reply in zip(self.open, replies):
            page = list_page(reply, self.state, self.queue, self.calls.max_payload)
            keys = [_entry_key(self.state, e) for e in page.entries]
            found += zip(keys, page.jobs)
            if not page.position:
                continue  # nothing more after the watermark in this partition
            still.append(p)
            frontier = min(frontier, keys[-1] if len(keys) >= need else _position_key(page.position))
        found.sort(key=lambda kj: kj[0])
        taken = [kj for kj in found if kj[0] <= frontier][:need]
        self.jobs += [j for _k, j in taken]
        self.open = still
        if len(taken) == need:
            self.mark = _key_position(self.state, taken[-1][0])
        if frontier == _END and len(taken) == len(found):
            self.done = True  # every partition is done and every job found is listed
        elif len(taken) < need:
            self.mark = _key_position(self.state, frontier)

    def result(self) -> tuple[list[JobInfo], str | None]:
        """(jobs, next cursor or None when the listing is complete)."""
        return self.jobs, None if self.done else encode_cursor(self.state, self.queue, None, self.mark)


def list_walk(calls: Lister, queue: str, state: str | JobState, limit: int, cursor: str | None,
              run_at: tuple[Any, Any] = (None, None)) -> ListWalk | MergeWalk:
    """The walk of one ``jobs()`` page: :class:`MergeWalk` for the states with one order across
    partitions, :class:`ListWalk` (partition by partition) for ready jobs. Arguments are checked
    here (ValueError saying what is expected)."""
    walk = ListWalk(calls, queue, state, limit, None, run_at)  # checks queue, state, limit and range
    if walk.state in MERGED_STATES:
        return MergeWalk(calls, queue, walk.state, limit, cursor, run_at)
    return ListWalk(calls, queue, state, limit, cursor, run_at)
