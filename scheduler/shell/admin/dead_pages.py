"""Dead letters a page at a time, newest death first, across every partition: what the console's
dead-letter page and ``zsched dead list`` show, in the same order, with a total and a mark to
continue from in either direction.

A page walks each partition's dead set from its mark (``ZRANGE ... BYSCORE REV LIMIT``, a page of
ids at a time), merges them by (time of death, id) and reads bodies in chunks (``inspect``) only
until the page is full: the work is about one page of matches (more when a queue or error filter
skips many), never the whole dead-letter queue. The total is exact and cheap without filters (one
ZCOUNT per partition) or with only a queue (the per-queue dead counts of ``stats``); with an
error filter, or a queue and a time range, it is counted by scanning at most
:data:`COUNT_SCAN` dead jobs and shown as "at least" beyond."""
from __future__ import annotations

import heapq
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from ...client import Client
from ...protocol.ids import ID_CHARS, encode_id
from ...protocol.models import JobInfo, JobState
from ...protocol.replies import parse_stats
from .dead import DeadFilter
from .errors import BadInput

COUNT_SCAN = 20_000  # dead jobs a filtered total reads at most (bodies, in chunks of 100)
_CHUNK = 100
_MARK = re.compile(rf"^(\d{{1,16}})-([0-9a-f]{{{ID_CHARS}}})$")

Mark = tuple[int, bytes]  # (died at ms, raw id): a place in the merged order


def parse_mark(text: str, name: str = "cursor") -> Mark:
    """A page mark as printed (``DIEDMS-JOBID``) -> (ms, raw id); BadInput saying the form."""
    m = _MARK.match(text or "")
    if not m:
        raise BadInput(f"{name} must be a mark printed by a dead-letter page (MILLISECONDS-JOBID, like "
                       f"1700000000000-{'0' * ID_CHARS}), got {text[:80]!r}")
    return int(m.group(1)), bytes.fromhex(m.group(2))


def format_mark(mark: Mark) -> str:
    """The printed form of a mark (see :func:`parse_mark`)."""
    return f"{mark[0]}-{mark[1].hex()}"


def _mark_of(info: JobInfo) -> Mark:
    assert info.died_at is not None
    return round(info.died_at.timestamp() * 1000), bytes.fromhex(info.id)


def _score(ms: float) -> str | int:
    """A score bound as Redis reads it (``-inf``/``+inf`` for open ends)."""
    if ms == float("inf"):
        return "+inf"
    return "-inf" if ms == float("-inf") else int(ms)


def _partition(client: Client, p: int, newest_first: bool, start: Mark | None, lo_ms: float, hi_ms: float,
               page: int = 200) -> Iterator[tuple[int, bytes]]:
    """One partition's dead ids as (died ms, raw id), newest first (or oldest first), strictly
    beyond ``start`` in that order, deaths within [lo_ms, hi_ms]; a page of ids per round trip.
    Ties on the ms are walked with an offset among them, so none is skipped or repeated."""
    key = client.keyspace.key(p, "d")
    at: Any = _score(hi_ms if newest_first else lo_ms) if start is None else start[0]
    end = _score(lo_ms if newest_first else hi_ms)
    last = start  # entries at or before it are skipped (ties on its ms come again in the first rounds)
    offset = 0  # entries of score `at` already passed
    while True:
        if newest_first:
            rows = client.redis.zrange(key, at, end, desc=True, byscore=True, offset=offset, num=page,
                                       withscores=True)
        else:
            rows = client.redis.zrange(key, at, end, byscore=True, offset=offset, num=page, withscores=True)
        got = [(int(s), bytes(m)) for m, s in cast("list[tuple[bytes, float]]", rows)]
        for e in got:
            if last is not None and (e >= last if newest_first else e <= last):
                continue  # at or before the mark: listed on an earlier page (ties on its ms)
            yield e
        if len(got) < page:
            return
        if got[-1][0] == at:
            offset += len(got)  # a run of ties longer than a page
        else:
            at = got[-1][0]
            offset = sum(1 for e in got if e[0] == at)


def iter_dead_ordered(client: Client, flt: DeadFilter, *, newest_first: bool = True, start: Mark | None = None,
                      lo_ms: float = float("-inf"), hi_ms: float = float("inf")) -> Iterator[JobInfo]:
    """Dead jobs matching ``flt`` across partitions in death order (newest first by default),
    strictly beyond ``start``, deaths within [lo_ms, hi_ms]. Lazy: bodies are read a chunk at a time."""
    gens = [_partition(client, p, newest_first, start, lo_ms, hi_ms) for p in range(client.keyspace.partitions)]
    merged = heapq.merge(*gens, reverse=newest_first)
    calls = client.calls
    while chunk := list(itertools.islice(merged, _CHUNK)):
        ids = [encode_id(raw) for _ms, raw in chunk]
        infos = calls.job_infos(ids, client.transport.call_many(calls.inspect_calls(ids)))
        for jid in ids:
            info = infos[jid]
            if info is not None and info.state is JobState.DEAD and info.died_at is not None and flt.matches(info):
                yield info


@dataclass(frozen=True)
class DeadPage:
    """One page of dead letters, newest first. ``older``/``newer``: marks to continue from (None:
    nothing that way). ``total``: jobs matching the filter; ``exact`` False when it is a lower bound
    (a filtered count stopped after COUNT_SCAN jobs)."""

    jobs: list[JobInfo]
    total: int
    exact: bool
    older: str | None
    newer: str | None


def dead_total(client: Client, flt: DeadFilter, lo_ms: float = float("-inf"),
               hi_ms: float = float("inf")) -> tuple[int, bool]:
    """How many dead jobs match (exact, True), or at least how many (False): see the module docstring."""
    ranged = lo_ms != float("-inf") or hi_ms != float("inf")
    if flt.error_contains is None and flt.queue is None:
        pipe = client.redis.pipeline(transaction=False)
        for p in range(client.keyspace.partitions):
            pipe.zcount(client.keyspace.key(p, "d"), _score(lo_ms), _score(hi_ms))
        return sum(int(n) for n in pipe.execute()), True
    if flt.error_contains is None and flt.queue is not None and not ranged:
        stats = [parse_stats(r) for r in client.transport.call_many(client.calls.stats_calls())]
        return sum(st.queues().get(flt.queue, {}).get("dead", 0) for st in stats), True
    n = scanned = 0
    for _info in iter_dead_ordered(client, DeadFilter(), lo_ms=lo_ms, hi_ms=hi_ms):
        scanned += 1
        if flt.matches(_info):
            n += 1
        if scanned >= COUNT_SCAN:
            return n, False
    return n, True


def dead_page(client: Client, flt: DeadFilter, limit: int, *, older_than: str | None = None,
              newer_than: str | None = None, lo_ms: float = float("-inf"), hi_ms: float = float("inf")) -> DeadPage:
    """The page of ``limit`` dead jobs, newest first, after mark ``older_than`` (the next page) or
    before ``newer_than`` (the previous page), or the newest when neither is given."""
    if older_than is not None and newer_than is not None:
        raise BadInput("give older_than or newer_than, not both")
    if newer_than is not None:
        back = list(itertools.islice(iter_dead_ordered(client, flt, newest_first=False,
                                                       start=parse_mark(newer_than, "newer_than"),
                                                       lo_ms=lo_ms, hi_ms=hi_ms), limit + 1))
        more_newer = len(back) > limit
        jobs = back[:limit][::-1]
        more_older = True  # the page it came back from
    else:
        start = parse_mark(older_than, "older_than") if older_than is not None else None
        jobs = list(itertools.islice(iter_dead_ordered(client, flt, start=start, lo_ms=lo_ms, hi_ms=hi_ms),
                                     limit + 1))
        more_older, more_newer = len(jobs) > limit, start is not None
        jobs = jobs[:limit]
    total, exact = dead_total(client, flt, lo_ms, hi_ms)
    if not jobs:  # the jobs past the mark were requeued or purged meanwhile: the way back stays open
        return DeadPage(jobs, total, exact, newer_than, older_than)
    older = format_mark(_mark_of(jobs[-1])) if more_older else None
    newer = format_mark(_mark_of(jobs[0])) if more_newer else None
    return DeadPage(jobs, total, exact, older, newer)
