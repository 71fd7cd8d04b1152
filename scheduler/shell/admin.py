"""Operator operations behind ``zsched schedule | job | dead | stats``, built on the Lua scripts.

Everything here is reusable without the command line: parsing WHEN and DURATION arguments,
job lookups with precise "which state is it in" errors, paging through the dead-letter sets of all
partitions with bounded memory, filtered and paced requeues, bounded purges and the stats report.

Scripts are called through the client's own machinery (``client.transport`` / ``client._core``),
so calls are EVALSHA with NOSCRIPT recovery and every state change stays one atomic script.
"""
from __future__ import annotations

import asyncio
import base64
import heapq
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from ..client import Client
from ..protocol import config
from ..protocol.connection import mask_url, sync_redis
from ..protocol.ids import decode_id, encode_id, partition_of
from ..protocol.keys import Keyspace, validate_name
from ..protocol.models import JobError, JobInfo, JobState
from ..protocol.timeutil import MAX_MS, to_ms

# ----------------------------------------------------------------------------------- errors


class AdminError(Exception):
    """An operation could not be done; ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class NotFound(AdminError):
    """No such job (or namespace). Exit code 1."""


class WrongState(AdminError):
    """The job exists but its state does not allow the operation. Exit code 1."""

    def __init__(self, message: str, state: JobState) -> None:
        super().__init__(message)
        self.state = state


class BadInput(AdminError, ValueError):
    """An argument is invalid; the message says what was wrong and what is expected. Exit code 2."""

    exit_code = 2


# ----------------------------------------------------------------------------- WHEN / DURATION

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DUR_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_EPOCH = re.compile(r"\d+(?:\.\d+)?")
WHEN_FORMS = ("ISO-8601 with a zone (2026-12-01T09:00:00+01:00 or 2026-12-01T08:00:00Z), "
              "+DURATION from now (+90s, +4h, +1d2h30m), 'now', or epoch seconds (1767225600)")


def parse_duration(text: str, *, name: str = "duration") -> float:
    """``7d``, ``12h``, ``90s``, ``500ms``, ``1d2h30m``, ``2w`` -> seconds (float, >= 0).

    A unit is required (a bare number is ambiguous): ms, s, m, h, d, w. Each unit may appear once.
    """
    if not isinstance(text, str):
        raise BadInput(f"{name} must be a string like 7d or 1h30m, got {type(text).__name__}")
    s = text.strip().lower()
    pos, total, seen = 0, 0.0, set()
    for m in _DUR_PART.finditer(s):
        if m.start() != pos or m.group(2) in seen:
            break
        seen.add(m.group(2))
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        hint = " (a unit is required: 90 seconds is 90s)" if _EPOCH.fullmatch(s) else ""
        raise BadInput(f"{name} {text!r} is invalid{hint}: expected a number with a unit (ms, s, m, h, d, w), "
                       "or several in a row like 1d2h30m")
    if not math.isfinite(total) or total > 10_000 * 365 * 86400:
        raise BadInput(f"{name} {text!r} is too large")
    return total


def parse_schedule_when(text: str) -> int | timedelta:
    """A WHEN for scheduling: ``now`` and ``+DURATION`` stay relative (a timedelta, resolved by
    Redis's clock when the job is written, so a skewed host clock cannot move the job); other
    forms are absolute epoch milliseconds (see :func:`parse_when`)."""
    t = text.strip() if isinstance(text, str) else text
    if isinstance(t, str) and t.lower() == "now":
        return timedelta(0)
    if isinstance(t, str) and t.startswith("+"):
        parse_when(t)  # the same checks and messages as every other WHEN
        return timedelta(seconds=parse_duration(t[1:], name=f"WHEN {t!r}: duration"))
    return parse_when(text)


def parse_when(text: str, *, now: float | None = None, name: str = "WHEN") -> int:
    """Parse a WHEN argument into epoch milliseconds.

    Accepted: ISO-8601 with a zone (``2026-12-01T09:00:00+01:00``, ``...Z``), ``+DURATION`` from now
    (``+90s``, ``+4h``, ``+1d2h30m``), ``now``, or epoch seconds (``1767225600``, ``1767225600.5``).
    Naive ISO times are refused: a scheduler must not guess which zone the operator meant.
    """
    if not isinstance(text, str):
        raise BadInput(f"{name} must be a string, got {type(text).__name__}")
    t = text.strip()
    now_s = time.time() if now is None else now
    try:
        if t.lower() == "now":
            return to_ms(now_s, name=name)
        if t.startswith("+"):
            return to_ms(now_s + parse_duration(t[1:], name=f"{name} {t!r}: duration"), name=name)
        if _EPOCH.fullmatch(t):
            secs = float(t)
            if secs >= 1e11:
                raise BadInput(f"{name} {text!r} looks like epoch milliseconds; expected epoch seconds "
                               f"(e.g. {int(secs) // 1000})")
            return to_ms(secs, name=name)
    except BadInput:
        raise
    except (ValueError, TypeError) as exc:
        raise BadInput(f"{name} {text!r} is out of range: {exc}") from None
    iso = t[:-1] + "Z" if t.endswith("z") else t
    try:
        dt = datetime.fromisoformat(iso)
    except ValueError:
        raise BadInput(f"{name} {text!r} is invalid: expected {WHEN_FORMS}") from None
    if dt.tzinfo is None or dt.utcoffset() is None:
        example = dt.isoformat()
        raise BadInput(f"{name} {text!r} has no time zone: add Z for UTC or an offset, e.g. {example}Z or "
                       f"{example}+01:00 (naive times are refused so a job never runs an hour off)")
    try:
        return to_ms(dt, name=name)
    except ValueError as exc:
        raise BadInput(f"{name} {text!r} is out of range: {exc}") from None


def parse_payload(text: str) -> Any:
    """A ``--payload`` argument: a JSON document, ``@path`` (a JSON file) or ``-`` (JSON on stdin)."""
    source = "--payload"
    if text == "-":
        text, source = sys.stdin.read(), "--payload - (stdin)"
    elif text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise BadInput(f"--payload {text!r}: cannot read {path}: {exc.strerror or exc}") from None
        source = f"--payload @{path}"
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                       "expected a JSON document such as '{\"to\": \"a@example.com\"}' (quote it for the "
                       "shell), @file.json or - for stdin") from None


def parse_job_id(text: str) -> str:
    """Check a job id's format (30 hex characters); returns it lowercased."""
    t = text.strip().lower()
    try:
        decode_id(t)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return t


def parse_queue(text: str) -> str:
    try:
        return validate_name("queue", text)
    except (ValueError, TypeError) as exc:
        raise BadInput(str(exc)) from None


# ----------------------------------------------------------------------------------- clients


def safe_url(url: str) -> str:
    """A Redis URL with its credentials masked, for messages."""
    return mask_url(url)


def open_client(url: str | None, namespace: str | None, *, create: bool = False) -> Client:
    """Connect for an operator command.

    With ``create=False`` (every command but ``schedule``) a namespace that does not exist in Redis
    is an error (NotFound) instead of being created on the fly, so a typo in ``--namespace`` does
    not show an empty, healthy-looking system.
    """
    u = config.redis_url(url)
    ns = config.namespace(namespace)
    r = sync_redis(u, socket_connect_timeout=5, socket_timeout=60)
    try:
        if not create and not r.exists(Keyspace(ns, 1).config_key):
            raise NotFound(f"namespace {ns!r} does not exist at {safe_url(u)} (nothing was ever scheduled in it); "
                           "check --namespace / ZSCHED_NAMESPACE and --redis / ZSCHED_REDIS_URL")
        return Client(r, namespace=ns)
    except BaseException:
        r.close()
        raise


def redis_now_ms(client: Client) -> int:
    """The Redis server clock (the clock the scripts stamp deaths and leases with)."""
    secs, usecs = client.redis.time()
    return int(secs) * 1000 + int(usecs) // 1000


def _call(client: Client, name: str, partition: int, *args: Any) -> Any:
    return client.transport.call(*client._core.call(name, partition, *args))


def _call_many(client: Client, calls: Sequence[tuple[str, int, Sequence[Any]]]) -> list[Any]:
    if not calls:
        return []
    return client.transport.call_many([client._core.call(name, p, *args) for name, p, args in calls])


# ------------------------------------------------------------------------------------- jobs


def get_job(client: Client, job_id: str) -> JobInfo:
    """The job, or NotFound (unknown id, or a finished job whose tombstone expired)."""
    info = client.get(job_id)
    if info is None:
        raise NotFound(f"job {job_id} not found in namespace {client.keyspace.namespace!r} "
                       "(unknown id, or it finished and its tombstone expired)")
    return info


def _state_error(client: Client, job_id: str, action: str, done: str, allowed: str,
                 hints: dict[JobState, str]) -> AdminError:
    """Explain why ``action`` was refused: inspect the job once more to name its state."""
    info = client.get(job_id)
    if info is None:
        return NotFound(f"job {job_id} not found in namespace {client.keyspace.namespace!r} "
                        "(unknown id, or it finished and its tombstone expired)")
    hint = hints.get(info.state, "")
    return WrongState(f"cannot {action} job {job_id}: it is {info.state.value}; only {allowed} jobs can be "
                      f"{done}{'; ' + hint if hint else ''}", info.state)


_RUNNING_HINT = "a running job cannot be stopped from outside: it ends when it is acked, fails or its lease expires"


def cancel_job(client: Client, job_id: str) -> None:
    """Cancel a scheduled or ready job; WrongState/NotFound say why not."""
    raw, p = client._core.locate(job_id)
    code = int(_call(client, "cancel", p, raw, client._core.tomb_ms))
    if code == 1:
        return
    if code == -3:
        info = get_job(client, job_id)
        name = (info.key or "cron:?:").split(":")[1]
        raise WrongState(f"cannot cancel job {job_id}: it is the pending occurrence of cron {name!r}, and a cron "
                         f"always has exactly one; remove or replace the cron instead (zsched cron remove {name})",
                         info.state)
    raise _state_error(client, job_id, "cancel", "cancelled", "scheduled or ready", {
        JobState.RUNNING: _RUNNING_HINT,
        JobState.DEAD: f"delete it with: zsched dead purge {job_id}",
    })


def reschedule_job(client: Client, job_id: str, at_ms: int) -> JobInfo:
    """Move a scheduled or ready job to ``at_ms``; returns the job as it is now."""
    raw, p = client._core.locate(job_id)
    code = int(_call(client, "reschedule", p, raw, at_ms))
    if code != 1:
        raise _state_error(client, job_id, "reschedule", "rescheduled", "scheduled or ready", {
            JobState.RUNNING: _RUNNING_HINT,
            JobState.DEAD: f"bring it back with: zsched dead requeue {job_id} --at WHEN",
        })
    return get_job(client, job_id)


def get_dead_job(client: Client, job_id: str) -> JobInfo:
    info = get_job(client, job_id)
    if info.state is not JobState.DEAD:
        raise WrongState(f"job {job_id} is not dead: it is {info.state.value} (see: zsched job show {job_id})",
                         info.state)
    return info


def requeue_one(client: Client, job_id: str, at_ms: int | None = None) -> tuple[bool, JobInfo]:
    """Requeue one dead job (now, or at ``at_ms``). Returns (requeued, job after).

    ``requeued`` is False when the job exists but is not dead (already requeued, or never died):
    nothing was changed, which is what makes requeuing idempotent. Unknown ids raise NotFound.
    """
    raw, p = client._core.locate(job_id)
    ok = int(_call(client, "requeue", p, at_ms or 0, raw)[0]) == 1
    return ok, get_job(client, job_id)


def purge_one(client: Client, job_id: str) -> None:
    """Delete one dead job for good."""
    if client.purge(job_id):
        return
    raise _state_error(client, job_id, "purge", "purged", "dead", {
        JobState.SCHEDULED: f"to drop it use: zsched job cancel {job_id}",
        JobState.READY: f"to drop it use: zsched job cancel {job_id}",
    })


# ------------------------------------------------------------------------------ dead letters


def error_text(err: JobError | None) -> str:
    """The whole last error as one string: ``type: message`` then the traceback."""
    if err is None:
        return ""
    return f"{err}\n{err.traceback}" if err.traceback else str(err)


def first_line(text: str, width: int | None = None) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    if width is not None and len(line) > width:
        line = line[: width - 3] + "..."
    return line


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
    for ids in _chunks(iter_dead_ids(client, until_ms=bound, page=page), chunk):
        replies = _call_many(client, [("inspect", p, (raw,)) for _, raw, p in ids])
        for (_, raw, _p), reply in zip(ids, replies):
            info = client._core.one_info(encode_id(raw), reply)
            if info is not None and info.state is JobState.DEAD and flt.matches(info):
                yield info


def list_jobs(client: Client, queue: str, state: str, limit: int = 50,
              cursor: str | None = None) -> tuple[list[JobInfo], str | None]:
    """One page of a queue's jobs in one state (``client.jobs``): (jobs, next cursor or None).
    A malformed cursor, or one of another listing, is BadInput."""
    try:
        return client.jobs(queue=queue, state=state, limit=limit, cursor=cursor)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


def list_dead(client: Client, queue: str | None = None, limit: int = 50) -> list[JobInfo]:
    """Newest dead jobs (the ``dead_list`` script on every partition, one round trip)."""
    return client.dead(queue=queue, limit=limit)


# --------------------------------------------------------------------------------- requeue

DEFAULT_MASS_RATE = 200.0  # jobs/s for mass requeues


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
      ``rate`` jobs per second (``batch_size(rate)`` jobs per round trip, grouped by partition).
    * Due later (``at_ms`` in the future) with a rate: nothing waits now; instead the due times are
      spread, batch ``k`` is due at ``at_ms + sent / rate``, so the scheduler fires them at
      ``rate`` jobs/s from ``at_ms`` on.
    * ``dry_run``: nothing is written and nothing waits; outcomes say ``would requeue``.

    Each job is requeued by the ``requeue`` script, which returns 0 for a job that is not dead any
    more: such a job is reported ``not dead`` and left alone, so two overlapping or repeated runs
    bring a job back once.
    """
    rate = rate or None
    spread = at_ms is not None and rate is not None and at_ms > now_ms() + 1000
    pacer = pacer or Pacer(None if spread or dry_run else rate)
    sent = 0
    for batch in _chunks(jobs, batch_size(rate)):
        due = at_ms
        if spread and at_ms is not None and rate is not None:
            due = min(MAX_MS, at_ms + int(sent * 1000 / rate))
        if dry_run:
            for info in batch:
                yield RequeueOutcome(info, "would requeue", due)
            sent += len(batch)
            continue
        pacer.wait(sent)
        by_part: dict[int, list[JobInfo]] = {}
        for info in batch:
            by_part.setdefault(partition_of(decode_id(info.id)), []).append(info)
        parts = list(by_part.items())
        replies = _call_many(client, [("requeue", p, (due or 0, *(decode_id(j.id) for j in js))) for p, js in parts])
        for (p, js), codes in zip(parts, replies):
            for info, code in zip(js, codes):
                yield RequeueOutcome(info, "requeued" if int(code) == 1 else "not dead", due)
        sent += len(batch)


# ----------------------------------------------------------------------------------- purge


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
    active = list(range(client.keyspace.partitions))
    total = 0
    while active:
        replies = _call_many(client, [("purge", p, ("older", cutoff_ms, batch)) for p in active])
        total += sum(int(n) for n in replies)
        active = [p for p, n in zip(active, replies) if int(n) >= batch]
    return total


# ----------------------------------------------------------------------------------- stats

_STATES = ("scheduled", "ready", "running", "dead")


@dataclass
class PartitionStats:
    """One partition: owner replica (None: unknown or none), epoch, earliest due timer, counts."""

    partition: int
    owner: str | None
    epoch: int
    earliest_due_ms: int | None
    scheduled: int = 0
    ready: int = 0
    running: int = 0
    dead: int = 0


@dataclass
class StatsReport:
    namespace: str
    now_ms: int
    queues: dict[str, dict[str, int]]
    partitions: list[PartitionStats]
    owners_source: str          # "etcd", "unavailable" (etcd did not answer) or "not configured"
    owners_error: str | None = None
    etcd_endpoints: str | None = None
    totals: dict[str, int] = field(default_factory=dict)


def read_owner_records(endpoints: str, namespace: str, *, timeout: float = 1.5) -> dict[int, tuple[str, int]]:
    """Partition -> (replica id, create revision = the owner's epoch) from etcd (keys
    ``/zsched/NS/owners/P``). Raises on any failure (unreachable, timeout, auth); bounded by about
    ``2 * timeout`` seconds in total."""
    from ..coord import EtcdCoordinator

    async def run() -> dict[int, tuple[str, int]]:
        coord = EtcdCoordinator.from_endpoints(endpoints, timeout=timeout)
        try:
            await coord.connect(timeout=timeout)
            prefix = f"/zsched/{namespace}/owners/"
            kvs, _rev = await coord.get_prefix(prefix, timeout=timeout)
        finally:
            await coord.close()
        out: dict[int, tuple[str, int]] = {}
        for kv in kvs:
            rest = kv.key[len(prefix):]
            if rest.isdigit():
                out[int(rest)] = (kv.value.decode("utf-8", "replace"), kv.create_revision)
        return out

    async def bounded() -> dict[int, tuple[str, int]]:
        return await asyncio.wait_for(run(), timeout * 2 + 0.5)

    return asyncio.run(bounded())


def read_owners(endpoints: str, namespace: str, *, timeout: float = 1.5) -> dict[int, str]:
    """Partition -> replica id from etcd; see :func:`read_owner_records`."""
    return {p: rec[0] for p, rec in read_owner_records(endpoints, namespace, timeout=timeout).items()}


def collect_stats(client: Client, *, etcd_endpoints: str | None = None, etcd_timeout: float = 1.5) -> StatsReport:
    """Per-queue and per-partition counts (the ``stats`` script on every partition, one round
    trip), earliest due timer per partition, and partition owners from etcd when endpoints are
    given. An unreachable etcd does not fail the report: ``owners_source`` is ``unavailable``."""
    parts = client.keyspace.partitions
    replies = _call_many(client, [("stats", p, ()) for p in range(parts)])
    now = redis_now_ms(client)
    queues = client._core.merge_stats(replies)
    owners: dict[int, str] = {}
    source, err = "not configured", None
    if etcd_endpoints:
        try:
            owners = read_owners(etcd_endpoints, client.keyspace.namespace, timeout=etcd_timeout)
            source = "etcd"
        except Exception as exc:  # noqa: BLE001 - any etcd failure degrades to "unknown"
            source, err = "unavailable", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    kinds = {"s": "scheduled", "a": "running", "d": "dead"}
    out: list[PartitionStats] = []
    for p, reply in enumerate(replies):
        gauges, ready, head = reply[0], reply[2], int(float(reply[3]))
        ps = PartitionStats(p, owners.get(p), int(reply[7] or 0), head if head >= 0 else None)
        for i in range(0, len(gauges), 2):
            kind, _, _name = gauges[i].decode().partition(":")
            if kind in kinds:
                setattr(ps, kinds[kind], getattr(ps, kinds[kind]) + int(gauges[i + 1]))
        ps.ready = sum(int(ready[i + 1]) for i in range(0, len(ready), 2))
        out.append(ps)
    totals = {s: sum(getattr(ps, s) for ps in out) for s in _STATES}
    return StatsReport(client.keyspace.namespace, now, queues, out, source, err, etcd_endpoints, totals)


# ------------------------------------------------------------------------------ formatting


def iso(value: datetime | int | float | None) -> str | None:
    """UTC ISO-8601 with milliseconds and ``Z``; accepts a datetime or epoch ms."""
    if value is None:
        return None
    dt = value if isinstance(value, datetime) else datetime.fromtimestamp(value / 1000.0, tz=UTC)
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def human_delta(seconds: float) -> str:
    """``in 3h59m`` / ``2m10s ago`` / ``now``."""
    s = abs(seconds)
    if s < 1:
        return "now"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            n = int(s // size)
            parts.append(f"{n}{unit}")
            s -= n * size
        if len(parts) == 2:
            break
    text = "".join(parts)
    return f"in {text}" if seconds > 0 else f"{text} ago"


def jsonable(value: Any) -> Any:
    """Make a payload JSON-safe: bytes become ``{"$base64": ...}``, datetimes ISO strings, map keys
    strings, tuples lists."""
    if isinstance(value, dict):
        return {(k if isinstance(k, str) else json.dumps(jsonable(k)) if not isinstance(k, (int, float, bool))
                 or k is None else str(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"$base64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def error_doc(err: JobError | None) -> dict[str, Any] | None:
    if err is None:
        return None
    return {"at": iso(err.at), "type": err.type, "message": err.message, "traceback": err.traceback}


def job_doc(info: JobInfo) -> dict[str, Any]:
    """A job as a JSON-ready dict (``zsched job show --json``)."""
    return {
        "id": info.id, "state": info.state.value, "queue": info.queue, "key": info.key,
        "run_at": iso(info.run_at), "attempts": info.attempts, "max_attempts": info.max_attempts,
        "created": iso(info.created), "lease_deadline": iso(info.lease_deadline), "fence": info.fence,
        "died_at": iso(info.died_at), "finished_at": iso(info.finished_at), "expires_at": iso(info.expires_at),
        "last_error": error_doc(info.last_error), "payload": jsonable(info.payload),
    }


def job_row_doc(info: JobInfo) -> dict[str, Any]:
    """A job as one row of ``zsched job list --json``: every field of :func:`job_doc` but the
    payload and the traceback."""
    doc = job_doc(info)
    del doc["payload"]
    if doc["last_error"] is not None:
        del doc["last_error"]["traceback"]
    return doc


def dead_row_doc(info: JobInfo) -> dict[str, Any]:
    """A dead job as one row of a listing (``zsched dead list --json``)."""
    return {"id": info.id, "queue": info.queue, "attempts": info.attempts, "max_attempts": info.max_attempts,
            "died_at": iso(info.died_at), "error_type": info.last_error.type if info.last_error else None,
            "error": first_line(str(info.last_error)) if info.last_error else None}


def stats_doc(rep: StatsReport) -> dict[str, Any]:
    return {
        "namespace": rep.namespace,
        "now": iso(rep.now_ms),
        "partition_count": len(rep.partitions),
        "queues": rep.queues,
        "totals": rep.totals,
        "owners_source": rep.owners_source,
        "owners_error": rep.owners_error,
        "partitions": [
            {"partition": ps.partition, "owner": ps.owner, "epoch": ps.epoch,
             "earliest_due": iso(ps.earliest_due_ms), "earliest_due_ms": ps.earliest_due_ms,
             "scheduled": ps.scheduled, "ready": ps.ready, "running": ps.running, "dead": ps.dead}
            for ps in rep.partitions
        ],
    }


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, right: Iterable[int] = ()) -> str:
    """An aligned text table: columns separated by two spaces, ``right`` columns right-aligned,
    the last column not padded."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    ralign = set(right)

    def fmt(row: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(row):
            if i == len(row) - 1 and i not in ralign:
                out.append(c)
            else:
                out.append(c.rjust(widths[i]) if i in ralign else c.ljust(widths[i]))
        return "  ".join(out).rstrip()

    return "\n".join([fmt(list(headers))] + [fmt(r) for r in cells])
