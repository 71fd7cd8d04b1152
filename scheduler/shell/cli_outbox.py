"""``zsched outbox ddl | apply`` (the outbox table in the user's PostgreSQL) and ``zsched relay``
(moves its committed rows into zsched; :mod:`scheduler.shell.relay`, docs/effects.md)."""
from __future__ import annotations

import argparse
import asyncio
import logging
from typing import Any

from .. import runtime
from ..client import AsyncClient
from ..client.outbox import DEFAULT_TABLE, OutboxError, ddl, table_name
from ..metrics import host_arg, metrics_url, port_arg, serve, stop_serving
from ..protocol import config
from ..protocol.masking import mask_secrets
from ..redisio.transport import RedisRetry
from .admin import BadInput, NotFound
from .cli_common import EXIT_OK, SubParsers, described, duration_arg, patch_errors
from .cli_effects import PostgresUnavailable, TableKind, postgres_option, postgres_url
from .relay import DEFAULT_BATCH, DEFAULT_POLL, Relay, RelayMetrics, RelayStopped, run_until_stopped

log = logging.getLogger("zsched.relay")
MAX_BATCH = 10_000
# A relay's round trips to Redis retry briefly: its own loop rides out longer outages, and a short
# budget keeps each PostgreSQL transaction (and the rows it locks) short
RELAY_RETRY = RedisRetry(budget=2.0)


def add_parsers(sub: SubParsers) -> None:
    """Register ``outbox`` and ``relay`` (called by scheduler/shell/cli.py)."""
    group = patch_errors(sub.add_parser("outbox", **described({
        "help": "the transactional outbox table in your PostgreSQL: print or apply its DDL",
        "description": "The table scheduler.client.outbox.schedule() writes jobs into inside your transactions, "
                       "and 'zsched relay' moves them from (docs/effects.md)."})))
    actions = group.add_subparsers(dest="outbox_action", metavar="ACTION", required=True)
    OUTBOX.add_ddl_leaves(actions)

    p = patch_errors(sub.add_parser("relay", **described({
        "help": "move committed outbox rows of a namespace into zsched (run any number of them)",
        "description": "Move the rows committed to the outbox table into zsched with schedule_many, a transaction "
                       "per batch (SELECT ... FOR UPDATE SKIP LOCKED, schedule, DELETE, COMMIT), woken by LISTEN/"
                       "NOTIFY with --poll as the safety net. Runs until SIGINT or SIGTERM (exit 0)."})))
    config.add_connection_options(p)
    postgres_option(p)
    p.add_argument("--table", default=DEFAULT_TABLE, metavar="NAME",
                   help=f"the outbox table, 'name' or 'schema.name' (default {DEFAULT_TABLE})")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="ROWS",
                   help=f"rows per transaction, 1 to {MAX_BATCH} (default {DEFAULT_BATCH})")
    p.add_argument("--poll", type=duration_arg, default=DEFAULT_POLL, metavar="DURATION",
                   help=f"look for rows at least this often without a notification (default {DEFAULT_POLL:g}s)")
    p.add_argument("--durable", choices=("replica", "fsync"),
                   help="delete the rows only once Redis confirms the jobs on a replica (replica) or in its AOF "
                        "(fsync, Redis 7.2+): no job lost to a Redis failover or crash after the move")
    p.add_argument("--metrics-port", type=port_arg, metavar="PORT", help="serve Prometheus /metrics on this port")
    p.add_argument("--metrics-host", type=host_arg, default=config.DEFAULT_METRICS_HOST, metavar="ADDR",
                   help=f"address /metrics listens on (default {config.DEFAULT_METRICS_HOST})")
    p.set_defaults(func=_relay)


OUTBOX = TableKind("outbox", DEFAULT_TABLE, table_name, ddl, OutboxError)


def _relay(args: argparse.Namespace) -> int:
    table = OUTBOX.table(args)
    if not 1 <= args.batch <= MAX_BATCH:
        raise BadInput(f"--batch must be from 1 to {MAX_BATCH} rows, got {args.batch}")
    if not float(args.poll) > 0:
        raise BadInput(f"--poll must be more than 0 seconds, got {args.poll}")
    try:
        import psycopg  # noqa: F401 - checked before anything starts
    except ImportError:
        raise BadInput("psycopg is not installed: pip install -e '.[postgres]' in a checkout of zsched") from None
    dsn = postgres_url(args)
    namespace = config.namespace(args.namespace)
    url = config.redis_url(args.redis)
    metrics = RelayMetrics(namespace, table) if args.metrics_port else None
    server = serve(metrics.registry, args.metrics_port, args.metrics_host) if metrics else None
    try:
        return runtime.run(_main(args, dsn, url, namespace, table, metrics))
    finally:
        if server is not None:
            stop_serving(server)


async def _main(args: argparse.Namespace, dsn: str, url: str, namespace: str, table: str,
                metrics: RelayMetrics | None) -> int:
    stop = asyncio.Event()
    installed = runtime.stop_signals(asyncio.get_running_loop(), lambda sig: _stopping(stop, sig))
    client = AsyncClient.from_url(url, namespace=namespace, retry=RELAY_RETRY, durable=args.durable)
    relay = Relay(client, dsn, namespace=namespace, table=table, batch=args.batch, poll=float(args.poll),
                  metrics=metrics, redis_where=mask_secrets(url))
    log.info("relay moving rows of namespace %s from %s at %s to %s (batch %d, poll %gs%s)", namespace, table,
             mask_secrets(dsn), mask_secrets(url), args.batch, float(args.poll),
             f", metrics on {metrics_url(args.metrics_host, args.metrics_port)}" if metrics else "")
    try:
        await run_until_stopped(relay, stop)
    except RelayStopped as exc:
        if exc.missing_table:
            raise NotFound(str(exc)) from None
        raise PostgresUnavailable(str(exc)) from None
    finally:
        for sig in installed:
            asyncio.get_running_loop().remove_signal_handler(sig)
        await client.close()
    log.info("relay stopped: moved %d row(s)%s", relay.moved,
             f", {relay.rejected} left with an error" if relay.rejected else "")
    return EXIT_OK


def _stopping(stop: asyncio.Event, sig: Any) -> None:
    if not stop.is_set():
        log.info("relay: %s: stopping after the batch in flight", getattr(sig, "name", sig))
    stop.set()
