"""What every operator subcommand shares: options, argument types, error format, exit codes, output.

The operator subcommands (``schedule``, ``job``, ``dead``, ``stats``, ``cron``, ``epochs``) are thin
argparse layers over :mod:`scheduler.shell.admin`. Each takes ``--redis``, ``--namespace`` and
``--json`` (:func:`common_options`); argparse's own errors look like ours (:func:`patch_errors`);
every (sub)command has a description in ``--help`` (:class:`Commands`); and :func:`runner`
connects and runs the command. ``zsched``'s main maps the conditions an operator can cause to one
line on stderr (``zsched: error: ...``) and an exit code (:mod:`scheduler.shell.cli_errors`):
:data:`EXIT_OK` 0 ok, :data:`EXIT_NOT_FOUND` 1 not found (unknown job or namespace, or a job whose
state does not allow the operation), :data:`EXIT_BAD_INPUT` 2 bad input, :data:`EXIT_UNAVAILABLE`
3 Redis or etcd unreachable or refusing, 4 this machine's set-up (a TLS file, a port in use).
Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, NoReturn, TextIO, TypeAlias

from ..client import Client
from ..protocol import config
from . import admin
from .admin import BadInput
from .cli_errors import EXIT_BAD_INPUT as EXIT_BAD_INPUT  # the exit codes, for the command modules
from .cli_errors import EXIT_NOT_FOUND as EXIT_NOT_FOUND
from .cli_errors import EXIT_OK as EXIT_OK
from .cli_errors import EXIT_UNAVAILABLE as EXIT_UNAVAILABLE

Handler = Callable[[Client, argparse.Namespace], int | None]
"""A subcommand's body: gets a connected client and the parsed arguments, returns the exit code
(None: 0) or raises :class:`~scheduler.shell.admin.AdminError`."""

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""What ``add_subparsers`` returns: where a module registers its subcommands."""

WHEN_HELP = ("ISO-8601 with a zone (2026-12-01T09:00:00+01:00, ...Z), +DURATION from now "
             "(+90s, +4h, +1d2h30m), 'now', or epoch seconds")
LOG_LEVEL_HELP = "logging level (default INFO; env ZSCHED_LOG_LEVEL)"
DEBUG_HELP = "print the traceback of known errors too (env ZSCHED_DEBUG=1)"
EPILOG = ("exit codes: 0 ok, 1 not found (unknown job/namespace, or a state that does not allow it), "
          "2 bad input, 3 Redis unreachable or refusing, 4 a TLS file cannot be read, 130 Ctrl-C "
          "(see docs/operations.md)")


# ------------------------------------------------------------------------- argument types


def argtype(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """Turn an admin parser (raising BadInput) into an argparse type (ArgumentTypeError), so a
    bad argument is refused before anything connects."""

    def conv(text: str) -> Any:
        try:
            return fn(text)
        except BadInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    conv.__name__ = fn.__name__.replace("parse_", "")
    return conv


when_arg = argtype(admin.parse_when)
schedule_when_arg = argtype(admin.parse_schedule_when)
duration_arg = argtype(lambda t: admin.parse_duration(t, name="DURATION"))
payload_arg = argtype(admin.parse_payload)
job_id_arg = argtype(admin.parse_job_id)
queue_arg = argtype(admin.parse_queue)


def number(kind: str, lo: float, hi: float, *, integer: bool = False) -> Callable[[str], Any]:
    """An argparse type for a finite number from ``lo`` to ``hi`` (an int with ``integer``);
    ``kind`` names it in the message (``expected seconds from 0.1 to 60, got 'x'``)."""

    def conv(text: str) -> Any:
        try:
            v: float = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        if not lo <= v <= hi:  # refuses nan and inf too; a 400-digit int is compared, not converted
            raise argparse.ArgumentTypeError(f"expected {kind} from {lo:g} to {hi:g}, got {text!r}")
        return v

    conv.__name__ = kind
    return conv


# ------------------------------------------------------------------------------- parsers


def _usage_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    # one line, as every other failure: the usage argparse would print first is what --help shows
    parser.exit(EXIT_BAD_INPUT, f"zsched: error: {message} (see: {parser.prog} --help)\n")


def patch_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make argparse's own errors look like ours (one ``zsched: error:`` line with a pointer to
    ``--help``, exit 2); returns ``parser``."""
    # Per instance rather than a parser class: the subcommands of other modules (scheduler,
    # worker, dev) are made by argparse's own class; zsched's main patches them once registered.
    parser.error = functools.partial(_usage_error, parser)  # type: ignore[method-assign]
    return parser


def common_options() -> argparse.ArgumentParser:
    """A parent parser with ``--redis``, ``--namespace`` and ``--json`` (and :func:`add_process_options`)."""
    c = argparse.ArgumentParser(add_help=False)
    g = c.add_argument_group("connection and output")
    config.add_connection_options(g)
    g.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    add_process_options(c)
    return c


def output_options() -> argparse.ArgumentParser:
    """A parent parser with ``--json`` (and :func:`add_process_options`), for commands that do not
    talk to Redis (``effects ddl``, ``outbox apply``: PostgreSQL only)."""
    c = argparse.ArgumentParser(add_help=False)
    c.add_argument_group("output").add_argument("--json", action="store_true",
                                                help="print one JSON document instead of a table")
    add_process_options(c)
    return c


def add_process_options(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--debug`` on a subcommand's parser, as on ``zsched``'s own (the docs
    say common options go after the subcommand). Their default is SUPPRESS: a subcommand not given
    them leaves the top-level parser's value (its default, or what came before the subcommand)."""
    g = parser.add_argument_group("process options (also accepted before the subcommand)")
    g.add_argument("--log-level", default=argparse.SUPPRESS, help=LOG_LEVEL_HELP)
    g.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)


def described(kw: dict[str, Any]) -> dict[str, Any]:
    """``add_parser`` keywords with a ``description`` (shown by ``--help``): the ``help`` line as a
    sentence when none is given, so no command's ``--help`` is without one."""
    text = kw.get("help")
    if not kw.get("description") and text:
        kw = {**kw, "description": text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")}
    return kw


def check_etcd(args: argparse.Namespace) -> None:
    """A precheck (see :func:`runner`) for commands with ``--etcd``: resolve it (else
    ZSCHED_ETCD_ENDPOINTS, else None) into ``args.etcd``, refusing a malformed list as bad input
    before anything connects."""
    args.etcd = config.optional_etcd_endpoints(args.etcd)


def check_grace(args: argparse.Namespace) -> None:
    """A precheck (see :func:`runner`): ``--grace`` goes only with ``--misfire skip``."""
    if args.grace is not None and args.misfire != "skip":
        raise BadInput("--grace only applies with --misfire skip (how late a skipped occurrence may still run); "
                       "add --misfire skip or drop --grace")


class Commands:
    """Registers operator subcommands on ``sub`` with the shared options, epilog and error format."""

    def __init__(self, sub: SubParsers, *, epilog: str = EPILOG) -> None:
        self.sub = sub
        self.epilog = epilog
        self.common = common_options()

    def group(self, name: str, **kw: Any) -> SubParsers:
        """A command with actions (``zsched NAME ACTION``); returns where the actions go."""
        p = patch_errors(self.sub.add_parser(name, **described(kw)))
        return p.add_subparsers(dest=f"{name}_action", metavar="ACTION", required=True)

    def leaf(self, parent: SubParsers, name: str, handler: Handler, *, create: bool = False,
             precheck: Callable[[argparse.Namespace], None] | None = None, **kw: Any) -> argparse.ArgumentParser:
        """A runnable (sub)command under ``parent`` (``self.sub`` or a :meth:`group`); see :func:`runner`
        for ``create`` and ``precheck``. Returns its parser for the command's own arguments."""
        p = patch_errors(parent.add_parser(name, parents=[self.common], epilog=self.epilog, **described(kw)))
        p.set_defaults(func=runner(handler, create=create, precheck=precheck))
        return p


# --------------------------------------------------------------------------------- runner


def fail(message: str) -> None:
    """Print ``zsched: error: message`` on stderr."""
    print(f"zsched: error: {message}", file=sys.stderr)


def warn(message: str) -> None:
    """Print ``zsched: warning: message`` on stderr."""
    print(f"zsched: warning: {message}", file=sys.stderr)


def warn_past(at: int | timedelta | None, runs: str = "the job runs") -> None:
    """Warn (one ``zsched: warning:`` line) when ``at``, a parsed ``--at``, is an absolute time
    before now: accepted (a job due in the past runs as soon as a worker claims it), but more
    often a typo (a year, a zone) than a wish. ``now`` and ``+DURATION`` (timedelta) never warn."""
    if at is None or isinstance(at, timedelta):
        return
    ahead_s = (at - time.time() * 1000) / 1000
    if ahead_s < 0:
        warn(f"--at {admin.iso(at)} is in the past ({admin.human_delta(ahead_s)}): {runs} at once")


def runner(handler: Handler, *, create: bool,
           precheck: Callable[[argparse.Namespace], None] | None = None) -> Callable[[argparse.Namespace], int]:
    """The ``func`` of a subcommand: run ``precheck(args)`` (refuses contradictory arguments with
    BadInput before connecting, so the operator learns what to fix even when Redis is down),
    connect (``create``: may create the namespace; otherwise an unknown one is NotFound), run the
    handler, close. What it raises goes to ``zsched``'s main, which turns known conditions into one
    line and their exit code (:func:`scheduler.shell.cli_errors.explain`)."""

    def run(args: argparse.Namespace) -> int:
        client: Client | None = None
        try:
            if precheck is not None:
                precheck(args)
            client = admin.open_client(args.redis, args.namespace, create=create)
            return int(handler(client, args) or 0)
        finally:
            if client is not None:
                client.close()

    return run


# --------------------------------------------------------------------------------- output


def print_json(doc: Any, out: TextIO | None = None) -> None:
    """Print ``doc`` as one line of JSON (UTF-8 as it is) on ``out`` (default stdout)."""
    print(admin.to_json(doc), file=out or sys.stdout)  # not json.dumps: payloads nest past its recursion limit


def when_text(ms: int | None, now_ms: float | None = None) -> str:
    """``2026-12-01T08:00:00.000Z (in 3h)``: an instant in epoch ms and how far from now; ``-`` for None."""
    if ms is None:
        return "-"
    now = time.time() * 1000 if now_ms is None else now_ms
    return f"{admin.iso(ms)} ({admin.human_delta((ms - now) / 1000)})"


def dt_ms(dt: datetime | None) -> int | None:
    """A datetime as epoch ms (None stays None)."""
    return None if dt is None else int(round(dt.timestamp() * 1000))
