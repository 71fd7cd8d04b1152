"""The asyncio producer client, :class:`AsyncClient` (redis.asyncio)."""
from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Unpack

from ..protocol import codec, config, control
from ..protocol import durability as dur
from ..protocol.calls import Calls, id_list
from ..protocol.codes import Outcome, cancel_outcome, cron_removed, purge_outcome, requeue_outcomes, reschedule_outcome
from ..protocol.connection import AsyncRedis, async_redis, is_cluster
from ..protocol.cron import CronInfo
from ..protocol.keys import Keyspace
from ..protocol.models import JobInfo, JobState
from ..protocol.options import JobOptionFields, JobOptions, with_overrides
from ..protocol.replies import merge_stats, parse_stats
from ..protocol.timeutil import At
from ..protocol.transport import NO_RETRY, TRANSIENT, AsyncScriptTransport, RetryPolicy
from .layout import follows_layout_async
from .options import UNSET, ClientOptions, info_server_command, resolve_sharded_pubsub, socket_timeout
from .settings import (
    DEFAULT_QUEUE_IDLE,
    QUEUE_IDLE_FIELD,
    config_commands,
    no_rate_limit_fields,
    parse_dead_retention,
    parse_queue_idle,
    parse_rate_limits,
    queue_idle_field,
    rate_limit_fields,
    retention_fields,
)


class AsyncClient:
    """asyncio producer client (redis.asyncio): the methods of :class:`~scheduler.Client`, as
    coroutines.

    The constructor sends nothing: the namespace's partition count is read (and fixed, for a new
    namespace) on first use or by ``await connect()`` (also ``async with``), where a mismatch with
    an explicit ``partitions`` raises :class:`~scheduler.ConfigError`. :attr:`calls` and
    :attr:`keyspace` are available once connected.

    ``cancel``, ``reschedule``, ``requeue`` and ``purge`` return an :class:`~scheduler.Outcome`:
    truthy only when the job was changed, else the member that says why not.
    """

    def __init__(self, redis_client: AsyncRedis, *, namespace: str | None = None, partitions: int | None = None,
                 max_payload_bytes: int = codec.DEFAULT_MAX_PAYLOAD, tombstone_ttl: float = 3600.0,
                 retry: RetryPolicy | None = None, durable: str | None = None, durable_replicas: int = 1,
                 durable_timeout: float = 1.0, sharded_pubsub: bool | None = None) -> None:
        """``namespace`` (default ZSCHED_NAMESPACE or ``zsched``); ``partitions``: expected count
        (default: the namespace's, 16 for a new one). ``max_payload_bytes``: largest payload
        accepted. ``tombstone_ttl``: seconds a finished job stays visible to ``get()``.
        ``retry``: how calls are retried when Redis is unreachable or a reply is lost.
        ``durable``: default durability of ``schedule``/``schedule_many`` (None, ``"replica"``,
        ``"fsync"``), waiting for ``durable_replicas`` replicas up to ``durable_timeout`` seconds.
        ``sharded_pubsub``: publish and subscribe to wake-ups with Redis 7 sharded pub/sub
        (SPUBLISH/SSUBSCRIBE on channels in each partition's slot, so a message reaches only the
        node that owns it instead of every node of a cluster); None (default): exactly when
        ``redis_client`` is a Redis Cluster client. True needs Redis >= 7. Producers, scheduler
        replicas and workers of a namespace should agree: a subscriber of the other layout does
        not hear the wake-ups and falls back to its periodic checks (later, never lost).
        Every argument is checked here; nothing is sent to Redis."""
        self.redis = redis_client
        self._opts = ClientOptions(namespace=namespace, partitions=partitions, max_payload_bytes=max_payload_bytes,
                                   tombstone_ttl=tombstone_ttl, retry=retry, durable=durable,
                                   durable_replicas=durable_replicas, durable_timeout=durable_timeout,
                                   socket_timeout=socket_timeout(redis_client),
                                   sharded=resolve_sharded_pubsub(redis_client, sharded_pubsub),
                                   cluster=is_cluster(redis_client))
        self.transport = AsyncScriptTransport(redis_client, self._opts.retry)
        self._calls: Calls | None = None

    @classmethod
    def from_url(cls, url: str | None = None, *, redis_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> AsyncClient:
        """A client for a URL (default ZSCHED_REDIS_URL): ``redis://``, ``rediss://`` (TLS),
        ``unix://`` or ``redis+sentinel://...`` (see :mod:`scheduler.protocol.connection`);
        ``redis_options``: extra redis-py connection arguments. Other arguments as for the
        constructor; nothing is sent yet."""
        return cls(async_redis(config.redis_url(url), **(redis_options or {})), **kwargs)

    async def connect(self) -> AsyncClient:
        """Read the namespace's partition count (storing the default for a new namespace), in one
        attempt: a connection error is raised at once, for callers that run their own retry loop
        (the scheduler tier, the workers). Every other method does this on first use, retried
        under the client's retry policy like the rest of the call. Idempotent. Raises ConfigError
        when the count differs from an explicit ``partitions``."""
        await self._connect(NO_RETRY)
        return self

    async def reload_layout(self) -> int:
        """Read the namespace's partition count again (after ``zsched migrate-partitions``);
        returns it. Methods do this by themselves when Redis refuses their count."""
        self._calls = None
        return (await self._connect(self._opts.retry)).ks.partitions

    async def _connect(self, retry: RetryPolicy) -> Calls:
        if self._calls is None:
            delays = retry.delays()
            while True:
                pipe = self.redis.pipeline(transaction=False)
                self._opts.partition_commands(pipe)
                try:
                    replies = await pipe.execute()
                    break
                except TRANSIENT:
                    delay = next(delays, None)
                    if delay is None:
                        raise
                    await asyncio.sleep(delay)
            self._calls = self._opts.calls(replies)
        return self._calls

    @property
    def calls(self) -> Calls:
        """The namespace's script call builder and reply parser; RuntimeError before ``connect()``."""
        if self._calls is None:
            raise RuntimeError("AsyncClient not connected yet: await client.connect() first")
        return self._calls

    @property
    def keyspace(self) -> Keyspace:
        """The namespace's key layout; RuntimeError before ``connect()``."""
        return self.calls.ks

    async def _connected(self) -> Calls:
        return self._calls or await self._connect(self._opts.retry)

    async def close(self) -> None:
        """Close the Redis connections."""
        await self.redis.aclose()

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _durability(self, durable: Any) -> dur.Durability | None:
        d = self._opts.durability(durable)
        if d is not None and d.mode == "fsync" and not self._opts.waitaof_checked:
            args, kw = info_server_command(self.redis)
            dur.require_waitaof(await self.redis.info(*args, **kw))
            self._opts.waitaof_checked = True
        return d

    # -- scheduling -------------------------------------------------------------------------------
    @follows_layout_async
    async def schedule(self, at: At, payload: Any = None, *, key: str | None = None,
                       options: JobOptions | None = None, durable: str | None = UNSET,
                       **job_options: Unpack[JobOptionFields]) -> str:
        """Schedule one job; returns its id.

        ``at``: aware datetime, timedelta from now (Redis's clock), or epoch seconds. ``key``:
        idempotency key (while a job with it is live, the existing id is returned and nothing is
        written). ``options``: a :class:`~scheduler.JobOptions`; option keywords (``queue``,
        ``max_attempts``, ``lease``, ``misfire``, ``misfire_grace``, ``backoff``, ``jitter``)
        override it field by field. ``durable``: ``"replica"`` or ``"fsync"`` to wait for the
        write to be replicated or persisted (default: the client's setting); DurabilityTimeout
        (with the id) when that is not confirmed in time. MisfiredAtSchedule when a
        ``misfire="skip"`` job was already past its grace. A lost reply is re-sent; the script
        makes that idempotent."""
        calls = self._calls or await self._connected()
        call = calls.prepare_one(at, payload, key, with_overrides(options, job_options))
        d = await self._durability(durable)
        replies = await self.transport.call_many([call], resend=self._opts.resend_schedule,
                                                 then=d.command() if d else None)
        job_id = calls.one_id(replies[0])
        if d is not None:
            d.check(replies[1], [job_id])
        return job_id

    @follows_layout_async
    async def schedule_many(self, jobs: Iterable[Sequence[Any]], *, options: JobOptions | None = None,
                            durable: str | None = UNSET, **job_options: Unpack[JobOptionFields]) -> list[str]:
        """Schedule many ``(at, payload)`` or ``(at, payload, key)`` jobs in one pipelined round trip
        (one script call per partition and 1000 jobs); returns ids in input order. Every job is
        validated before anything is written. ``options``, the option keywords and ``durable`` as
        for :meth:`schedule` (one WAIT for the whole batch; errors carry every id)."""
        calls = await self._connected()
        items = list(jobs)
        batch, pos = calls.prepare(items, with_overrides(options, job_options))
        if not batch:
            return []
        d = await self._durability(durable)
        replies = await self.transport.call_many(batch, resend=self._opts.resend_schedule,
                                                 then=d.command() if d else None)
        ids = calls.collect_ids(replies[:len(batch)], pos, len(items))
        if d is not None:
            d.check(replies[-1], ids)
        return ids

    # -- changing a job -----------------------------------------------------------------------------
    @follows_layout_async
    async def cancel(self, job_id: str) -> Outcome:
        """Cancel a scheduled or ready job: ``DONE``; else ``NOT_FOUND`` (unknown or finished),
        ``RUNNING``, ``DEAD`` (purge it) or ``CRON_OCCURRENCE`` (remove the cron instead), and
        nothing changed."""
        calls = await self._connected()
        return cancel_outcome(await self.transport.call(*calls.cancel_call(job_id)))

    @follows_layout_async
    async def reschedule(self, job_id: str, at: At) -> Outcome:
        """Move a scheduled or ready job to ``at`` (aware datetime, timedelta from now by Redis's
        clock as in :meth:`schedule`, epoch seconds): ``DONE``; else ``NOT_FOUND``, ``RUNNING``
        or ``DEAD`` (requeue it), and nothing changed."""
        calls = await self._connected()
        return reschedule_outcome(await self.transport.call(*calls.reschedule_call(job_id, calls.when(at))))

    @follows_layout_async
    async def requeue(self, job_id: str, at: At | None = None) -> Outcome:
        """Bring a dead job back with its attempts reset, now or at ``at`` (as in :meth:`reschedule`): ``DONE``, or
        ``NOT_DEAD`` when it is not dead (so a second requeue of the same job does nothing)."""
        calls = await self._connected()
        ((call, _pos),) = calls.requeue_calls([job_id], None if at is None else calls.when(at))
        return requeue_outcomes(await self.transport.call(*call))[0]

    @follows_layout_async
    async def purge(self, job_id: str) -> Outcome:
        """Delete a dead job for good: ``DONE``, or ``NOT_DEAD`` when it is not dead."""
        calls = await self._connected()
        return purge_outcome(await self.transport.call(*calls.purge_call(job_id)))

    # -- reading ----------------------------------------------------------------------------------
    @follows_layout_async
    async def get(self, job_id: str) -> JobInfo | None:
        """The job in whatever state it is (see :class:`~scheduler.JobInfo`), or None if the id is
        unknown or its tombstone expired."""
        calls = await self._connected()
        return calls.one_info(job_id, await self.transport.call(*calls.inspect_call(job_id)))

    @follows_layout_async
    async def get_many(self, job_ids: Iterable[str]) -> dict[str, JobInfo | None]:
        """Many jobs in one pipelined round trip: id -> JobInfo, or None for unknown ids. Every id
        is checked before anything is sent (a malformed one raises ValueError naming it)."""
        calls = await self._connected()
        ids = id_list(job_ids)
        batch = calls.inspect_calls(ids)
        if not batch:
            return {}
        return calls.job_infos(ids, await self.transport.call_many(batch))

    @follows_layout_async
    async def get_by_key(self, key: str) -> JobInfo | None:
        """The live job (scheduled, ready, running or dead) holding the idempotency ``key``, or None."""
        calls = await self._connected()
        job_id = control.key_holder(await self.redis.hget(calls.key_index(key), key))
        return None if job_id is None else await self.get(job_id)

    @follows_layout_async
    async def jobs(self, *, queue: str, state: str | JobState, limit: int = 100, cursor: str | None = None,
                   run_at_from: Any = None, run_at_to: Any = None) -> tuple[list[JobInfo], str | None]:
        """One page of the jobs of ``queue`` in ``state`` (``scheduled``, ``ready``, ``running`` or
        ``dead``): ``(jobs, next_cursor)``; pass ``next_cursor`` back as ``cursor`` until it is
        None. Each script call examines a bounded number of entries, so a page may be short, even
        empty, while ``next_cursor`` is not None: keep paging. A job that stays in its state is
        listed exactly once. ``limit``: 1 to 1000; a malformed cursor, or one of another listing,
        raises ValueError. ``run_at_from``/``run_at_to`` (scheduled jobs only; aware datetimes or
        epoch seconds, inclusive): only jobs due in that range, read as a range of the timer sets,
        so pages stay full; pass the same range with every page."""
        walk = (await self._connected()).list_walk(queue, state, limit, cursor, (run_at_from, run_at_to))
        while (call := walk.next_call()) is not None:
            walk.take(await self.transport.call(*call))
        return walk.result()

    @follows_layout_async
    async def dead(self, queue: str | None = None, limit: int = 100) -> list[JobInfo]:
        """The ``limit`` most recently dead-lettered jobs across partitions (optionally of one
        queue), newest first."""
        calls = await self._connected()
        return calls.dead_infos(await self.transport.call_many(calls.dead_list_calls(queue, limit)), limit)

    @follows_layout_async
    async def stats(self) -> dict[str, dict[str, int]]:
        """Per queue: counts of scheduled, ready, running and dead jobs."""
        calls = await self._connected()
        return merge_stats(map(parse_stats, await self.transport.call_many(calls.stats_calls())))

    # -- cron -------------------------------------------------------------------------------------
    @follows_layout_async
    async def add_cron(self, name: str, expression: str, payload: Any = None, *, tz: str = "UTC",
                       options: JobOptions | None = None, **job_options: Unpack[JobOptionFields]) -> str:
        """Create or replace a recurring schedule; returns the id of its pending occurrence. Each
        occurrence is an ordinary job keyed ``cron:NAME:NOMINAL_MS``; a cron always has exactly
        one pending occurrence. ``tz``: the zone the expression is read in; ``options`` and the
        option keywords as for :meth:`schedule` (``misfire``: what an outage's missed occurrences
        become; ``jitter``: at most an hour)."""
        calls = await self._connected()
        call = calls.cron_set_call(name, expression, payload, tz, with_overrides(options, job_options))
        return calls.cron_set_reply(await self.transport.call(*call))

    @follows_layout_async
    async def remove_cron(self, name: str) -> Outcome:
        """Delete a cron and cancel its pending occurrence (one already running finishes):
        ``DONE``, or ``NO_CRON`` when there is no such cron."""
        calls = await self._connected()
        return cron_removed(await self.transport.call(*calls.cron_remove_call(name)))

    @follows_layout_async
    async def pause_cron(self, name: str) -> Outcome:
        """Pause a cron: its pending occurrence is cancelled (one already running finishes) and no
        occurrence is created until :meth:`resume_cron`. ``DONE`` when paused now, ``UNCHANGED``
        when it already was, ``NO_CRON`` when there is no such cron. Idempotent."""
        calls = await self._connected()
        return control.cron_pause_status(await self.transport.call(*calls.cron_pause_call(name)))

    @follows_layout_async
    async def resume_cron(self, name: str) -> Outcome:
        """Resume a paused cron from now: its next occurrence is the first one after now; those
        that fell in the pause are not run (nor counted as missed). ``DONE`` when resumed,
        ``UNCHANGED`` when it was not paused, ``NO_CRON`` when there is no such cron."""
        calls = await self._connected()
        definition = await self.redis.hget(calls.cron_definition_key(name), "def")
        call = control.cron_resume_call(calls, name, definition, control.time_ms(await self.redis.time()))
        return Outcome.NO_CRON if call is None else control.cron_pause_status(await self.transport.call(*call))

    # -- queue pause ------------------------------------------------------------------------------
    @follows_layout_async
    async def pause(self, queue: str) -> Outcome:
        """Pause ``queue``: workers claim none of its jobs until :meth:`resume`; due jobs keep
        moving to ready and wait there (misfire is decided when a job becomes due, so waiting out a
        pause misfires nothing). Namespace-wide, kept in Redis (survives restarts of every
        process). ``DONE`` when the queue was paused now, ``UNCHANGED`` when it already was (its
        start time is kept)."""
        step = control.QueuePause(await self._connected(), queue)
        pipe = self.redis.pipeline(transaction=False)
        step.config_commands(pipe, control.time_ms(await self.redis.time()))
        return step.result(await self.transport.call_many(step.script_calls(await pipe.execute())))

    @follows_layout_async
    async def resume(self, queue: str) -> Outcome:
        """Resume a paused queue: workers claim the jobs that waited, at once. ``DONE`` when it
        was paused, ``UNCHANGED`` otherwise. Idempotent."""
        calls = await self._connected()
        replies = await self.transport.call_many(calls.resume_calls(queue))
        return control.queue_resumed(await self.redis.hdel(calls.ks.config_key, control.paused_field(queue)), replies)

    async def paused(self) -> dict[str, datetime]:
        """The paused queues: queue -> when its pause started."""
        calls = await self._connected()
        return control.paused_queues(await self.redis.hgetall(calls.ks.config_key))

    async def crons(self) -> list[CronInfo]:
        """Every cron of the namespace, by name."""
        calls = await self._connected()
        pipe = self.redis.pipeline(transaction=False)
        calls.cron_list_commands(pipe)
        names = await pipe.execute()
        pipe = self.redis.pipeline(transaction=False)
        order = calls.cron_detail_commands(pipe, names)
        details = await pipe.execute() if order else []
        ids = calls.cron_pending_ids(details)
        batch = calls.inspect_calls(ids)
        pending = calls.job_infos(ids, await self.transport.call_many(batch) if batch else [])
        return calls.cron_infos(order, details, pending)

    # -- namespace settings -------------------------------------------------------------------------
    async def set_rate_limit(self, queue: str, per_second: float, burst: float | None = None) -> None:
        """Limit how fast due jobs of ``queue`` are dispatched (jobs/s, namespace-wide); ``burst``:
        tokens that may be spent at once (default a quarter second's worth). The scheduler tier
        picks it up within a moment."""
        await self._write_config(rate_limit_fields(queue, per_second, burst), "rate")

    async def clear_rate_limit(self, queue: str) -> bool:
        """Remove a queue's rate limit (held jobs are released at once); False when it had none."""
        return bool((await self._write_config(no_rate_limit_fields(queue), "rate"))[0])

    async def rate_limits(self) -> dict[str, tuple[float, float]]:
        """Queue -> (jobs per second, burst)."""
        calls = await self._connected()
        return parse_rate_limits(await self.redis.hgetall(calls.ks.config_key))

    async def set_dead_retention(self, max_dead: int | None = None, dead_ttl: float | None = None) -> None:
        """Keep at most ``max_dead`` dead jobs in the namespace (oldest dropped first) and drop dead
        jobs older than ``dead_ttl`` seconds; ``None`` lifts that limit. Applied by the scheduler
        tier on every tick."""
        await self._write_config(retention_fields(max_dead, dead_ttl), "dead")

    async def dead_retention(self) -> tuple[int | None, float | None]:
        """(max_dead, dead_ttl seconds) as set with :meth:`set_dead_retention`; None = no limit."""
        calls = await self._connected()
        return parse_dead_retention(await self.redis.hgetall(calls.ks.config_key))

    async def set_queue_retirement(self, idle: float | None = DEFAULT_QUEUE_IDLE) -> None:
        """Retire a queue's name in a partition once the queue is empty there and idle for ``idle``
        seconds (default 1 day; ``None``: never); it comes back when a job is scheduled to it."""
        await self._write_config({QUEUE_IDLE_FIELD: queue_idle_field(idle)}, "queues")

    async def queue_retirement(self) -> float | None:
        """Seconds after which an empty, idle queue name is retired; None = never."""
        calls = await self._connected()
        return parse_queue_idle(await self.redis.hgetall(calls.ks.config_key))

    async def _write_config(self, fields: dict[str, str | None], what: str) -> list[Any]:
        calls = await self._connected()
        pipe = self.redis.pipeline(transaction=True)
        config_commands(pipe, calls.ks, fields, what)
        return await pipe.execute()
