"""``zsched namespace settings | tombstone-ttl``: the namespace-wide settings from the command line.

Every process of a namespace follows these (the scheduler tier at once, workers within 5 s);
``settings`` shows them all in one place, each also set by its own command (``dead retention``,
``queue rate-limit``) or client method.
"""
from __future__ import annotations

import argparse
from typing import Any

from ..client import Client
from . import admin
from .cli_common import EXIT_OK, Commands, SubParsers, duration_arg, print_json


def add_parsers(sub: SubParsers) -> None:
    """Register ``namespace`` and its actions (called by scheduler/shell/cli.py)."""
    cmds = Commands(sub)
    ns = cmds.group("namespace", help="the namespace's settings: show them; set the tombstone TTL",
                    description="Settings stored with the namespace, which every process of it follows.")
    cmds.leaf(ns, "settings", _settings,
              help="every namespace-wide setting: partitions, tombstone TTL, dead-letter retention, queue "
                   "retirement, rate limits")
    p = cmds.leaf(ns, "tombstone-ttl", _tombstone_ttl,
                  help="show or set how long finished jobs stay visible (zsched job show, Client.get)",
                  description="Show (no argument) or set how long a finished job (done, cancelled, misfired) keeps "
                              "its tombstone, which zsched job show and Client.get() answer from. The scheduler tier "
                              "follows a change at once, workers within 5 s, producers when they connect. Each "
                              "tombstone costs about 100 B of Redis memory; 0s keeps none.")
    p.add_argument("ttl", nargs="?", type=duration_arg, metavar="DURATION", help="e.g. 1h, 10m, 90s; 0s keeps none")


def _tombstone_ttl(client: Client, args: argparse.Namespace) -> int:
    if args.ttl is not None:
        client.set_tombstone_ttl(args.ttl)
    ttl = client.tombstone_ttl()
    if args.json:
        print_json({"tombstone_ttl_seconds": ttl})
    else:
        print(f"tombstone ttl: {admin.human_span(ttl)} (finished jobs stay visible this long)")
    return EXIT_OK


def _settings(client: Client, args: argparse.Namespace) -> int:
    max_dead, dead_ttl = client.dead_retention()
    idle = client.queue_retirement()
    doc: dict[str, Any] = {
        "namespace": client.keyspace.namespace,
        "partitions": client.keyspace.partitions,
        "tombstone_ttl_seconds": client.tombstone_ttl(),
        "dead_retention": {"max_dead": max_dead, "dead_ttl_seconds": dead_ttl},
        "queue_retirement_seconds": idle,
        "rate_limits": {q: {"per_second": r, "burst": b} for q, (r, b) in sorted(client.rate_limits().items())},
    }
    if args.json:
        print_json(doc)
        return EXIT_OK
    print(f"namespace:         {doc['namespace']}")
    print(f"partitions:        {doc['partitions']}")
    print(f"tombstone ttl:     {admin.human_span(doc['tombstone_ttl_seconds'])}")
    print(f"max dead jobs:     {max_dead if max_dead is not None else 'no cap'}")
    print(f"dead job ttl:      {admin.human_span(dead_ttl) if dead_ttl is not None else 'kept until purged'}")
    print(f"queue retirement:  {admin.human_span(idle) + ' idle' if idle is not None else 'never'}")
    limits = doc["rate_limits"]
    print("rate limits:       " + (", ".join(f"{q} {v['per_second']:g}/s (burst {v['burst']:g})"
                                             for q, v in limits.items()) or "none"))
    return EXIT_OK
