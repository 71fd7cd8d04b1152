"""Producer client: ``Client`` (blocking, redis-py) and ``AsyncClient`` (redis.asyncio).

Both share :class:`~scheduler.protocol.calls.Calls`, which validates input, builds script calls and parses replies, so the
two differ only in how they talk to Redis.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import redis
import redis.asyncio as aredis

from .protocol import codec, config
from .protocol import durability as dur
from .protocol.calls import DEFAULT_QUEUE_IDLE, QUEUE_IDLE_FIELD, Calls, id_list
from .protocol.codec import finite_number
from .protocol.connection import async_redis, sync_redis
from .protocol.cron import CronInfo
from .protocol.ids import encode_id
from .protocol.keys import Keyspace, validate_name
from .protocol.models import JobInfo, JobState
from .protocol.timeutil import to_ms
from .protocol.transport import DEFAULT_RETRY, AsyncScriptTransport, RetryPolicy, ScriptTransport

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

    def __init__(self, core: Calls, retry: RetryPolicy | None, durable: str | None, durable_replicas: int,
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
        self._core = Calls(self.keyspace, **_core_kwargs(max_payload_bytes, tombstone_ttl))
        self._opts = _Options(self._core, retry, durable, durable_replicas, durable_timeout,
                              _socket_timeout(redis_client))
        self.transport = ScriptTransport(redis_client, self._opts.retry)

    @classmethod
    def from_url(cls, url: str | None = None, *, redis_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> Client:
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

    def __enter__(self) -> Client:
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
        ids = id_list(job_ids)
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
        self._core_obj: Calls | None = None
        self._retry = retry or DEFAULT_RETRY
        dur.resolve(durable, durable_replicas, durable_timeout)  # fail here, not on first use
        self._dur_args = (durable, durable_replicas, durable_timeout)
        self._opts: _Options | None = None
        self.transport = AsyncScriptTransport(redis_client, self._retry)

    @classmethod
    def from_url(cls, url: str | None = None, *, redis_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> AsyncClient:
        """See :meth:`Client.from_url`."""
        return cls(async_redis(config.redis_url(url), **(redis_options or {})), **kwargs)

    async def connect(self) -> AsyncClient:
        """Read (or fix, for a new namespace) the partition count; idempotent."""
        if self._core_obj is None:
            cfg = Keyspace(self._ns, 1).config_key
            await self.redis.hsetnx(cfg, "partitions", self._want or config.DEFAULT_PARTITIONS)
            count = config.resolve_partitions(await self.redis.hget(cfg, "partitions"), self._want, self._ns)
            core = Calls(Keyspace(self._ns, count), **self._kw)
            self._opts = _Options(core, self._retry, *self._dur_args, _socket_timeout(self.redis))
            self._core_obj = core
        return self

    @property
    def keyspace(self) -> Keyspace:
        if self._core_obj is None:
            raise RuntimeError("AsyncClient not connected yet: await client.connect() first")
        return self._core_obj.ks

    @property
    def core(self) -> Calls:
        """The connected client's call builder (after ``connect()``)."""
        if self._core_obj is None:
            raise RuntimeError("AsyncClient not connected yet: await client.connect() first")
        return self._core_obj

    async def _core(self) -> Calls:
        if self._core_obj is None:
            await self.connect()
        assert self._core_obj is not None
        return self._core_obj

    async def close(self) -> None:
        await self.redis.aclose()

    async def __aenter__(self) -> AsyncClient:
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
        ids = id_list(job_ids)
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
