"""The asyncio producer client, :class:`AsyncClient` (redis.asyncio)."""
from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar, Unpack, cast

from ..protocol import codec, config, control
from ..protocol import durability as dur
from ..protocol.calls import Calls, id_list
from ..protocol.codes import Outcome, cancel_outcome, cron_removed, purge_outcome, requeue_outcomes, reschedule_outcome
from ..protocol.cron import CronInfo
from ..protocol.keys import Keyspace
from ..protocol.models import JobInfo, JobState
from ..protocol.options import JobOptionFields, JobOptions, with_overrides
from ..protocol.replies import merge_stats, parse_stats
from ..protocol.timeutil import At
from ..redisio.connection import AsyncRedis, async_redis, is_cluster
from ..redisio.transport import NO_RETRY, AsyncScriptTransport, RedisRetry
from ..redisio.transport_async import lost_in_transit, send_retried_async
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
    parse_tombstone_ttl,
    queue_idle_field,
    rate_limit_fields,
    retention_fields,
    tombstone_ttl_fields,
)
from .sync import Client
from .tracing import current_trace

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def twin(sync: Callable[..., Any]) -> Callable[[F], F]:
    """The coroutine twin of the blocking client's ``sync``: one text documents both (kept in
    :class:`~scheduler.Client`), so the two cannot drift; ``tests/unit/test_client_parity.py``
    holds their signatures together too. A coroutine also raises a connection closed under one of
    its redis-py calls (a failover closing connections in use) as the ConnectionError it is
    (:func:`~scheduler.redisio.transport_async.lost_in_transit`), never as redis-py's
    AttributeError or uvloop's RuntimeError."""
    def mark(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):
            fn = cast(F, lost_in_transit(fn))
        fn.__doc__ = sync.__doc__
        return fn
    return mark


class AsyncClient:
    """asyncio producer client (redis.asyncio): the methods of :class:`~scheduler.Client`, as
    coroutines.

    The constructor sends nothing: the namespace's partition count is read (and fixed, for a new
    namespace) on first use or by ``await connect()`` (also ``async with``), where a mismatch with
    an explicit ``partitions`` raises :class:`~scheduler.ConfigError`. :attr:`calls` and
    :attr:`keyspace` are available once connected.

    The methods return what :class:`~scheduler.Client`'s return (an :class:`~scheduler.Outcome`
    for the calls that change one thing), documented there once for both.
    """

    @twin(Client.__init__)
    def __init__(self, redis_client: AsyncRedis, *, namespace: str | None = None, partitions: int | None = None,
                 max_payload_bytes: int = codec.DEFAULT_MAX_PAYLOAD,
                 tombstone_ttl: float | None = None,
                 retry: RedisRetry | None = None, durable: str | None = None, durable_replicas: int = 1,
                 durable_timeout: float = 1.0, sharded_pubsub: bool | None = None) -> None:
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
    @twin(Client.from_url)
    def from_url(cls, url: str | None = None, *, redis_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> AsyncClient:
        return cls(async_redis(config.redis_url(url), **(redis_options or {})), **kwargs)

    @twin(Client.connect)
    async def connect(self) -> AsyncClient:
        await self._connect(NO_RETRY)
        return self

    @twin(Client.reload_layout)
    async def reload_layout(self) -> int:
        self._calls = None
        return (await self._connect(self._opts.retry)).ks.partitions

    async def _connect(self, retry: RedisRetry) -> Calls:
        if self._calls is None:
            def layout() -> Awaitable[list[Any]]:
                pipe = self.redis.pipeline(transaction=False)
                self._opts.partition_commands(pipe)
                return pipe.execute()

            self._calls = self._opts.calls(await self._direct(layout, retry))
        return self._calls

    async def _direct(self, send: Callable[[], Awaitable[T]], retry: RedisRetry | None = None) -> T:
        """``send()``, plain commands the same when applied twice (a read, a settings write), sent
        again under ``retry`` (default the client's) after a transient error or a "not run" reply,
        as the transport sends scripts again: without it, the first such call after a Redis
        restart failed on the pooled connection that died with the old server."""
        return await send_retried_async(send, retry or self._opts.retry)

    async def _config(self, calls: Calls) -> dict[Any, Any]:
        return cast("dict[Any, Any]", await self._direct(lambda: self.redis.hgetall(calls.ks.config_key)))

    async def _redis_time_ms(self) -> int:
        return control.time_ms(await self._direct(self.redis.time))

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
        await self.transport.close()
        await self.redis.aclose()

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _durability(self, durable: Any) -> dur.Durability | None:
        d = self._opts.durability(durable)
        if d is not None and d.mode == "fsync" and not self._opts.waitaof_checked:
            args, kw = info_server_command(self.redis)
            dur.require_waitaof(await self._direct(lambda: self.redis.info(*args, **kw)))
            self._opts.waitaof_checked = True
        return d

    # -- scheduling -------------------------------------------------------------------------------
    @follows_layout_async
    @twin(Client.schedule)
    async def schedule(self, at: At, payload: Any = None, *, key: str | None = None,
                       options: JobOptions | None = None, durable: str | None = UNSET,
                       **job_options: Unpack[JobOptionFields]) -> str:
        calls = self._calls or await self._connected()
        call = calls.prepare_one(at, payload, key, with_overrides(options, job_options), current_trace())
        d = await self._durability(durable)
        replies = await self.transport.call_many([call], resend=self._opts.resend_schedule,
                                                 then=d.command() if d else None)
        job_id = calls.one_id(replies[0])
        if d is not None:
            d.check(replies[1], [job_id])
        return job_id

    @follows_layout_async
    @twin(Client.schedule_many)
    async def schedule_many(self, jobs: Iterable[Sequence[Any]], *, options: JobOptions | None = None,
                            durable: str | None = UNSET, ids_from: Sequence[str] | None = None,
                            **job_options: Unpack[JobOptionFields]) -> list[str]:
        calls = await self._connected()
        items = list(jobs)
        batch, pos = calls.prepare(items, with_overrides(options, job_options), ids_from, current_trace())
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
    @twin(Client.cancel)
    async def cancel(self, job_id: str) -> Outcome:
        calls = await self._connected()
        return cancel_outcome(await self.transport.call(*calls.cancel_call(job_id)))

    @follows_layout_async
    @twin(Client.reschedule)
    async def reschedule(self, job_id: str, at: At) -> Outcome:
        calls = await self._connected()
        return reschedule_outcome(await self.transport.call(*calls.reschedule_call(job_id, calls.when(at))))

    @follows_layout_async
    @twin(Client.requeue)
    async def requeue(self, job_id: str, at: At | None = None) -> Outcome:
        calls = await self._connected()
        ((call, _pos),) = calls.requeue_calls([job_id], None if at is None else calls.when(at))
        return requeue_outcomes(await self.transport.call(*call))[0]

    @follows_layout_async
    @twin(Client.purge)
    async def purge(self, job_id: str) -> Outcome:
        calls = await self._connected()
        return purge_outcome(await self.transport.call(*calls.purge_call(job_id)))

    # -- reading ----------------------------------------------------------------------------------
    @follows_layout_async
    @twin(Client.get)
    async def get(self, job_id: str) -> JobInfo | None:
        calls = await self._connected()
        return calls.one_info(job_id, await self.transport.call(*calls.inspect_call(job_id)))

    @follows_layout_async
    @twin(Client.get_many)
    async def get_many(self, job_ids: Iterable[str]) -> dict[str, JobInfo | None]:
        calls = await self._connected()
        ids = id_list(job_ids)
        batch = calls.inspect_calls(ids)
        if not batch:
            return {}
        return calls.job_infos(ids, await self.transport.call_many(batch))

    @follows_layout_async
    @twin(Client.get_by_key)
    async def get_by_key(self, key: str) -> JobInfo | None:
        calls = await self._connected()
        job_id = control.key_holder(await self._direct(lambda: self.redis.hget(calls.key_index(key), key)))
        return None if job_id is None else await self.get(job_id)

    @follows_layout_async
    @twin(Client.jobs)
    async def jobs(self, *, queue: str, state: str | JobState, limit: int = 100, cursor: str | None = None,
                   run_at_from: Any = None, run_at_to: Any = None) -> tuple[list[JobInfo], str | None]:
        walk = (await self._connected()).list_walk(queue, state, limit, cursor, (run_at_from, run_at_to))
        while calls := walk.next_calls():
            walk.take_all(await self.transport.call_many(calls))
        return walk.result()

    @follows_layout_async
    @twin(Client.dead)
    async def dead(self, queue: str | None = None, limit: int = 100) -> list[JobInfo]:
        calls = await self._connected()
        return calls.dead_infos(await self.transport.call_many(calls.dead_list_calls(queue, limit)), limit)

    @follows_layout_async
    @twin(Client.stats)
    async def stats(self) -> dict[str, dict[str, int]]:
        calls = await self._connected()
        return merge_stats(map(parse_stats, await self.transport.call_many(calls.stats_calls())))

    # -- cron -------------------------------------------------------------------------------------
    @follows_layout_async
    @twin(Client.add_cron)
    async def add_cron(self, name: str, expression: str, payload: Any = None, *, tz: str = "UTC",
                       options: JobOptions | None = None, **job_options: Unpack[JobOptionFields]) -> str:
        calls = await self._connected()
        call = calls.cron_set_call(name, expression, payload, tz, with_overrides(options, job_options))
        return calls.cron_set_reply(await self.transport.call(*call))

    @follows_layout_async
    @twin(Client.remove_cron)
    async def remove_cron(self, name: str) -> Outcome:
        calls = await self._connected()
        return cron_removed(await self.transport.call(*calls.cron_remove_call(name)))

    @follows_layout_async
    @twin(Client.pause_cron)
    async def pause_cron(self, name: str) -> Outcome:
        calls = await self._connected()
        return control.cron_pause_status(await self.transport.call(*calls.cron_pause_call(name)))

    @follows_layout_async
    @twin(Client.resume_cron)
    async def resume_cron(self, name: str) -> Outcome:
        calls = await self._connected()
        definition = await self._direct(lambda: self.redis.hget(calls.cron_definition_key(name), "def"))
        call = control.cron_resume_call(calls, name, definition, await self._redis_time_ms())
        return Outcome.NO_CRON if call is None else control.cron_pause_status(await self.transport.call(*call))

    # -- queue pause ------------------------------------------------------------------------------
    @follows_layout_async
    @twin(Client.pause)
    async def pause(self, queue: str) -> Outcome:
        step = control.QueuePause(await self._connected(), queue)
        now_ms = await self._redis_time_ms()

        def config() -> Awaitable[list[Any]]:
            pipe = self.redis.pipeline(transaction=False)
            step.config_commands(pipe, now_ms)
            return pipe.execute()

        return step.result(await self.transport.call_many(step.script_calls(await self._direct(config))))

    @follows_layout_async
    @twin(Client.resume)
    async def resume(self, queue: str) -> Outcome:
        calls = await self._connected()
        replies = await self.transport.call_many(calls.resume_calls(queue))
        deleted = await self._direct(lambda: self.redis.hdel(calls.ks.config_key, control.paused_field(queue)))
        return control.queue_resumed(deleted, replies)

    @twin(Client.paused)
    async def paused(self) -> dict[str, datetime]:
        calls = await self._connected()
        return control.paused_queues(await self._config(calls))

    @twin(Client.crons)
    async def crons(self) -> list[CronInfo]:
        calls = await self._connected()

        def listed() -> Awaitable[list[Any]]:
            pipe = self.redis.pipeline(transaction=False)
            calls.cron_list_commands(pipe)
            return pipe.execute()

        names = await self._direct(listed)
        order: list[Any] = []

        def detailed() -> Awaitable[list[Any]]:
            pipe = self.redis.pipeline(transaction=False)
            order[:] = calls.cron_detail_commands(pipe, names)
            return pipe.execute()

        details = await self._direct(detailed)  # no round trip when there is no cron
        ids = calls.cron_pending_ids(details)
        batch = calls.inspect_calls(ids)
        pending = calls.job_infos(ids, await self.transport.call_many(batch) if batch else [])
        return calls.cron_infos(order, details, pending)

    # -- namespace settings -------------------------------------------------------------------------
    @twin(Client.set_rate_limit)
    async def set_rate_limit(self, queue: str, per_second: float, burst: float | None = None) -> None:
        await self._write_config(rate_limit_fields(queue, per_second, burst), "rate")

    @twin(Client.clear_rate_limit)
    async def clear_rate_limit(self, queue: str) -> Outcome:
        return control.toggled(bool((await self._write_config(no_rate_limit_fields(queue), "rate"))[0]))

    @twin(Client.rate_limits)
    async def rate_limits(self) -> dict[str, tuple[float, float]]:
        calls = await self._connected()
        return parse_rate_limits(await self._config(calls))

    @twin(Client.set_dead_retention)
    async def set_dead_retention(self, max_dead: int | None = None, dead_ttl: float | None = None) -> None:
        await self._write_config(retention_fields(max_dead, dead_ttl), "dead")

    @twin(Client.dead_retention)
    async def dead_retention(self) -> tuple[int | None, float | None]:
        calls = await self._connected()
        return parse_dead_retention(await self._config(calls))

    @twin(Client.set_queue_retirement)
    async def set_queue_retirement(self, idle: float | None = DEFAULT_QUEUE_IDLE) -> None:
        await self._write_config({QUEUE_IDLE_FIELD: queue_idle_field(idle)}, "queues")

    @twin(Client.queue_retirement)
    async def queue_retirement(self) -> float | None:
        calls = await self._connected()
        return parse_queue_idle(await self._config(calls))

    @twin(Client.set_tombstone_ttl)
    async def set_tombstone_ttl(self, ttl: float) -> None:
        calls = await self._connected()
        await self._write_config(tombstone_ttl_fields(ttl), "tombstones")
        self._opts.use_tombstone_ttl(calls, float(ttl))

    @twin(Client.tombstone_ttl)
    async def tombstone_ttl(self) -> float:
        calls = await self._connected()
        return parse_tombstone_ttl(await self._config(calls))

    @twin(Client.reload_settings)
    async def reload_settings(self, config: Mapping[Any, Any] | None = None) -> bool:
        calls = await self._connected()
        cfg = await self._config(calls) if config is None else config
        return self._opts.use_tombstone_ttl(calls, parse_tombstone_ttl(cfg))

    async def _write_config(self, fields: dict[str, str | None], what: str) -> list[Any]:
        calls = await self._connected()

        def write() -> Awaitable[list[Any]]:  # a MULTI: applied whole or not at all, the same when re-sent
            pipe = self.redis.pipeline(transaction=True)
            config_commands(pipe, calls.ks, fields, what)
            return pipe.execute()

        return await self._direct(write)
