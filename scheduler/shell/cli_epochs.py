"""``zsched epochs show | reset``: inspect and repair the scheduler tier's fencing epochs.

Thin argparse layer over :mod:`scheduler.shell.epochs`, with the shared options and error format of
:mod:`scheduler.shell.cli_common`: ``--redis``, ``--namespace``, ``--json`` on every subcommand; exit
codes 0 ok, 1 not found (unknown namespace) or not done (a partition's epoch changed before the
reset, or the confirmation was declined), 2 bad input, 3 Redis unreachable or refusing; errors on
stderr as ``zsched: error: ...``. See "Epoch conflict runbook" in docs/operations.md.
"""
from __future__ import annotations

import argparse
import logging
import sys

from ..client import Client
from ..protocol.keys import MAX_PARTITIONS
from ..protocol.masking import mask_secrets
from . import admin, epochs
from .admin import AdminError, BadInput, table
from .cli_common import EXIT_OK, Commands, SubParsers, check_etcd, number, print_json, warn

log = logging.getLogger(__name__)

FIX_HINT = "see 'Epoch conflict runbook' in docs/operations.md"
EPILOG = ("exit codes: 0 ok, 1 unknown namespace, or not (all) done: an epoch changed after it was read, or "
          "the confirmation was declined; 2 bad input; 3 Redis unreachable or refusing")


class NotDone(AdminError):
    """Nothing (or not everything) was changed, on purpose. Exit code 1."""


def add_parsers(sub: SubParsers) -> None:
    """Register ``epochs show`` and ``epochs reset`` (called by scheduler/shell/cli.py)."""
    cmds = Commands(sub, epilog=EPILOG)
    acts = cmds.group(
        "epochs", help="show or reset the partitions' fencing epochs (repair after an etcd restore)",
        description="Each partition's owner ticks with an epoch (the etcd create revision of its ownership "
                    "key); Redis keeps the highest epoch seen and refuses older ones. After etcd was restored "
                    "or replaced, every epoch it hands out is older, every tick is refused and nothing fires "
                    "(the replicas log 'EPOCH CONFLICT'). 'reset' repairs that.")

    p = cmds.leaf(acts, "show", _show, precheck=check_etcd,
                  help="each partition's stored epoch; with --etcd, its owner and conflicts",
                  description="List the highest epoch Redis has seen per partition. With --etcd "
                              "(or ZSCHED_ETCD_ENDPOINTS), also each partition's owner and the "
                              "epoch it ticks with: CONFLICT marks an owner whose epoch is older "
                              "than Redis's, so all its ticks are refused.")
    p.add_argument("--etcd", metavar="ENDPOINTS",
                   help="etcd endpoints for owners and conflicts (env ZSCHED_ETCD_ENDPOINTS)")
    p.add_argument("--etcd-timeout", type=number("seconds", 0.1, 60), default=1.5, metavar="S",
                   help="give up on etcd after this long and show owners as unknown (default 1.5)")

    p = cmds.leaf(
        acts, "reset", _reset, precheck=_check_reset_args,
        help="set stored epochs to 0 so the current owners' epochs are accepted again",
        description="Set the stored epoch of the selected partitions to 0 (one atomic compare-and-set per "
                    "partition: a partition whose epoch changed after it was read is left alone). The next "
                    "tick of each partition's owner re-establishes its epoch. Safe while replicas run: tick is "
                    "atomic, so a stale replica can contend for due jobs but never fire one twice.")
    p.add_argument("--partition", type=number("a partition number", 0, MAX_PARTITIONS - 1, integer=True),
                   action="append", metavar="P", help="a partition to reset (repeat for several)")
    p.add_argument("--all", dest="all_", action="store_true", help="every partition of the namespace")
    p.add_argument("--expect", type=number("an epoch", 0, 2**63 - 1, integer=True), metavar="EPOCH",
                   help="with one --partition: reset only if the stored epoch is EPOCH (the value the "
                        "replica's error or 'epochs show' named); default: the value read just before")
    p.add_argument("-y", "--yes", action="store_true",
                   help="do not ask for confirmation (required when stdin is not a terminal)")


def _check_reset_args(args: argparse.Namespace) -> None:
    """Refuse a contradictory or missing selection (run before connecting to Redis)."""
    epochs.select_partitions(args.partition, args.all_, MAX_PARTITIONS)
    if args.expect is not None and (args.all_ or len(set(args.partition or ())) != 1):
        raise BadInput("--expect EPOCH applies to exactly one --partition (each partition has its own epoch)")


# ------------------------------------------------------------------------------- commands


def _show(client: Client, args: argparse.Namespace) -> int:
    ns = client.keyspace.namespace
    stored = epochs.read_epochs(client)
    endpoints = args.etcd  # resolved and checked by check_etcd
    owners: dict[int, epochs.Owner] | None = None
    source, error = "not configured", None
    if endpoints:
        try:
            owners = epochs.read_owner_epochs(endpoints, ns, timeout=args.etcd_timeout)
            source = "etcd"
        except Exception as exc:  # noqa: BLE001 - any etcd failure degrades to "unknown"
            # The repair tool must work while etcd is broken (that is when it is needed), so every
            # failure of this read-only lookup degrades to "owners unknown"; its type and message are
            # in the warning, its traceback with --log-level DEBUG.
            log.debug("reading partition owners from etcd failed", exc_info=True)
            source, error = "unavailable", admin.etcd_failure(exc)
            warn(f"etcd at {mask_secrets(endpoints)} did not answer ({error}); owners and conflicts shown as unknown")
    rows = epochs.describe(stored, owners)
    conflicts = [r.partition for r in rows if r.conflict]
    if args.json:
        print_json({
            "namespace": ns, "partition_count": len(rows), "owners_source": source, "owners_error": error,
            "partitions": [{"partition": r.partition, "epoch": r.epoch,
                            "owner": r.owner.replica if r.owner else None,
                            "owner_epoch": r.owner.epoch if r.owner else None, "conflict": r.conflict}
                           for r in rows],
            "conflicts": conflicts if owners is not None else None,
        })
        return EXIT_OK
    print(f"namespace {ns}: {len(rows)} partitions; EPOCH is the highest owner epoch Redis has seen (0: none)")
    print()
    if owners is None:
        print(table(("PARTITION", "EPOCH"), [(r.partition, r.epoch) for r in rows], right=(0, 1)))
        print("\n(owners and conflicts: give --etcd or set ZSCHED_ETCD_ENDPOINTS)" if source == "not configured"
              else "\n(owners unknown: etcd did not answer)")
        return EXIT_OK

    def status(r: epochs.PartitionEpoch) -> str:
        if r.owner is None:
            return "no owner"
        return "CONFLICT" if r.conflict else "ok"

    print(table(("PARTITION", "EPOCH", "OWNER", "OWNER EPOCH", "STATUS"),
                [(r.partition, r.epoch, r.owner.replica if r.owner else None, r.owner.epoch if r.owner else None,
                  status(r)) for r in rows], right=(0, 1, 3)))
    if conflicts:
        sel = " ".join(f"--partition {p}" for p in conflicts)
        print(f"\nCONFLICT: {len(conflicts)} partition(s) whose owner ticks with an epoch older than Redis's, so "
              f"every tick is refused and their due jobs do not fire (etcd was restored or replaced?). "
              f"Fix: zsched epochs reset {sel} --namespace {ns} ({FIX_HINT})")
    return EXIT_OK


def _reset(client: Client, args: argparse.Namespace) -> int:
    ns = client.keyspace.namespace
    parts = epochs.select_partitions(args.partition, args.all_, client.keyspace.partitions)
    expected = epochs.read_epochs(client, parts)
    if args.expect is not None:
        expected = {parts[0]: args.expect}
    if not args.yes:
        _confirm(ns, expected)
    outcomes = epochs.reset_epochs(client, expected)
    changed = [o for o in outcomes if o.status == "changed"]
    done = [o for o in outcomes if o.status == "reset"]
    if args.json:
        print_json({"namespace": ns, "reset": len(done), "unchanged": len(outcomes) - len(done) - len(changed),
                     "changed": len(changed),
                     "partitions": [{"partition": o.partition, "status": o.status, "epoch_before": o.before,
                                     "epoch_now": o.now} for o in outcomes]})
    else:
        for o in outcomes:
            if o.status == "reset":
                print(f"partition {o.partition}: epoch {o.before} -> 0 (reset)")
            elif o.status == "unchanged":
                print(f"partition {o.partition}: epoch is 0 already, nothing to do")
            else:
                print(f"partition {o.partition}: NOT reset: the stored epoch is {o.now}, not {o.before} as read "
                      "(a replica changed it meanwhile)")
        print(f"reset {len(done)} of {len(outcomes)} partition(s) in namespace {ns}; each owner re-establishes its "
              "epoch with its next tick (replicas retry a conflicting partition as soon as they hear of the reset, "
              "at the latest within 30 s)")
    if changed:
        raise NotDone(f"{len(changed)} partition(s) not reset because their epoch changed after it was read "
                      f"({', '.join(str(o.partition) for o in changed)}); look again with 'zsched epochs show "
                      f"--etcd ...' and run the reset again if they are still in conflict")
    return EXIT_OK


def _confirm(namespace: str, expected: dict[int, int]) -> None:
    """Ask on the terminal (prompt on stderr, so stdout keeps only the result); refuse without one."""
    try:
        interactive = sys.stdin.isatty()
    except (AttributeError, ValueError, OSError):
        interactive = False
    if not interactive:
        raise BadInput(f"refusing to reset {len(expected)} partition epoch(s) without confirmation: stdin is not "
                       "a terminal; add --yes")
    shown = ", ".join(f"{p} (epoch {e})" for p, e in sorted(expected.items())[:20])
    more = f" and {len(expected) - 20} more" if len(expected) > 20 else ""
    sys.stderr.write(f"namespace {namespace}: reset the stored epoch of partition(s) {shown}{more} to 0? "
                     "Do this after an etcd restore, when replicas log EPOCH CONFLICT. [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if answer.strip().lower() not in ("y", "yes"):
        raise NotDone("not confirmed: nothing was changed")
