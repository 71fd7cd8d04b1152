"""The blocking producer client, :class:`Client` (redis-py)."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
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
from ..redisio.batch import send_retried
from ..redisio.connection import SyncRedis, is_cluster, sync_redis
from ..redisio.transport import NO_RETRY, RedisRetry, ScriptTransport
from .layout import follows_layout
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
from .tracing import current_trace

T = TypeVar("T")


class Client:
    """Blocking producer client. Thread-safe (redis-py connection pool).

    The constructor sends nothing: the namespace's partition count is read (and fixed, for a new
    namespace) on first use or by :meth:`connect`, where a mismatch with an explicit
    ``partitions`` raises :class:`~scheduler.ConfigError`.

    ``cancel``, ``reschedule``, ``requeue``, ``purge``, ``pause``, ``resume``, ``remove_cron``,
    ``pause_cron``, ``resume_cron`` and ``clear_rate_limit`` return an :class:`~scheduler.Outcome`: truthy only when
    something was changed, else the member that says why not (not found, running, dead, not dead,
    a cron's occurrence, unchanged, no such cron). They raise only for bad input (a malformed id)
    and Redis errors.

    :class:`~scheduler.AsyncClient` has the same methods, as coroutines, with the same
    documentation. The one difference: the :attr:`calls` and :attr:`keyspace` properties of this
    client connect on first use, where the asyncio client's raise before ``await connect()`` (a
    property cannot await); its methods connect on first use as these do.
    """

    def __init__(self, redis_client: SyncRedis, *, namespace: str | None = None, partitions: int | None = None,
                 max_payload_bytes: int = codec.DEFAULT_MAX_PAYLOAD,
                 tombstone_ttl: float | None = None,
                 retry: RedisRetry | None = None, durable: str | None = None, durable_replicas: int = 1,
                 durable_timeout: float = 1.0, sharded_pubsub: bool | None = None) -> None:
        """``namespace`` (default ZSCHED_NAMESPACE or ``zsched``); ``partitions``: expected count
        (default: the namespace's, 16 for a new one). ``max_payload_bytes``: largest payload
        accepted. ``tombstone_ttl``: deprecated; how long a finished job stays visible to
        ``get()`` is a namespace setting now (:meth:`set_tombstone_ttl`), read at connect; given
        here, it overrides the namespace's for this client alone (with a DeprecationWarning).
        ``retry``: how long and how often calls are retried when Redis is unreachable or a reply
        is lost (default: :data:`~scheduler.redisio.transport.DEFAULT_RETRY`, up to 10 s).
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
        self.transport = ScriptTransport(redis_client, self._opts.retry)
        self._calls: Calls | None = None
        self._connecting = threading.Lock()

    @classmethod
    def from_url(cls, url: str | None = None, *, redis_options: dict[str, Any] | None = None,
                 **kwargs: Any) -> Client:
        """A client for a URL (default ZSCHED_REDIS_URL): ``redis://``, ``rediss://`` (TLS),
        ``unix://`` or ``redis+sentinel://host:port[,host:port...]/MASTER[/db]`` (see
        :mod:`scheduler.redisio.connection`); user:password@ for ACL. ``redis_options``: extra
        redis-py connection arguments (e.g. ``socket_timeout``). Other arguments as for the
        constructor; nothing is sent yet."""
        return cls(sync_redis(config.redis_url(url), **(redis_options or {})), **kwargs)

    def connect(self) -> Client:
        """Read the namespace's partition count (storing the default for a new namespace), in one
        attempt: a connection error is raised at once. Every other method does this on first use,
        retried under the client's retry policy like the rest of the call (callers with a retry
        loop of their own, as the scheduler tier and the workers, call this). Idempotent (and
        thread-safe on the blocking client). Raises ConfigError when the count differs from an
        explicit ``partitions``."""
        self._connect(NO_RETRY)
        return self

    def reload_layout(self) -> int:
        """Read the namespace's partition count again (after ``zsched migrate-partitions``);
        returns it. Methods do this by themselves when Redis refuses their count."""
        with self._connecting:
            self._calls = None
        return self._connect(self._opts.retry).ks.partitions

    def _connect(self, retry: RedisRetry) -> Calls:
        with self._connecting:
            if self._calls is None:
                def layout() -> list[Any]:
                    pipe = self.redis.pipeline(transaction=False)
                    self._opts.partition_commands(pipe)
                    return cast("list[Any]", pipe.execute())

                self._calls = self._opts.calls(self._direct(layout, retry))
            return self._calls

    def _direct(self, send: Callable[[], T], retry: RedisRetry | None = None) -> T:
        """``send()``, plain commands the same when applied twice (a read, a settings write), sent
        again under ``retry`` (default the client's) after a transient error or a "not run" reply
        (a Redis loading its data, a master turned replica), as the transport sends scripts again."""
        return send_retried(send, retry or self._opts.retry)

    def _config(self) -> dict[Any, Any]:
        key = self.keyspace.config_key
        return cast("dict[Any, Any]", self._direct(lambda: self.redis.hgetall(key)))

    def _redis_time_ms(self) -> int:
        return control.time_ms(self._direct(self.redis.time))

    @property
    def calls(self) -> Calls:
        """The namespace's script call builder and reply parser (connects on first use)."""
        return self._calls or self._connect(self._opts.retry)

    @property
    def keyspace(self) -> Keyspace:
        """The namespace's key layout (connects on first use)."""
        return self.calls.ks

    def close(self) -> None:
        """Close the Redis connections."""
        self.redis.close()

    def __enter__(self) -> Client:
        return self.connect()  # as ``async with AsyncClient(...)`` does

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _durability(self, durable: Any) -> dur.Durability | None:
        d = self._opts.durability(durable)
        if d is not None and d.mode == "fsync" and not self._opts.waitaof_checked:
            args, kw = info_server_command(self.redis)
            dur.require_waitaof(self._direct(lambda: self.redis.info(*args, **kw)))
            self._opts.waitaof_checked = True
        return d

    # -- scheduling -------------------------------------------------------------------------------
    @follows_layout
    def schedule(self, at: At, payload: Any = None, *, key: str | None = None, options: JobOptions | None = None,
                 durable: str | None = UNSET, **job_options: Unpack[JobOptionFields]) -> str:
        """Schedule one job; returns its id.

        ``at``: aware datetime, timedelta from now (Redis's clock), or epoch seconds. ``key``:
        idempotency key; while a job with that key is live, scheduling again returns the existing
        id and writes nothing. ``options``: a :class:`~scheduler.JobOptions`; the same options as
        keywords (``queue``, ``max_attempts``, ``lease``, ``misfire``, ``misfire_grace``,
        ``backoff``, ``jitter``) override it field by field. ``durable``: ``"replica"`` (wait
        until ``durable_replicas`` replicas have the job) or ``"fsync"`` (wait for the master's
        AOF fsync, Redis 7.2+); default: the client's setting.

        Raises :class:`~scheduler.protocol.errors.DurabilityTimeout` (with the id) when that is not
        confirmed in time: the job may exist; :class:`~scheduler.protocol.errors.MisfiredAtSchedule`
        when a ``misfire="skip"`` job was already past its grace. A call whose reply is lost
        (timeout, dropped connection) is re-sent under the client's retry policy; the script makes
        the re-send idempotent, so a job is never created twice."""
        calls = self._calls or self.calls
        call = calls.prepare_one(at, payload, key, with_overrides(options, job_options), current_trace())
        d = self._durability(durable)
        if d is None and self._opts.resend_schedule:
            return calls.one_id(self.transport.call(*call))
        replies = self.transport.call_many([call], resend=self._opts.resend_schedule, then=d.command() if d else None)
        job_id = calls.one_id(replies[0])
        if d is not None:
            d.check(replies[1], [job_id])
        return job_id

    @follows_layout
    def schedule_many(self, jobs: Iterable[Sequence[Any]], *, options: JobOptions | None = None,
                      durable: str | None = UNSET, ids_from: Sequence[str] | None = None,
                      **job_options: Unpack[JobOptionFields]) -> list[str]:
        """Schedule many ``(at, payload)`` or ``(at, payload, key)`` jobs in one pipelined round trip
        (one script call per partition and 1000 jobs); returns ids in input order. Every job is
        validated before anything is written. ``options``, the option keywords and ``durable``: as
        for :meth:`schedule` (one WAIT for the whole batch; a DurabilityTimeout or
        MisfiredAtSchedule carries every id). ``ids_from``: a stable name per job (``"orders:42"``)
        from which its id is derived, with absolute times: sending the same batch again (after a
        crash before you recorded that it was sent) creates none of its jobs that exist or
        finished within the tombstone TTL, and returns their ids; what ``zsched relay`` uses."""
        calls = self.calls
        items = list(jobs)
        batch, pos = calls.prepare(items, with_overrides(options, job_options), ids_from, current_trace())
        if not batch:
            return []
        d = self._durability(durable)
        replies = self.transport.call_many(batch, resend=self._opts.resend_schedule, then=d.command() if d else None)
        ids = calls.collect_ids(replies[:len(batch)], pos, len(items))
        if d is not None:
            d.check(replies[-1], ids)
        return ids

    # -- changing a job -----------------------------------------------------------------------------
    @follows_layout
    def cancel(self, job_id: str) -> Outcome:
        """Cancel a scheduled or ready job: ``DONE``; else ``NOT_FOUND`` (unknown or finished),
        ``RUNNING``, ``DEAD`` (purge it) or ``CRON_OCCURRENCE`` (remove the cron instead), and
        nothing changed."""
        return cancel_outcome(self.transport.call(*self.calls.cancel_call(job_id)))

    @follows_layout
    def reschedule(self, job_id: str, at: At) -> Outcome:
        """Move a scheduled or ready job to ``at`` (aware datetime, timedelta from now by Redis's
        clock as in :meth:`schedule`, epoch seconds): ``DONE``; else ``NOT_FOUND``, ``RUNNING``
        or ``DEAD`` (requeue it), and nothing changed."""
        call = self.calls.reschedule_call(job_id, self.calls.when(at))
        return reschedule_outcome(self.transport.call(*call))

    @follows_layout
    def requeue(self, job_id: str, at: At | None = None) -> Outcome:
        """Bring a dead job back with its attempts reset, now or at ``at`` (as in :meth:`reschedule`): ``DONE``, or
        ``NOT_DEAD`` when it is not dead (so a second requeue of the same job does nothing)."""
        ((call, _pos),) = self.calls.requeue_calls([job_id], None if at is None else self.calls.when(at))
        return requeue_outcomes(self.transport.call(*call))[0]

    @follows_layout
    def purge(self, job_id: str) -> Outcome:
        """Delete a dead job for good: ``DONE``, or ``NOT_DEAD`` when it is not dead."""
        return purge_outcome(self.transport.call(*self.calls.purge_call(job_id)))

    # -- reading ----------------------------------------------------------------------------------
    @follows_layout
    def get(self, job_id: str) -> JobInfo | None:
        """The job in whatever state it is (see :class:`~scheduler.JobInfo` for the fields per
        state), or None if the id is unknown or its tombstone expired."""
        calls = self.calls
        return calls.one_info(job_id, self.transport.call(*calls.inspect_call(job_id)))

    @follows_layout
    def get_many(self, job_ids: Iterable[str]) -> dict[str, JobInfo | None]:
        """Many jobs in one pipelined round trip (one ``inspect`` call per partition and 500 ids):
        id -> JobInfo, or None for unknown ids. Every id is checked before anything is sent (a
        malformed one raises ValueError naming it)."""
        calls = self.calls
        ids = id_list(job_ids)
        batch = calls.inspect_calls(ids)
        if not batch:
            return {}
        return calls.job_infos(ids, self.transport.call_many(batch))

    @follows_layout
    def get_by_key(self, key: str) -> JobInfo | None:
        """The live job (scheduled, ready, running or dead) holding the idempotency ``key``, or None."""
        calls = self.calls
        job_id = control.key_holder(self._direct(lambda: self.redis.hget(calls.key_index(key), key)))
        return None if job_id is None else self.get(job_id)

    @follows_layout
    def jobs(self, *, queue: str, state: str | JobState, limit: int = 100, cursor: str | None = None,
             run_at_from: Any = None, run_at_to: Any = None) -> tuple[list[JobInfo], str | None]:
        """One page of the jobs of ``queue`` in ``state`` (``scheduled``, ``ready``, ``running`` or
        ``dead``): returns ``(jobs, next_cursor)``; pass ``next_cursor`` back as ``cursor`` for the
        next page, until it is None.

        Scheduled jobs are listed by run_at across every partition (those held back by a rate
        limit, already due, first), running jobs by lease deadline, dead ones by time of death
        (oldest first), ties by id: each page merges what every partition has next (one pipelined
        round trip per round). Ready jobs are listed partition after partition, each in the order
        workers claim them. Nothing is loaded whole: each script call examines a bounded number
        of entries (timers of every queue share one set per partition), so a page may hold fewer
        than ``limit`` jobs, even none, while ``next_cursor`` is not None: keep paging. A job that
        stays in its state is listed exactly once; one that moves meanwhile (fired, claimed,
        retried) may be missed or listed again. ``limit``: 1 to 1000. The cursor is an opaque
        string, checked on input (ValueError when it is malformed or belongs to another listing).

        ``run_at_from``/``run_at_to`` (scheduled jobs only; aware datetimes or epoch seconds,
        inclusive; None: open end): only the jobs due in that range. The range is read from the
        timer sets by score (a ZRANGE by rank between its ends), so the scan budget is spent only
        on jobs in range and pages are full whenever enough jobs match. Pass the same range with
        every page of the listing. Another state with a range raises ValueError."""
        walk = self.calls.list_walk(queue, state, limit, cursor, (run_at_from, run_at_to))
        while calls := walk.next_calls():
            walk.take_all(self.transport.call_many(calls))
        return walk.result()

    @follows_layout
    def dead(self, queue: str | None = None, limit: int = 100) -> list[JobInfo]:
        """The ``limit`` most recently dead-lettered jobs across partitions (optionally of one
        queue), newest first."""
        calls = self.calls
        return calls.dead_infos(self.transport.call_many(calls.dead_list_calls(queue, limit)), limit)

    @follows_layout
    def stats(self) -> dict[str, dict[str, int]]:
        """Per queue: counts of scheduled, ready, running and dead jobs."""
        return merge_stats(map(parse_stats, self.transport.call_many(self.calls.stats_calls())))

    # -- cron -------------------------------------------------------------------------------------
    @follows_layout
    def add_cron(self, name: str, expression: str, payload: Any = None, *, tz: str = "UTC",
                 options: JobOptions | None = None, **job_options: Unpack[JobOptionFields]) -> str:
        """Create or replace a recurring schedule; returns the id of its pending occurrence.

        Each occurrence is an ordinary job (retries, leases, dead-letter) whose idempotency key is
        ``cron:NAME:NOMINAL_MS``; a cron always has exactly one pending occurrence, and the
        scheduler tier schedules the next one in the same atomic step that fires the current one.
        ``tz``: the zone the expression is read in. ``options`` and the option keywords as for
        :meth:`schedule`: ``misfire`` after an outage: ``run_late`` fires one catch-up run (the
        handler sees the nominal time and how many were missed, ``job.cron``), ``skip`` drops the
        missed ones; ``jitter``: each occurrence fires uniformly within [nominal, nominal + jitter]
        seconds (at most an hour)."""
        calls = self.calls
        call = calls.cron_set_call(name, expression, payload, tz, with_overrides(options, job_options))
        return calls.cron_set_reply(self.transport.call(*call))

    @follows_layout
    def remove_cron(self, name: str) -> Outcome:
        """Delete a cron and cancel its pending occurrence (one already running finishes):
        ``DONE``, or ``NO_CRON`` when there is no such cron."""
        return cron_removed(self.transport.call(*self.calls.cron_remove_call(name)))

    @follows_layout
    def pause_cron(self, name: str) -> Outcome:
        """Pause a cron: its pending occurrence is cancelled (one already running finishes) and no
        occurrence is created until :meth:`resume_cron`. ``DONE`` when paused now, ``UNCHANGED``
        when it already was, ``NO_CRON`` when there is no such cron. Idempotent."""
        return control.cron_pause_status(self.transport.call(*self.calls.cron_pause_call(name)))

    @follows_layout
    def resume_cron(self, name: str) -> Outcome:
        """Resume a paused cron from now: its next occurrence is the first one after now; those
        that fell in the pause are not run (nor counted as missed). ``DONE`` when resumed,
        ``UNCHANGED`` when it was not paused, ``NO_CRON`` when there is no such cron."""
        calls = self.calls
        definition = self._direct(lambda: self.redis.hget(calls.cron_definition_key(name), "def"))
        call = control.cron_resume_call(calls, name, definition, self._redis_time_ms())
        return Outcome.NO_CRON if call is None else control.cron_pause_status(self.transport.call(*call))

    # -- queue pause ------------------------------------------------------------------------------
    @follows_layout
    def pause(self, queue: str) -> Outcome:
        """Pause ``queue``: workers claim none of its jobs until :meth:`resume`; due jobs keep
        moving to ready and wait there (misfire is decided when a job becomes due, so waiting out a
        pause misfires nothing). Namespace-wide, kept in Redis (survives restarts of every
        process). ``DONE`` when the queue was paused now, ``UNCHANGED`` when it already was (its
        start time is kept)."""
        step = control.QueuePause(self.calls, queue)
        now_ms = self._redis_time_ms()

        def config() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)
            step.config_commands(pipe, now_ms)
            return cast("list[Any]", pipe.execute())

        return step.result(self.transport.call_many(step.script_calls(self._direct(config))))

    @follows_layout
    def resume(self, queue: str) -> Outcome:
        """Resume a paused queue: workers claim the jobs that waited, at once. ``DONE`` when it
        was paused, ``UNCHANGED`` otherwise. Idempotent."""
        calls = self.calls
        replies = self.transport.call_many(calls.resume_calls(queue))
        deleted = self._direct(lambda: self.redis.hdel(calls.ks.config_key, control.paused_field(queue)))
        return control.queue_resumed(deleted, replies)

    def paused(self) -> dict[str, datetime]:
        """The paused queues: queue -> when its pause started."""
        return control.paused_queues(self._config())

    def crons(self) -> list[CronInfo]:
        """Every cron of the namespace, by name."""
        calls = self.calls

        def listed() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)
            calls.cron_list_commands(pipe)
            return cast("list[Any]", pipe.execute())

        names = self._direct(listed)
        order: list[tuple[int, str]] = []

        def detailed() -> list[Any]:
            pipe = self.redis.pipeline(transaction=False)
            order[:] = calls.cron_detail_commands(pipe, names)
            return cast("list[Any]", pipe.execute())

        details = self._direct(detailed)  # no round trip when there is no cron
        ids = calls.cron_pending_ids(details)
        batch = calls.inspect_calls(ids)
        pending = calls.job_infos(ids, self.transport.call_many(batch) if batch else [])
        return calls.cron_infos(order, details, pending)

    # -- namespace settings -------------------------------------------------------------------------
    def set_rate_limit(self, queue: str, per_second: float, burst: float | None = None) -> None:
        """Limit how fast due jobs of ``queue`` are dispatched (jobs/s, namespace-wide), so a herd
        drains as a steady stream, oldest first. ``burst``: tokens that may be spent at once
        (default a quarter second's worth). Takes effect on the scheduler tier within a moment
        (pub/sub), or 5 s at most."""
        self._write_config(rate_limit_fields(queue, per_second, burst), "rate")

    def clear_rate_limit(self, queue: str) -> Outcome:
        """Remove a queue's rate limit; jobs it held back are released at once. ``DONE``, or
        ``UNCHANGED`` when the queue had none."""
        return control.toggled(bool(self._write_config(no_rate_limit_fields(queue), "rate")[0]))

    def rate_limits(self) -> dict[str, tuple[float, float]]:
        """Queue -> (jobs per second, burst)."""
        return parse_rate_limits(self._config())

    def set_dead_retention(self, max_dead: int | None = None, dead_ttl: float | None = None) -> None:
        """Bound the dead-letter set: keep at most ``max_dead`` dead jobs in the namespace (each of
        the P partitions keeps ceil(max_dead / P), oldest dropped first) and drop dead jobs older
        than ``dead_ttl`` seconds; ``None`` lifts that limit. The scheduler tier applies it on
        every tick; each dropped job is counted (``zsched_jobs_total{event="dropped"}``) and
        logged with its id by the replica that dropped it."""
        self._write_config(retention_fields(max_dead, dead_ttl), "dead")

    def dead_retention(self) -> tuple[int | None, float | None]:
        """(max_dead, dead_ttl seconds) as set with :meth:`set_dead_retention`; None = no limit."""
        return parse_dead_retention(self._config())

    def set_queue_retirement(self, idle: float | None = DEFAULT_QUEUE_IDLE) -> None:
        """Retire a queue's name (its interned index, gauges and counters) in a partition once the
        queue is empty there and has seen no job scheduled or finished for ``idle`` seconds
        (default 1 day; ``None``: never). Each partition interns at most 65535 names, so a
        namespace that creates queue names over time needs this; a retired name comes back as
        soon as a job is scheduled to it (its counters then start from 0)."""
        self._write_config({QUEUE_IDLE_FIELD: queue_idle_field(idle)}, "queues")

    def queue_retirement(self) -> float | None:
        """Seconds after which an empty, idle queue name is retired; None = never."""
        return parse_queue_idle(self._config())

    def set_tombstone_ttl(self, ttl: float) -> None:
        """How long a finished job (done, cancelled, misfired) stays visible to ``get()``, in
        seconds (0: not at all; default 1 h), for the whole namespace. Stored with the namespace
        like its partition count: this client uses it at once, the scheduler tier within a moment
        (pub/sub, 5 s at most), workers within 5 s, other producers when they connect or call
        :meth:`reload_settings`. Each tombstone costs about 100 B of Redis memory: at thousands of
        jobs per second a shorter TTL saves memory; below twice the client's retry budget a
        producer no longer re-sends a ``schedule`` whose reply was lost."""
        self._write_config(tombstone_ttl_fields(ttl), "tombstones")
        self._opts.use_tombstone_ttl(self.calls, float(ttl))

    def tombstone_ttl(self) -> float:
        """The namespace's tombstone TTL in seconds, as set with :meth:`set_tombstone_ttl`."""
        return parse_tombstone_ttl(self._config())

    def reload_settings(self, config: Mapping[Any, Any] | None = None) -> bool:
        """Read again the namespace settings this client applies itself (the tombstone TTL);
        True when one changed. ``config``: the namespace config hash, when the caller has just
        read it (the scheduler tier, on every change), so it is not read twice. Workers do this
        every few seconds; a long-lived producer may call it, or reconnect."""
        calls = self.calls
        cfg = self._config() if config is None else config
        return self._opts.use_tombstone_ttl(calls, parse_tombstone_ttl(cfg))

    def _write_config(self, fields: dict[str, str | None], what: str) -> list[Any]:
        ks = self.keyspace

        def write() -> list[Any]:  # a MULTI: applied whole or not at all, the same when re-sent
            pipe = self.redis.pipeline(transaction=True)
            config_commands(pipe, ks, fields, what)
            return cast("list[Any]", pipe.execute())

        return self._direct(write)
