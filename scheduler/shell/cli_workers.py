"""``zsched workers``: the live worker processes of a namespace and, per queue, how many serve it
and how busy they are, from the worker registry (:mod:`scheduler.protocol.registry`).

Thin argparse layer over :mod:`scheduler.shell.admin.workers`, with the shared options, exit codes
and error format of :mod:`scheduler.shell.cli_common`.
"""
from __future__ import annotations

import argparse

from ..client import Client
from . import admin
from .cli_common import EXIT_OK, Commands, SubParsers, print_json, queue_arg, warn

QUEUES_WIDTH = 40  # the QUEUES column is cut here (--json has every name)


def add_parsers(sub: SubParsers) -> None:
    """Register ``workers`` (called by scheduler/shell/cli.py)."""
    cmds = Commands(sub)
    p = cmds.leaf(sub, "workers", _workers, help="live worker processes: queues, slots in use, last heartbeat",
                  description="The live worker processes of the namespace (from the worker registry every worker "
                              "refreshes): id, host, pid, queues, concurrency, busy and free handler slots, last "
                              "heartbeat, uptime; then per queue the serving workers and their slots. A worker "
                              "that stopped refreshing (killed) drops out 3 of its refresh intervals after its "
                              "last refresh (15 s by default).")
    p.add_argument("--queue", type=queue_arg, metavar="Q", help="only the workers serving queue Q")


def _queues_text(queues: tuple[str, ...]) -> str:
    text = ",".join(queues)
    if len(text) <= QUEUES_WIDTH:
        return text
    shown: list[str] = []
    for q in queues:
        if len(",".join([*shown, q])) > QUEUES_WIDTH - 8:
            break
        shown.append(q)
    return ",".join(shown) + f",+{len(queues) - len(shown)} more"


def _workers(client: Client, args: argparse.Namespace) -> int:
    snap = admin.read_registry(client)
    ns = client.keyspace.namespace
    if snap.unreadable:
        warn(f"{len(snap.unreadable)} worker registry record(s) could not be read (written by another zsched "
             f"version?): {', '.join(snap.unreadable[:5])}")
    if args.json:
        print_json(admin.workers_doc(snap, ns, args.queue))
        return EXIT_OK
    listed = admin.listed(snap, args.queue)
    now = snap.now_ms
    which = f" serving queue {args.queue}" if args.queue else ""
    print(f"namespace {ns}: {len(listed)} live worker(s){which}, Redis time {admin.iso(now)}")
    print()
    if not listed:
        print("no live worker" + which + " (a worker registers when it starts: zsched worker MODULE:ATTR)")
    else:
        rows = [(w.id, w.record.host, w.record.pid, _queues_text(w.record.queues), w.record.concurrency,
                 w.record.busy, w.record.free, admin.human_delta((w.last_ms - now) / 1000),
                 admin.human_span((now - w.started_ms) / 1000), admin.worker_state(w), w.record.version)
                for w in listed]
        print(admin.table(("ID", "HOST", "PID", "QUEUES", "CONCURRENCY", "BUSY", "FREE", "HEARTBEAT", "UPTIME",
                           "STATE", "VERSION"), rows, right=(2, 4, 5, 6)))
    by_queue = admin.queue_summary(snap, args.queue)
    if by_queue:
        print()
        qrows = [(q, s.workers, s.slots, s.busy, s.free) for q, s in by_queue.items()]
        print(admin.table(("QUEUE", "WORKERS", "SLOTS", "BUSY", "FREE"), qrows, right=(1, 2, 3, 4)))
        notes = []
        if any(len(w.record.queues) > 1 for w in snap.serving):
            notes.append("SLOTS and FREE: a worker serving several queues counts its slots under each; BUSY: "
                         "handlers running that queue's jobs")
        if len(snap.serving) < len(snap.workers):
            notes.append("workers stopping (draining) are not counted here: they take no new jobs")
        for note in notes:
            print(f"\n({note})")
    return EXIT_OK
