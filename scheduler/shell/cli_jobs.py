"""``zsched schedule | job show | cancel | reschedule | list``: operator commands for one job or a queue's jobs.

Thin argparse layer over :mod:`scheduler.shell.admin`, with the shared options, exit codes and error
format of :mod:`scheduler.shell.cli_common`. :func:`job_lines` is the text form of one job, also used
by ``zsched dead show``.
"""
from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from ..client import Client
from ..protocol.calls import LIST_MAX_LIMIT, LIST_STATES, MISFIRE_POLICIES
from ..protocol.errors import DurabilityError, MisfiredAtSchedule
from ..protocol.models import JobInfo
from . import admin
from .cli_common import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    WHEN_HELP,
    Commands,
    SubParsers,
    check_grace,
    dt_ms,
    fail,
    job_id_arg,
    number,
    payload_arg,
    print_json,
    queue_arg,
    schedule_when_arg,
    warn_past,
    when_text,
)


def add_parsers(sub: SubParsers) -> None:
    """Register ``schedule`` and ``job`` (called by scheduler/shell/cli.py)."""
    cmds = Commands(sub)
    p = cmds.leaf(sub, "schedule", _schedule, create=True, precheck=check_grace,
                  help="schedule a job; prints its id", description="Schedule one job and print its id.")
    p.add_argument("--at", required=True, type=schedule_when_arg, metavar="WHEN", help=WHEN_HELP)
    p.add_argument("--queue", required=True, type=queue_arg, metavar="Q", help="queue name")
    p.add_argument("--payload", required=True, type=payload_arg, metavar="JSON",
                   help="JSON payload, @file.json, or - for stdin")
    p.add_argument("--key", metavar="K",
                   help="idempotency key: while a job with it is live, the existing id is returned")
    p.add_argument("--max-attempts", type=number("an integer", 1, 255, integer=True), default=5, metavar="N",
                   help="claims before the job is dead-lettered (default 5)")
    p.add_argument("--lease", type=number("seconds", 0.1, 604800), default=30.0, metavar="S",
                   help="visibility timeout of a claim, seconds (default 30)")
    p.add_argument("--misfire", choices=MISFIRE_POLICIES, default="run_late",
                   help="when it comes due late: run_late (default) or skip (drop it past --grace)")
    p.add_argument("--grace", type=number("seconds", 0, 4233600), metavar="S",
                   help="with --misfire skip: how late it may still run, seconds (default 60)")
    p.add_argument("--durable", choices=("replica", "fsync"),
                   help="return only once a replica has the job (WAIT) or the AOF is fsynced (WAITAOF, "
                        "Redis 7.2+); exit 3 with the id if not confirmed in time (the job may exist)")
    p.add_argument("--durable-timeout", type=number("seconds", 0.001, 3600), default=1.0, metavar="S",
                   help="how long --durable waits, seconds (default 1)")

    job = cmds.group("job", help="show, cancel or reschedule one job", description="Operations on one job.")
    p = cmds.leaf(job, "show", _job_show, help="show a job's state, times, attempts, error and payload",
                  description="Show one job, by its id or by its idempotency key: the live job holding the key, "
                              "else the one that last finished with it while its tombstone lives.")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("id", nargs="?", type=job_id_arg, metavar="ID",
                       help="the job's id, as printed by zsched schedule")
    which.add_argument("--key", metavar="K", help="the job's idempotency key instead of its id")
    p = cmds.leaf(job, "cancel", _job_cancel, help="cancel a scheduled or ready job")
    p.add_argument("id", type=job_id_arg, metavar="ID", help="the job's id, as printed by zsched schedule")
    p = cmds.leaf(job, "reschedule", _job_reschedule, help="move a scheduled or ready job to another time")
    p.add_argument("id", type=job_id_arg, metavar="ID", help="the job's id, as printed by zsched schedule")
    p.add_argument("--at", required=True, type=schedule_when_arg, metavar="WHEN",
                   help=WHEN_HELP + "; 'now' and +DURATION are from Redis's clock, as for schedule")
    p = cmds.leaf(job, "list", _job_list,
                  help="a queue's scheduled, ready, running or dead jobs, one page at a time",
                  description="List the jobs of a queue in one state, one page at a time, in one order across "
                              "the partitions: scheduled by run_at (those held back by a rate limit, already due, "
                              "first), running by lease deadline, dead oldest first (zsched dead list: newest "
                              "first); ready jobs partition by partition in the order workers claim them. Each "
                              "page prints the cursor of the "
                              "next one; a page may be short (even empty) while a cursor is printed: keep paging "
                              "until none is. Finished jobs are not listed (zsched job show ID).")
    p.add_argument("--queue", required=True, type=queue_arg, metavar="Q", help="queue name")
    p.add_argument("--state", required=True, choices=LIST_STATES, help="which jobs to list")
    p.add_argument("--limit", type=number("an integer", 1, LIST_MAX_LIMIT, integer=True), default=50, metavar="N",
                   help=f"at most N jobs per page (default 50, at most {LIST_MAX_LIMIT})")
    p.add_argument("--cursor", metavar="C", help="continue after the page that printed this cursor")


# ------------------------------------------------------------------------------- commands


def _schedule(client: Client, args: argparse.Namespace) -> int:
    if args.durable:
        client = Client(client.redis, namespace=client.keyspace.namespace, durable=args.durable,
                        durable_timeout=args.durable_timeout)
    at = args.at if isinstance(args.at, timedelta) else args.at / 1000.0
    if args.misfire != "skip":  # with skip, the policy decides: past its grace, the job is refused below
        warn_past(args.at)
    try:
        jid = client.schedule(at, args.payload, queue=args.queue, key=args.key,
                              max_attempts=args.max_attempts, lease=args.lease, misfire=args.misfire,
                              misfire_grace=args.grace)
    except DurabilityError as exc:
        print(exc.job_id)  # the job may exist: scripts can check it
        fail(str(exc))
        return EXIT_UNAVAILABLE
    except MisfiredAtSchedule as exc:
        print(exc.job_id)  # recorded as misfired: `zsched job show` finds it
        fail(str(exc))
        return EXIT_BAD_INPUT
    if args.json:
        info = client.get(jid)
        print_json(admin.job_doc(info) if info else {"id": jid})
    else:
        print(jid)
    return EXIT_OK


def _job_show(client: Client, args: argparse.Namespace) -> int:
    info = admin.get_job(client, args.id) if args.id is not None else admin.get_job_by_key(client, args.key)
    if args.json:
        print_json(admin.job_doc(info))
    else:
        print(job_lines(info))
    return EXIT_OK


def _job_cancel(client: Client, args: argparse.Namespace) -> int:
    admin.cancel_job(client, args.id)
    if args.json:
        print_json({"id": args.id, "cancelled": True})
    else:
        print(f"cancelled {args.id}")
    return EXIT_OK


def _job_reschedule(client: Client, args: argparse.Namespace) -> int:
    warn_past(args.at)
    info = admin.reschedule_job(client, args.id, args.at)
    if args.json:
        print_json({"id": args.id, "rescheduled": True, "state": info.state.value, "run_at": admin.iso(info.run_at)})
    else:
        where = f"{info.state.value}, due {when_text(dt_ms(info.run_at))}"
        print(f"rescheduled {args.id} ({where})")
    return EXIT_OK


_LIST_COLUMNS = {  # zsched job list: the columns of each state
    "scheduled": ("RUN AT", "ATTEMPTS", "KEY", "LAST ERROR"),
    "ready": ("DUE AT", "ATTEMPTS", "KEY", "LAST ERROR"),
    "running": ("DUE AT", "ATTEMPTS", "LEASE DEADLINE", "FENCE"),
    "dead": ("DUE AT", "ATTEMPTS", "DIED AT", "LAST ERROR"),
}


def _job_list(client: Client, args: argparse.Namespace) -> int:
    jobs, cursor = admin.list_jobs(client, args.queue, args.state, args.limit, args.cursor)
    if args.json:
        print_json({"count": len(jobs), "jobs": [admin.job_row_doc(j) for j in jobs], "next_cursor": cursor})
        return EXIT_OK
    if jobs:
        def row(j: JobInfo) -> tuple[Any, ...]:
            err = admin.first_line(str(j.last_error), 80) if j.last_error else "-"
            attempts = f"{j.attempts}/{j.max_attempts}"
            if args.state == "running":
                return (j.id, admin.iso(j.run_at), attempts, admin.iso(j.lease_deadline), j.fence)
            if args.state == "dead":
                return (j.id, admin.iso(j.run_at), attempts, admin.iso(j.died_at), err)
            return (j.id, admin.iso(j.run_at), attempts, j.key or "-", err)

        print(admin.table(("ID", *_LIST_COLUMNS[args.state]), [row(j) for j in jobs], right=(2,)))
    else:
        print(f"no {args.state} jobs in queue {args.queue!r}" + (" on this page" if cursor else ""))
    if cursor:
        print(f"next page: zsched job list --queue {args.queue} --state {args.state} --limit {args.limit} "
              f"--cursor {cursor}")
    return EXIT_OK


# -------------------------------------------------------------------------------- job text


def job_lines(info: JobInfo, *, full_error: bool = False) -> str:
    """One job as aligned ``label  value`` lines (``zsched job show``): only the fields its state
    has, the last error's first line and the payload as one JSON line. ``full_error``
    (``zsched dead show``): the whole error, then the payload pretty-printed and the traceback."""
    rows = _summary_rows(info) + _lifecycle_rows(info) + _error_rows(info, full_error)
    has_body = info.state.value not in ("done", "cancelled", "misfired")  # tombstones keep no payload
    if has_body and not full_error:
        rows.append(("payload", admin.to_json(admin.jsonable(info.payload))))
    width = max(len(k) for k, _ in rows)
    text = "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
    if has_body and full_error:
        text += "\n\npayload:\n" + admin.to_json(admin.jsonable(info.payload), indent=2)
    if full_error and info.last_error is not None and info.last_error.traceback:
        text += "\n\ntraceback:\n" + info.last_error.traceback.rstrip("\n")
    return text


def _summary_rows(info: JobInfo) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [("id", info.id), ("state", info.state.value)]
    if info.queue is not None:
        rows.append(("queue", info.queue))
    if info.key:
        rows.append(("key", info.key))
    if info.run_at is not None:  # scheduled: when it fires; else when the current or last attempt was due
        label = "run at" if info.state.value == "scheduled" else "due at"
        rows.append((label, when_text(dt_ms(info.run_at))))
    if info.max_attempts is not None:
        rows.append(("attempts", f"{info.attempts}/{info.max_attempts}"))
    if info.created is not None:
        rows.append(("created", admin.iso(info.created) or "-"))
    return rows


def _lifecycle_rows(info: JobInfo) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    if info.lease_deadline is not None:
        rows.append(("lease deadline", when_text(dt_ms(info.lease_deadline))))
    if info.fence is not None:
        rows.append(("fence", str(info.fence)))
    if info.died_at is not None:
        rows.append(("died at", when_text(dt_ms(info.died_at))))
    elif info.finished_at is not None:
        rows.append((f"{info.state.value} at", when_text(dt_ms(info.finished_at))))
    if info.expires_at is not None:
        rows.append(("record expires", when_text(dt_ms(info.expires_at))))
    return rows


def _error_rows(info: JobInfo, full_error: bool) -> list[tuple[str, str]]:
    e = info.last_error
    if e is None:
        return []
    rows = [("last error", str(e) if full_error else admin.first_line(str(e), 160))]
    if e.at is not None:
        rows.append(("error at", admin.iso(e.at) or "-"))
    return rows
