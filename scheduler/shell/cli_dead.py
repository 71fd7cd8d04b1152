"""``zsched dead list | show | requeue | purge | retention``: the dead-letter queue from the command line.

Thin argparse layer over :mod:`scheduler.shell.admin`, with the shared options, exit codes and error
format of :mod:`scheduler.shell.cli_common`. Mass requeues stream one line (or one JSON element) per
job as they go, so a long, paced requeue shows its progress and holds no job list.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from datetime import timedelta
from typing import Any, Protocol, TextIO

from ..client import Client
from . import admin
from .admin import BadInput
from .cli_common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    WHEN_HELP,
    Commands,
    SubParsers,
    dt_ms,
    duration_arg,
    job_id_arg,
    number,
    print_json,
    queue_arg,
    schedule_when_arg,
    warn_past,
    when_text,
)
from .cli_errors import Interrupted
from .cli_jobs import job_lines


def add_parsers(sub: SubParsers) -> None:
    """Register ``dead`` and its actions (called by scheduler/shell/cli.py)."""
    cmds = Commands(sub)
    dead = cmds.group("dead", help="inspect, requeue or purge dead-lettered jobs",
                      description="The dead-letter queue: jobs whose attempts are spent or that failed permanently.")
    p = cmds.leaf(dead, "list", _dead_list, help="dead jobs, newest first, a page at a time, with the total",
                  description="Dead jobs across every partition, newest death first (the console's order), N per "
                              "page: id, queue, attempts, died at, and the last error's first line (the whole "
                              "error, with its traceback: zsched dead show ID). Prints how many match and the "
                              "commands for the next (older) and previous (newer) pages.")
    p.add_argument("--queue", type=queue_arg, metavar="Q", help="only this queue")
    p.add_argument("--limit", type=number("an integer", 1, 10000, integer=True), default=50, metavar="N",
                   help="at most N jobs per page (default 50)")
    way = p.add_mutually_exclusive_group()
    way.add_argument("--older", metavar="MARK", help="the page after MARK (printed by the previous page)")
    way.add_argument("--newer", metavar="MARK", help="the page before MARK (printed by the previous page)")
    p = cmds.leaf(dead, "show", _dead_show, help="a dead job's payload and full last error with traceback")
    p.add_argument("id", type=job_id_arg, metavar="ID", help="a dead job's id (see: zsched dead list)")
    _add_requeue(cmds, dead)
    p = cmds.leaf(dead, "purge", _dead_purge, help="delete dead jobs for good: one ID, or --older-than DURATION",
                  description="Delete dead jobs for good (body, error and idempotency key).")
    sel = p.add_mutually_exclusive_group(required=True)
    sel.add_argument("id", nargs="?", type=job_id_arg, metavar="ID", help="one dead job")
    sel.add_argument("--older-than", type=duration_arg, metavar="DURATION",
                     help="every dead job that died more than DURATION ago (7d, 12h, 1d12h, 30m)")
    p.add_argument("--dry-run", action="store_true", help="with --older-than: count what would be purged")
    p = cmds.leaf(dead, "retention", _dead_retention,
                  help="show or set how many dead jobs are kept, and for how long",
                  description="Show (no options) or set the namespace's dead-letter retention, applied by the "
                              "scheduler tier on every tick: past --max the oldest dead jobs are dropped, and those "
                              "that died more than --ttl ago; every drop is counted (zsched_jobs_total"
                              "{event=\"dropped\"}) and logged with its id.")
    p.add_argument("--max", type=number("an integer", 1, 10**12, integer=True), metavar="N",
                   help="keep at most N dead jobs in the namespace")
    p.add_argument("--ttl", type=duration_arg, metavar="DURATION", help="drop dead jobs older than DURATION (7d, 12h)")
    p.add_argument("--no-max", action="store_true", help="lift the --max cap")
    p.add_argument("--no-ttl", action="store_true", help="keep dead jobs forever (lift --ttl)")


def _add_requeue(cmds: Commands, dead: SubParsers) -> None:
    p = cmds.leaf(dead, "requeue", _dead_requeue,
                  help="bring dead jobs back (filtered, previewable, paced, idempotent)",
                  description="Requeue one dead job by ID, or every dead job matching --queue and/or "
                              "--error-contains, or --all. Attempts are reset. A job that is not dead any more is "
                              "left alone, so running the same requeue twice brings each job back once. Mass "
                              f"requeues are paced (--rate, default {admin.DEFAULT_MASS_RATE:g} jobs/s) and include "
                              "only jobs that died before the command started.")
    p.add_argument("id", nargs="?", type=job_id_arg, metavar="ID", help="one dead job")
    p.add_argument("--queue", type=queue_arg, metavar="Q", help="dead jobs of this queue")
    p.add_argument("--error-contains", metavar="TEXT",
                   help="dead jobs whose last error (type, message or traceback) contains TEXT")
    p.add_argument("-i", "--ignore-case", action="store_true", help="--error-contains ignores case")
    p.add_argument("--all", dest="all_", action="store_true", help="every dead job (required when no filter is given)")
    p.add_argument("--dry-run", action="store_true", help="list what would be requeued; change nothing")
    p.add_argument("--rate", type=number("jobs per second", 0, 1_000_000), metavar="JOBS_PER_S",
                   help=f"pace mass requeues (default {admin.DEFAULT_MASS_RATE:g}; 0 = no pacing). With a "
                        "future --at, due times are spread at this rate instead of waiting")
    p.add_argument("--at", type=schedule_when_arg, metavar="WHEN",
                   help="due time of the requeued jobs (default now); " + WHEN_HELP
                        + "; 'now' and +DURATION are from Redis's clock, as for schedule")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the summary, not one line per job")


# ------------------------------------------------------------------------------- list, show


def _dead_list(client: Client, args: argparse.Namespace) -> int:
    page = admin.dead_page(client, admin.DeadFilter(queue=args.queue), args.limit, older_than=args.older,
                           newer_than=args.newer)
    jobs = page.jobs
    if args.json:
        print_json({"count": len(jobs), "total": page.total, "total_exact": page.exact, "order": "newest first",
                    "jobs": [admin.dead_row_doc(j) for j in jobs], "older": page.older, "newer": page.newer})
        return EXIT_OK
    where = f" in queue {args.queue!r}" if args.queue else ""
    if not jobs:
        print(f"no dead jobs{where}" + (" on this page" if page.total else ""))
    else:
        total = f"{page.total}" if page.exact else f"at least {page.total}"
        print(f"{len(jobs)} of {total} dead jobs{where}, newest first")
        rows = [(j.id, j.queue, f"{j.attempts}/{j.max_attempts}", admin.iso(j.died_at),
                 admin.error_line(j.last_error, 100) or "-") for j in jobs]
        print(admin.table(("ID", "QUEUE", "ATTEMPTS", "DIED AT", "LAST ERROR"), rows, right=(2,)))
    command = "zsched dead list" + (f" --queue {args.queue}" if args.queue else "") + f" --limit {args.limit}"
    if page.older:
        print(f"next page (older): {command} --older {page.older}")
    if page.newer:
        print(f"previous page (newer): {command} --newer {page.newer}")
    return EXIT_OK


def _dead_show(client: Client, args: argparse.Namespace) -> int:
    info = admin.get_dead_job(client, args.id)
    if args.json:
        print_json(admin.job_doc(info))
        return EXIT_OK
    print(job_lines(info, full_error=True))
    return EXIT_OK


# ---------------------------------------------------------------------------------- requeue


def _dead_requeue(client: Client, args: argparse.Namespace) -> int:
    job_id, flt = admin.dead_selection(args.id, args.queue, args.error_contains, args.all_,
                                       ignore_case=args.ignore_case)
    warn_past(args.at, "the job runs" if job_id is not None else "the requeued jobs run")
    if job_id is not None:
        return _requeue_single(client, args, job_id)
    assert flt is not None
    if isinstance(args.at, timedelta):  # from Redis's clock: the due times of a spread are absolute
        args.at = admin.redis_now_ms(client) + round(args.at / timedelta(milliseconds=1))
    rate = admin.DEFAULT_MASS_RATE if args.rate is None else args.rate
    started = time.monotonic()
    outcomes = admin.requeue_stream(client, admin.iter_dead(client, flt), rate=rate, at_ms=args.at,
                                    dry_run=args.dry_run)
    counts = {"requeued": 0, "not dead": 0, "would requeue": 0}
    emit: _JobStream = _JsonJobs(sys.stdout) if args.json else _TextJobs(sys.stdout, args.quiet)
    try:
        for oc in outcomes:
            counts[oc.status] += 1
            emit.job(oc)
    except KeyboardInterrupt as exc:  # Ctrl-C (or SIGTERM) during a paced requeue: say how far it got
        if args.json:
            emit.close({"interrupted": True, "requeued": counts["requeued"], "not_dead": counts["not dead"]})
        done = f"{counts['requeued']} job(s) were requeued" if not args.dry_run else "nothing was changed"
        raise Interrupted(getattr(exc, "signum", signal.SIGINT),
                          f"{done} ({flt.describe()}); run the same command again to requeue the jobs "
                          "that are still dead") from None
    elapsed = time.monotonic() - started
    matched = sum(counts.values())
    if args.json:
        emit.close({"dry_run": args.dry_run, "selection": flt.describe(), "rate": rate or None,
                    "at": admin.iso(args.at), "matched": matched, "requeued": counts["requeued"],
                    "not_dead": counts["not dead"], "elapsed_s": round(elapsed, 3)})
        return EXIT_OK
    emit.close(None)
    sel = flt.describe()
    if matched == 0:
        print(f"nothing to requeue: no dead jobs match ({sel})")
    elif args.dry_run:
        eta = ""
        if rate and _spread(args, rate):
            eta = f"; due from {admin.iso(args.at)} on, spread at {rate:g} jobs/s"
        elif rate and matched / rate >= 1:
            eta = f"; at {rate:g} jobs/s this takes about {matched / rate:.0f}s"
        print(f"dry run: would requeue {matched} dead job(s) ({sel}){eta}; nothing was changed")
    else:
        extra = f", {counts['not dead']} already requeued/not dead (left alone)" if counts["not dead"] else ""
        print(f"requeued {counts['requeued']} job(s) ({sel}){extra} in {elapsed:.1f}s")
    return EXIT_OK


def _spread(args: argparse.Namespace, rate: float) -> bool:
    return bool(rate) and args.at is not None and args.at > time.time() * 1000 + 1000


def _requeue_single(client: Client, args: argparse.Namespace, job_id: str) -> int:
    if args.dry_run:
        info = admin.get_job(client, job_id)
        would = info.state.value == "dead"
        if args.json:
            print_json({"dry_run": True, "id": job_id, "state": info.state.value, "would_requeue": would})
        elif would:
            print(f"dry run: would requeue {job_id} (queue {info.queue}); nothing was changed")
        else:
            print(f"dry run: nothing to do: job {job_id} is not dead (it is {info.state.value})")
        return EXIT_OK
    ok, info = admin.requeue_one(client, job_id, args.at)
    if args.json:
        print_json({"id": job_id, "requeued": bool(ok), "state": info.state.value,
                    "run_at": admin.iso(info.run_at)})
    elif ok:
        due = f"due {when_text(dt_ms(info.run_at))}" if info.run_at and info.state.value == "scheduled" else "due now"
        print(f"requeued {job_id} (queue {info.queue}): {info.state.value}, {due}")
    else:
        print(f"nothing to do: job {job_id} is not dead (it is {info.state.value}): already requeued/not dead")
    return EXIT_OK


class _JobStream(Protocol):
    def job(self, oc: admin.RequeueOutcome) -> None: ...

    def close(self, summary: dict[str, Any] | None) -> None: ...


_ROW = "{:<13}  {:<30}  {:<16}  {:>8}  {:<24}  {}"


class _TextJobs:
    """Streams one aligned row per job (fixed widths, so nothing is buffered)."""

    def __init__(self, out: TextIO, quiet: bool) -> None:
        self.out, self.quiet, self.header = out, quiet, False

    def job(self, oc: admin.RequeueOutcome) -> None:
        if self.quiet:
            return
        if not self.header:
            print(_ROW.format("STATUS", "ID", "QUEUE", "ATTEMPTS", "DIED AT", "LAST ERROR"), file=self.out)
            self.header = True
        j = oc.job
        err = admin.first_line(str(j.last_error), 80) if j.last_error else "-"
        print(_ROW.format(oc.status, j.id, j.queue or "?", f"{j.attempts}/{j.max_attempts}",
                          admin.iso(j.died_at) or "-", err).rstrip(), file=self.out, flush=True)

    def close(self, summary: dict[str, Any] | None) -> None:
        pass  # the summary line is printed by the caller


class _JsonJobs:
    """Streams one JSON document ``{"jobs": [...], ...summary}`` without holding the job list."""

    def __init__(self, out: TextIO) -> None:
        self.out, self.n = out, 0
        out.write('{"jobs": [')

    def job(self, oc: admin.RequeueOutcome) -> None:
        doc = admin.dead_row_doc(oc.job)
        doc["status"] = oc.status
        doc["due"] = admin.iso(oc.due_ms)
        self.out.write((", " if self.n else "") + json.dumps(doc, ensure_ascii=False))
        self.n += 1

    def close(self, summary: dict[str, Any] | None) -> None:
        tail = json.dumps(summary or {}, ensure_ascii=False)[1:]
        self.out.write("]" + (", " + tail if tail != "}" else "}") + "\n")
        self.out.flush()


# --------------------------------------------------------------------------- purge, retention


def _dead_purge(client: Client, args: argparse.Namespace) -> int:
    if args.id is not None:
        return _purge_single(client, args)
    cutoff = admin.redis_now_ms(client) - int(args.older_than * 1000)
    if args.dry_run:
        n = admin.count_dead_older(client, cutoff)
    else:
        n = admin.purge_older(client, cutoff)
    if args.json:
        print_json({"dry_run": args.dry_run, "purged" if not args.dry_run else "would_purge": n,
                    "died_before": admin.iso(cutoff)})
    else:
        verb = "dry run: would purge" if args.dry_run else "purged"
        print(f"{verb} {n} dead job(s) that died before {admin.iso(cutoff)}")
    return EXIT_OK


def _purge_single(client: Client, args: argparse.Namespace) -> int:
    if args.dry_run:
        info = admin.get_job(client, args.id)
        would = info.state.value == "dead"
        if args.json:
            print_json({"dry_run": True, "id": args.id, "state": info.state.value, "would_purge": would})
        else:
            print(f"dry run: would purge {args.id}" if would else
                  f"dry run: cannot purge {args.id}: it is {info.state.value}, not dead")
        return EXIT_OK if would else EXIT_NOT_FOUND
    admin.purge_one(client, args.id)
    if args.json:
        print_json({"id": args.id, "purged": True})
    else:
        print(f"purged {args.id}")
    return EXIT_OK


def _dead_retention(client: Client, args: argparse.Namespace) -> int:
    if (args.max is not None and args.no_max) or (args.ttl is not None and args.no_ttl):
        raise BadInput("--max/--no-max and --ttl/--no-ttl are each either-or")
    max_dead, ttl = client.dead_retention()
    if args.max is not None or args.no_max or args.ttl is not None or args.no_ttl:
        max_dead = None if args.no_max else (args.max if args.max is not None else max_dead)
        ttl = None if args.no_ttl else (args.ttl if args.ttl is not None else ttl)
        client.set_dead_retention(max_dead=max_dead, dead_ttl=ttl)
    if args.json:
        print_json({"max_dead": max_dead, "dead_ttl_seconds": ttl})
    else:
        print(f"max dead jobs: {max_dead if max_dead is not None else 'no cap'}")
        print(f"dead job ttl:  {admin.human_delta(ttl) if ttl is not None else 'kept until purged'}")
    return EXIT_OK
