"""Script calls and replies for the producer side: input validation, call building, reply parsing.

:class:`Calls` is bound to one namespace's :class:`~.keys.Keyspace`; it builds the ``(script,
keys, args)`` triples the transports send and turns the scripts' replies into typed values. It
does no I/O, so the blocking client, the asyncio client, the tier, the workers and the operator
tools share it and cannot disagree about the wire format.
"""
from __future__ import annotations

import base64
import math
import random
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import timedelta
from functools import lru_cache
from typing import Any

import msgpack

from . import codec
from .codec import (
    build_record,
    decode_record,
    decode_tombstone,
    finite_number,
    pack_payload,
    split_template,
    unpack_payload,
)
from .cron import LOOKAHEAD, MAX_JITTER_S, CronInfo, occurrences, validate_expression, validate_tz, with_jitter
from .errors import MisfiredAtSchedule, PayloadError, ScriptError
from .ids import ID_BYTES, IdGenerator, decode_id, encode_id, partition_for_key, partition_of
from .keys import Keyspace, validate_name
from .models import JobError, JobInfo, JobState
from .timeutil import MAX_MS, ms_to_datetime, to_ms

BATCH = 1000  # jobs per schedule script call: bounded work per EVALSHA
MISFIRE_POLICIES = ("run_late", "skip")
DEFAULT_SKIP_GRACE = 60.0
DEFAULT_QUEUE_IDLE = 86400.0  # seconds an empty queue stays interned (Client.set_queue_retirement)
QUEUE_IDLE_FIELD = "queue:idle_ms"
RESERVED_KEY_PREFIX = "cron:"  # idempotency keys of cron occurrences (lua/_lib.lua cron_schedule)
INSPECT_BATCH = 500  # ids per inspect script call (get_many): bounded work per EVALSHA
LIST_STATES = ("scheduled", "ready", "running", "dead")  # what jobs() can list
LIST_MAX_LIMIT = 1000
LIST_ROUND_TRIPS = 16  # list script calls per jobs() page at most: a page may come back short
_LIST_PHASES = {"scheduled": "ht", "ready": "r", "running": "i", "dead": "d"}  # lua/list.lua positions
_CURSOR_MAGIC = b"zs1"


def parse_error(blob: bytes | None) -> JobError | None:
    """Decode an error blob ``at NUL type NUL message NUL traceback``."""
    if not blob:
        return None
    parts = blob.split(b"\0", 3) + [b""] * 4
    try:
        at = ms_to_datetime(int(parts[0]))
    except ValueError:
        at = None
    d = lambda b: b.decode("utf-8", "replace")  # noqa: E731
    return JobError(at, d(parts[1]), d(parts[2]), d(parts[3]))


def error_arg(etype: str, message: str, tb: str = "", limit: int = 4096) -> bytes:
    """Build the error argument of ``fail`` (bounded; NULs removed so the format stays parseable)."""
    etype, message, tb = (s.replace("\0", " ") for s in (etype, message, tb))
    etype = etype[:200]
    message = message[: max(0, limit - len(etype))]
    tb = tb[-max(0, limit - len(etype) - len(message)):] if limit - len(etype) - len(message) > 0 else ""
    return f"{etype}\0{message}\0{tb}".encode("utf-8", "replace")


_OPTION_NAMES = ("queue", "max_attempts", "lease", "misfire", "misfire_grace", "backoff", "jitter")


def job_options_checked(*, queue: str, max_attempts: int, lease: float, misfire: str, misfire_grace: float | None,
                 backoff: tuple[float, float] | None, jitter: float) -> dict[str, Any]:
    validate_name("queue", queue)
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int):
        raise TypeError(f"max_attempts must be an int, got {type(max_attempts).__name__}")
    if not 1 <= max_attempts <= codec.MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"max_attempts must be from 1 to {codec.MAX_ATTEMPTS_LIMIT}, got {max_attempts}")
    lease_s = finite_number("lease", lease)
    if not 0.1 <= lease_s <= 7 * 86400:
        raise ValueError(f"lease must be from 0.1 to 604800 seconds (7 days), got {lease!r}")
    if misfire not in MISFIRE_POLICIES:
        raise ValueError(f"misfire must be one of {MISFIRE_POLICIES}, got {misfire!r}")
    grace_ms = 0
    if misfire == "skip":
        g = DEFAULT_SKIP_GRACE if misfire_grace is None else finite_number("misfire_grace", misfire_grace)
        if not 0 <= g <= 49 * 86400:
            raise ValueError(f"misfire_grace must be from 0 to 4233600 seconds (49 days), got {misfire_grace!r}")
        grace_ms = int(g * 1000)
    elif misfire_grace is not None:
        raise ValueError("misfire_grace only applies to misfire='skip'; remove it or set misfire='skip'")
    bb, bc = codec.DEFAULT_BACKOFF_BASE_MS, codec.DEFAULT_BACKOFF_CAP_MS
    if backoff is not None:
        if not isinstance(backoff, (tuple, list)) or len(backoff) != 2:
            raise TypeError("backoff must be a (base_seconds, cap_seconds) pair")
        b = finite_number("backoff base", backoff[0])
        c = finite_number("backoff cap", backoff[1])
        if not (0 < b <= c <= 30 * 86400):
            raise ValueError(f"backoff must satisfy 0 < base <= cap <= 30 days, got {backoff!r}")
        bb, bc = int(b * 1000), int(c * 1000)
    j = finite_number("jitter", jitter)
    if j < 0:
        raise ValueError(f"jitter must be >= 0 seconds, got {jitter!r}")
    return dict(queue=queue, max_attempts=max_attempts, lease_ms=max(1, int(round(lease_s * 1000))),
                misfire_skip=misfire == "skip", misfire_grace_ms=grace_ms,
                backoff_base_ms=bb, backoff_cap_ms=bc, jitter_ms=int(j * 1000))


@lru_cache(maxsize=256, typed=True)  # typed: True must not hit the entry of 1
def job_options_cached(queue: Any, max_attempts: Any, lease: Any, misfire: Any, misfire_grace: Any,
                        backoff: Any, jitter: Any) -> dict[str, Any]:
    return job_options_checked(queue=queue, max_attempts=max_attempts, lease=lease, misfire=misfire,
                        misfire_grace=misfire_grace, backoff=backoff, jitter=jitter)


class Calls:
    """Transport-independent half of the client."""

    def __init__(self, keyspace: Keyspace, *, max_payload_bytes: int, tombstone_ttl: float) -> None:
        self.ks = keyspace
        self.max_payload = int(max_payload_bytes)
        if tombstone_ttl < 0 or not math.isfinite(tombstone_ttl):
            raise ValueError(f"tombstone_ttl must be >= 0 seconds, got {tombstone_ttl!r}")
        self.tomb_ms = int(tombstone_ttl * 1000)
        self.ids = IdGenerator()
        self.clock_offset_ms = 0  # Redis clock - this host's clock, from the last schedule reply
        self.chan = keyspace.namespace + ":"
        self._keys = [keyspace.partition_keys(p) for p in range(keyspace.partitions)]
        self._common = [[keyspace.prefix(p), self.chan, str(p)] for p in range(keyspace.partitions)]

    # -- call building -------------------------------------------------------------------------
    def call(self, name: str, partition: int, *args: Any) -> tuple[str, list[str], list[Any]]:
        return name, self._keys[partition], self._common[partition] + list(args)

    def job_options(self, **kwargs: Any) -> dict[str, Any]:
        """Validate the per-job options once (shared by every job of a schedule_many); cached,
        since producers pass the same few option sets again and again."""
        try:
            return job_options_cached(*(kwargs[k] for k in _OPTION_NAMES))
        except TypeError as exc:
            if "unhashable" not in str(exc):
                raise
            return job_options_checked(**kwargs)

    def validate_key(self, key: object) -> str | None:
        if key is None:
            return None
        if not isinstance(key, str):
            raise TypeError(f"key must be a str or None, got {type(key).__name__}")
        n = len(key.encode("utf-8"))
        if not 1 <= n <= codec.MAX_KEY_BYTES:
            raise ValueError(f"key must be 1-{codec.MAX_KEY_BYTES} bytes of UTF-8, got {n} bytes")
        if key.startswith(RESERVED_KEY_PREFIX):
            raise ValueError(f"key {key[:40]!r} is reserved: keys starting with {RESERVED_KEY_PREFIX!r} belong to cron "
                             "occurrences (one producer could otherwise take over a cron's next run); use another prefix")
        return key

    def prepare(self, items: Iterable[Sequence[Any]], opts: dict[str, Any]) -> tuple[list[tuple], list[list[int]]]:
        """Validate every job, then build the schedule calls. Nothing is written if any job is bad."""
        now_s = time.time()
        created = int(now_s)
        parts = self.ks.partitions
        jitter_ms = opts["jitter_ms"]
        rec_opts = {k: opts[k] for k in ("max_attempts", "lease_ms", "misfire_skip", "misfire_grace_ms",
                                         "backoff_base_ms", "backoff_cap_ms")}
        by_part: dict[int, list[Any]] = defaultdict(list)
        order: dict[int, list[int]] = defaultdict(list)
        new_id = self.ids.new
        for n, item in enumerate(items):
            if len(item) == 2:
                at, payload = item
                key = None
            elif len(item) == 3:
                at, payload, key = item
                key = self.validate_key(key)
            else:
                raise ValueError(f"job {n}: expected (at, payload) or (at, payload, key), got {len(item)} items")
            ms, when = self.run_at(at, jitter_ms, now_s)
            data = pack_payload(payload, self.max_payload)
            rec = build_record(data, created_s=created, key=key, **rec_opts)
            raw, p = new_id(ms, parts, key)
            lst = by_part[p]
            lst.append(raw + rec)  # placeholder queue index = first 2 bytes of the record (0)
            lst.append(when)
            lst.append(key if key is not None else "")
            order[p].append(n)
        calls: list[tuple] = []
        positions: list[list[int]] = []
        for p, flat in by_part.items():
            idx = order[p]
            for s in range(0, len(idx), BATCH):
                chunk = flat[s * 3 : (s + BATCH) * 3]
                calls.append(self.call("schedule", p, opts["queue"], self.tomb_ms, len(chunk) // 3, 0, *chunk))
                positions.append(idx[s : s + BATCH])
        return calls, positions

    def prepare_one(self, at: Any, payload: Any, key: str | None, opts: dict[str, Any]) -> tuple:
        """Fast path of :meth:`prepare` for one job (the common producer call)."""
        key = self.validate_key(key)
        ms, when = self.run_at(at, opts["jitter_ms"], time.time())
        rec = build_record(pack_payload(payload, self.max_payload), created_s=int(time.time()), key=key,
                           max_attempts=opts["max_attempts"], lease_ms=opts["lease_ms"],
                           misfire_skip=opts["misfire_skip"], misfire_grace_ms=opts["misfire_grace_ms"],
                           backoff_base_ms=opts["backoff_base_ms"], backoff_cap_ms=opts["backoff_cap_ms"])
        raw, p = self.ids.new(ms, self.ks.partitions, key)
        return self.call("schedule", p, opts["queue"], self.tomb_ms, 1, 0, raw + rec, when, key or "")

    def run_at(self, at: Any, jitter_ms: int, now_s: float) -> tuple[int, int | str]:
        """``at`` as (estimated epoch ms in Redis's clock, the schedule script's run_at argument).

        Absolute times (datetimes, epoch seconds) are sent as they are. A timedelta is relative
        to *now*, and now is Redis's clock, not this host's: it is sent as ``ESTrDELTA`` and the
        script resolves it with TIME (lua/schedule.lua), so a producer whose clock is off fires
        nothing early and misfires nothing. The estimate (local clock + the offset learned from
        earlier replies) names the id and usually is the run_at itself."""
        if isinstance(at, timedelta):
            delta = int(round(at.total_seconds() * 1000))
            if jitter_ms:
                delta += random.randint(0, jitter_ms)
            est = int(now_s * 1000) + self.clock_offset_ms + delta
            if not 0 <= est <= MAX_MS:
                raise ValueError(f"at must land between 1970-01-01 and 9999-12-31 UTC, got now + {at!r}")
            return est, f"{est}r{delta}"
        ms = to_ms(at, now=now_s)
        if jitter_ms:
            ms = min(MAX_MS, ms + random.randint(0, jitter_ms))
        return ms, ms

    def schedule_reply(self, reply: list[Any]) -> tuple[list[bytes], list[int]]:
        """A ``schedule`` reply -> (raw ids in order, 0-based positions misfired at schedule time);
        learns the Redis clock offset for the next relative times."""
        now = int(reply[0])
        self.clock_offset_ms = now - int(time.time() * 1000)
        m = int(reply[1])
        return reply[2 + m:], [int(x) - 1 for x in reply[2:2 + m]]

    def one_id(self, reply: list[Any]) -> str:
        raw, misfired = self.schedule_reply(reply)
        if len(raw) != 1:
            raise ScriptError(f"schedule returned {len(raw)} ids for 1 job")
        job_id = encode_id(raw[0])
        if misfired:
            raise MisfiredAtSchedule([job_id], [job_id])
        return job_id

    def collect_ids(self, replies: list[Any], positions: list[list[int]], total: int) -> list[str]:
        out: list[str] = [""] * total
        missed: list[int] = []
        for reply, pos in zip(replies, positions):
            raw, misfired = self.schedule_reply(reply)
            if len(raw) != len(pos):
                raise ScriptError(f"schedule returned {len(raw)} ids for {len(pos)} jobs")
            for n, r in zip(pos, raw):
                out[n] = encode_id(r)
            missed += [pos[i] for i in misfired]
        if missed:
            raise MisfiredAtSchedule(out, [out[n] for n in sorted(missed)])
        return out

    def locate(self, job_id: str) -> tuple[bytes, int]:
        raw = decode_id(job_id)
        p = partition_of(raw)
        if p >= self.ks.partitions:
            raise ValueError(f"job id {job_id!r} names partition {p}, but the namespace has {self.ks.partitions}")
        return raw, p

    def job_info(self, job_id: str, reply: list[Any]) -> JobInfo | None:
        """One ``inspect`` reply (lua/inspect.lua: state, record, score, token, error, queue, due,
        summary) as a JobInfo; None for ``{}`` (unknown id, or its tombstone expired)."""
        if not reply:
            return None
        state = JobState(reply[0].decode())
        rec_b, score, token, err, qname = reply[1:6]
        due, summary = (reply[6], reply[7]) if len(reply) >= 8 else (None, None)
        score_ms = int(float(score)) if score is not None else None
        due_dt = ms_to_datetime(int(float(due))) if due is not None else None
        queue = qname.decode() if qname else None
        if rec_b is None:
            return self.tombstone_info(job_id, state, score_ms, queue, summary)
        dead = state is JobState.DEAD
        died = ms_to_datetime(score_ms) if dead and score_ms is not None else None
        try:
            rec = decode_record(rec_b)
        except PayloadError as exc:  # a poison body must not make get()/dead() unusable
            return JobInfo(id=job_id, state=state, queue=queue, run_at=due_dt, died_at=died, finished_at=died,
                           last_error=parse_error(err), payload={"_undecodable": str(exc)})
        try:
            payload = unpack_payload(rec.payload_bytes, self.max_payload)
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

    @staticmethod
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

    def dead_infos(self, replies: list[list[Any]], limit: int) -> list[JobInfo]:
        out = []
        for p, flat in enumerate(replies):
            for i in range(0, len(flat), 6):
                raw, rec_b, died, err, qname, due = flat[i : i + 6]
                info = self.job_info(encode_id(raw), [b"dead", rec_b, died, None, err, qname, due, None])
                if info:
                    out.append(info)
        out.sort(key=lambda j: j.died_at or 0, reverse=True)
        return out[:limit]

    @staticmethod
    def merge_stats(replies: list[list[Any]]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}

        def q(name: str) -> dict[str, int]:
            return out.setdefault(name, {"scheduled": 0, "ready": 0, "running": 0, "dead": 0})

        names = {"s": "scheduled", "a": "running", "d": "dead"}
        for reply in replies:
            gauges, ready = reply[0], reply[2]
            for i in range(0, len(gauges), 2):
                kind, _, name = gauges[i].decode().partition(":")
                if kind in names:
                    q(name)[names[kind]] += int(gauges[i + 1])
            for i in range(0, len(ready), 2):
                q(ready[i].decode())["ready"] += int(ready[i + 1])
        return out

    # -- cron ---------------------------------------------------------------------------------
    def cron_set_call(self, name: str, expression: str, payload: Any, *, queue: str, tz: str, misfire: str,
                      misfire_grace: float | None, jitter: float, max_attempts: int, lease: float,
                      backoff: tuple[float, float] | None) -> tuple:
        """Validate everything (nothing is written on error) and build the cron_set call."""
        validate_name("cron name", name)
        validate_expression(expression)
        zone = validate_tz(tz)
        opts = self.job_options(queue=queue, max_attempts=max_attempts, lease=lease, misfire=misfire,
                                misfire_grace=misfire_grace, backoff=backoff, jitter=jitter)
        if opts["jitter_ms"] > MAX_JITTER_S * 1000:
            raise ValueError(f"jitter must be at most {MAX_JITTER_S} seconds, got {jitter!r}")
        data = pack_payload(payload, self.max_payload)
        rec = build_record(data, created_s=int(time.time()), max_attempts=opts["max_attempts"],
                           lease_ms=opts["lease_ms"], misfire_skip=opts["misfire_skip"],
                           misfire_grace_ms=opts["misfire_grace_ms"], backoff_base_ms=opts["backoff_base_ms"],
                           backoff_cap_ms=opts["backoff_cap_ms"])
        head, tail = split_template(rec)
        nominals = occurrences(expression, zone, int(time.time() * 1000), LOOKAHEAD + 1)
        if not nominals:
            raise ValueError(f"cron expression {expression!r} never fires (e.g. a day that does not exist)")
        pairs = with_jitter(nominals, opts["jitter_ms"])
        definition = msgpack.packb({"expr": expression, "tz": tz, "queue": queue, "misfire": misfire,
                                    "grace": misfire_grace, "jitter": jitter, "created": time.time()})
        p = partition_for_key(name, self.ks.partitions)
        flat = [x for pair in pairs for x in pair]
        return self.call("cron_set", p, name, queue, definition, head, tail, self.tomb_ms, len(pairs), *flat)

    def cron_remove_call(self, name: str) -> tuple:
        validate_name("cron name", name)
        return self.call("cron_remove", partition_for_key(name, self.ks.partitions), name, self.tomb_ms)

    def cron_list_commands(self, pipe: Any) -> None:
        for p in range(self.ks.partitions):
            pipe.smembers(self.ks.key(p, "crons"))

    def cron_detail_commands(self, pipe: Any, names_per_partition: list[set[bytes]]) -> list[tuple[int, str]]:
        order = []
        for p, names in enumerate(names_per_partition):
            for raw in sorted(names):
                name = raw.decode()
                pipe.hmget(self.ks.key(p, f"cron:{name}"), "def", "pending", "pnom", "last")
                order.append((p, name))
        return order

    def _inspect_plan(self, job_ids: Iterable[str]) -> list[tuple[int, list[tuple[str, bytes]]]]:
        """Ids grouped by partition (first-seen order, duplicates once), at most INSPECT_BATCH per
        group: one ``inspect`` call per group. Every id is checked first (ValueError naming it)."""
        by_part: dict[int, list[tuple[str, bytes]]] = {}
        for jid in dict.fromkeys(job_ids):
            raw, p = self.locate(jid)
            by_part.setdefault(p, []).append((jid, raw))
        return [(p, group[s:s + INSPECT_BATCH]) for p, group in by_part.items()
                for s in range(0, len(group), INSPECT_BATCH)]

    def inspect_calls(self, job_ids: list[str]) -> list[tuple]:
        """``inspect`` calls for many jobs (one per partition and INSPECT_BATCH ids), to pipeline
        in one round trip; :meth:`job_infos` maps their replies back to the ids."""
        return [self.call("inspect", p, *(raw for _, raw in group)) for p, group in self._inspect_plan(job_ids)]

    def job_infos(self, job_ids: list[str], replies: list[Any]) -> dict[str, JobInfo | None]:
        """The replies of ``call_many(inspect_calls(job_ids))`` as id -> JobInfo (None: unknown)."""
        out: dict[str, JobInfo | None] = {}
        for (_p, group), reply in zip(self._inspect_plan(job_ids), replies):
            for (jid, _raw), one in zip(group, reply):
                out[jid] = self.job_info(jid, one)
        return out

    def one_info(self, job_id: str, reply: list[Any]) -> JobInfo | None:
        """The reply of an ``inspect`` call for one id."""
        return self.job_info(job_id, reply[0]) if reply else None

    # -- listing (jobs()) ---------------------------------------------------------------------
    def list_walk(self, queue: str, state: Any, limit: int, cursor: str | None) -> ListWalk:
        return ListWalk(self, queue, state, limit, cursor)

    def encode_cursor(self, state: str, queue: str, partition: int, position: bytes) -> str:
        raw = b"\0".join((_CURSOR_MAGIC, state.encode(), queue.encode(), str(partition).encode(), position))
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")

    def decode_cursor(self, cursor: object, state: str, queue: str) -> tuple[int, bytes]:
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
        if not c_part.isdigit() or int(c_part) >= self.ks.partitions:
            raise bad(f"partition {c_part.decode('ascii', 'replace')!r} is not one of the namespace's "
                      f"{self.ks.partitions}")
        if pos:
            phases = _LIST_PHASES[state]
            ok = pos[:1].decode("latin-1") in phases
            if ok and len(pos) > 1:
                ok = len(pos) >= ID_BYTES + 3 and pos[-ID_BYTES - 1:-ID_BYTES] == b","
                num = pos[1:-ID_BYTES - 1]
                try:
                    val = float(num.decode("ascii"))
                    ok = ok and math.isfinite(val) and (state != "ready" or (num.isdigit() and int(num) >= 1))
                except (UnicodeDecodeError, ValueError):
                    ok = False
            if not ok:
                raise bad("its position is malformed")
        return int(c_part), pos

    def cron_infos(self, order: list[tuple[int, str]], details: list[list[Any]],
                   pending: dict[str, JobInfo | None]) -> list[CronInfo]:
        out = []
        for (p, name), (d, pend, pnom, last) in zip(order, details):
            if d is None:
                continue  # removed meanwhile
            spec = msgpack.unpackb(d, raw=False)
            pid_text = encode_id(pend) if pend else None
            job = pending.get(pid_text) if pid_text else None
            out.append(CronInfo(
                name=name, expression=spec["expr"], tz=spec["tz"], queue=spec["queue"], misfire=spec["misfire"],
                misfire_grace=spec.get("grace"), jitter=spec.get("jitter", 0),
                next_fire=job.run_at if job else None,
                next_nominal=ms_to_datetime(int(pnom)) if pnom and pend else None,
                last_fired=ms_to_datetime(int(last)) if last else None,
                pending_id=pid_text, payload=job.payload if job else None))
        return sorted(out, key=lambda c: c.name)

    def requeue_args(self, at: object | None) -> int:
        return 0 if at is None else to_ms(at)


class ListWalk:
    """One ``jobs()`` page: walks the partitions in order from the cursor, one ``list`` script call
    at a time (each bounded by its scan budget), until the page is full, the partitions are done,
    or LIST_ROUND_TRIPS calls were made. The sync and async clients drive it the same way::

        while (call := walk.next_call()) is not None:
            walk.take(transport.call(*call))
        jobs, cursor = walk.result()
    """

    def __init__(self, core: Calls, queue: str, state: Any, limit: int, cursor: str | None) -> None:
        validate_name("queue", queue)
        st = state.value if isinstance(state, JobState) else state
        if st not in LIST_STATES:
            raise ValueError(f"state must be one of {', '.join(LIST_STATES)} (finished jobs are not listed: "
                             f"look them up by id with get()), got {state!r}")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= LIST_MAX_LIMIT:
            raise ValueError(f"limit must be an integer from 1 to {LIST_MAX_LIMIT}, got {limit!r}")
        self.core, self.queue, self.state, self.limit = core, queue, st, limit
        self.partition: int | None
        if cursor is None:
            self.partition, self.position = 0, b""
        else:
            self.partition, self.position = core.decode_cursor(cursor, st, queue)
        self.budget = max(1000, 2 * limit)
        self.jobs: list[JobInfo] = []
        self.calls = 0

    def next_call(self) -> tuple | None:
        if self.partition is None or len(self.jobs) >= self.limit or self.calls >= LIST_ROUND_TRIPS:
            return None
        self.calls += 1
        return self.core.call("list", self.partition, self.state, self.queue, self.limit - len(self.jobs),
                              self.position, self.budget)

    def take(self, reply: list[Any]) -> None:
        assert self.partition is not None
        state = self.state.encode()
        qname = self.queue.encode()
        for i in range(1, len(reply), 6):
            raw, rec_b, score, token, err, due = reply[i:i + 6]
            info = self.core.job_info(encode_id(raw), [state, rec_b, score, token, err, qname, due, None])
            if info is not None:
                self.jobs.append(info)
        if reply[0]:
            self.position = reply[0]
        else:
            self.partition += 1
            self.position = b""
            if self.partition >= self.core.ks.partitions:
                self.partition = None

    def result(self) -> tuple[list[JobInfo], str | None]:
        if self.partition is None:
            return self.jobs, None
        return self.jobs, self.core.encode_cursor(self.state, self.queue, self.partition, self.position)


def id_list(job_ids: Iterable[str]) -> list[str]:
    if isinstance(job_ids, (str, bytes)):
        raise TypeError("job_ids must be a list of job ids, not one id (use get() for one)")
    return list(job_ids)


