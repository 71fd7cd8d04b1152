"""The console's inputs, checked: every query and path parameter of every page, and the form
fields the dead-letter actions share with the dead-letter page. A value the console does not take
is a :class:`BadRequest`: a 400 page naming the parameter, what it accepts and what it got, never
a traceback and never an empty page that reads as "nothing matches".

Parameters a page does not know are ignored (the browser's own forms send only known ones).
"""
from __future__ import annotations

import functools
import math
import re
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from ...protocol.codec import MAX_KEY_BYTES
from ...protocol.errors import ZschedError
from ...protocol.ids import ID_CHARS
from ...protocol.keys import validate_name
from ...protocol.listing import LIST_STATES, decode_cursor
from .. import admin

DEAD_LIMIT_MAX = 500      # dead letters one page shows at most
DEAD_LIMIT_DEFAULT = 100
ERROR_TEXT_MAX = 200      # the dead-letter filter "error contains"
RATE_MAX = 100_000        # jobs/s of a dead-letter requeue
YEARS = (1970, 9998)      # dates a filter or a reschedule takes (job times are ms since 1970)
_JOB_ID = re.compile(f"[0-9a-fA-F]{{{ID_CHARS}}}")
_TASK_ID = re.compile(r"[0-9a-f]{12}")  # tasks.RequeueTask ids: secrets.token_hex(6)
_DIGITS = re.compile(r"[0-9]{1,12}")


class BadRequest(ZschedError, ValueError):
    """An input the console does not accept (a 400 page); the message says which one, what is
    accepted and what was given. A ValueError, so the actions report it as a refusal."""


def _shown(text: str, width: int = 60) -> str:
    """A given value for a message: quoted, cut to ``width`` characters."""
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def whole_number(name: str, text: str, lo: int, hi: int) -> int:
    """``text`` as an integer from ``lo`` to ``hi`` (decimal digits only)."""
    if not _DIGITS.fullmatch(text) or not lo <= int(text) <= hi:
        raise BadRequest(f"{name} must be a whole number from {lo} to {hi}, got {_shown(text)}")
    return int(text)


@functools.cache
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones() | {"UTC"})


def zone(text: str) -> ZoneInfo:
    """A time zone by its IANA name (``Europe/Berlin``; empty: UTC)."""
    if not text:
        return ZoneInfo("UTC")
    if text not in _zones():
        raise BadRequest(f"tz must be an IANA time zone name like Europe/Berlin or UTC, got {_shown(text)}")
    return ZoneInfo(text)


def local_time(name: str, text: str, tz: str) -> datetime:
    """A ``datetime-local`` field (``2026-05-01T09:30``, seconds optional) in zone ``tz`` (an offset
    in the text wins) -> an aware datetime."""
    where = zone(tz)
    try:
        naive = datetime.fromisoformat(text)
    except ValueError:
        naive = None
    if naive is None or not YEARS[0] <= naive.year <= YEARS[1]:
        raise BadRequest(f"{name} must be a date and time like 2026-05-01T09:30 (years {YEARS[0]} to {YEARS[1]}), "
                         f"got {_shown(text)}")
    return naive.replace(tzinfo=where) if naive.tzinfo is None else naive


def time_range(q: Mapping[str, str], start: str, end: str) -> tuple[datetime | None, datetime | None]:
    """The optional range ``q[start]`` .. ``q[end]`` in zone ``q["tz"]``; the zone is checked even
    when neither end is given."""
    tz = q.get("tz", "") or ""
    zone(tz)
    lo = local_time(start, q[start], tz) if q.get(start) else None
    hi = local_time(end, q[end], tz) if q.get(end) else None
    if lo is not None and hi is not None and lo > hi:
        raise BadRequest(f"{start} ({q[start]}) is after {end} ({q[end]}): give {start} <= {end}")
    return lo, hi


def queue(text: str) -> str:
    """A queue name (the rules of ``protocol.keys.validate_name``)."""
    try:
        return validate_name("queue", text)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def state(text: str) -> str:
    """A state the jobs page lists."""
    if text not in LIST_STATES:
        raise BadRequest(f"state must be one of {', '.join(LIST_STATES)}, got {_shown(text)}")
    return text


def job_id(text: str) -> str:
    """A job id (``/job/{id}``), lowercased."""
    if not _JOB_ID.fullmatch(text):
        raise BadRequest(f"a job id is {ID_CHARS} hexadecimal characters (as schedule returns it), "
                         f"got {_shown(text)}")
    return text.lower()


def task_id(text: str) -> str:
    """A background requeue's id (``/task/{id}``)."""
    if not _TASK_ID.fullmatch(text):
        raise BadRequest(f"a requeue task id is 12 hexadecimal characters, got {_shown(text)}")
    return text


def rate(text: str) -> float | None:
    """A dead-letter requeue's rate in jobs per second (empty: as fast as batches go)."""
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= RATE_MAX):
        raise BadRequest(f"rate must be a number of jobs per second above 0 and at most {RATE_MAX}, "
                         f"got {_shown(text)}")
    return value


def local_path(text: str) -> str | None:
    """``text`` when it is a path on this console (where to go after a login or an action), else
    None. Not ``//host`` nor ``/\\host``: browsers read a backslash as a slash, so either would
    send the operator to another site."""
    if not text.startswith("/") or text[1:2] in ("/", "\\") or "\\" in text:
        return None
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text) or len(text) > 2000:
        return None
    return text


@dataclass(frozen=True)
class JobsQuery:
    """What ``/jobs`` asks for: a job to find, or one page of a queue's jobs in a state."""

    find: str = ""
    queue: str = ""
    state: str = "ready"
    start: datetime | None = None
    end: datetime | None = None
    cursor: str | None = None


def jobs_query(q: Mapping[str, str], partitions: int) -> JobsQuery:
    """``/jobs``'s parameters: ``find`` (a job id or an idempotency key), or ``queue``, ``state``,
    ``from``, ``to``, ``tz`` and ``cursor`` (from the page's "next page" link)."""
    find = q.get("find", "").strip()
    if len(find.encode()) > max(ID_CHARS, MAX_KEY_BYTES):
        raise BadRequest(f"find takes a job id ({ID_CHARS} characters) or an idempotency key (at most "
                         f"{MAX_KEY_BYTES} bytes), got {len(find.encode())} bytes")
    name = queue(q["queue"]) if q.get("queue") else ""
    st = state(q.get("state") or "ready")
    start, end = time_range(q, "from", "to")
    cursor = q.get("cursor") or None
    if cursor is not None:
        if not name:
            raise BadRequest("cursor continues a listing: give its queue and state too (follow the page's "
                             "next-page link)")
        try:
            decode_cursor(cursor, st, name, partitions)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
    return JobsQuery(find, name, st, start, end, cursor)


@dataclass(frozen=True)
class DeadQuery:
    """Which dead letters ``/dead`` (or a dead-letter action) selects, and how many it shows."""

    filter: admin.DeadFilter
    start: datetime | None
    end: datetime | None
    limit: int
    older: str | None = None  # a page mark: the page after it (older deaths)
    newer: str | None = None  # a page mark: the page before it (newer deaths)


def dead_query(q: Mapping[str, str]) -> DeadQuery:
    """``/dead``'s parameters (and a dead-letter action's fields): ``queue``, ``error`` (text the
    last error contains, any case), ``since``, ``until``, ``tz``, ``limit`` (rows shown), ``older``
    or ``newer`` (a page mark: the next or the previous page)."""
    name = queue(q["queue"]) if q.get("queue") else None
    text = q.get("error") or None
    if text is not None and len(text) > ERROR_TEXT_MAX:
        raise BadRequest(f"error (the text a last error contains) takes at most {ERROR_TEXT_MAX} characters, "
                         f"got {len(text)}")
    start, end = time_range(q, "since", "until")
    raw = q.get("limit", "")
    limit = whole_number("limit", raw, 1, DEAD_LIMIT_MAX) if raw else DEAD_LIMIT_DEFAULT
    marks = {k: q.get(k) or None for k in ("older", "newer")}
    for k, v in marks.items():
        if v is not None:
            try:
                admin.parse_mark(v, k)
            except admin.BadInput as exc:
                raise BadRequest(str(exc)) from None
    if marks["older"] and marks["newer"]:
        raise BadRequest("give older or newer (the page after or before a mark), not both")
    return DeadQuery(admin.DeadFilter(queue=name, error_contains=text, ignore_case=True), start, end, limit,
                     marks["older"], marks["newer"])
