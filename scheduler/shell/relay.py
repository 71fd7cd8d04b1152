"""The outbox relay (``zsched relay``): moves committed outbox rows of one namespace into zsched.
Each batch is one PostgreSQL transaction: ``SELECT ... ORDER BY id LIMIT batch FOR UPDATE SKIP
LOCKED`` (so any number of relays share a table without waiting on or moving each other's rows),
``schedule_many`` per (queue, options) group with each row's key as the idempotency key and an id
derived from the row (``ids_from``), ``DELETE`` of the moved rows, COMMIT. A relay killed between
the schedule and the commit leaves its rows to the next relay: its send derives the same ids and the
schedule script, told that these may be re-sent, creates none of the jobs that exist or left a
tombstone (a job that already ran in that window included), so a row makes one job. A row zsched
refuses (a payload over this relay's limit, options written by hand that do not check) is marked
with its ``error`` and left for the operator, not retried forever in front of the others.

The relay drains while batches come back full, then waits for a notification (``LISTEN`` on a
separate connection, the table's channel, the namespace as payload) or the poll interval, the
safety net for a notification lost while the listener reconnected. PostgreSQL and Redis outages
are ridden out with capped backoff, one log line per outage and one when it ends.
"""
from __future__ import annotations

import asyncio
import logging
import random
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..client import AsyncClient
from ..client.outbox import channel, derived_key, row_options, table_name
from ..protocol.codec import unpack_payload
from ..protocol.errors import (
    LayoutChanged,
    MisfiredAtSchedule,
    PayloadError,
    ScriptArgumentError,
    ZschedError,
    failure_kind,
)
from ..protocol.masking import mask_secrets
from ..protocol.timeutil import ms_to_datetime
from ..redisio.connection import permanent_failure

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("zsched.relay")

DEFAULT_BATCH = 1000
DEFAULT_POLL = 5.0
STATS_EVERY = 5.0  # seconds between the waiting-rows count (a COUNT over the namespace's index)
STOP_GRACE = 3.0  # seconds a batch in flight at a stop signal has to commit before it is cancelled
BACKOFF_BASE, BACKOFF_CAP = 0.1, 5.0
CONNECT_TIMEOUT = 5  # seconds: a PostgreSQL that does not answer is an outage, not a hang
# PostgreSQL refusals that no retry can fix (the CLI exits with one line instead)
_PERMANENT = re.compile(r"authentication failed|no pg_hba\.conf entry|database \".*\" does not exist|role \".*\" "
                        r"does not exist|invalid dsn|invalid connection option|missing \"=\"", re.I)
# Redis failures a retry may fix; ScriptArgumentError: a script refused a call the client had
# checked (a version mismatch while scripts roll out), not any row's fault
REDIS_ERRORS = (redis.RedisError, OSError, LayoutChanged, ScriptArgumentError)


class RelayStopped(ZschedError):
    """The relay cannot go on: a refusal no retry can fix (bad credentials, no such database, the
    outbox table missing). The message says what and how to fix it."""

    def __init__(self, message: str, missing_table: bool = False) -> None:
        super().__init__(message)
        self.missing_table = missing_table


class RelayMetrics:
    """The relay's Prometheus metrics, in a registry of their own (``--metrics-port`` serves it)."""

    def __init__(self, namespace: str, table: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = {"namespace": namespace, "table": table}
        names = list(labels)
        self.waiting = Gauge("zsched_outbox_rows_waiting", "Outbox rows of the namespace not yet moved (counted "
                             f"every {STATS_EVERY:g} s)", names, registry=self.registry).labels(**labels)
        self.oldest = Gauge("zsched_outbox_oldest_row_age_seconds", "Age of the oldest outbox row not yet moved "
                            "(0 when none)", names, registry=self.registry).labels(**labels)
        self.moved = Counter("zsched_outbox_rows_moved", "Outbox rows moved into zsched, by outcome: scheduled, "
                             "misfired (a misfire='skip' job past its grace), rejected (left with its error)",
                             [*names, "outcome"], registry=self.registry)
        self.batch_seconds = Histogram("zsched_outbox_batch_seconds", "One batch: select, schedule, delete, commit",
                                       names, registry=self.registry).labels(**labels)
        self.delay = Histogram("zsched_outbox_delay_seconds", "From a row's insert to its job scheduled",
                               names, buckets=(.005, .01, .02, .05, .1, .2, .5, 1, 2, 5, 10, 30, 60, 300),
                               registry=self.registry).labels(**labels)
        self.labels = labels

    def count(self, outcome: str, n: int) -> None:
        """Add ``n`` rows moved with ``outcome``."""
        if n:
            self.moved.labels(**self.labels, outcome=outcome).inc(n)


class Outage:
    """One store's outage (PostgreSQL or Redis): logged once when it starts, every 30 s while it
    lasts, once when it ends; capped, jittered backoff."""

    def __init__(self, store: str, where: str) -> None:
        self.store, self.where = store, where
        self.failures = 0
        self.since = self.last_log = 0.0
        self.kind = ""

    def failed(self, exc: BaseException) -> float:
        """Count a failure (logged as said); the seconds to wait before the next try."""
        now, kind = time.monotonic(), failure_kind(exc)
        why = " ".join(mask_secrets(f"{type(exc).__name__}: {exc}").split())  # psycopg's messages span lines
        if self.failures == 0 or kind != self.kind:
            self.since = now if self.failures == 0 else self.since
            self.last_log, self.kind = now, kind
            log.warning("relay: %s at %s unavailable (%s); retrying with backoff", self.store, self.where, why)
        elif now - self.last_log > 30:
            self.last_log = now
            log.warning("relay: %s still unavailable after %.0f s (%s)", self.store, now - self.since, why)
        self.failures += 1
        return float(min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(self.failures - 1, 20)) * random.uniform(0.5, 1.0))

    def ok(self) -> None:
        """A round trip went through: log the end of the outage, if any."""
        if self.failures:
            log.info("relay: %s reachable again after %.1f s", self.store, time.monotonic() - self.since)
            self.failures = 0


@dataclass(frozen=True, slots=True)
class _Statements:
    select: str
    delete: str
    reject: str
    stats: str
    exists: str


def _statements(table: str) -> _Statements:
    t = table_name(table)
    return _Statements(
        select=("SELECT id, queue, run_at_ms, payload, key, options::text, "
                "extract(epoch FROM clock_timestamp() - created_at)::float8 "
                f"FROM {t} WHERE namespace = %s AND error IS NULL ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED"),
        delete=f"DELETE FROM {t} WHERE id = ANY(%s)",
        reject=f"UPDATE {t} SET error = %s WHERE id = %s",
        # one index scan for the count, one index probe for the oldest
        stats=(f"SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - (SELECT created_at FROM {t} "
               "WHERE namespace = %s AND error IS NULL ORDER BY id LIMIT 1))::float8, 0) "
               f"FROM {t} WHERE namespace = %s AND error IS NULL"),
        exists="SELECT to_regclass(%s) IS NOT NULL",
    )


def postgres_where(conn: Any) -> str:
    """``host:port/dbname`` of a connection, for log lines (no credentials)."""
    return mask_secrets(f"{conn.info.host}:{conn.info.port}/{conn.info.dbname}")


class Relay:
    """Moves the committed rows of ``namespace`` in the outbox ``table`` of the PostgreSQL at
    ``dsn`` into zsched through ``client``. :meth:`run` until ``stop`` is set.

    ``on_moved`` (optional) is called after each batch commits with the keys of the jobs it
    scheduled (the benchmark times commit-to-scheduled with it)."""

    def __init__(self, client: AsyncClient, dsn: str, *, namespace: str, table: str, batch: int = DEFAULT_BATCH,
                 poll: float = DEFAULT_POLL, metrics: RelayMetrics | None = None, redis_where: str = "Redis",
                 on_moved: Callable[[list[str]], None] | None = None) -> None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a whole number of rows from 1, got {batch!r}")
        if not poll > 0:
            raise ValueError(f"poll must be more than 0 seconds, got {poll!r}")
        self.client, self.dsn, self.namespace = client, dsn, namespace
        self.table, self.channel = table_name(table), channel(table)
        self.batch, self.poll, self.metrics, self.on_moved = batch, poll, metrics, on_moved
        self.st = _statements(table)
        self.pg = Outage("PostgreSQL", mask_secrets(dsn))
        self.redis = Outage("Redis", redis_where)
        self.wake = asyncio.Event()
        self.moved = 0  # rows moved by this relay (scheduled, misfired or rejected)
        self.rejected = 0
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._next_stats = 0.0

    # -- connections --------------------------------------------------------------------------------
    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        import psycopg
        try:
            return await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
        except psycopg.OperationalError as exc:
            text = " ".join(str(exc).split())
            if _PERMANENT.search(text):
                raise RelayStopped(f"PostgreSQL at {mask_secrets(self.dsn)} refused the connection: "
                                   f"{mask_secrets(text)} (check --postgres / ZSCHED_POSTGRES_URL)") from None
            raise

    async def _work_conn(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is None or self._conn.closed:
            conn = await self._connect()
            try:
                cur = await conn.execute(self.st.exists, (self.table,))
                found = await cur.fetchone()
            except BaseException:
                await conn.close()
                raise
            if not (found and found[0]):
                where = postgres_where(conn)
                await conn.close()
                raise RelayStopped(f"the outbox table {self.table} does not exist in {where}; create "
                                   f"it with 'zsched outbox apply --postgres URL --table {self.table}'",
                                   missing_table=True)
            self._conn = conn
        return self._conn

    async def close(self) -> None:
        """Close the batch connection (:meth:`run` does it itself; for callers of :meth:`drain`)."""
        await self._drop_conn()

    async def _drop_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # a dead connection may fail to close; it is gone either way
                pass

    # -- one batch ----------------------------------------------------------------------------------
    async def move_batch(self) -> int:
        """Move at most one batch in one transaction; the number of rows it took (moved or rejected)."""
        conn = await self._work_conn()
        started = time.perf_counter()
        async with conn.transaction():
            cur = await conn.execute(self.st.select, (self.namespace, self.batch))
            rows = await cur.fetchall()
            if not rows:
                return 0
            keys, delays, rejected = await self._schedule(rows)
            for row_id, why in rejected.items():
                await conn.execute(self.st.reject, (why, row_id))
            await conn.execute(self.st.delete, ([r[0] for r in rows if r[0] not in rejected],))
        took = time.perf_counter() - started
        self.moved += len(rows)
        self.rejected += len(rejected)
        if self.metrics is not None:
            self.metrics.batch_seconds.observe(took)
            for d in delays:
                self.metrics.delay.observe(d + took)
            self.metrics.count("rejected", len(rejected))
        if self.on_moved is not None:
            self.on_moved(keys)
        return len(rows)

    async def _schedule(self, rows: list[Any]) -> tuple[list[str], list[float], dict[int, str]]:
        """Schedule the rows' jobs, grouped by (queue, options); the keys scheduled, the rows'
        waits so far, and the rows refused (id -> why)."""
        groups: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for row in rows:
            groups[(row[1], row[5])].append(row)
        keys: list[str] = []
        delays: list[float] = []
        rejected: dict[int, str] = {}
        limit = self.client.calls.max_payload
        for (queue, options), group in groups.items():
            try:
                opts = row_options(queue, options)
            except (TypeError, ValueError) as exc:
                rejected.update((r[0], f"options: {exc}") for r in group)
                continue
            items: list[tuple[Any, Any, str]] = []
            for row in group:
                try:
                    payload = unpack_payload(bytes(row[3]), limit)
                    items.append((ms_to_datetime(row[2]), payload, row[4] or derived_key(self.table, row[0])))
                except (PayloadError, ValueError, OverflowError) as exc:
                    rejected[row[0]] = str(exc)
            good = [r for r in group if r[0] not in rejected]
            items, good = await self._send(items, good, opts, rejected)
            keys += [key for _at, _payload, key in items]
            delays += [float(r[6]) for r in good]
        return keys, delays, rejected

    async def _send(self, items: list[Any], rows: list[Any], opts: Any,
                    rejected: dict[int, str]) -> tuple[list[Any], list[Any]]:
        """``schedule_many`` of one group. Input the client refuses (it checks every job before it
        writes any) is narrowed to the rows at fault, which are refused, and the rest sent."""
        if not items:
            return items, rows
        try:
            await self._schedule_many(items, rows, opts)
            return items, rows
        except (TypeError, ValueError) as exc:
            if isinstance(exc, REDIS_ERRORS):
                raise
            calls = self.client.calls
            for item, row in zip(items, rows):
                try:
                    calls.prepare([item], opts)
                except (TypeError, ValueError) as one:
                    rejected[row[0]] = str(one)
            if not any(row[0] in rejected for row in rows):
                raise  # not one row's fault (e.g. a script's refusal): retried as an outage
            kept = [(i, r) for i, r in zip(items, rows) if r[0] not in rejected]
            items, rows = [i for i, _ in kept], [r for _, r in kept]
            if items:
                await self._schedule_many(items, rows, opts)
            return items, rows

    async def _schedule_many(self, items: list[Any], rows: list[Any], opts: Any) -> None:
        # Each job's id derives from its row (ids_from): a relay killed after this and before its
        # COMMIT leaves the rows to the next one, whose send finds the jobs, or the tombstones of
        # those that already ran, and creates nothing.
        try:
            names = [derived_key(self.table, r[0]) for r in rows]
            await self.client.schedule_many(items, options=opts, ids_from=names)
            outcome_counts = {"scheduled": len(items)}
        except MisfiredAtSchedule as exc:  # created as misfired tombstones: moved, as Client.schedule would
            outcome_counts = {"scheduled": len(items) - len(exc.misfired), "misfired": len(exc.misfired)}
        if self.metrics is not None:
            for outcome, n in outcome_counts.items():
                self.metrics.count(outcome, n)

    async def _stats(self) -> None:
        if self.metrics is None or time.monotonic() < self._next_stats:
            return
        self._next_stats = time.monotonic() + STATS_EVERY
        conn = await self._work_conn()
        cur = await conn.execute(self.st.stats, (self.namespace, self.namespace))
        row = await cur.fetchone()
        if row is not None:
            self.metrics.waiting.set(row[0])
            self.metrics.oldest.set(max(0.0, row[1]))

    # -- loops --------------------------------------------------------------------------------------
    async def drain(self) -> int:
        """Move batches while they come back full; the rows moved."""
        total = 0
        while True:
            n = await self.move_batch()
            total += n
            if n < self.batch:
                return total

    async def run(self, stop: asyncio.Event) -> None:
        """Move rows until ``stop`` is set: drain, then wait for a notification or the poll
        interval; outages are retried with backoff. Raises :class:`RelayStopped` for a refusal no
        retry can fix."""
        listener = asyncio.create_task(self._listen(stop))
        try:
            while not stop.is_set():
                self.wake.clear()  # before the drain: a notification during it makes the next wait return
                delay = await self._step()
                await _wait_any(stop, self.wake if delay is None else None, self.poll if delay is None else delay)
        finally:
            listener.cancel()
            await asyncio.gather(listener, return_exceptions=True)
            await self._drop_conn()

    async def _step(self) -> float | None:
        """One drain and the stats: None when it went through, else the backoff before the next."""
        import psycopg
        try:
            await self.client.connect()
            self.redis.ok()
            await self.drain()
            await self._stats()
        except psycopg.errors.UndefinedTable:
            raise RelayStopped(f"the outbox table {self.table} was dropped; create it again with 'zsched outbox "
                               f"apply --postgres URL --table {self.table}'", missing_table=True) from None
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            await self._drop_conn()
            return self.pg.failed(exc)
        except REDIS_ERRORS as exc:
            if isinstance(exc, redis.RedisError) and permanent_failure(exc):
                raise
            return self.redis.failed(exc)
        self.pg.ok()
        self.redis.ok()
        return None

    async def _listen(self, stop: asyncio.Event) -> None:
        """Set :attr:`wake` on each notification for the namespace; reconnects after a failure
        (the main loop logs the outage: this connection fails with the other) and wakes the main
        loop then, for the rows committed while nobody listened."""
        import psycopg
        failures = 0
        while not stop.is_set():
            try:
                conn = await self._connect()
                try:
                    await conn.execute(f'LISTEN "{self.channel}"')
                    failures = 0
                    self.wake.set()
                    async for note in conn.notifies():
                        if note.payload == self.namespace:
                            self.wake.set()
                finally:
                    await conn.close()
            except (psycopg.OperationalError, psycopg.InterfaceError, RelayStopped) as exc:
                failures += 1
                log.debug("relay: listener connection failed (%s); reconnecting", exc)
                await _wait_any(stop, None, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(failures, 10)))


async def _wait_any(stop: asyncio.Event, wake: asyncio.Event | None, timeout: float) -> None:
    """Wait until ``stop`` (or ``wake``, if given) is set, or ``timeout`` seconds."""
    waits = [asyncio.ensure_future(stop.wait())] + ([asyncio.ensure_future(wake.wait())] if wake else [])
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


async def run_until_stopped(relay: Relay, stop: asyncio.Event) -> None:
    """:meth:`Relay.run` until ``stop``; a batch in flight then has :data:`STOP_GRACE` seconds to
    commit before it is cancelled (its transaction rolls back: the rows stay for the next relay)."""
    task = asyncio.create_task(relay.run(stop))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            await asyncio.wait([task], timeout=STOP_GRACE)
            task.cancel()  # no-op once done
        try:
            await task
        except asyncio.CancelledError:
            if not stop.is_set():
                raise
    finally:
        stopping.cancel()
