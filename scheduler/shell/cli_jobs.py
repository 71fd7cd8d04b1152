"""``zsched schedule | job | dead | stats``: operator commands for jobs and the dead-letter queue.

Thin argparse layer over :mod:`scheduler.shell.admin`. Every subcommand takes ``--redis``,
``--namespace`` and ``--json``. Exit codes: 0 ok, 1 not found (unknown job or namespace, or a job
whose state does not allow the operation), 2 bad input, 3 Redis unreachable or refusing. Errors go
to stderr as ``zsched: error: ...``.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn, TextIO

import redis

from ..client import Client
from ..protocol import config
from ..protocol.calls import LIST_MAX_LIMIT, LIST_STATES, MISFIRE_POLICIES
from ..protocol.errors import DurabilityError, MisfiredAtSchedule
from ..protocol.models import JobInfo
from . import admin
from .admin import AdminError, BadInput, NotFound

EXIT_OK, EXIT_NOT_FOUND, EXIT_BAD_INPUT, EXIT_UNAVAILABLE = 0, 1, 2, 3

Handler = Callable[[Client, argparse.Namespace], int | None]


# ------------------------------------------------------------------------- argument types


def _argtype(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """Turn an admin parser (raising BadInput) into an argparse type (ArgumentTypeError)."""

    def conv(text: str) -> Any:
        try:
            return fn(text)
        except BadInput as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    conv.__name__ = fn.__name__.replace("parse_", "")
    return conv


when_arg = _argtype(admin.parse_when)
schedule_when_arg = _argtype(admin.parse_schedule_when)
duration_arg = _argtype(lambda t: admin.parse_duration(t, name="DURATION"))
payload_arg = _argtype(admin.parse_payload)
job_id_arg = _argtype(admin.parse_job_id)
queue_arg = _argtype(admin.parse_queue)


def _number(kind: str, lo: float, hi: float, *, integer: bool = False) -> Callable[[str], Any]:
    def conv(text: str) -> Any:
        try:
            v: float = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text!r}") from None
        if not (math.isfinite(v) and lo <= v <= hi):
            raise argparse.ArgumentTypeError(f"expected {kind} from {lo:g} to {hi:g}, got {text!r}")
        return v

    conv.__name__ = kind
    return conv


def _error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.print_usage(sys.stderr)
    parser.exit(EXIT_BAD_INPUT, f"zsched: error: {message} (see: {parser.prog} --help)\n")


def _patched(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make argparse's own errors look like ours (``zsched: error:``, exit 2)."""
    parser.error = functools.partial(_error, parser)
    return parser


def _common() -> argparse.ArgumentParser:
    c = argparse.ArgumentParser(add_help=False)
    g = c.add_argument_group("connection and output")
    g.add_argument("--redis", metavar="URL", help="Redis URL (env ZSCHED_REDIS_URL, default redis://127.0.0.1:6379/0)")
    g.add_argument("--namespace", metavar="NS", help="namespace (env ZSCHED_NAMESPACE, default zsched)")
    g.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    return c


# ------------------------------------------------------------------------------- parsers

WHEN_HELP = ("ISO-8601 with a zone (2026-12-01T09:00:00+01:00, ...Z), +DURATION from now "
             "(+90s, +4h, +1d2h30m), 'now', or epoch seconds")
EPILOG = ("exit codes: 0 ok, 1 not found (unknown job/namespace, or a state that does not allow it), "
          "2 bad input, 3 Redis unreachable or refusing")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``schedule``, ``job``, ``dead`` and ``stats`` (called by scheduler/cli.py)."""
    common = _common()

    def leaf(parent: argparse._SubParsersAction[argparse.ArgumentParser], name: str, handler: Handler, *,
             create: bool = False, **kw: Any) -> argparse.ArgumentParser:
        p = _patched(parent.add_parser(name, parents=[common], epilog=EPILOG, **kw))
        p.set_defaults(func=_runner(handler, create=create))
        return p

    def group(name: str, **kw: Any) -> argparse._SubParsersAction[argparse.ArgumentParser]:
        p = _patched(sub.add_parser(name, **kw))
        return p.add_subparsers(dest=f"{name}_action", metavar="ACTION", required=True)

    p = leaf(sub, "schedule", _schedule, create=True, help="schedule a job; prints its id",
             description="Schedule one job and print its id.")
    p.add_argument("--at", required=True, type=schedule_when_arg, metavar="WHEN", help=WHEN_HELP)
    p.add_argument("--queue", required=True, type=queue_arg, metavar="Q", help="queue name")
    p.add_argument("--payload", required=True, type=payload_arg, metavar="JSON",
                   help="JSON payload, @file.json, or - for stdin")
    p.add_argument("--key", metavar="K",
                   help="idempotency key: while a job with it is live, the existing id is returned")
    p.add_argument("--max-attempts", type=_number("an integer", 1, 255, integer=True), default=5, metavar="N",
                   help="claims before the job is dead-lettered (default 5)")
    p.add_argument("--lease", type=_number("seconds", 0.1, 604800), default=30.0, metavar="S",
                   help="visibility timeout of a claim, seconds (default 30)")
    p.add_argument("--misfire", choices=MISFIRE_POLICIES, default="run_late",
                   help="when it comes due late: run_late (default) or skip (drop it past --grace)")
    p.add_argument("--grace", type=_number("seconds", 0, 4233600), metavar="S",
                   help="with --misfire skip: how late it may still run, seconds (default 60)")
    p.add_argument("--durable", choices=("replica", "fsync"),
                   help="return only once a replica has the job (WAIT) or the AOF is fsynced (WAITAOF, "
                        "Redis 7.2+); exit 3 with the id if not confirmed in time (the job may exist)")
    p.add_argument("--durable-timeout", type=_number("seconds", 0.001, 3600), default=1.0, metavar="S",
                   help="how long --durable waits, seconds (default 1)")

    job = group("job", help="show, cancel or reschedule one job", description="Operations on one job.")
    p = leaf(job, "show", _job_show, help="show a job's state, times, attempts, error and payload")
    p.add_argument("id", type=job_id_arg, metavar="ID")
    p = leaf(job, "cancel", _job_cancel, help="cancel a scheduled or ready job")
    p.add_argument("id", type=job_id_arg, metavar="ID")
    p = leaf(job, "reschedule", _job_reschedule, help="move a scheduled or ready job to another time")
    p.add_argument("id", type=job_id_arg, metavar="ID")
    p.add_argument("--at", required=True, type=when_arg, metavar="WHEN", help=WHEN_HELP)
    p = leaf(job, "list", _job_list, help="a queue's scheduled, ready, running or dead jobs, one page at a time",
             description="List the jobs of a queue in one state, one page at a time, partition by partition: "
                         "scheduled by run_at (those held back by a rate limit first), ready in claim order, "
                         "running by lease deadline, dead oldest first. Each page prints the cursor of the "
                         "next one; a page may be short (even empty) while a cursor is printed: keep paging "
                         "until none is. Finished jobs are not listed (zsched job show ID).")
    p.add_argument("--queue", required=True, type=queue_arg, metavar="Q", help="queue name")
    p.add_argument("--state", required=True, choices=LIST_STATES, help="which jobs to list")
    p.add_argument("--limit", type=_number("an integer", 1, LIST_MAX_LIMIT, integer=True), default=50, metavar="N",
                   help=f"at most N jobs per page (default 50, at most {LIST_MAX_LIMIT})")
    p.add_argument("--cursor", metavar="C", help="continue after the page that printed this cursor")

    dead = group("dead", help="inspect, requeue or purge dead-lettered jobs",
                 description="The dead-letter queue: jobs whose attempts are spent or that failed permanently.")
    p = leaf(dead, "list", _dead_list, help="newest dead jobs: id, queue, attempts, died at, last error")
    p.add_argument("--queue", type=queue_arg, metavar="Q", help="only this queue")
    p.add_argument("--limit", type=_number("an integer", 1, 10000, integer=True), default=50, metavar="N",
                   help="at most N jobs, newest first (default 50)")
    p = leaf(dead, "show", _dead_show, help="a dead job's payload and full last error with traceback")
    p.add_argument("id", type=job_id_arg, metavar="ID")
    p = leaf(dead, "requeue", _dead_requeue, help="bring dead jobs back (filtered, previewable, paced, idempotent)",
             description="Requeue one dead job by ID, or every dead job matching --queue and/or --error-contains, "
                         "or --all. Attempts are reset. A job that is not dead any more is left alone, so "
                         "running the same requeue twice brings each job back once. Mass requeues are paced "
                         f"(--rate, default {admin.DEFAULT_MASS_RATE:g} jobs/s) and include only jobs that died "
                         "before the command started.")
    p.add_argument("id", nargs="?", type=job_id_arg, metavar="ID", help="one dead job")
    p.add_argument("--queue", type=queue_arg, metavar="Q", help="dead jobs of this queue")
    p.add_argument("--error-contains", metavar="TEXT",
                   help="dead jobs whose last error (type, message or traceback) contains TEXT")
    p.add_argument("-i", "--ignore-case", action="store_true", help="--error-contains ignores case")
    p.add_argument("--all", dest="all_", action="store_true", help="every dead job (required when no filter is given)")
    p.add_argument("--dry-run", action="store_true", help="list what would be requeued; change nothing")
    p.add_argument("--rate", type=_number("jobs per second", 0, 1_000_000), metavar="JOBS_PER_S",
                   help=f"pace mass requeues (default {admin.DEFAULT_MASS_RATE:g}; 0 = no pacing). With a "
                        "future --at, due times are spread at this rate instead of waiting")
    p.add_argument("--at", type=when_arg, metavar="WHEN",
                   help="due time of the requeued jobs (default now); " + WHEN_HELP)
    p.add_argument("-q", "--quiet", action="store_true", help="print only the summary, not one line per job")
    p = leaf(dead, "purge", _dead_purge, help="delete dead jobs for good: one ID, or --older-than DURATION",
             description="Delete dead jobs for good (body, error and idempotency key).")
    sel = p.add_mutually_exclusive_group(required=True)
    sel.add_argument("id", nargs="?", type=job_id_arg, metavar="ID", help="one dead job")
    sel.add_argument("--older-than", type=duration_arg, metavar="DURATION",
                     help="every dead job that died more than DURATION ago (7d, 12h, 1d12h, 30m)")
    p.add_argument("--dry-run", action="store_true", help="with --older-than: count what would be purged")
    p = leaf(dead, "retention", _dead_retention, help="show or set how many dead jobs are kept, and for how long",
             description="Show (no options) or set the namespace's dead-letter retention, applied by the "
                         "scheduler tier on every tick: past --max the oldest dead jobs are dropped, and those "
                         "that died more than --ttl ago; every drop is counted (zsched_jobs_total"
                         "{event=\"dropped\"}) and logged with its id.")
    p.add_argument("--max", type=_number("an integer", 1, 10**12, integer=True), metavar="N",
                   help="keep at most N dead jobs in the namespace")
    p.add_argument("--ttl", type=duration_arg, metavar="DURATION", help="drop dead jobs older than DURATION (7d, 12h)")
    p.add_argument("--no-max", action="store_true", help="lift the --max cap")
    p.add_argument("--no-ttl", action="store_true", help="keep dead jobs forever (lift --ttl)")

    p = leaf(sub, "stats", _stats, help="counts per queue and state; per partition owner, earliest due, counts",
             description="Counts per queue and state, and per partition: owner replica (from etcd), epoch, "
                         "earliest due timer and counts.")
    p.add_argument("--etcd", metavar="ENDPOINTS",
                   help="etcd endpoints for partition owners (env ZSCHED_ETCD_ENDPOINTS; without either, "
                        "owners are not shown)")
    p.add_argument("--etcd-timeout", type=_number("seconds", 0.1, 60), default=1.5, metavar="S",
                   help="give up on etcd after this long and show owners as unknown (default 1.5)")

    cron = group("cron", help="recurring schedules: add, list, remove")
    p = leaf(cron, "add", _cron_add, create=True, help="create or replace a cron",
             description="Create or replace the cron NAME. Each occurrence is an ordinary job; a cron always "
                         "has exactly one pending occurrence.")
    p.add_argument("name", type=queue_arg, metavar="NAME", help="cron name (letters, digits, _ . -)")
    p.add_argument("expr", metavar="EXPR",
                   help="cron expression: 'minute hour day month weekday' (e.g. '0 9 * * *'), or 6 fields with "
                        "seconds last")
    p.add_argument("--queue", required=True, type=queue_arg, metavar="Q", help="queue of the occurrences")
    p.add_argument("--payload", type=payload_arg, default=None, metavar="JSON",
                   help="payload as JSON, @FILE, or - for stdin (default null)")
    p.add_argument("--tz", default="UTC", metavar="TZ", help="IANA time zone of the expression (default UTC)")
    p.add_argument("--misfire", choices=MISFIRE_POLICIES, default="run_late",
                   help="after an outage: run_late fires one catch-up run, skip drops missed occurrences")
    p.add_argument("--grace", type=_number("seconds", 0, 4233600), metavar="S",
                   help="with --misfire skip: how late an occurrence may still run (default 60)")
    p.add_argument("--jitter", type=_number("seconds", 0, 86400), default=0.0, metavar="S",
                   help="spread each occurrence uniformly over [nominal, nominal + S]")
    p.add_argument("--max-attempts", type=_number("an integer", 1, 255, integer=True), default=5, metavar="N")
    leaf(cron, "list", _cron_list, help="every cron with its next fire time")
    p = leaf(cron, "remove", _cron_remove, help="delete a cron and cancel its pending occurrence")
    p.add_argument("name", type=queue_arg, metavar="NAME")


# ----------------------------------------------------------------------------------- cron


def _cron_add(client: Client, args: argparse.Namespace) -> int:
    pending = client.add_cron(args.name, args.expr, args.payload, queue=args.queue, tz=args.tz,
                              misfire=args.misfire, misfire_grace=args.grace, jitter=args.jitter,
                              max_attempts=args.max_attempts)
    [info] = [c for c in client.crons() if c.name == args.name] or [None]
    if args.json:
        _print_json(admin.jsonable(info.__dict__ if info else {"name": args.name, "pending_id": pending}))
    else:
        nxt = info.next_fire if info else None
        print(f"cron {args.name}: next occurrence {pending} at {_when_text(_dt_ms(nxt))}")
    return EXIT_OK


def _cron_list(client: Client, args: argparse.Namespace) -> int:
    crons = client.crons()
    if args.json:
        _print_json([admin.jsonable(c.__dict__) for c in crons])
        return EXIT_OK
    rows = [(c.name, c.expression, c.tz, c.queue, c.misfire + (f" ({c.misfire_grace:g}s)" if c.misfire_grace else ""),
             _when_text(_dt_ms(c.next_fire)), admin.iso(c.last_fired) or "-") for c in crons]
    print(admin.table(("NAME", "EXPR", "TZ", "QUEUE", "MISFIRE", "NEXT", "LAST FIRED"), rows) if rows else "no crons")
    return EXIT_OK


def _cron_remove(client: Client, args: argparse.Namespace) -> int:
    if not client.remove_cron(args.name):
        raise NotFound(f"no cron named {args.name!r} (see: zsched cron list)")
    if args.json:
        _print_json({"removed": args.name})
    else:
        print(f"cron {args.name} removed; its pending occurrence was cancelled")
    return EXIT_OK


# --------------------------------------------------------------------------------- runner


def _fail(message: str) -> None:
    print(f"zsched: error: {message}", file=sys.stderr)


def _warn(message: str) -> None:
    print(f"zsched: warning: {message}", file=sys.stderr)


def _runner(handler: Handler, *, create: bool) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        client: Client | None = None
        try:
            client = admin.open_client(args.redis, args.namespace, create=create)
            return int(handler(client, args) or 0)
        except AdminError as exc:
            _fail(str(exc))
            return exc.exit_code
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            url = admin.safe_url(config.redis_url(args.redis))
            _fail(f"cannot reach Redis at {url}: {exc} (check --redis / ZSCHED_REDIS_URL)")
            return EXIT_UNAVAILABLE
        except redis.exceptions.RedisError as exc:  # e.g. NOPERM for an ACL user, OOM, READONLY replica
            _fail(f"Redis refused the command: {type(exc).__name__}: {exc}")
            return EXIT_UNAVAILABLE
        except (ValueError, TypeError) as exc:  # validation in the client (ConfigError, PayloadError, ...)
            _fail(str(exc))
            return EXIT_BAD_INPUT
        except BrokenPipeError:  # `zsched dead list | head`
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
            return EXIT_OK
        finally:
            if client is not None:
                client.close()

    return run


def _print_json(doc: Any, out: TextIO | None = None) -> None:
    print(json.dumps(doc, ensure_ascii=False), file=out or sys.stdout)


def _when_text(ms: int | None, now_ms: float | None = None) -> str:
    if ms is None:
        return "-"
    now = time.time() * 1000 if now_ms is None else now_ms
    return f"{admin.iso(ms)} ({admin.human_delta((ms - now) / 1000)})"


def _dt_ms(dt: Any) -> int | None:
    return None if dt is None else int(round(dt.timestamp() * 1000))


def _job_lines(info: JobInfo, *, full_error: bool = False) -> str:
    rows: list[tuple[str, str]] = [("id", info.id), ("state", info.state.value)]
    if info.queue is not None:
        rows.append(("queue", info.queue))
    if info.key:
        rows.append(("key", info.key))
    if info.run_at is not None:  # scheduled: when it fires; else when the current or last attempt was due
        label = "run at" if info.state.value == "scheduled" else "due at"
        rows.append((label, _when_text(_dt_ms(info.run_at))))
    if info.max_attempts is not None:
        rows.append(("attempts", f"{info.attempts}/{info.max_attempts}"))
    if info.created is not None:
        rows.append(("created", admin.iso(info.created) or "-"))
    if info.lease_deadline is not None:
        rows.append(("lease deadline", _when_text(_dt_ms(info.lease_deadline))))
    if info.fence is not None:
        rows.append(("fence", str(info.fence)))
    if info.died_at is not None:
        rows.append(("died at", _when_text(_dt_ms(info.died_at))))
    elif info.finished_at is not None:
        rows.append((f"{info.state.value} at", _when_text(_dt_ms(info.finished_at))))
    if info.expires_at is not None:
        rows.append(("record expires", _when_text(_dt_ms(info.expires_at))))
    if info.last_error is not None:
        e = info.last_error
        rows.append(("last error", str(e) if full_error else admin.first_line(str(e), 160)))
        if e.at is not None:
            rows.append(("error at", admin.iso(e.at) or "-"))
    has_body = info.state.value not in ("done", "cancelled", "misfired")
    if has_body and not full_error:
        rows.append(("payload", json.dumps(admin.jsonable(info.payload), ensure_ascii=False)))
    width = max(len(k) for k, _ in rows)
    text = "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
    if has_body and full_error:
        text += "\n\npayload:\n" + json.dumps(admin.jsonable(info.payload), ensure_ascii=False, indent=2)
    if full_error and info.last_error is not None and info.last_error.traceback:
        text += "\n\ntraceback:\n" + info.last_error.traceback.rstrip("\n")
    return text


# ------------------------------------------------------------------------------- commands


def _schedule(client: Client, args: argparse.Namespace) -> int:
    if args.grace is not None and args.misfire != "skip":
        raise BadInput("--grace only applies with --misfire skip (how late a skipped job may still run)")
    if args.durable:
        client = Client(client.redis, namespace=client.keyspace.namespace, durable=args.durable,
                        durable_timeout=args.durable_timeout)
    at = args.at if isinstance(args.at, timedelta) else args.at / 1000.0
    try:
        jid = client.schedule(at, args.payload, queue=args.queue, key=args.key,
                              max_attempts=args.max_attempts, lease=args.lease, misfire=args.misfire,
                              misfire_grace=args.grace)
    except DurabilityError as exc:
        print(exc.job_id)  # the job may exist: scripts can check it
        _fail(str(exc))
        return EXIT_UNAVAILABLE
    except MisfiredAtSchedule as exc:
        print(exc.job_id)  # recorded as misfired: `zsched job show` finds it
        _fail(str(exc))
        return EXIT_BAD_INPUT
    if args.json:
        info = client.get(jid)
        _print_json(admin.job_doc(info) if info else {"id": jid})
    else:
        print(jid)
    return EXIT_OK


def _job_show(client: Client, args: argparse.Namespace) -> int:
    info = admin.get_job(client, args.id)
    if args.json:
        _print_json(admin.job_doc(info))
    else:
        print(_job_lines(info))
    return EXIT_OK


def _job_cancel(client: Client, args: argparse.Namespace) -> int:
    admin.cancel_job(client, args.id)
    if args.json:
        _print_json({"id": args.id, "cancelled": True})
    else:
        print(f"cancelled {args.id}")
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
        _print_json({"count": len(jobs), "jobs": [admin.job_row_doc(j) for j in jobs], "next_cursor": cursor})
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


def _job_reschedule(client: Client, args: argparse.Namespace) -> int:
    info = admin.reschedule_job(client, args.id, args.at)
    if args.json:
        _print_json({"id": args.id, "rescheduled": True, "state": info.state.value, "run_at": admin.iso(args.at)})
    else:
        where = f"{info.state.value}, due {_when_text(args.at)}"
        print(f"rescheduled {args.id} ({where})")
    return EXIT_OK


def _dead_list(client: Client, args: argparse.Namespace) -> int:
    jobs = admin.list_dead(client, args.queue, args.limit)
    if args.json:
        _print_json({"count": len(jobs), "jobs": [admin.dead_row_doc(j) for j in jobs]})
        return EXIT_OK
    if not jobs:
        print("no dead jobs" + (f" in queue {args.queue!r}" if args.queue else ""))
        return EXIT_OK
    rows = [(j.id, j.queue, f"{j.attempts}/{j.max_attempts}", admin.iso(j.died_at),
             admin.first_line(str(j.last_error), 100) if j.last_error else "-") for j in jobs]
    print(admin.table(("ID", "QUEUE", "ATTEMPTS", "DIED AT", "LAST ERROR"), rows, right=(2,)))
    return EXIT_OK


def _dead_show(client: Client, args: argparse.Namespace) -> int:
    info = admin.get_dead_job(client, args.id)
    if args.json:
        _print_json(admin.job_doc(info))
        return EXIT_OK
    print(_job_lines(info, full_error=True))
    return EXIT_OK


_ROW = "{:<13}  {:<30}  {:<16}  {:>8}  {:<24}  {}"


def _dead_requeue(client: Client, args: argparse.Namespace) -> int:
    job_id, flt = admin.dead_selection(args.id, args.queue, args.error_contains, args.all_,
                                       ignore_case=args.ignore_case)
    if job_id is not None:
        return _requeue_single(client, args, job_id)
    assert flt is not None
    rate = admin.DEFAULT_MASS_RATE if args.rate is None else args.rate
    started = time.monotonic()
    outcomes = admin.requeue_stream(client, admin.iter_dead(client, flt), rate=rate, at_ms=args.at,
                                    dry_run=args.dry_run)
    counts = {"requeued": 0, "not dead": 0, "would requeue": 0}
    emit = _JsonJobs(sys.stdout) if args.json else _TextJobs(sys.stdout, args.quiet)
    for oc in outcomes:
        counts[oc.status] += 1
        emit.job(oc)
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
            _print_json({"dry_run": True, "id": job_id, "state": info.state.value, "would_requeue": would})
        elif would:
            print(f"dry run: would requeue {job_id} (queue {info.queue}); nothing was changed")
        else:
            print(f"dry run: nothing to do: job {job_id} is not dead (it is {info.state.value})")
        return EXIT_OK
    ok, info = admin.requeue_one(client, job_id, args.at)
    if args.json:
        _print_json({"id": job_id, "requeued": ok, "state": info.state.value,
                     "run_at": admin.iso(info.run_at)})
    elif ok:
        due = f"due {_when_text(_dt_ms(info.run_at))}" if info.run_at and info.state.value == "scheduled" else "due now"
        print(f"requeued {job_id} (queue {info.queue}): {info.state.value}, {due}")
    else:
        print(f"nothing to do: job {job_id} is not dead (it is {info.state.value}): already requeued/not dead")
    return EXIT_OK


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
        pass


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


def _dead_retention(client: Client, args: argparse.Namespace) -> int:
    if (args.max is not None and args.no_max) or (args.ttl is not None and args.no_ttl):
        raise BadInput("--max/--no-max and --ttl/--no-ttl are each either-or")
    max_dead, ttl = client.dead_retention()
    if args.max is not None or args.no_max or args.ttl is not None or args.no_ttl:
        max_dead = None if args.no_max else (args.max if args.max is not None else max_dead)
        ttl = None if args.no_ttl else (args.ttl if args.ttl is not None else ttl)
        client.set_dead_retention(max_dead=max_dead, dead_ttl=ttl)
    if args.json:
        _print_json({"max_dead": max_dead, "dead_ttl_seconds": ttl})
    else:
        print(f"max dead jobs: {max_dead if max_dead is not None else 'no cap'}")
        print(f"dead job ttl:  {admin.human_delta(ttl) if ttl is not None else 'kept until purged'}")
    return EXIT_OK


def _dead_purge(client: Client, args: argparse.Namespace) -> int:
    if args.id is not None:
        if args.dry_run:
            info = admin.get_job(client, args.id)
            would = info.state.value == "dead"
            if args.json:
                _print_json({"dry_run": True, "id": args.id, "state": info.state.value, "would_purge": would})
            else:
                print(f"dry run: would purge {args.id}" if would else
                      f"dry run: cannot purge {args.id}: it is {info.state.value}, not dead")
            return EXIT_OK if would else EXIT_NOT_FOUND
        admin.purge_one(client, args.id)
        if args.json:
            _print_json({"id": args.id, "purged": True})
        else:
            print(f"purged {args.id}")
        return EXIT_OK
    cutoff = admin.redis_now_ms(client) - int(args.older_than * 1000)
    if args.dry_run:
        n = admin.count_dead_older(client, cutoff)
    else:
        n = admin.purge_older(client, cutoff)
    if args.json:
        _print_json({"dry_run": args.dry_run, "purged" if not args.dry_run else "would_purge": n,
                     "died_before": admin.iso(cutoff)})
    else:
        verb = "dry run: would purge" if args.dry_run else "purged"
        print(f"{verb} {n} dead job(s) that died before {admin.iso(cutoff)}")
    return EXIT_OK


def _stats(client: Client, args: argparse.Namespace) -> int:
    endpoints = args.etcd or os.environ.get("ZSCHED_ETCD_ENDPOINTS") or None
    rep = admin.collect_stats(client, etcd_endpoints=endpoints, etcd_timeout=args.etcd_timeout)
    if rep.owners_source == "unavailable":
        _warn(f"etcd at {endpoints} did not answer ({rep.owners_error}); partition owners shown as unknown")
    if args.json:
        _print_json(admin.stats_doc(rep))
        return EXIT_OK
    states = ("scheduled", "ready", "running", "dead")
    qrows = [(q, *(c[s] for s in states)) for q, c in sorted(rep.queues.items())]
    qrows.append(("TOTAL", *(rep.totals[s] for s in states)))
    print(f"namespace {rep.namespace}: {len(rep.partitions)} partitions, Redis time {admin.iso(rep.now_ms)}")
    print()
    print(admin.table(("QUEUE", "SCHEDULED", "READY", "RUNNING", "DEAD"), qrows, right=(1, 2, 3, 4)))
    print()

    def owner(ps: admin.PartitionStats) -> str:
        if rep.owners_source == "etcd":
            return ps.owner or "NONE"
        return "unknown" if rep.owners_source == "unavailable" else "-"

    prows = [(ps.partition, owner(ps), ps.epoch, _when_text(ps.earliest_due_ms, rep.now_ms),
              ps.scheduled, ps.ready, ps.running, ps.dead) for ps in rep.partitions]
    print(admin.table(("PARTITION", "OWNER", "EPOCH", "EARLIEST DUE", "SCHEDULED", "READY", "RUNNING", "DEAD"),
                      prows, right=(0, 2, 4, 5, 6, 7)))
    if rep.owners_source == "not configured":
        print("\n(owners: give --etcd or set ZSCHED_ETCD_ENDPOINTS)")
    elif rep.owners_source == "etcd" and any(ps.owner is None for ps in rep.partitions):
        print("\nNONE: no replica owns the partition, so its due jobs are not firing")
    return EXIT_OK
