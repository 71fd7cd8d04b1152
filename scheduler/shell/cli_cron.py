"""``zsched cron add | list | remove``: recurring schedules from the command line.

Thin argparse layer over the client's cron calls, with the shared options, exit codes and error
format of :mod:`scheduler.shell.cli_common`.
"""
from __future__ import annotations

import argparse

from ..client import Client
from ..protocol.calls import MISFIRE_POLICIES
from . import admin
from .admin import NotFound
from .cli_common import (
    EXIT_OK,
    Commands,
    SubParsers,
    check_grace,
    dt_ms,
    number,
    payload_arg,
    print_json,
    queue_arg,
    when_text,
)
from .cli_queue import report_toggle


def _time_zone(text: str) -> str:
    """An argparse type for ``--tz``: a non-empty name. Whether the zone exists is checked by the
    client, whose message lists examples."""
    if not text:
        raise argparse.ArgumentTypeError("expected an IANA time zone name like 'Europe/Berlin', got ''")
    return text


def add_parsers(sub: SubParsers) -> None:
    """Register ``cron`` and its actions (called by scheduler/shell/cli.py)."""
    cmds = Commands(sub)
    cron = cmds.group("cron", help="recurring schedules: add, list, remove")
    p = cmds.leaf(cron, "add", _cron_add, create=True, precheck=check_grace, help="create or replace a cron",
                  description="Create or replace the cron NAME. Each occurrence is an ordinary job; a cron always "
                              "has exactly one pending occurrence.")
    p.add_argument("name", type=queue_arg, metavar="NAME", help="cron name (letters, digits, _ . -)")
    p.add_argument("expr", metavar="EXPR",
                   help="cron expression: 'minute hour day month weekday' (e.g. '0 9 * * *'), or 6 fields with "
                        "seconds last")
    p.add_argument("--queue", required=True, type=queue_arg, metavar="Q", help="queue of the occurrences")
    p.add_argument("--payload", type=payload_arg, default=None, metavar="JSON",
                   help="payload as JSON, @FILE, or - for stdin (default null)")
    p.add_argument("--tz", default="UTC", type=_time_zone, metavar="TZ",
                   help="IANA time zone of the expression (default UTC)")
    p.add_argument("--misfire", choices=MISFIRE_POLICIES, default="run_late",
                   help="after an outage: run_late fires one catch-up run, skip drops missed occurrences")
    p.add_argument("--grace", type=number("seconds", 0, 4233600), metavar="S",
                   help="with --misfire skip: how late an occurrence may still run (default 60)")
    p.add_argument("--jitter", type=number("seconds", 0, 86400), default=0.0, metavar="S",
                   help="spread each occurrence uniformly over [nominal, nominal + S]")
    p.add_argument("--max-attempts", type=number("an integer", 1, 255, integer=True), default=5, metavar="N",
                   help="attempts each occurrence gets before it is dead-lettered (1-255, default 5)")
    cmds.leaf(cron, "list", _cron_list, help="every cron with its next fire time and whether it is paused")
    p = cmds.leaf(cron, "remove", _cron_remove, help="delete a cron and cancel its pending occurrence")
    p.add_argument("name", type=queue_arg, metavar="NAME", help="the cron's name (see: zsched cron list)")
    p = cmds.leaf(cron, "pause", _cron_pause, help="stop a cron's occurrences until it is resumed",
                  description="Pause the cron NAME: its pending occurrence is cancelled and none is created until "
                              "'zsched cron resume'. Idempotent.")
    p.add_argument("name", type=queue_arg, metavar="NAME")
    p = cmds.leaf(cron, "resume", _cron_resume, help="resume a paused cron from now",
                  description="Resume the paused cron NAME: its next occurrence is the first one after now; "
                              "occurrences that fell in the pause are not run.")
    p.add_argument("name", type=queue_arg, metavar="NAME")


def _cron_add(client: Client, args: argparse.Namespace) -> int:
    pending = client.add_cron(args.name, args.expr, args.payload, queue=args.queue, tz=args.tz,
                              misfire=args.misfire, misfire_grace=args.grace, jitter=args.jitter,
                              max_attempts=args.max_attempts)
    info = next((c for c in client.crons() if c.name == args.name), None)
    if args.json:
        print_json(admin.jsonable(info.__dict__ if info else {"name": args.name, "pending_id": pending}))
    else:
        nxt = info.next_fire if info else None
        print(f"cron {args.name}: next occurrence {pending} at {when_text(dt_ms(nxt))}")
    return EXIT_OK


def _cron_list(client: Client, args: argparse.Namespace) -> int:
    crons = client.crons()
    if args.json:
        print_json([admin.jsonable(c.__dict__) for c in crons])
        return EXIT_OK
    rows = [(c.name, c.expression, c.tz, c.queue, c.misfire + (f" ({c.misfire_grace:g}s)" if c.misfire_grace else ""),
             when_text(dt_ms(c.next_fire)), admin.iso(c.last_fired) or "-", str(c.missed),
             f"since {admin.iso(c.paused)}" if c.paused else "-") for c in crons]
    print(admin.table(("NAME", "EXPR", "TZ", "QUEUE", "MISFIRE", "NEXT", "LAST FIRED", "MISSED", "PAUSED"), rows)
          if rows else "no crons")
    return EXIT_OK


def _cron_remove(client: Client, args: argparse.Namespace) -> int:
    if not client.remove_cron(args.name):
        raise NotFound(f"no cron named {args.name!r} (see: zsched cron list)")
    if args.json:
        print_json({"removed": args.name})
    else:
        print(f"cron {args.name} removed; its pending occurrence was cancelled")
    return EXIT_OK



def _cron_pause(client: Client, args: argparse.Namespace) -> int:
    return report_toggle("cron", args.name, True, client.pause_cron(args.name), args.json)


def _cron_resume(client: Client, args: argparse.Namespace) -> int:
    return report_toggle("cron", args.name, False, client.resume_cron(args.name), args.json)
