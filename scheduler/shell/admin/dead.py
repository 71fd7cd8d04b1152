"""The dead-letter runbook at scale: selecting dead jobs by queue and error text, walking every
partition's dead set with bounded memory, requeues paced so they do not become a herd, and
purges of everything older than a cutoff."""
from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from ...client import Client
from ...protocol.call import Call
from ...protocol.ids import encode_id
from ...protocol.models import JobInfo, JobState
from ...protocol.timeutil import MAX_MS
from .errors import BadInput
from .jobs import redis_now_ms
from .output import error_text

DEFAULT_MASS_RATE = 200.0  # jobs/s for mass requeues


@dataclass(frozen=True)
class DeadFilter:
    """Which dead jobs a mass operation selects: all of them, or those of one queue and/or whose
    last error (type, message or traceback) contains a text."""

    queue: str | None = None
    error_contains: str | None = None
    ignore_case: bool = False

    def matches(self, info: JobInfo) -> bool:
        if self.queue is not None and info.queue != self.queue:
            return False
        if self.error_contains is not None:
            text = error_text(info.last_error)
            needle = self.error_contains
            if self.ignore_case:
                text, needle = text.casefold(), needle.casefold()
            if needle not in text:
                return False
        return True

    def describe(self) -> str:
        parts = []
        if self.queue is not None:
            parts.append(f"queue {self.queue!r}")
        if self.error_contains is not None:
            parts.append(f"last error containing {self.error_contains!r}" + (" (any case)" if self.ignore_case else ""))
        return " and ".join(parts) if parts else "all dead jobs"


def dead_selection(job_id: str | None, queue: str | None, error_contains: str | None,
                   all_: bool, *, ignore_case: bool = False) -> tuple[str | None, DeadFilter | None]:
    """Check the selection of ``dead requeue``: one job id, or ``--queue`` and/or
    ``--error-contains``, or ``--all`` (required to select everything, so a forgotten filter never
    replays the whole dead-letter queue). Returns (job id, None) or (None, filter)."""
    filters = queue is not None or error_contains is not None
    if job_id is not None:
        if filters or all_:
            raise BadInput("give either a job ID or filters (--queue, --error-contains, --all), not both")
        return job_id, None
    if all_ and filters:
        raise BadInput("--all selects every dead job; it cannot be combined with --queue or --error-contains")
    if not all_ and not filters:
        raise BadInput("nothing selected: give a job ID, --queue Q, --error-contains TEXT (both may be "
                       "combined), or --all")
    if error_contains is not None and error_contains == "":
        raise BadInput("--error-contains needs a non-empty text")
    return None, DeadFilter(queue=queue, error_contains=error_contains, ignore_case=ignore_case)


def _partition_dead_ids(client: Client, partition: int, until_ms: int, page: int) -> Iterator[tuple[float, bytes, int]]:
    """Yield ``(died_at_ms, raw id, partition)`` of a partition's dead set, oldest first, up to
    ``until_ms`` (inclusive), one page (ZRANGE BYSCORE ... LIMIT) at a time.

    The cursor is ``(score, id)``, exclusive, which is also the set's own order: jobs requeued or
    purged between pages (by this caller or anyone else) cannot make it skip or repeat a job.
    """
    key = client.keyspace.key(partition, "d")
    last: tuple[float, bytes] | None = None
    at_last = 0  # entries already yielded with score == last[0]: they may still be in the set
    extra = 0
    while True:
        want = page + at_last + extra
        lo: Any = "-inf" if last is None else repr(last[0])
        rows = cast("list[tuple[bytes, float]]", client.redis.zrange(
            key, lo, until_ms, byscore=True, offset=0, num=want, withscores=True))
        fresh = [(float(s), m) for m, s in rows if last is None or (float(s), m) > last]
        for s, m in fresh:
            if last is not None and s == last[0]:
                at_last += 1
            else:
                at_last = 1
            last = (s, m)
            yield s, m, partition
        if len(rows) < want:
            return
        extra = 0 if fresh else extra + page  # defensive: never spin on an unchanged window


def iter_dead_ids(client: Client, *, until_ms: int, page: int = 200) -> Iterator[tuple[float, bytes, int]]:
    """All dead ids of all partitions, oldest death first, as ``(died_at_ms, raw id, partition)``.

    Memory is bounded by one page of ids (15 bytes each) per partition; bodies are not read here.
    """
    gens = [_partition_dead_ids(client, p, until_ms, page) for p in range(client.keyspace.partitions)]
    return heapq.merge(*gens, key=lambda e: (e[0], e[1]))


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for it in items:
        chunk.append(it)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def iter_dead(client: Client, flt: DeadFilter, *, until_ms: int | None = None, chunk: int = 100,
              page: int = 200) -> Iterator[JobInfo]:
    """Dead jobs matching ``flt``, oldest death first, across every partition.

    Ids are paged from each partition's dead set; bodies and errors are read with the ``inspect``
    script, ``chunk`` jobs per pipelined round trip, so at most ``chunk`` bodies are held at once.
    ``until_ms`` (default: the Redis clock now) bounds the scan: jobs that die after the operation
    started are not included, so a requeued job that dies again is not requeued a second time by
    the same run. Jobs that stopped being dead meanwhile are skipped.
    """
    bound = redis_now_ms(client) if until_ms is None else until_ms
    calls = client.calls
    for entries in _chunks(iter_dead_ids(client, until_ms=bound, page=page), chunk):
        ids = [encode_id(raw) for _, raw, _p in entries]
        infos = calls.job_infos(ids, client.transport.call_many(calls.inspect_calls(ids)))
        for jid in ids:
            info = infos[jid]
            if info is not None and info.state is JobState.DEAD and flt.matches(info):
                yield info



def list_dead(client: Client, queue: str | None = None, limit: int = 50) -> list[JobInfo]:
    """Newest dead jobs (the ``dead_list`` script on every partition, one round trip)."""
    return client.dead(queue=queue, limit=limit)




class Pacer:
    """Spaces out work to ``rate`` jobs per second: the call for jobs ``[n, ...)`` starts no
    earlier than ``n / rate`` seconds after the first one. ``rate`` None or 0: no pacing."""

    def __init__(self, rate: float | None, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = rate or None
        self.clock = clock
        self.sleep = sleep
        self._t0: float | None = None

    def wait(self, sent: int) -> float:
        """Block until ``sent`` jobs' worth of time has passed since the first call; returns the
        seconds slept."""
        if self.rate is None:
            return 0.0
        now = self.clock()
        if self._t0 is None:
            self._t0 = now
        delay = self._t0 + sent / self.rate - now
        if delay > 0:
            self.sleep(delay)
            return delay
        return 0.0


def batch_size(rate: float | None, *, max_batch: int = 500) -> int:
    """Jobs per requeue round trip: about a tenth of a second's worth at ``rate`` (so the stream
    is smooth), at least 1 and at most ``max_batch``."""
    if not rate:
        return max_batch
    return max(1, min(max_batch, math.ceil(rate / 10)))


@dataclass(frozen=True)
class RequeueOutcome:
    """One job of a mass requeue: ``status`` is ``requeued``, ``not dead`` (someone requeued or
    purged it meanwhile: nothing done) or ``would requeue`` (dry run). ``due_ms``: when it is due
    (None: at once)."""

    job: JobInfo
    status: str
    due_ms: int | None = None


def requeue_stream(client: Client, jobs: Iterable[JobInfo], *, rate: float | None, at_ms: int | None = None,
                   dry_run: bool = False, pacer: Pacer | None = None,
                   now_ms: Callable[[], float] = lambda: time.time() * 1000) -> Iterator[RequeueOutcome]:
    """Requeue ``jobs`` in batches, paced so a mass requeue does not become a herd.

    * Due now (``at_ms`` None or not in the future): the requeue calls are paced in real time,
      ``rate`` jobs per second (``batch_size(rate)`` jobs per round trip, one call per partition).
    * Due later (``at_ms`` in the future) with a rate: nothing waits now; instead the due times are
      spread, job ``n`` (from 0) is due at ``at_ms + n / rate`` (to the millisecond), so the
      scheduler fires them at ``rate`` jobs/s from ``at_ms`` on.
    * ``dry_run``: nothing is written and nothing waits; outcomes say ``would requeue``.

    Each job is requeued by the ``requeue`` script, which answers NOT_DEAD for a job that is not
    dead any more: such a job is reported ``not dead`` and left alone, so two overlapping or
    repeated runs bring a job back once. Outcomes come in the order of ``jobs``.
    """
    rate = rate or None
    spread = at_ms is not None and rate is not None and at_ms > now_ms() + 1000
    pacer = pacer or Pacer(None if spread or dry_run else rate)
    sent = 0
    for batch in _chunks(jobs, batch_size(rate)):
        if spread and at_ms is not None and rate is not None:
            dues: list[int | None] = [min(MAX_MS, at_ms + int((sent + i) * 1000 / rate)) for i in range(len(batch))]
        else:
            dues = [at_ms] * len(batch)
        if dry_run:
            for info, due in zip(batch, dues):
                yield RequeueOutcome(info, "would requeue", due)
            sent += len(batch)
            continue
        pacer.wait(sent)
        for info, due, outcome in zip(batch, dues, _requeue_batch(client, [info.id for info in batch], dues)):
            yield RequeueOutcome(info, "requeued" if outcome else "not dead", due)
        sent += len(batch)


def _requeue_batch(client: Client, ids: list[str], dues: list[int | None]) -> list[bool]:
    """Requeue ``ids[i]`` due at ``dues[i]`` in one pipelined round trip (one ``requeue`` call per
    partition and due time); True where the job was dead and is requeued."""
    calls = client.calls
    runs: list[tuple[int, int, list[tuple[Call, list[int]]]]] = []  # (first index, count, plan)
    start = 0
    while start < len(ids):
        end = start + 1
        while end < len(ids) and dues[end] == dues[start]:
            end += 1
        runs.append((start, end - start, calls.requeue_calls(ids[start:end], dues[start])))
        start = end
    replies = client.transport.call_many([call for _s, _n, plan in runs for call, _pos in plan])
    out: list[bool] = []
    for _start, n, plan in runs:
        out += [bool(o) for o in calls.requeue_replies(plan, replies[:len(plan)], n)]
        replies = replies[len(plan):]
    return out


def count_dead_older(client: Client, cutoff_ms: int) -> int:
    """How many dead jobs died at or before ``cutoff_ms`` (one pipelined ZCOUNT per partition)."""
    pipe = client.redis.pipeline(transaction=False)
    for p in range(client.keyspace.partitions):
        pipe.zcount(client.keyspace.key(p, "d"), "-inf", cutoff_ms)
    return sum(int(n) for n in pipe.execute())


def purge_older(client: Client, cutoff_ms: int, *, batch: int = 500) -> int:
    """Delete every dead job that died at or before ``cutoff_ms``: ``purge`` mode 'older', at most
    ``batch`` jobs per call, all partitions in one pipelined round trip per round, until every
    partition returns a short batch. Returns the number purged."""
    calls = client.calls
    active = list(range(client.keyspace.partitions))
    total = 0
    while active:
        purged = [int(n) for n in client.transport.call_many([calls.purge_older_call(p, cutoff_ms, batch)
                                                               for p in active])]
        total += sum(purged)
        active = [p for p, n in zip(active, purged) if n >= batch]
    return total

