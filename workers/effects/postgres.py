"""Fenced effects in PostgreSQL: a handler's writes commit once per job, whatever the attempts.

::

    from workers.effects import fenced

    @worker.handler("payments")
    def pay(job):
        with psycopg.connect(DSN) as conn, fenced(conn, job):
            conn.execute("INSERT INTO ledger ...", ...)

``fenced`` opens a transaction on ``conn``, and its first statement records the job's step in the
effects table (:func:`ddl`): one ``INSERT ... ON CONFLICT DO NOTHING`` on the primary key
(namespace, job id, step), the one extra statement a fenced block costs. The row and the user's
writes commit together or not at all, so:

* a repeat after a commit (a worker that died between the commit and its ack, an attempt run
  again after its lease ran out) finds the row and raises :class:`AlreadyApplied` (the recorded
  fence is not higher) or :class:`StaleAttempt` (a newer attempt's), before any of its writes;
* two attempts inside their blocks at once meet on the row's unique index: the second waits for
  the first to end; if the first commits, the second raises as above, if it rolls back, the
  second goes on (the first wrote nothing, so the effects still apply once);
* an error inside the block rolls everything back, the row included: the retry applies anew.

Both exceptions leave the block without running it (the ``with`` body is skipped by raising from
``__enter__``) and roll back; a handler that lets them escape has its job acked by the worker.
Rows older than the retention are deleted by :func:`prune` (``zsched effects prune``); a
duplicate arriving after its row was pruned is not recognised, so keep the retention longer than
a job can take from its first attempt to its last (the default is the namespace's tombstone TTL).

Isolation: the default READ COMMITTED is what the protocol needs. Under REPEATABLE READ or
SERIALIZABLE, two overlapping attempts make PostgreSQL raise a serialization failure in the
second one (a retriable error: the job is retried, and then finds the row).
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from scheduler.protocol.sqlnames import check_table

from .outcomes import EffectsError, EffectsTableMissing, skip
from .target import Target, target_of

if TYPE_CHECKING:
    import psycopg

DEFAULT_TABLE = "zsched_effects"
PRUNE_BATCH = 1000  # rows per DELETE: short transactions, bounded locks and WAL per statement


def table_name(table: str) -> str:
    """``table`` checked: ``name`` or ``schema.name``, unquoted lower-case identifiers; raises
    :class:`EffectsError` otherwise (it is written into statements, so never taken unchecked)."""
    return check_table(table, "effects table", EffectsError)


def ddl(table: str = DEFAULT_TABLE) -> str:
    """The effects table's DDL (idempotent: ``IF NOT EXISTS``), as ``zsched effects ddl`` prints it."""
    t = table_name(table)
    index = t.replace(".", "_") + "_applied_at"
    return (f"CREATE TABLE IF NOT EXISTS {t} (\n"
            "    namespace  text        NOT NULL,\n"
            "    job_id     text        NOT NULL,\n"
            "    step       text        NOT NULL DEFAULT '',\n"
            "    fence      bigint      NOT NULL,\n"
            "    attempt    integer     NOT NULL,\n"
            "    applied_at timestamptz NOT NULL DEFAULT now(),\n"
            "    PRIMARY KEY (namespace, job_id, step)\n"
            ");\n"
            f"CREATE INDEX IF NOT EXISTS {index.split('.')[-1]} ON {t} (applied_at);\n")


@dataclass(frozen=True, slots=True)
class _Statements:
    record: str
    recorded: str
    prune: str


def _statements(table: str) -> _Statements:
    t = table_name(table)
    return _Statements(
        record=(f"INSERT INTO {t} (namespace, job_id, step, fence, attempt) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (namespace, job_id, step) DO NOTHING"),
        recorded=f"SELECT fence, attempt, applied_at FROM {t} WHERE namespace = %s AND job_id = %s AND step = %s",
        # The oldest rows first, at most a batch; SKIP LOCKED: two pruners never wait on each other
        prune=(f"DELETE FROM {t} e USING (SELECT namespace, job_id, step FROM {t} WHERE applied_at < now() - %s "
               "AND (%s::text IS NULL OR namespace = %s) ORDER BY applied_at LIMIT %s FOR UPDATE SKIP LOCKED) old "
               "WHERE (e.namespace, e.job_id, e.step) = (old.namespace, old.job_id, old.step)"),
    )


def _check_connection(conn: Any) -> None:
    import psycopg
    if conn.closed:
        raise EffectsError("fenced() got a closed PostgreSQL connection: open a new one (psycopg.connect) "
                           "for the handler's writes")
    status = conn.info.transaction_status
    if status != psycopg.pq.TransactionStatus.IDLE:
        raise EffectsError(
            f"fenced() opens its own transaction, and the connection is already in one (status {status.name}): "
            "commit or roll back first, or give fenced() a connection of its own; nothing was written")


def _skip_or_race(t: Target, row: Sequence[Any] | None) -> Exception:
    if row is None:
        # ON CONFLICT saw a row this statement's snapshot could not: only under REPEATABLE READ or
        # SERIALIZABLE, where PostgreSQL raises a serialization failure first. Never silently go on.
        return EffectsError(f"job {t.job_id}: the effects row conflicted but cannot be read; run the handler's "
                            "transaction at READ COMMITTED (the default)")
    fence, attempt, applied_at = row
    return skip(t.job_id, t.step, t.fence, int(fence), int(attempt), applied_at)


def _missing_table(exc: psycopg.Error, table: str) -> EffectsTableMissing:
    why = exc.diag.message_primary or str(exc).splitlines()[0]  # one line: not psycopg's LINE/caret lines
    return EffectsTableMissing(f"the effects table {table} does not exist ({why}); create it with "
                               f"'zsched effects apply --postgres URL --table {table}' or run the DDL "
                               f"'zsched effects ddl' prints")


@contextmanager
def fenced(conn: psycopg.Connection[Any], job: Any, *, step: str = "", table: str = DEFAULT_TABLE,
           namespace: str | None = None) -> Iterator[psycopg.Transaction]:
    """A transaction on ``conn`` whose writes apply once per (job, ``step``) over all its attempts.

    Raises :class:`AlreadyApplied` or :class:`StaleAttempt` (both :class:`EffectSkipped`) instead
    of running the block when another attempt's writes are recorded; :class:`EffectsError` when
    ``conn`` is closed or already inside a transaction, :class:`EffectsTableMissing` when the
    table is not there. ``step`` names one of several fenced blocks of a handler (each store it
    writes); ``namespace`` defaults to the job's. Yields the psycopg transaction."""
    import psycopg
    t = target_of(job, step, namespace)
    st = _statements(table)
    _check_connection(conn)
    with conn.transaction() as tx:
        try:
            cur = conn.execute(st.record, (t.namespace, t.job_id, t.step, t.fence, t.attempt))
        except psycopg.errors.UndefinedTable as exc:  # ours only: the block's own statements raise as they are
            raise _missing_table(exc, table) from None
        if cur.rowcount != 1:
            raise _skip_or_race(t, conn.execute(st.recorded, (t.namespace, t.job_id, t.step)).fetchone())
        yield tx


@asynccontextmanager
async def fenced_async(conn: psycopg.AsyncConnection[Any], job: Any, *, step: str = "", table: str = DEFAULT_TABLE,
                       namespace: str | None = None) -> AsyncIterator[psycopg.AsyncTransaction]:
    """:func:`fenced` for an asyncio handler and a ``psycopg.AsyncConnection``: ``async with``."""
    import psycopg
    t = target_of(job, step, namespace)
    st = _statements(table)
    _check_connection(conn)
    async with conn.transaction() as tx:
        try:
            cur = await conn.execute(st.record, (t.namespace, t.job_id, t.step, t.fence, t.attempt))
        except psycopg.errors.UndefinedTable as exc:
            raise _missing_table(exc, table) from None
        if cur.rowcount != 1:
            row = await (await conn.execute(st.recorded, (t.namespace, t.job_id, t.step))).fetchone()
            raise _skip_or_race(t, row)
        yield tx


def _cutoff(retention: timedelta | float) -> timedelta:
    seconds = retention.total_seconds() if isinstance(retention, timedelta) else float(retention)
    if not seconds >= 0:  # also NaN
        raise EffectsError(f"effects retention must be 0 seconds or more, got {retention!r}")
    return timedelta(seconds=seconds)


def prune(conn: psycopg.Connection[Any], retention: timedelta | float, *, namespace: str | None = None,
          table: str = DEFAULT_TABLE, batch: int = PRUNE_BATCH) -> int:
    """Delete the effects rows recorded more than ``retention`` (a timedelta or seconds) ago, of
    ``namespace`` or of all, in transactions of at most ``batch`` rows, until none is left; returns
    how many were deleted. ``conn`` must not be inside a transaction (each batch commits)."""
    import psycopg
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise EffectsError(f"prune batch must be a whole number of rows from 1, got {batch!r}")
    st, keep = _statements(table), _cutoff(retention)
    _check_connection(conn)
    total = 0
    while True:
        with conn.transaction():
            try:
                n = conn.execute(st.prune, (keep, namespace, namespace, batch)).rowcount
            except psycopg.errors.UndefinedTable as exc:
                raise _missing_table(exc, table) from None
        total += max(n, 0)
        if n < batch:
            return total
