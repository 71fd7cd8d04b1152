"""Producer client: ``Client`` (blocking, redis-py) and ``AsyncClient`` (redis.asyncio).

Both share :class:`_Core`, which validates input, builds script calls and parses replies, so the
two differ only in how they talk to Redis.
"""
from __future__ import annotations

import base64
import math
from functools import lru_cache
import random
import time
from collections import defaultdict
from datetime import timedelta
from typing import Any, Iterable, Sequence

import redis
import redis.asyncio as aredis

from .protocol import codec, config
import msgpack

from .protocol.codec import (build_record, decode_record, decode_tombstone, finite_number, pack_payload, split_template,
                    unpack_payload)
from .protocol.cron import LOOKAHEAD, MAX_JITTER_S, CronInfo, occurrences, validate_expression, validate_tz, with_jitter
from .protocol.errors import MisfiredAtSchedule, PayloadError, ScriptError
from .protocol.ids import ID_BYTES, IdGenerator, decode_id, encode_id, partition_for_key, partition_of
from .protocol.keys import Keyspace, validate_name
from .protocol.models import JobError, JobInfo, JobState
from .protocol import durability as dur
from .protocol.connection import async_redis, sync_redis
from .protocol.transport import DEFAULT_RETRY, AsyncScriptTransport, RetryPolicy, ScriptTransport
from .protocol.timeutil import MAX_MS, ms_to_datetime, to_ms

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


def _job_options(*, queue: str, max_attempts: int, lease: float, misfire: str, misfire_grace: float | None,
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
def _job_options_cached(queue: Any, max_attempts: Any, lease: Any, misfire: Any, misfire_grace: Any,
                        backoff: Any, jitter: Any) -> dict[str, Any]:
    return _job_options(queue=queue, max_attempts=max_attempts, lease=lease, misfire=misfire,
                        misfire_grace=misfire_grace, backoff=backoff, jitter=jitter)


class _Core:
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
            return _job_options_cached(*(kwargs[k] for k in _OPTION_NAMES))
        except TypeError as exc:
            if "unhashable" not in str(exc):
                raise
            return _job_options(**kwargs)

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
    def list_walk(self, queue: str, state: Any, limit: int, cursor: str | None) -> "_ListWalk":
        return _ListWalk(self, queue, state, limit, cursor)

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


class _ListWalk:
    """One ``jobs()`` page: walks the partitions in order from the cursor, one ``list`` script call
    at a time (each bounded by its scan budget), until the page is full, the partitions are done,
    or LIST_ROUND_TRIPS calls were made. The sync and async clients drive it the same way::

        while (call := walk.next_call()) is not None:
            walk.take(transport.call(*call))
        jobs, cursor = walk.result()
    """

    def __init__(self, core: _Core, queue: str, state: Any, limit: int, cursor: str | None) -> None:
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


def _id_list(job_ids: Iterable[str]) -> list[str]:
    if isinstance(job_ids, (str, bytes)):
        raise TypeError("job_ids must be a list of job ids, not one id (use get() for one)")
    return list(job_ids)


_JOBS_DOC = """One page of the jobs of ``queue`` in ``state`` (``scheduled``, ``ready``,
        ``running`` or ``dead``): returns ``(jobs, next_cursor)``; pass ``next_cursor`` back as
        ``cursor`` for the next page, until it is None.

        Partitions are walked in order; within one: scheduled jobs by run_at (those held back by
        a rate limit first), ready jobs in claim order, running by lease deadline, dead by time of
        death (oldest first). Nothing is loaded whole: each script call examines a bounded number
        of entries (timers of every queue share one set per partition), so a page may hold fewer
        than ``limit`` jobs, even none, while ``next_cursor`` is not None: keep paging. A job that
        stays in its state is listed exactly once; one that moves meanwhile (fired, claimed,
        retried) may be missed or listed again. ``limit``: 1 to 1000. The cursor is an opaque
        string, checked on input (ValueError when it is malformed or belongs to another listing)."""


def _core_kwargs(max_payload_bytes: int, tombstone_ttl: float) -> dict[str, Any]:
    if isinstance(max_payload_bytes, bool) or not isinstance(max_payload_bytes, int) or max_payload_bytes < 1:
        raise ValueError(f"max_payload_bytes must be a positive int, got {max_payload_bytes!r}")
    return dict(max_payload_bytes=max_payload_bytes, tombstone_ttl=finite_number("tombstone_ttl", tombstone_ttl))


_SCHEDULE_DOC = """Schedule one job; returns its id.

        ``at``: aware datetime, timedelta from now, or epoch seconds. ``key``: idempotency key; while a
        job with that key is live, scheduling again returns the existing id and writes nothing.
        ``misfire``: ``run_late`` (default) or ``skip`` (drop it when it comes due more than
        ``misfire_grace`` seconds late, default 60). ``jitter``: spread run_at uniformly over
        [at, at + jitter] seconds. ``backoff``: (base, cap) seconds for retries.
        ``durable``: ``"replica"`` (wait until ``durable_replicas`` replicas have the job) or
        ``"fsync"`` (wait for the master's AOF fsync, Redis 7.2+); default: the client's setting.
        Raises :class:`~scheduler.errors.DurabilityTimeout` (with the id) when that is not confirmed
        in time: the job may exist. A call whose reply is lost (timeout, dropped connection) is
        re-sent under the client's :class:`~scheduler.transport.RetryPolicy`; the script makes the
        re-send idempotent, so a job is never created twice."""

_UNSET: Any = object()


def _socket_timeout(redis_client: Any) -> float | None:
    pool = getattr(redis_client, "connection_pool", None)
    t = getattr(pool, "connection_kwargs", {}).get("socket_timeout") if pool is not None else None
    return float(t) if isinstance(t, (int, float)) else None


class _Options:
    """Transport and durability settings shared by the sync and async clients."""

    def __init__(self, core: _Core, retry: RetryPolicy | None, durable: str | None, durable_replicas: int,
                 durable_timeout: float, socket_timeout: float | None = None) -> None:
        self.retry = retry or DEFAULT_RETRY
        self.durable_replicas = durable_replicas
        self.durable_timeout = durable_timeout
        self.socket_timeout = socket_timeout
        self.durable = self._check(dur.resolve(durable, durable_replicas, durable_timeout))
        # A re-sent schedule recognises its jobs by id, finished ones by their tombstone: re-send
        # only while tombstones outlive the retry window by a wide margin.
        self.resend_schedule = core.tomb_ms >= 2000 * self.retry.budget
        self.waitaof_checked = False  # durable="fsync": the server was checked for WAITAOF once

    def _check(self, d: dur.Durability | None) -> dur.Durability | None:
        t = self.socket_timeout
        if d is not None and t is not None and d.timeout_ms >= t * 1000:
            raise ValueError(f"durable_timeout ({d.timeout_ms / 1000:g} s) must be shorter than the Redis socket "
                             f"timeout ({t:g} s), or every WAIT that runs out would look like a lost connection; "
                             "lower durable_timeout or raise socket_timeout")
        return d

    def durability(self, durable: Any) -> dur.Durability | None:
        if durable is _UNSET:
            return self.durable
        return self._check(dur.resolve(durable, self.durable_replicas, self.durable_timeout))


class Client:
    """Blocking producer client. Thread-safe (redis-py connection pool)."""

    def __init__(self, redis_client: redis.Redis, *, namespace: str | None = None, partitions: int | None = None,
                 max_payload_bytes: int = codec.DEFAULT_MAX_PAYLOAD, tombstone_ttl: float = 3600.0,
                 retry: RetryPolicy | None = None, durable: str | None = None, durable_replicas: int = 1,
                 durable_timeout: float = 1.0) -> None:
        """``retry``: how long and how often calls are retried when Redis is unreachable or a reply
        is lost (default: :data:`~scheduler.transport.DEFAULT_RETRY`, up to 10 s). ``durable``:
        default durability of ``schedule``/``schedule_many`` (None, ``"replica"``, ``"fsync"``),
        waiting for ``durable_replicas`` replicas up to ``durable_timeout`` seconds."""
        ns = config.namespace(namespace)
        want = config.partitions(partitions)
        cfg = Keyspace(ns, 1).config_key
        redis_client.hsetnx(cfg, "partitions", want or config.DEFAULT_PARTITIONS)
        count = config.resolve_partitions(redis_client.hget(cfg, "partitions"), want, ns)
        self.redis = redis_client
        self.keyspace = Keyspace(ns, count)
        self._core = _Core(self.keyspace, **_core_kwargs(max_payload_bytes, tombstone_ttl))
        self._opts = _Options(self._core, retry, durable, durable_replicas, durable_timeout,
                              _socket_timeout(redis_client))
        self.transport = ScriptTransport(redis_client, self._opts.retry)

    @classmethod
    def from_url(cls, url: str | None = None, *, redis_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> "Client":
        """Connect with a URL (default ZSCHED_REDIS_URL): ``redis://``, ``rediss://`` (TLS),
        ``unix://`` or ``redis+sentinel://host:port[,host:port...]/MASTER[/db]`` (see
        :mod:`scheduler.connection`); user:password@ for ACL. ``redis_options``: extra redis-py
        connection arguments (e.g. ``socket_timeout``)."""
        return cls(sync_redis(config.redis_url(url), **(redis_options or {})), **kwargs)

    def close(self) -> None:
        self.redis.close()

    def _durability(self, durable: Any) -> dur.Durability | None:
        d = self._opts.durability(durable)
        if d is not None and d.mode == "fsync" and not self._opts.waitaof_checked:
            dur.require_waitaof(self.redis.info("server"))
            self._opts.waitaof_checked = True
        return d

    def _schedule_calls(self, calls: list[Any], d: dur.Durability | None) -> list[Any]:
        replies = self.transport.call_many(calls, resend=self._opts.resend_schedule,
                                           then=d.command() if d else None)
        return replies

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def schedule(self, at: Any, payload: Any = None, *, queue: str = "default", key: str | None = None,
                 max_attempts: int = 5, lease: float = 30.0, misfire: str = "run_late",
                 misfire_grace: float | None = None, backoff: tuple[float, float] | None = None,
                 jitter: float = 0.0, durable: str | None = _UNSET) -> str:
        opts = self._core.job_options(queue=queue, max_attempts=max_attempts, lease=lease, misfire=misfire,
                                      misfire_grace=misfire_grace, backoff=backoff, jitter=jitter)
        call = self._core.prepare_one(at, payload, key, opts)
        d = self._durability(durable)
        if d is None and self._opts.resend_schedule:
            return self._core.one_id(self.transport.call(*call))
        replies = self._schedule_calls([call], d)
        job_id = self._core.one_id(replies[0])
        if d is not None:
            d.check(replies[1], [job_id])
        return job_id

    schedule.__doc__ = _SCHEDULE_DOC

    def schedule_many(self, jobs: Iterable[Sequence[Any]], *, queue: str = "default", max_attempts: int = 5,
                      lease: float = 30.0, misfire: str = "run_late", misfire_grace: float | None = None,
                      backoff: tuple[float, float] | None = None, jitter: float = 0.0,
                      durable: str | None = _UNSET) -> list[str]:
        """Schedule many ``(at, payload)`` or ``(at, payload, key)`` jobs in one pipelined round trip
        (one script call per partition and 1000 jobs); returns ids in input order. Every job is
        validated before anything is written. ``durable``: as for :meth:`schedule` (one WAIT for
        the whole batch; a :class:`~scheduler.errors.DurabilityTimeout` carries every id)."""
        items = list(jobs)
        opts = self._core.job_options(queue=queue, max_attempts=max_attempts, lease=lease, misfire=misfire,
                                      misfire_grace=misfire_grace, backoff=backoff, jitter=jitter)
        calls, pos = self._core.prepare(items, opts)
        if not calls:
            return []
        d = self._durability(durable)
        replies = self._schedule_calls(calls, d)
        ids = self._core.collect_ids(replies[:len(calls)], pos, len(items))
        if d is not None:
            d.check(replies[-1], ids)
        return ids

    def cancel(self, job_id: str) -> bool:
        """Cancel a scheduled or ready job. False if unknown, finished, running or dead."""
        raw, p = self._core.locate(job_id)
        return self.transport.call(*self._core.call("cancel", p, raw, self._core.tomb_ms)) == 1

    def reschedule(self, job_id: str, at: Any) -> bool:
        """Move a scheduled or ready job to a new time. False if unknown, running or dead."""
        ms = to_ms(at)
        raw, p = self._core.locate(job_id)
        return self.transport.call(*self._core.call("reschedule", p, raw, ms)) == 1

    def get(self, job_id: str) -> JobInfo | None:
        """The job in whatever state it is (see :class:`~scheduler.models.JobInfo` for the fields
        per state), or None if the id is unknown or its tombstone expired."""
        raw, p = self._core.locate(job_id)
        return self._core.one_info(job_id, self.transport.call(*self._core.call("inspect", p, raw)))

    def get_many(self, job_ids: Iterable[str]) -> dict[str, JobInfo | None]:
        """Many jobs in one pipelined round trip (one ``inspect`` call per partition and 500 ids):
        id -> JobInfo, or None for unknown ids. Every id is checked before anything is sent (a
        malformed one raises ValueError naming it)."""
        ids = _id_list(job_ids)
        calls = self._core.inspect_calls(ids)
        if not calls:
            return {}
        return self._core.job_infos(ids, self.transport.call_many(calls))

    def jobs(self, *, queue: str, state: str | JobState, limit: int = 100,
             cursor: str | None = None) -> tuple[list[JobInfo], str | None]:
        walk = self._core.list_walk(queue, state, limit, cursor)
        while (call := walk.next_call()) is not None:
            walk.take(self.transport.call(*call))
        return walk.result()

    jobs.__doc__ = _JOBS_DOC

    def dead(self, queue: str | None = None, limit: int = 100) -> list[JobInfo]:
        """Newest dead-lettered jobs across partitions (optionally of one queue)."""
        if queue is not None:
            validate_name("queue", queue)
        calls = [self._core.call("dead_list", p, queue or "", limit, 10 * limit + 1000)
                 for p in range(self.keyspace.partitions)]
        return self._core.dead_infos(self.transport.call_many(calls), limit)

    def requeue(self, job_id: str, at: Any = None) -> bool:
        """Bring a dead job back (attempts reset), now or at ``at``. False if it is not dead, so a
        second requeue of the same job does nothing."""
        ms = self._core.requeue_args(at)
        raw, p = self._core.locate(job_id)
        return self.transport.call(*self._core.call("requeue", p, ms, raw))[0] == 1

    def purge(self, job_id: str) -> bool:
        """Delete a dead job for good."""
        raw, p = self._core.locate(job_id)
        return self.transport.call(*self._core.call("purge", p, "ids", 0, raw)) == 1

    def stats(self) -> dict[str, dict[str, int]]:
        """Per queue: counts of scheduled, ready, running and dead jobs."""
        calls = [self._core.call("stats", p) for p in range(self.keyspace.partitions)]
        return self._core.merge_stats(self.transport.call_many(calls))


    # -- cron -----------------------------------------------------------------------------------
    def add_cron(self, name: str, expression: str, payload: Any = None, *, queue: str = "default",
                 tz: str = "UTC", misfire: str = "run_late", misfire_grace: float | None = None,
                 jitter: float = 0.0, max_attempts: int = 5, lease: float = 30.0,
                 backoff: tuple[float, float] | None = None) -> str:
        """Create or replace a recurring schedule; returns the id of its pending occurrence.

        Each occurrence is an ordinary job (retries, leases, dead-letter) whose idempotency key is
        ``cron:NAME:NOMINAL_MS``; a cron always has exactly one pending occurrence, and the
        scheduler tier schedules the next one in the same atomic step that fires the current one.
        ``misfire``: after an outage, ``run_late`` fires one catch-up run (the handler sees the
        nominal time and how many were missed, ``job.cron``); ``skip`` drops the missed ones.
        ``jitter``: each occurrence fires uniformly within [nominal, nominal + jitter] seconds.
        """
        reply = self.transport.call(*self._core.cron_set_call(
            name, expression, payload, queue=queue, tz=tz, misfire=misfire, misfire_grace=misfire_grace,
            jitter=jitter, max_attempts=max_attempts, lease=lease, backoff=backoff))
        return encode_id(reply[0])

    def remove_cron(self, name: str) -> bool:
        """Delete a cron and cancel its pending occurrence (one already running finishes)."""
        return self.transport.call(*self._core.cron_remove_call(name)) == 1

    def crons(self) -> list[CronInfo]:
        """Every cron of the namespace, by name."""
        pipe = self.redis.pipeline(transaction=False)
        self._core.cron_list_commands(pipe)
        names = pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        order = self._core.cron_detail_commands(pipe, names)
        details = pipe.execute() if order else []
        ids = [encode_id(d[1]) for d in details if d[1]]
        calls = self._core.inspect_calls(ids)
        pending = self._core.job_infos(ids, self.transport.call_many(calls) if calls else [])
        return self._core.cron_infos(order, details, pending)

    def set_rate_limit(self, queue: str, per_second: float, burst: float | None = None) -> None:
        """Limit how fast due jobs of ``queue`` are dispatched (jobs/s, namespace-wide), so a herd
        drains as a steady stream, oldest first. Takes effect on the scheduler tier within a
        moment (pub/sub), or 5 s at most."""
        rate, b = validate_rate(queue, per_second, burst)
        self.redis.hset(self.keyspace.config_key, f"rate:{queue}", f"{rate!r} {b!r}")
        self.redis.publish(self.keyspace.config_channel, "rate")

    def clear_rate_limit(self, queue: str) -> bool:
        """Remove a queue's rate limit; jobs it held back are released at once."""
        validate_name("queue", queue)
        n = self.redis.hdel(self.keyspace.config_key, f"rate:{queue}")
        self.redis.publish(self.keyspace.config_channel, "rate")
        return bool(n)

    def rate_limits(self) -> dict[str, tuple[float, float]]:
        """Queue -> (jobs per second, burst)."""
        return parse_rate_limits(self.redis.hgetall(self.keyspace.config_key))

    def set_dead_retention(self, max_dead: int | None = None, dead_ttl: float | None = None) -> None:
        """Bound the dead-letter set: keep at most ``max_dead`` dead jobs in the namespace (each of
        the P partitions keeps ceil(max_dead / P), oldest dropped first) and drop dead jobs older
        than ``dead_ttl`` seconds; ``None`` lifts that limit. The scheduler tier applies it on
        every tick; each dropped job is counted (``zsched_jobs_total{event="dropped"}``) and
        logged with its id by the replica that dropped it."""
        pipe = self.redis.pipeline(transaction=True)
        config_commands(pipe, self.keyspace, retention_fields(max_dead, dead_ttl), "dead")
        pipe.execute()

    def dead_retention(self) -> tuple[int | None, float | None]:
        """(max_dead, dead_ttl seconds) as set with :meth:`set_dead_retention`; None = no limit."""
        return parse_dead_retention(self.redis.hgetall(self.keyspace.config_key))

    def set_queue_retirement(self, idle: float | None = DEFAULT_QUEUE_IDLE) -> None:
        """Retire a queue's name (its interned index, gauges and counters) in a partition once the
        queue is empty there and has seen no job scheduled or finished for ``idle`` seconds
        (default 1 day; ``None``: never). Each partition interns at most 65535 names, so a
        namespace that creates queue names over time needs this; a retired name comes back as
        soon as a job is scheduled to it (its counters then start from 0)."""
        self.redis.hset(self.keyspace.config_key, QUEUE_IDLE_FIELD, queue_idle_field(idle))
        self.redis.publish(self.keyspace.config_channel, "queues")

    def queue_retirement(self) -> float | None:
        """Seconds after which an empty, idle queue name is retired; None = never."""
        return parse_queue_idle(self.redis.hgetall(self.keyspace.config_key))


class AsyncClient:
    """asyncio producer client (redis.asyncio). Same methods as :class:`Client`, as coroutines.

    The namespace's partition count is read on first use (or ``await connect()``); a mismatch with
    an explicit ``partitions`` raises ConfigError there.
    """

    def __init__(self, redis_client: aredis.Redis, *, namespace: str | None = None, partitions: int | None = None,
                 max_payload_bytes: int = codec.DEFAULT_MAX_PAYLOAD, tombstone_ttl: float = 3600.0,
                 retry: RetryPolicy | None = None, durable: str | None = None, durable_replicas: int = 1,
                 durable_timeout: float = 1.0) -> None:
        """Arguments as for :class:`Client`; nothing is sent to Redis before the first call."""
        self.redis = redis_client
        self._ns = config.namespace(namespace)
        self._want = config.partitions(partitions)
        self._kw = _core_kwargs(max_payload_bytes, tombstone_ttl)
        self._core_obj: _Core | None = None
        self._retry = retry or DEFAULT_RETRY
        dur.resolve(durable, durable_replicas, durable_timeout)  # fail here, not on first use
        self._dur_args = (durable, durable_replicas, durable_timeout)
        self._opts: _Options | None = None
        self.transport = AsyncScriptTransport(redis_client, self._retry)

    @classmethod
    def from_url(cls, url: str | None = None, *, redis_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> "AsyncClient":
        """See :meth:`Client.from_url`."""
        return cls(async_redis(config.redis_url(url), **(redis_options or {})), **kwargs)

    async def connect(self) -> "AsyncClient":
        """Read (or fix, for a new namespace) the partition count; idempotent."""
        if self._core_obj is None:
            cfg = Keyspace(self._ns, 1).config_key
            await self.redis.hsetnx(cfg, "partitions", self._want or config.DEFAULT_PARTITIONS)
            count = config.resolve_partitions(await self.redis.hget(cfg, "partitions"), self._want, self._ns)
            core = _Core(Keyspace(self._ns, count), **self._kw)
            self._opts = _Options(core, self._retry, *self._dur_args, _socket_timeout(self.redis))
            self._core_obj = core
        return self

    @property
    def keyspace(self) -> Keyspace:
        if self._core_obj is None:
            raise RuntimeError("AsyncClient not connected yet: await client.connect() first")
        return self._core_obj.ks

    @property
    def core(self) -> _Core:
        """The connected client's call builder (after ``connect()``)."""
        if self._core_obj is None:
            raise RuntimeError("AsyncClient not connected yet: await client.connect() first")
        return self._core_obj

    async def _core(self) -> _Core:
        if self._core_obj is None:
            await self.connect()
        assert self._core_obj is not None
        return self._core_obj

    async def close(self) -> None:
        await self.redis.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _durability(self, durable: Any) -> dur.Durability | None:
        assert self._opts is not None
        d = self._opts.durability(durable)
        if d is not None and d.mode == "fsync" and not self._opts.waitaof_checked:
            dur.require_waitaof(await self.redis.info("server"))
            self._opts.waitaof_checked = True
        return d

    async def schedule(self, at: Any, payload: Any = None, *, queue: str = "default", key: str | None = None,
                       max_attempts: int = 5, lease: float = 30.0, misfire: str = "run_late",
                       misfire_grace: float | None = None, backoff: tuple[float, float] | None = None,
                       jitter: float = 0.0, durable: str | None = _UNSET) -> str:
        core = await self._core()
        assert self._opts is not None
        opts = core.job_options(queue=queue, max_attempts=max_attempts, lease=lease, misfire=misfire,
                                misfire_grace=misfire_grace, backoff=backoff, jitter=jitter)
        call = core.prepare_one(at, payload, key, opts)
        d = await self._durability(durable)
        replies = await self.transport.call_many([call], resend=self._opts.resend_schedule,
                                                 then=d.command() if d else None)
        job_id = core.one_id(replies[0])
        if d is not None:
            d.check(replies[1], [job_id])
        return job_id

    schedule.__doc__ = _SCHEDULE_DOC

    async def schedule_many(self, jobs: Iterable[Sequence[Any]], *, queue: str = "default", max_attempts: int = 5,
                            lease: float = 30.0, misfire: str = "run_late", misfire_grace: float | None = None,
                            backoff: tuple[float, float] | None = None, jitter: float = 0.0,
                            durable: str | None = _UNSET) -> list[str]:
        """See :meth:`Client.schedule_many`."""
        core = await self._core()
        assert self._opts is not None
        items = list(jobs)
        opts = core.job_options(queue=queue, max_attempts=max_attempts, lease=lease, misfire=misfire,
                                misfire_grace=misfire_grace, backoff=backoff, jitter=jitter)
        calls, pos = core.prepare(items, opts)
        if not calls:
            return []
        d = await self._durability(durable)
        replies = await self.transport.call_many(calls, resend=self._opts.resend_schedule,
                                                 then=d.command() if d else None)
        ids = core.collect_ids(replies[:len(calls)], pos, len(items))
        if d is not None:
            d.check(replies[-1], ids)
        return ids

    async def cancel(self, job_id: str) -> bool:
        core = await self._core()
        raw, p = core.locate(job_id)
        return await self.transport.call(*core.call("cancel", p, raw, core.tomb_ms)) == 1

    async def reschedule(self, job_id: str, at: Any) -> bool:
        core = await self._core()
        ms = to_ms(at)
        raw, p = core.locate(job_id)
        return await self.transport.call(*core.call("reschedule", p, raw, ms)) == 1

    async def get(self, job_id: str) -> JobInfo | None:
        """See :meth:`Client.get`."""
        core = await self._core()
        raw, p = core.locate(job_id)
        return core.one_info(job_id, await self.transport.call(*core.call("inspect", p, raw)))

    async def get_many(self, job_ids: Iterable[str]) -> dict[str, JobInfo | None]:
        """See :meth:`Client.get_many`."""
        core = await self._core()
        ids = _id_list(job_ids)
        calls = core.inspect_calls(ids)
        if not calls:
            return {}
        return core.job_infos(ids, await self.transport.call_many(calls))

    async def jobs(self, *, queue: str, state: str | JobState, limit: int = 100,
                   cursor: str | None = None) -> tuple[list[JobInfo], str | None]:
        core = await self._core()
        walk = core.list_walk(queue, state, limit, cursor)
        while (call := walk.next_call()) is not None:
            walk.take(await self.transport.call(*call))
        return walk.result()

    jobs.__doc__ = _JOBS_DOC

    async def dead(self, queue: str | None = None, limit: int = 100) -> list[JobInfo]:
        core = await self._core()
        if queue is not None:
            validate_name("queue", queue)
        calls = [core.call("dead_list", p, queue or "", limit, 10 * limit + 1000) for p in range(core.ks.partitions)]
        return core.dead_infos(await self.transport.call_many(calls), limit)

    async def requeue(self, job_id: str, at: Any = None) -> bool:
        core = await self._core()
        ms = core.requeue_args(at)
        raw, p = core.locate(job_id)
        return (await self.transport.call(*core.call("requeue", p, ms, raw)))[0] == 1

    async def purge(self, job_id: str) -> bool:
        core = await self._core()
        raw, p = core.locate(job_id)
        return await self.transport.call(*core.call("purge", p, "ids", 0, raw)) == 1

    async def stats(self) -> dict[str, dict[str, int]]:
        core = await self._core()
        calls = [core.call("stats", p) for p in range(core.ks.partitions)]
        return core.merge_stats(await self.transport.call_many(calls))


    async def add_cron(self, name: str, expression: str, payload: Any = None, *, queue: str = "default",
                       tz: str = "UTC", misfire: str = "run_late", misfire_grace: float | None = None,
                       jitter: float = 0.0, max_attempts: int = 5, lease: float = 30.0,
                       backoff: tuple[float, float] | None = None) -> str:
        core = await self._core()
        reply = await self.transport.call(*core.cron_set_call(
            name, expression, payload, queue=queue, tz=tz, misfire=misfire, misfire_grace=misfire_grace,
            jitter=jitter, max_attempts=max_attempts, lease=lease, backoff=backoff))
        return encode_id(reply[0])

    async def remove_cron(self, name: str) -> bool:
        core = await self._core()
        return await self.transport.call(*core.cron_remove_call(name)) == 1

    async def crons(self) -> list[CronInfo]:
        core = await self._core()
        pipe = self.redis.pipeline(transaction=False)
        core.cron_list_commands(pipe)
        names = await pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        order = core.cron_detail_commands(pipe, names)
        details = await pipe.execute() if order else []
        ids = [encode_id(d[1]) for d in details if d[1]]
        calls = core.inspect_calls(ids)
        pending = core.job_infos(ids, await self.transport.call_many(calls) if calls else [])
        return core.cron_infos(order, details, pending)

    async def set_rate_limit(self, queue: str, per_second: float, burst: float | None = None) -> None:
        core = await self._core()
        rate, b = validate_rate(queue, per_second, burst)
        await self.redis.hset(core.ks.config_key, f"rate:{queue}", f"{rate!r} {b!r}")
        await self.redis.publish(core.ks.config_channel, "rate")

    async def clear_rate_limit(self, queue: str) -> bool:
        core = await self._core()
        validate_name("queue", queue)
        n = await self.redis.hdel(core.ks.config_key, f"rate:{queue}")
        await self.redis.publish(core.ks.config_channel, "rate")
        return bool(n)

    async def rate_limits(self) -> dict[str, tuple[float, float]]:
        core = await self._core()
        return parse_rate_limits(await self.redis.hgetall(core.ks.config_key))

    async def set_dead_retention(self, max_dead: int | None = None, dead_ttl: float | None = None) -> None:
        """See :meth:`Client.set_dead_retention`."""
        core = await self._core()
        pipe = self.redis.pipeline(transaction=True)
        config_commands(pipe, core.ks, retention_fields(max_dead, dead_ttl), "dead")
        await pipe.execute()

    async def dead_retention(self) -> tuple[int | None, float | None]:
        """See :meth:`Client.dead_retention`."""
        core = await self._core()
        return parse_dead_retention(await self.redis.hgetall(core.ks.config_key))

    async def set_queue_retirement(self, idle: float | None = DEFAULT_QUEUE_IDLE) -> None:
        """See :meth:`Client.set_queue_retirement`."""
        core = await self._core()
        await self.redis.hset(core.ks.config_key, QUEUE_IDLE_FIELD, queue_idle_field(idle))
        await self.redis.publish(core.ks.config_channel, "queues")

    async def queue_retirement(self) -> float | None:
        """See :meth:`Client.queue_retirement`."""
        core = await self._core()
        return parse_queue_idle(await self.redis.hgetall(core.ks.config_key))


def validate_rate(queue: str, per_second: object, burst: object | None) -> tuple[float, float]:
    """Check a rate limit; burst defaults to a quarter second's worth (at least 1 job): small enough
    that a herd starts as a stream, large enough that a briefly delayed owner does not lose tokens."""
    validate_name("queue", queue)
    rate = finite_number("per_second", per_second)
    if not 0 < rate <= 1_000_000:
        raise ValueError(f"per_second must be > 0 and <= 1000000 jobs/s, got {per_second!r}")
    b = max(1.0, rate / 4) if burst is None else finite_number("burst", burst)
    if not 1 <= b <= 10_000_000:
        raise ValueError(f"burst must be from 1 to 10000000 jobs, got {burst!r}")
    return rate, b


def parse_rate_limits(cfg: dict[bytes, bytes]) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    for k, v in cfg.items():
        if k.startswith(b"rate:"):
            try:
                rate, burst = (float(x) for x in v.split())
            except ValueError:
                continue
            out[k[5:].decode()] = (rate, burst)
    return out


def retention_fields(max_dead: object, dead_ttl: object) -> dict[str, str | None]:
    """Validate a dead-letter retention setting; the config fields to write (None = delete)."""
    if max_dead is not None and (isinstance(max_dead, bool) or not isinstance(max_dead, int)
                                 or not 1 <= max_dead <= 10**12):
        raise ValueError(f"max_dead must be None (no cap) or an int from 1 to 10**12, got {max_dead!r}")
    ttl_ms = None
    if dead_ttl is not None:
        ttl = finite_number("dead_ttl", dead_ttl)
        if not 1 <= ttl <= 10 * 365 * 86400:
            raise ValueError(f"dead_ttl must be None (keep forever) or 1 s to 10 years, got {dead_ttl!r}")
        ttl_ms = str(int(ttl * 1000))
    return {"dead:max": None if max_dead is None else str(max_dead), "dead:ttl_ms": ttl_ms}


def parse_dead_retention(cfg: Any) -> tuple[int | None, float | None]:
    """(max_dead, dead_ttl seconds) from the namespace config; None where unset or unreadable."""
    def num(field: bytes) -> int | None:
        try:
            v = int(cfg[field])
        except (KeyError, ValueError):
            return None
        return v if v > 0 else None

    ttl_ms = num(b"dead:ttl_ms")
    return num(b"dead:max"), None if ttl_ms is None else ttl_ms / 1000.0


def queue_idle_field(idle: object) -> str:
    """Validate a queue retirement time; the config value (ms, '0' = never)."""
    if idle is None:
        return "0"
    t = finite_number("idle", idle)
    if not 0.001 <= t <= 10 * 365 * 86400:
        raise ValueError(f"idle must be None (never retire) or 1 ms to 10 years, got {idle!r}")
    return str(max(1, int(t * 1000)))


def parse_queue_idle(cfg: Any) -> float | None:
    """The queue retirement time in seconds (the default when unset); None = never."""
    raw = cfg.get(QUEUE_IDLE_FIELD.encode(), cfg.get(QUEUE_IDLE_FIELD))
    try:
        ms = DEFAULT_QUEUE_IDLE * 1000 if raw is None else int(raw)
    except ValueError:
        ms = DEFAULT_QUEUE_IDLE * 1000
    return ms / 1000.0 if ms > 0 else None


def config_commands(pipe: Any, ks: Keyspace, fields: dict[str, str | None], what: str) -> None:
    """Queue the namespace-config writes (None deletes a field) and the change notice the
    scheduler tier listens for."""
    for k, v in fields.items():
        if v is None:
            pipe.hdel(ks.config_key, k)
        else:
            pipe.hset(ks.config_key, k, v)
    pipe.publish(ks.config_channel, what)
