"""``zsched stats``: counts per queue and state, and per partition its owner, epoch and earliest due timer.

Thin argparse layer over :func:`scheduler.shell.admin.collect_stats`, with the shared options, exit
codes and error format of :mod:`scheduler.shell.cli_common`.
"""
from __future__ import annotations

import argparse

from ..client import Client
from ..protocol.masking import mask_secrets
from . import admin
from .cli_common import EXIT_OK, Commands, SubParsers, check_etcd, number, print_json, warn, when_text


def add_parsers(sub: SubParsers) -> None:
    """Register ``stats`` (called by scheduler/shell/cli.py)."""
    cmds = Commands(sub)
    p = cmds.leaf(sub, "stats", _stats, precheck=check_etcd,
                  help="counts per queue and state, live workers per queue; per partition owner, earliest due",
                  description="Counts per queue and state with the live workers serving each queue (from the worker "
                              "registry; a queue with ready jobs and no live worker is warned about), and per "
                              "partition: owner replica (from etcd), epoch, earliest due timer and counts.")
    p.add_argument("--etcd", metavar="ENDPOINTS",
                   help="etcd endpoints for partition owners (env ZSCHED_ETCD_ENDPOINTS; without either, "
                        "owners are not shown)")
    p.add_argument("--etcd-timeout", type=number("seconds", 0.1, 60), default=1.5, metavar="S",
                   help="give up on etcd after this long and show owners as unknown (default 1.5)")


def _workers_cell(rep: admin.StatsReport, queue: str) -> str:
    if rep.workers_error is not None:
        return "?"
    w = rep.workers.get(queue)
    return str(w.workers if w is not None else 0)


def _warn_workers(rep: admin.StatsReport) -> None:
    """A queue whose ready jobs nobody will take must not look like a slow one."""
    if rep.workers_error is not None:
        warn(f"{rep.workers_error}; the WORKERS column shows '?'")
    for queue, ready in rep.without_workers():
        paused = " (it is paused, too)" if queue in rep.paused else ""
        warn(f"queue {queue} has {ready} ready job(s) and no live worker{paused}: start a worker serving it "
             "(zsched workers lists the live ones)")


def _stats(client: Client, args: argparse.Namespace) -> int:
    rep = admin.collect_stats(client, etcd_endpoints=args.etcd, etcd_timeout=args.etcd_timeout)
    if rep.owners_source == "unavailable":
        warn(f"etcd at {mask_secrets(args.etcd)} did not answer ({rep.owners_error}); partition owners shown as "
             "unknown")
    _warn_workers(rep)
    if args.json:
        print_json(admin.stats_doc(rep))
        return EXIT_OK
    states = ("scheduled", "ready", "running", "dead")
    empty = {s: 0 for s in states}
    qrows = [(q, *(rep.queues.get(q, empty)[s] for s in states), _workers_cell(rep, q))
             for q in sorted(set(rep.queues) | set(rep.workers))]
    qrows.append(("TOTAL", *(rep.totals[s] for s in states), ""))
    print(f"namespace {rep.namespace}: {len(rep.partitions)} partitions, Redis time {admin.iso(rep.now_ms)}")
    print()
    print(admin.table(("QUEUE", "SCHEDULED", "READY", "RUNNING", "DEAD", "WORKERS"), qrows, right=(1, 2, 3, 4, 5)))
    print()

    def owner(ps: admin.PartitionStats) -> str:
        if rep.owners_source == "etcd":
            return ps.owner or "NONE"
        return "unknown" if rep.owners_source == "unavailable" else "-"

    prows = [(ps.partition, owner(ps), ps.epoch, when_text(ps.earliest_due_ms, rep.now_ms),
              ps.scheduled, ps.ready, ps.running, ps.dead) for ps in rep.partitions]
    print(admin.table(("PARTITION", "OWNER", "EPOCH", "EARLIEST DUE", "SCHEDULED", "READY", "RUNNING", "DEAD"),
                      prows, right=(0, 2, 4, 5, 6, 7)))
    if rep.owners_source == "not configured":
        print("\n(owners: give --etcd or set ZSCHED_ETCD_ENDPOINTS)")
    elif rep.owners_source == "etcd" and any(ps.owner is None for ps in rep.partitions):
        print("\nNONE: no replica owns the partition, so its due jobs are not firing")
    return EXIT_OK
