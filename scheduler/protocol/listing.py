"""Paging through a queue's jobs in one state (``jobs()``, ``zsched job list``): the ``list``
script's calls, partition after partition, and the opaque cursor that continues a listing."""
from __future__ import annotations

import base64
import math
from typing import Any, Protocol

from .call import Call
from .ids import ID_BYTES
from .keys import Keyspace, validate_name
from .models import JobInfo, JobState
from .replies import list_page
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


def encode_cursor(state: str, queue: str, partition: int, position: bytes) -> str:
    """Where a listing continues, as an opaque URL-safe string."""
    raw = b"\0".join((_CURSOR_MAGIC, state.encode(), queue.encode(), str(partition).encode(), position))
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: object, state: str, queue: str, partitions: int) -> tuple[int, bytes]:
    """A ``jobs()`` cursor -> (partition, position); ValueError saying what is wrong."""
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
    if not c_part.isdigit() or int(c_part) >= partitions:
        raise bad(f"partition {c_part.decode('ascii', 'replace')!r} is not one of the namespace's {partitions}")
    if pos and not _position_ok(pos, state):
        raise bad("its position is malformed")
    return int(c_part), pos


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
    listing. The sync and async clients drive it the same way::

        while (call := walk.next_call()) is not None:
            walk.take(transport.call(*call))
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
        if cursor is None:
            self.partition, self.position = 0, b""
        else:
            self.partition, self.position = decode_cursor(cursor, st, queue, calls.ks.partitions)
        self.budget = max(1000, 2 * limit)
        self.jobs: list[JobInfo] = []
        self.sent = 0

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
