"""``zsched effects ddl | apply | prune``: the table of the fenced PostgreSQL effects
(:mod:`workers.effects`, docs/effects.md).

``ddl`` prints the table's DDL (for a migration tool), ``apply`` runs it, ``prune`` deletes the
rows older than the retention in bounded batches, once or every ``--every``. The retention
defaults to the namespace's tombstone TTL (read from Redis): a finished job stays visible that
long, and its effects row should outlive any attempt of it.
"""
from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workers.effects import DEFAULT_TABLE, EffectsError, EffectsTableMissing, ddl, prune
from workers.effects.postgres import table_name

from ..client.outbox import OutboxError, OutboxTableMissing
from ..protocol import config
from ..protocol.masking import mask_secrets
from . import admin
from .admin import BadInput, NotFound
from .admin.errors import AdminError
from .cli_common import (
    EXIT_OK,
    SubParsers,
    common_options,
    described,
    duration_arg,
    output_options,
    patch_errors,
    print_json,
)
from .relay import postgres_where

if TYPE_CHECKING:
    import psycopg

POSTGRES_ENV = "ZSCHED_POSTGRES_URL"


class PostgresUnavailable(AdminError):
    """PostgreSQL cannot be reached or refused the connection. Exit code 3."""

    exit_code = 3


def add_parsers(sub: SubParsers) -> None:
    """Register ``effects`` and its actions (called by scheduler/shell/cli.py)."""
    group = patch_errors(sub.add_parser("effects", **described({
        "help": "the fenced effects table in your PostgreSQL: print or apply its DDL, prune old rows",
        "description": "The table workers.effects.fenced() records each job's effects in (docs/effects.md)."})))
    actions = group.add_subparsers(dest="effects_action", metavar="ACTION", required=True)

    kw = EFFECTS.add_ddl_leaves(actions)
    p = table_leaf(actions, "prune", _prune, redis=True, help="delete rows older than the retention, in batches", **kw,
                   description="Delete the effects rows recorded longer ago than the retention, in transactions of "
                               "--batch rows. The retention is --retention, else the namespace's tombstone TTL "
                               "(read from --redis). A duplicate of a job whose row is gone is no longer recognised: "
                               "keep the retention longer than a job takes from its first attempt to its last.")
    p.add_argument("--retention", type=duration_arg, metavar="DURATION",
                   help="delete rows older than this (e.g. 1h, 7d); default: the namespace's tombstone TTL")
    p.add_argument("--all-namespaces", action="store_true",
                   help="prune every namespace's rows, not only --namespace's")
    p.add_argument("--batch", type=int, default=1000, metavar="ROWS", help="rows per transaction (default 1000)")
    p.add_argument("--every", type=duration_arg, metavar="DURATION",
                   help="keep running and prune again at this interval (Ctrl-C stops)")


@dataclass(frozen=True)
class TableKind:
    """One of zsched's tables in the user's PostgreSQL (``effects``, ``outbox``): its role
    (``what``), default name, name check and DDL, and the error class those raise."""

    what: str
    default_table: str
    name_of: Callable[[str], str]
    ddl_of: Callable[[str], str]
    error: type[Exception]

    def add_ddl_leaves(self, actions: SubParsers) -> dict[str, Any]:
        """Register the ``ddl`` and ``apply`` actions; the keywords for the kind's other leaves."""
        kw: dict[str, Any] = {"what": self.what, "default_table": self.default_table}
        table_leaf(actions, "ddl", self.print_ddl, help="print the table's DDL (CREATE TABLE IF NOT EXISTS ...)",
                   postgres=False, **kw)
        table_leaf(actions, "apply", self.apply, help="create the table (and its index) if it is not there", **kw)
        return kw

    def table(self, args: argparse.Namespace) -> str:
        """``--table``, checked (:class:`BadInput` when it is not a valid name)."""
        try:
            return self.name_of(args.table)
        except self.error as exc:
            raise BadInput(str(exc)) from None

    def print_ddl(self, args: argparse.Namespace) -> int:
        """``zsched KIND ddl``."""
        print(self.ddl_of(self.table(args)), end="")
        return EXIT_OK

    def apply(self, args: argparse.Namespace) -> int:
        """``zsched KIND apply``."""
        table = self.table(args)
        return apply_ddl(args, f"{self.what} table {table}", self.ddl_of(table))


EFFECTS = TableKind("effects", DEFAULT_TABLE, table_name, ddl, EffectsError)


def table_leaf(actions: SubParsers, name: str, handler: Any, *, what: str, default_table: str,
               postgres: bool = True, redis: bool = False, **kw: Any) -> argparse.ArgumentParser:
    """An action on one of zsched's tables in the user's PostgreSQL (``effects``, ``outbox``):
    ``--table`` (``what``: the table's role), ``--postgres`` unless ``postgres`` is False, and the
    connection options only for an action that reads the namespace (``redis``)."""
    parent = common_options() if redis else output_options()
    p = patch_errors(actions.add_parser(name, parents=[parent], **described(kw)))
    p.add_argument("--table", default=default_table, metavar="NAME",
                   help=f"the {what} table, 'name' or 'schema.name' (default {default_table})")
    if postgres:
        postgres_option(p)
    p.set_defaults(func=handler)
    return p


def postgres_option(p: argparse.ArgumentParser) -> None:
    """``--postgres URL`` (default ``$ZSCHED_POSTGRES_URL``)."""
    p.add_argument("--postgres", metavar="URL",
                   help=f"PostgreSQL conninfo or URL (postgresql://USER:PASSWORD@HOST:PORT/DB); "
                        f"default ${POSTGRES_ENV}")


def postgres_url(args: argparse.Namespace) -> str:
    """``--postgres``, else ``$ZSCHED_POSTGRES_URL``; BadInput (exit 2) when neither is set."""
    url = args.postgres or os.environ.get(POSTGRES_ENV)
    if not url:
        raise BadInput(f"no PostgreSQL given: pass --postgres URL or set {POSTGRES_ENV}")
    return str(url)


@contextmanager
def connect_postgres(args: argparse.Namespace) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to :func:`postgres_url`, closed afterwards; psycopg's failures and
    the effects' and outbox's errors inside become the CLI's one-line errors and exit codes."""
    try:
        import psycopg
    except ImportError:
        raise BadInput("psycopg is not installed: pip install -e '.[postgres]' in a checkout of zsched") from None
    url = postgres_url(args)
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.ProgrammingError as exc:  # the URL itself: no server was asked
        raise BadInput(f"the PostgreSQL URL {mask_secrets(url)} is not valid: {one_line(exc)} (check --postgres / "
                       f"{POSTGRES_ENV})") from None
    except psycopg.Error as exc:
        raise PostgresUnavailable(f"cannot connect to PostgreSQL at {mask_secrets(url)}: "
                                  f"{one_line(exc)} (check --postgres / {POSTGRES_ENV})") from None
    try:
        yield conn
    except psycopg.OperationalError as exc:
        raise PostgresUnavailable(f"PostgreSQL at {mask_secrets(url)} failed: {one_line(exc)}") \
            from None
    except (EffectsTableMissing, OutboxTableMissing) as exc:
        raise NotFound(str(exc)) from None
    except (EffectsError, OutboxError) as exc:
        raise BadInput(str(exc)) from None
    except psycopg.Error as exc:  # e.g. no privilege to create or delete
        raise PostgresUnavailable(f"PostgreSQL at {mask_secrets(url)} refused: {one_line(exc)}") \
            from None
    finally:
        conn.close()


def one_line(exc: Exception) -> str:
    """A driver's message (psycopg's span lines, with hints on the next) as one masked line."""
    return " ".join(mask_secrets(str(exc)).split())


def apply_ddl(args: argparse.Namespace, what: str, statements: str) -> int:
    """Run a table's DDL on ``--postgres`` and say where (``zsched effects|outbox apply``)."""
    with connect_postgres(args) as conn:
        conn.execute(statements)
        where = postgres_where(conn)
    if args.json:
        print_json({"table": what.split()[-1], "database": where})
    else:
        print(f"{what} ready in {where}")
    return EXIT_OK


def _retention(args: argparse.Namespace) -> float:
    if args.retention is not None:
        return float(args.retention)
    client = admin.open_client(args.redis, args.namespace, create=False)
    try:
        return client.tombstone_ttl()
    finally:
        client.close()


def _prune(args: argparse.Namespace) -> int:
    table = EFFECTS.table(args)
    if args.batch < 1:
        raise BadInput(f"--batch must be 1 or more rows, got {args.batch}")
    namespace = None if args.all_namespaces else config.namespace(args.namespace)
    retention = _retention(args)
    with connect_postgres(args) as conn:
        while True:
            n = prune(conn, retention, namespace=namespace, table=table, batch=args.batch)
            scope = "every namespace" if namespace is None else f"namespace {namespace}"
            if args.json:
                print_json({"deleted": n, "retention_seconds": retention, "namespace": namespace, "table": table})
            else:
                print(f"pruned {n} effects row(s) of {scope} older than {admin.human_span(retention)} from {table}",
                      flush=True)
            if args.every is None:
                return EXIT_OK
            time.sleep(float(args.every))
