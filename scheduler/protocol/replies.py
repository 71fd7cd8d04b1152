"""The scripts' structured replies as typed values.

``claim`` (:func:`parse_claim`), ``schedule`` (:func:`parse_schedule`), the job views of
``inspect``, ``list`` and ``dead_list`` (:func:`job_info`, :func:`list_page`,
:func:`dead_list_infos`) and ``stats`` (:func:`parse_stats`). Replies that are status codes are
parsed in :mod:`.codes`. Everything here is pure: no I/O, no clock.
"""
from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from .codec import Record, decode_record, decode_tombstone, unpack_payload
from .errors import PayloadError
from .ids import encode_id
from .models import JobError, JobInfo, JobState
from .timeutil import ms_to_datetime

# -- claim -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Claimed:
    """One job returned by the ``claim`` script. ``record`` is None when the body is undecodable
    (a poison job: dead-letter it with ``raw_record`` kept for inspection)."""

    raw_id: bytes
    raw_record: bytes
    record: Record | None
    decode_error: str | None
    token: int
    deadline_ms: int
    due_ms: int


def claim_paused(reply: list[Any]) -> int | None:
    """When a ``claim`` was refused because its queue is paused (lua/pause.lua): the epoch ms the
    pause started; None for an ordinary reply (a paused reply has 2 elements, a job adds 5)."""
    return int(reply[1]) if len(reply) == 2 else None


def parse_claim(reply: list[Any]) -> tuple[int, list[Claimed]]:
    """``claim`` reply -> (Redis's clock in microseconds when it ran, jobs); a paused queue's
    reply (:func:`claim_paused`) holds no jobs."""
    now = int(reply[0])
    out: list[Claimed] = []
    if claim_paused(reply) is not None:
        return now, out
    for i in range(1, len(reply), 5):
        raw_id, raw_rec, token, deadline, due = reply[i : i + 5]
        try:
            rec: Record | None = decode_record(raw_rec)
            err = None
        except PayloadError as exc:
            rec, err = None, str(exc)
        out.append(Claimed(raw_id, raw_rec, rec, err, int(token), int(deadline), int(due)))
    return now, out


def backoff_delay_ms(attempt: int, base_ms: int, cap_ms: int, rng: random.Random | None = None) -> int:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempt)].

    Full jitter (not "base + jitter") is what breaks up a retry storm: jobs that failed in the same
    second come back spread over the whole window instead of together.
    """
    ceiling = min(cap_ms, base_ms * (2 ** min(attempt, 60)))
    return (rng or random).randint(0, int(ceiling))


# -- schedule --------------------------------------------------------------------------------------


class ScheduleReply(NamedTuple):
    """A ``schedule`` reply: the raw ids in the order sent (for a key that was already live, the
    existing job's id), the 0-based positions of the jobs that misfired at schedule time, and the
    Redis clock when the script ran."""

    ids: list[bytes]
    misfired: list[int]
    now_ms: int


def parse_schedule(reply: list[Any]) -> ScheduleReply:
    """``{now_ms, m, m 1-based positions, ids...}`` (lua/schedule.lua) as a ScheduleReply."""
    m = int(reply[1])
    return ScheduleReply(list(reply[2 + m:]), [int(x) - 1 for x in reply[2:2 + m]], int(reply[0]))


# -- job views: inspect, list, dead_list ------------------------------------------------------------


def parse_error(blob: bytes | None) -> JobError | None:
    """Decode an error blob ``at_ms NUL type NUL message NUL traceback`` (the partition's ``e``
    hash; a tombstone keeps it without the traceback)."""
    if not blob:
        return None
    parts = blob.split(b"\0", 3) + [b""] * 4
    try:
        at = ms_to_datetime(int(parts[0]))
    except ValueError:
        at = None
    etype, message, tb = (b.decode("utf-8", "replace") for b in parts[1:4])
    return JobError(at, etype, message, tb)


def job_info(job_id: str, reply: list[Any], max_payload: int) -> JobInfo | None:
    """One ``inspect`` reply (lua/inspect.lua: state, record, score, token, error, queue, due,
    summary) as a JobInfo; None for ``{}`` (unknown id, or its tombstone expired). Payloads over
    ``max_payload`` bytes, or bodies that do not decode, become ``{"_undecodable": why}`` so one
    poison job cannot make a listing unusable."""
    if not reply:
        return None
    state = JobState(reply[0].decode())
    rec_b, score, token, err, qname = reply[1:6]
    due, summary = (reply[6], reply[7]) if len(reply) >= 8 else (None, None)
    score_ms = int(float(score)) if score is not None else None
    due_dt = ms_to_datetime(int(float(due))) if due is not None else None
    queue = qname.decode() if qname else None
    if rec_b is None:
        return tombstone_info(job_id, state, score_ms, queue, summary)
    dead = state is JobState.DEAD
    died = ms_to_datetime(score_ms) if dead and score_ms is not None else None
    try:
        rec = decode_record(rec_b)
    except PayloadError as exc:
        return JobInfo(id=job_id, state=state, queue=queue, run_at=due_dt, died_at=died, finished_at=died,
                       last_error=parse_error(err), payload={"_undecodable": str(exc)})
    try:
        payload = unpack_payload(rec.payload_bytes, max_payload)
    except PayloadError as exc:
        payload = {"_undecodable": str(exc)}
    if due_dt is None and state is JobState.SCHEDULED and score_ms is not None:
        due_dt = ms_to_datetime(score_ms)
    return JobInfo(
        id=job_id, state=state, queue=queue, key=rec.key, run_at=due_dt,
        attempts=rec.attempt, max_attempts=rec.max_attempts, created=ms_to_datetime(rec.created * 1000),
        lease_deadline=ms_to_datetime(score_ms) if state is JobState.RUNNING else None,
        fence=int(token) if token is not None else None,
        died_at=died, finished_at=died, last_error=parse_error(err), payload=payload,
    )


def tombstone_info(job_id: str, state: JobState, expires_ms: int | None, queue: str | None,
                   summary: bytes | None) -> JobInfo:
    """A done/cancelled/misfired job from its summary (codec.Tombstone); a legacy tombstone
    (no summary) only knows when it expires."""
    expires = ms_to_datetime(expires_ms) if expires_ms is not None else None
    if not summary:
        return JobInfo(id=job_id, state=state, expires_at=expires)
    try:
        t = decode_tombstone(summary)
    except PayloadError:
        return JobInfo(id=job_id, state=state, queue=queue, expires_at=expires)
    return JobInfo(
        id=job_id, state=state, queue=queue, key=t.key, run_at=ms_to_datetime(t.due_ms),
        attempts=t.attempts, max_attempts=t.max_attempts or None,
        created=ms_to_datetime(t.created * 1000) if t.created else None,
        expires_at=ms_to_datetime(t.expires_ms), finished_at=ms_to_datetime(t.finished_ms),
        last_error=parse_error(t.error),
    )


def inspect_infos(job_ids: Iterable[str], reply: list[Any], max_payload: int) -> list[JobInfo | None]:
    """An ``inspect`` reply for several ids (one reply per id, in the order sent)."""
    return [job_info(jid, one, max_payload) for jid, one in zip(job_ids, reply)]


class ListEntry(NamedTuple):
    """Where a listed job sits in its partition's order: its raw id, its score (epoch ms) and,
    for a scheduled job, whether it is held by its queue's rate limit (listed before the timers)."""

    raw_id: bytes
    score: int
    held: bool


class ListPage(NamedTuple):
    """A ``list`` reply: the jobs, and where the next call of this partition continues (empty:
    the partition has nothing more); ``entries``: each job's place (aligned with ``jobs``)."""

    jobs: list[JobInfo]
    position: bytes
    entries: list[ListEntry]


def list_page(reply: list[Any], state: str, queue: str, max_payload: int) -> ListPage:
    """``{position, then id, record, score, token, error, due per job}`` (lua/list.lua; a
    scheduled job's token is ``h`` when it is held by its queue's rate limit)."""
    st, qname = state.encode(), queue.encode()
    jobs, entries = [], []
    for i in range(1, len(reply), 6):
        raw, rec_b, score, token, err, due = reply[i:i + 6]
        held = token == b"h"
        info = job_info(encode_id(raw), [st, rec_b, score, None if held else token, err, qname, due, None],
                        max_payload)
        if info is not None:
            jobs.append(info)
            entries.append(ListEntry(bytes(raw), int(float(score)), held))
    return ListPage(jobs, reply[0] or b"", entries)


def dead_list_infos(replies: Iterable[list[Any]], limit: int, max_payload: int) -> list[JobInfo]:
    """The ``dead_list`` replies of every partition (id, record, died at, error, queue, due per
    job) merged: the ``limit`` most recent deaths, newest first."""
    out = []
    for flat in replies:
        for i in range(0, len(flat), 6):
            raw, rec_b, died, err, qname, due = flat[i : i + 6]
            info = job_info(encode_id(raw), [b"dead", rec_b, died, None, err, qname, due, None], max_payload)
            if info:
                out.append(info)
    out.sort(key=lambda j: j.died_at or 0, reverse=True)
    return out[:limit]


# -- stats -----------------------------------------------------------------------------------------

_GAUGE_STATES = {"s": "scheduled", "a": "running", "d": "dead"}


@dataclass(frozen=True)
class StatsReply:
    """One partition's ``stats`` reply. ``gauges``: ``s:Q`` scheduled, ``h:Q`` held by a rate
    limit, ``a:Q`` running, ``d:Q`` dead; ``counters``: events per queue (``fired:Q``, ...);
    ``ready``: ready-list length per queue; ``earliest_due_ms``: the next timer (None: none);
    totals of the timer, in-flight and dead sets; the highest scheduler epoch seen; ``paused``:
    queue -> epoch ms when its pause started, for the queues paused in this partition.
    ``due_soon``: per queue, timers due within the horizon asked for (``Calls.stats_call``) among
    the first ``scan_max`` of them; ``due_soon_total``: every timer due by then (None when no
    horizon was asked for); ``now_ms``: Redis's clock when it answered (None from scripts
    before 2026-12-04)."""

    gauges: dict[str, int]
    counters: dict[str, int]
    ready: dict[str, int]
    earliest_due_ms: int | None
    timers: int
    in_flight: int
    dead: int
    epoch: int
    paused: dict[str, int] = dataclasses.field(default_factory=dict)
    due_soon: dict[str, int] = dataclasses.field(default_factory=dict)
    due_soon_total: int | None = None
    now_ms: int | None = None

    def due_soon_by_queue(self) -> dict[str, float]:
        """Per queue: ready jobs plus timers due within the horizon. Exact while the script read
        every due timer; beyond ``scan_max`` of them it read a quarter as many at evenly spaced
        ranks, and the total (exact) is shared out in the proportions of those."""
        out: dict[str, float] = {q: float(n) for q, n in self.ready.items()}
        seen = sum(self.due_soon.values())
        scale = self.due_soon_total / seen if self.due_soon_total and seen else 1.0
        for q, n in self.due_soon.items():
            out[q] = out.get(q, 0.0) + n * scale
        return out

    def queues(self) -> dict[str, dict[str, int]]:
        """Per queue: scheduled, ready, running and dead jobs in this partition."""
        out: dict[str, dict[str, int]] = {}
        for field, n in self.gauges.items():
            kind, _, name = field.partition(":")
            if kind in _GAUGE_STATES:
                _counts(out, name)[_GAUGE_STATES[kind]] += n
        for name, n in self.ready.items():
            _counts(out, name)["ready"] += n
        return out


def _counts(out: dict[str, dict[str, int]], queue: str) -> dict[str, int]:
    return out.setdefault(queue, {"scheduled": 0, "ready": 0, "running": 0, "dead": 0})


def _pairs(flat: list[Any]) -> dict[str, int]:
    return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}


def parse_stats(reply: list[Any]) -> StatsReply:
    """``{gauges, counters, ready lengths, earliest due or -1, timers, in flight, dead, epoch,
    paused, due soon, due soon total or -1, now ms}`` (lua/stats.lua)."""
    head = int(float(reply[3]))
    return StatsReply(_pairs(reply[0]), _pairs(reply[1]), _pairs(reply[2]), head if head >= 0 else None,
                      int(reply[4]), int(reply[5]), int(reply[6]), int(reply[7] or 0),
                      _pairs(reply[8]) if len(reply) > 8 else {}, _pairs(reply[9]) if len(reply) > 9 else {},
                      int(reply[10]) if len(reply) > 10 and int(reply[10]) >= 0 else None,
                      int(reply[11]) if len(reply) > 11 else None)


def merge_stats(partitions: Iterable[StatsReply]) -> dict[str, dict[str, int]]:
    """Per queue across partitions: scheduled, ready, running and dead jobs."""
    out: dict[str, dict[str, int]] = {}
    for stats in partitions:
        for name, counts in stats.queues().items():
            total = _counts(out, name)
            for state, n in counts.items():
                total[state] += n
    return out
