"""``zsched queue pause | resume | list``: stop and restart claiming from a queue during an incident.

Thin argparse layer over ``Client.pause``/``resume``/``paused`` and ``stats``, with the shared
options, exit codes and error format of :mod:`scheduler.shell.cli_common`.
"""
from __future__ import annotations

import argparse
import logging

from ..client import Client
from ..protocol.codes import Outcome
from . import admin
from .cli_common import EXIT_OK, Commands, SubParsers, dt_ms, print_json, queue_arg, when_text

log = logging.getLogger("zsched.audit")


def add_parsers(sub: SubParsers) -> None:
    """Register ``queue`` and its actions (called by scheduler/shell/cli.py)."""
    cmds = Commands(sub)
    queue = cmds.group("queue", help="pause, resume and list queues",
                       description="Pause a queue (workers claim none of its jobs; due jobs keep moving to ready "
                                   "and wait there), resume it, list queues with their counts and pause state.")
    p = cmds.leaf(queue, "pause", _pause, help="stop workers claiming jobs of a queue",
                  description="Pause QUEUE namespace-wide: workers claim none of its jobs until 'zsched queue "
                              "resume'. Due jobs keep moving to ready and wait there; nothing misfires because "
                              "of the pause. Idempotent; kept in Redis across restarts.")
    p.add_argument("queue", type=queue_arg, metavar="QUEUE", help="queue name")
    p = cmds.leaf(queue, "resume", _resume, help="let workers claim jobs of a paused queue again",
                  description="Resume QUEUE: workers claim the jobs that waited in ready at once. Idempotent.")
    p.add_argument("queue", type=queue_arg, metavar="QUEUE", help="queue name")
    cmds.leaf(queue, "list", _list, help="every queue with its counts and whether it is paused",
              description="Every queue with its scheduled, ready, running and dead counts, and since when it "
                          "is paused (if it is).")


def _pause(client: Client, args: argparse.Namespace) -> int:
    changed = client.pause(args.queue)
    log.info("queue %s paused (changed=%s) by the CLI", args.queue, changed)
    since = client.paused().get(args.queue)
    return report_toggle("queue", args.queue, True, changed, args.json, f" since {when_text(dt_ms(since))}")


def _resume(client: Client, args: argparse.Namespace) -> int:
    changed = client.resume(args.queue)
    log.info("queue %s resumed (changed=%s) by the CLI", args.queue, changed)
    return report_toggle("queue", args.queue, False, changed, args.json)


def report_toggle(kind: str, name: str, paused: bool, outcome: Outcome, as_json: bool, extra: str = "") -> int:
    """Print the outcome of a pause or resume of a queue or cron (``zsched queue|cron pause|resume``);
    NotFound (exit 1) for a cron that does not exist."""
    if outcome is Outcome.NO_CRON:
        raise admin.NotFound(f"no cron named {name!r} (see: zsched cron list)")
    changed = outcome is Outcome.DONE
    if as_json:
        print_json({kind: name, "paused": paused, "changed": changed})
    elif paused:
        print(f"{kind} {name} {'paused' if changed else 'was already paused'}{extra}")
    else:
        print(f"{kind} {name} {'resumed' if changed else 'was not paused'}{extra}")
    return EXIT_OK


def _list(client: Client, args: argparse.Namespace) -> int:
    counts = client.stats()
    paused = client.paused()
    names = sorted(set(counts) | set(paused))
    states = ("scheduled", "ready", "running", "dead")
    if args.json:
        print_json([{"queue": q, **{s: counts.get(q, {}).get(s, 0) for s in states},
                     "paused_since": admin.iso(paused.get(q))} for q in names])
        return EXIT_OK
    rows = [(q, *(counts.get(q, {}).get(s, 0) for s in states),
             when_text(dt_ms(paused[q])) if q in paused else "-") for q in names]
    print(admin.table(("QUEUE", "SCHEDULED", "READY", "RUNNING", "DEAD", "PAUSED SINCE"), rows, right=(1, 2, 3, 4))
          if rows else "no queues")
    return EXIT_OK
