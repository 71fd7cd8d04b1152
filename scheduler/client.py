"""Producer client: ``Client`` (blocking, redis-py) and ``AsyncClient`` (redis.asyncio).

Both share :class:`_Core`, which validates input, builds script calls and parses replies, so the
two differ only in how they talk to Redis.
"""
from __future__ import annotations

import math
from functools import lru_cache
import random
import time
from collections import defaultdict
from typing import Any, Iterable, Sequence

import redis
import redis.asyncio as aredis

from . import codec, config
import msgpack

from .codec import build_record, decode_record, finite_number, pack_payload, split_template, unpack_payload
from .cron import LOOKAHEAD, MAX_JITTER_S, CronInfo, occurrences, validate_expression, validate_tz, with_jitter
from .errors import PayloadError, ScriptError
from .ids import IdGenerator, decode_id, encode_id, partition_for_key, partition_of
from .keys import Keyspace, validate_name
from .models import JobError, JobInfo, JobState
from . import durability as dur
from .connection import async_redis, sync_redis
from .transport import DEFAULT_RETRY, AsyncScriptTransport, RetryPolicy, ScriptTransport
from .timeutil import MAX_MS, ms_to_datetime, to_ms

BATCH = 1000  # jobs per schedule script call: bounded work per EVALSHA
MISFIRE_POLICIES = ("run_late", "skip")
DEFAULT_SKIP_GRACE = 60.0
_PLACEHOLDER_Q = b"\x00\x00"


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
            ms = to_ms(at, now=now_s)
            if jitter_ms:
                ms = min(MAX_MS, ms + random.randint(0, jitter_ms))
            data = pack_payload(payload, self.max_payload)
            rec = build_record(data, created_s=created, key=key, **rec_opts)
            raw, p = new_id(ms, parts, key)
            lst = by_part[p]
            lst.append(raw + rec)  # placeholder queue index = first 2 bytes of the record (0)
            lst.append(ms)
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
        ms = to_ms(at)
        if opts["jitter_ms"]:
            ms = min(MAX_MS, ms + random.randint(0, opts["jitter_ms"]))
        rec = build_record(pack_payload(payload, self.max_payload), created_s=int(time.time()), key=key,
                           max_attempts=opts["max_attempts"], lease_ms=opts["lease_ms"],
                           misfire_skip=opts["misfire_skip"], misfire_grace_ms=opts["misfire_grace_ms"],
                           backoff_base_ms=opts["backoff_base_ms"], backoff_cap_ms=opts["backoff_cap_ms"])
        raw, p = self.ids.new(ms, self.ks.partitions, key)
        return self.call("schedule", p, opts["queue"], self.tomb_ms, 1, 0, raw + rec, ms, key or "")

    @staticmethod
    def one_id(reply: list[Any]) -> str:
        if len(reply) != 1:
            raise ScriptError(f"schedule returned {len(reply)} ids for 1 job")
        return encode_id(reply[0])

    @staticmethod
    def collect_ids(replies: list[Any], positions: list[list[int]], total: int) -> list[str]:
        out: list[str] = [""] * total
        for reply, pos in zip(replies, positions):
            if len(reply) != len(pos):
                raise ScriptError(f"schedule returned {len(reply)} ids for {len(pos)} jobs")
            for n, raw in zip(pos, reply):
                out[n] = encode_id(raw)
        return out

    def locate(self, job_id: str) -> tuple[bytes, int]:
        raw = decode_id(job_id)
        p = partition_of(raw)
        if p >= self.ks.partitions:
            raise ValueError(f"job id {job_id!r} names partition {p}, but the namespace has {self.ks.partitions}")
        return raw, p

    def job_info(self, job_id: str, reply: list[Any]) -> JobInfo | None:
        if not reply:
            return None
        state = JobState(reply[0].decode())
        rec_b, score, token, err, qname = reply[1:6]
        score_ms = int(float(score)) if score is not None else None
        if rec_b is None:
            return JobInfo(id=job_id, state=state, expires_at=ms_to_datetime(score_ms))
        try:
            rec = decode_record(rec_b)
        except PayloadError as exc:  # a poison body must not make get()/dead() unusable
            return JobInfo(id=job_id, state=state, queue=qname.decode() if qname else None,
                           died_at=ms_to_datetime(score_ms) if state is JobState.DEAD else None,
                           last_error=parse_error(err), payload={"_undecodable": str(exc)})
        try:
            payload = unpack_payload(rec.payload_bytes, self.max_payload)
        except PayloadError as exc:
            payload = {"_undecodable": str(exc)}
        return JobInfo(
            id=job_id, state=state, queue=qname.decode() if qname else None, key=rec.key,
            run_at=ms_to_datetime(score_ms) if state is JobState.SCHEDULED else None,
            attempts=rec.attempt, max_attempts=rec.max_attempts, created=ms_to_datetime(rec.created * 1000),
            lease_deadline=ms_to_datetime(score_ms) if state is JobState.RUNNING else None,
            fence=int(token) if token is not None else None,
            died_at=ms_to_datetime(score_ms) if state is JobState.DEAD else None,
            last_error=parse_error(err), payload=payload,
        )

    def dead_infos(self, replies: list[list[Any]], limit: int) -> list[JobInfo]:
        out = []
        for p, flat in enumerate(replies):
            for i in range(0, len(flat), 5):
                raw, rec_b, died, err, qname = flat[i : i + 5]
                info = self.job_info(encode_id(raw), [b"dead", rec_b, died, None, err, qname])
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

    def inspect_calls(self, job_ids: list[str]) -> list[tuple]:
        """``inspect`` calls for many jobs, to pipeline in one round trip."""
        out = []
        for jid in job_ids:
            raw, p = self.locate(jid)
            out.append(self.call("inspect", p, raw))
        return out

    def job_infos(self, job_ids: list[str], replies: list[Any]) -> dict[str, JobInfo | None]:
        return {jid: self.job_info(jid, reply) for jid, reply in zip(job_ids, replies)}

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
        self.version: str | None = None

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
        if d is not None and d.mode == "fsync" and self._opts.version is None:
            dur.require_waitaof(self.redis.info("server"))
            self._opts.version = "waitaof"
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
        raw, p = self._core.locate(job_id)
        return self._core.job_info(job_id, self.transport.call(*self._core.call("inspect", p, raw)))

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
        if d is not None and d.mode == "fsync" and self._opts.version is None:
            dur.require_waitaof(await self.redis.info("server"))
            self._opts.version = "waitaof"
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
        core = await self._core()
        raw, p = core.locate(job_id)
        return core.job_info(job_id, await self.transport.call(*core.call("inspect", p, raw)))

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
