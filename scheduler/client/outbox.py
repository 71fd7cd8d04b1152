"""Transactional enqueue for PostgreSQL (an outbox): a job exists if and only if the producer's
transaction commits.

::

    from scheduler.client import outbox

    with psycopg.connect(DSN) as conn, conn.transaction():
        conn.execute("INSERT INTO orders ...", ...)
        outbox.schedule(conn, timedelta(hours=1), {"order": 42}, queue="reminders")

:func:`schedule` inserts one row into the outbox table (:func:`ddl`) inside the caller's open
transaction and sends ``pg_notify`` in the same statement (PostgreSQL delivers it only on commit,
once per transaction and namespace). A relay (``zsched relay``, any number of them) moves
committed rows into zsched with ``schedule_many`` and deletes them in the same PostgreSQL
transaction; a rolled-back transaction leaves no row, so no job.

``at`` and the job options are checked exactly as ``Client.schedule`` checks them (the same
protocol code), so a bad call raises here, before anything is written. ``at`` is resolved to
absolute epoch ms at enqueue: a ``timedelta`` counts from this host's clock now (not from Redis's
clock when the relay moves the row, which is what ``Client.schedule`` does), so a row that waits
in the outbox still runs when it was asked to. ``jitter`` is applied by the relay.

Each row's job gets an idempotency key: ``key`` when given, else ``outbox:TABLE:ID`` from the
row's id. A relay killed after ``schedule_many`` and before its ``DELETE`` commits leaves the rows
for the next relay, whose re-send finds the job by its key and creates nothing, as long as that
job is still live (scheduled, ready or running: an idempotency key names a live job). Keys
starting with ``outbox:`` are reserved for the derived ones.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Unpack

from ..protocol import config
from ..protocol.calls import validate_key
from ..protocol.codec import DEFAULT_MAX_PAYLOAD, pack_payload
from ..protocol.errors import ZschedError
from ..protocol.options import DEFAULT_OPTIONS, OPTION_NAMES, JobOptionFields, JobOptions, with_overrides
from ..protocol.sqlnames import check_table
from ..protocol.timeutil import At, job_time_ms
from .options import payload_limit

if TYPE_CHECKING:
    import psycopg

DEFAULT_TABLE = "zsched_outbox"
KEY_PREFIX = "outbox:"
"""Idempotency keys starting with this are the outbox's own (``outbox:TABLE:ID``); refused as ``key``."""
# Options the row's own columns hold (queue) or the relay applies without storing them differently
_COLUMN_OPTIONS = ("queue",)


class OutboxError(ZschedError):
    """The outbox cannot take the row: the connection is not inside a transaction (autocommit),
    closed or in a failed transaction, or a table name is not one. Nothing was written."""


class OutboxTableMissing(OutboxError):
    """The outbox table does not exist (the caller's transaction is aborted, as by any failed
    statement: roll it back). Create it with ``zsched outbox apply`` or :func:`ddl`."""


def table_name(table: str) -> str:
    """``table`` checked: ``name`` or ``schema.name`` of unquoted lower-case identifiers; raises
    :class:`OutboxError` otherwise (it is written into statements, so never taken unchecked)."""
    return check_table(table, "outbox table", OutboxError)


def channel(table: str) -> str:
    """The LISTEN/NOTIFY channel of an outbox table (its name); the payload is the namespace."""
    return table_name(table)


def derived_key(table: str, row_id: int) -> str:
    """The idempotency key of a row given without ``key``: ``outbox:TABLE:ID``."""
    return f"{KEY_PREFIX}{table}:{row_id}"


def ddl(table: str = DEFAULT_TABLE) -> str:
    """The outbox table's DDL (idempotent: ``IF NOT EXISTS``), as ``zsched outbox ddl`` prints it.

    ``error`` is set by a relay on a row zsched refuses (e.g. a payload over the relay's limit):
    such a row is left in the table for the operator and skipped by the relays' scan, whose index
    covers only the rows without one."""
    t = table_name(table)
    index = t.split(".")[-1] + "_pending"
    return (f"CREATE TABLE IF NOT EXISTS {t} (\n"
            "    id         bigserial   PRIMARY KEY,\n"
            "    namespace  text        NOT NULL,\n"
            "    queue      text        NOT NULL,\n"
            "    run_at_ms  bigint      NOT NULL,\n"
            "    payload    bytea       NOT NULL,\n"
            "    key        text,\n"
            "    options    jsonb       NOT NULL DEFAULT '{}',\n"
            "    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),\n"
            "    error      text\n"
            ");\n"
            f"CREATE INDEX IF NOT EXISTS {index} ON {t} (namespace, id) WHERE error IS NULL;\n")


def stored_options(opts: JobOptions) -> str:
    """The options of a row as the JSON its ``options`` column holds: the fields that differ from
    the defaults, queue excepted (a column of its own); :func:`row_options` reads them back."""
    out = {}
    for name in OPTION_NAMES:
        value = getattr(opts, name)
        if name not in _COLUMN_OPTIONS and value != getattr(DEFAULT_OPTIONS, name):
            out[name] = list(value) if isinstance(value, tuple) else value
    return json.dumps(out, sort_keys=True, separators=(",", ":"))


def row_options(queue: str, options: str | dict[str, Any]) -> JobOptions:
    """A row's :class:`JobOptions` from its ``queue`` and ``options`` columns, checked as when it was
    written (TypeError/ValueError for a row written by hand with bad ones)."""
    fields = json.loads(options) if isinstance(options, str) else options
    if not isinstance(fields, dict):
        raise TypeError(f"options must be a JSON object, got {type(fields).__name__}")
    return with_overrides(None, {**fields, "queue": queue})  # type: ignore[typeddict-item]


def _row(at: At, payload: Any, key: str | None, namespace: str | None, options: JobOptions | None,
         job_options: JobOptionFields, max_payload_bytes: int) -> tuple[Any, ...]:
    """The INSERT's parameters, every one checked: what ``Client.schedule`` refuses, this refuses."""
    opts = with_overrides(options, job_options)
    key = validate_key(key)
    if key is not None and key.startswith(KEY_PREFIX):
        raise ValueError(f"key {key[:40]!r} is reserved: keys starting with {KEY_PREFIX!r} are the outbox's own "
                         "(outbox:TABLE:ID, for rows given without a key); use another prefix")
    run_at = job_time_ms(at)
    data = pack_payload(payload, payload_limit(max_payload_bytes))
    return (config.namespace(namespace), opts.queue, run_at, data, key, stored_options(opts))


def _statement(table: str) -> str:
    t = table_name(table)
    # One round trip: the row and its notification (delivered only if the transaction commits;
    # PostgreSQL folds identical ones of a transaction into one)
    return (f"WITH r AS (INSERT INTO {t} (namespace, queue, run_at_ms, payload, key, options) "
            "VALUES (%s, %s, %s, %s, %s, %s::jsonb) RETURNING id) SELECT id, pg_notify(%s, %s) FROM r")


def _check_connection(conn: Any) -> None:
    import psycopg
    if conn.closed:
        raise OutboxError("outbox.schedule() got a closed PostgreSQL connection: schedule inside the open "
                          "transaction that makes the job's other writes")
    status = conn.info.transaction_status
    if status == psycopg.pq.TransactionStatus.INERROR:
        raise OutboxError("outbox.schedule(): the connection's transaction has failed (an earlier statement "
                          "raised): roll it back; nothing was written")
    if conn.autocommit and status == psycopg.pq.TransactionStatus.IDLE:
        raise OutboxError("outbox.schedule() needs the connection inside a transaction, and this one is in "
                          "autocommit mode outside one: the row would commit on its own, apart from your other "
                          "writes. Use 'with conn.transaction():' (or autocommit=False and conn.commit()); "
                          "nothing was written")


def _missing_table(exc: psycopg.Error, table: str) -> OutboxTableMissing:
    why = exc.diag.message_primary or str(exc).splitlines()[0]  # one line: not psycopg's LINE/caret lines
    return OutboxTableMissing(f"the outbox table {table} does not exist ({why}); create it with "
                              f"'zsched outbox apply --postgres URL --table {table}' or run the DDL "
                              "'zsched outbox ddl' prints; roll back this transaction")


def schedule(conn: psycopg.Connection[Any], at: At, payload: Any = None, *, key: str | None = None,
             namespace: str | None = None, table: str = DEFAULT_TABLE, options: JobOptions | None = None,
             max_payload_bytes: int = DEFAULT_MAX_PAYLOAD, **job_options: Unpack[JobOptionFields]) -> int:
    """Schedule a job as part of ``conn``'s transaction: it exists if and only if that commits.

    ``at``, ``payload``, ``key``, ``options`` and the option keywords (``queue``, ``max_attempts``,
    ``lease``, ``misfire``, ``misfire_grace``, ``backoff``, ``jitter``): as ``Client.schedule``;
    ``namespace`` defaults as the client's (``ZSCHED_NAMESPACE``, else ``zsched``). Returns the
    row's id (its job's key is ``outbox:TABLE:ID`` unless ``key`` is given).

    Raises what ``Client.schedule`` raises for bad input (TypeError, ValueError, PayloadError) and
    :class:`OutboxError` for a connection in autocommit mode outside a transaction, closed, or in a
    failed transaction; nothing is written then. :class:`OutboxTableMissing` when the table is not
    there (the transaction is aborted by PostgreSQL)."""
    import psycopg
    params = _row(at, payload, key, namespace, options, job_options, max_payload_bytes)
    statement = _statement(table)
    _check_connection(conn)
    try:
        row = conn.execute(statement, (*params, channel(table), params[0])).fetchone()
    except psycopg.errors.UndefinedTable as exc:
        raise _missing_table(exc, table) from None
    assert row is not None  # INSERT ... RETURNING one row
    return int(row[0])


async def schedule_async(conn: psycopg.AsyncConnection[Any], at: At, payload: Any = None, *, key: str | None = None,
                         namespace: str | None = None, table: str = DEFAULT_TABLE, options: JobOptions | None = None,
                         max_payload_bytes: int = DEFAULT_MAX_PAYLOAD, **job_options: Unpack[JobOptionFields]) -> int:
    """:func:`schedule` for a ``psycopg.AsyncConnection``."""
    import psycopg
    params = _row(at, payload, key, namespace, options, job_options, max_payload_bytes)
    statement = _statement(table)
    _check_connection(conn)
    try:
        cur = await conn.execute(statement, (*params, channel(table), params[0]))
    except psycopg.errors.UndefinedTable as exc:
        raise _missing_table(exc, table) from None
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])
