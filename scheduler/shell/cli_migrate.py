"""``zsched migrate-partitions``: move a namespace to a new partition count.

Thin argparse layer over :mod:`scheduler.shell.migrate`, with the shared options and error format
of :mod:`scheduler.shell.cli_common`. Exit codes: 0 done (or nothing to do), 1 unknown namespace
or not finished (running jobs did not end in time: re-run), 2 bad input (or another migration is
half done), 3 Redis unreachable or refusing.
"""
from __future__ import annotations

import argparse
import sys

from ..client import Client
from ..protocol.keys import MAX_PARTITIONS
from .cli_common import EXIT_OK, Commands, SubParsers, number, print_json
from .migrate import Migration

EPILOG = ("exit codes: 0 done or nothing to do; 1 unknown namespace, or stopped before the end (re-run the same "
          "command); 2 bad input, or another migration is half done; 3 Redis unreachable or refusing")


def add_parsers(sub: SubParsers) -> None:
    """Register ``migrate-partitions`` (called by scheduler/shell/cli.py)."""
    cmds = Commands(sub, epilog=EPILOG)
    p = cmds.leaf(
        sub, "migrate-partitions", _migrate,
        help="move every job of a namespace to a new partition count",
        description="Move every job (scheduled, ready, held, dead, finished summaries, idempotency keys and "
                    "crons; running jobs once they finish) to the partitions it belongs to under --to N "
                    "partitions, then make N the namespace's count. While it runs the namespace is paused: "
                    "no due job fires, workers claim nothing and producers get LayoutChanged (jobs due "
                    "meanwhile fire late, misfire policies apply). Safe to interrupt and run again: it "
                    "resumes, and nothing is lost or doubled. Afterwards restart the scheduler replicas "
                    "and workers; producers follow by themselves. See docs/scaling.md.")
    p.add_argument("--to", required=True, type=number("a partition count", 1, MAX_PARTITIONS, integer=True),
                   metavar="N", help=f"the new partition count (1-{MAX_PARTITIONS})")
    p.add_argument("--batch", type=number("a batch size", 10, 100_000, integer=True), default=2000, metavar="N",
                   help="jobs one script call moves (default 2000: a few ms of Redis time per call)")
    p.add_argument("--takeover", action="store_true",
                   help="take over from a run that died (kill -9, lost host) without waiting up to 60 s for "
                        "its lock to expire; never use it while another run is alive")
    p.add_argument("--wait-running", type=number("seconds", 0, 86_400), default=600.0, metavar="S",
                   help="how long to wait for jobs running when it started to finish (default 600)")


def _migrate(client: Client, args: argparse.Namespace) -> int:
    def progress(line: str) -> None:
        if not args.json:
            print(line, file=sys.stderr, flush=True)

    report = Migration(client, args.to, batch=args.batch, wait_running=args.wait_running, progress=progress,
                       takeover=args.takeover).run()
    if args.json:
        print_json({"namespace": report.namespace, "from": report.old, "to": report.new, "resumed": report.resumed,
                    "moved": report.moved, "already_in_place": report.skipped, "reaped": report.reaped,
                    "rounds": report.rounds, "seconds": round(report.seconds, 3)})
        return EXIT_OK
    if report.old == report.new:
        print(f"namespace {report.namespace} already has {report.new} partitions: nothing to do")
        return EXIT_OK
    rate = report.moved / report.seconds if report.seconds > 0 else 0.0
    print(f"namespace {report.namespace}: {report.old} -> {report.new} partitions; moved {report.moved} "
          f"(jobs, summaries and crons) in {report.seconds:.1f} s ({rate:,.0f}/s)"
          + (f", {report.skipped} already in place from the interrupted run" if report.skipped else "")
          + (f", {report.reaped} expired lease(s) reaped" if report.reaped else ""))
    print("restart the scheduler replicas and workers now: until then they are refused (their count is "
          f"{report.old}); producers follow by themselves")
    return EXIT_OK
