"""``zsched worker MODULE:ATTR``: run a :class:`workers.Worker` defined in your code."""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from scheduler.metrics import host_arg, port_arg
from scheduler.protocol import config
from scheduler.protocol.errors import ZschedError

from .options import DEFAULT_PREFETCH, MAX_ACK_LINGER
from .worker import Worker


def _csv(value: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of queue names, e.g. default,emails")
    return items


def _int_at_least(low: int, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number >= ``low`` (``what`` names it in the error)."""

    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = low - 1
        if n < low:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value!r}")
        return n

    return parse


_count = _int_at_least(0, "a whole number >= 0")
_positive_int = _int_at_least(1, "a positive integer")


def _seconds(value: str) -> float:
    try:
        s = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {value!r}") from None
    if not s >= 0 or s == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds >= 0, got {value!r}")
    return s


def _linger_ms(value: str) -> float:
    """``--ack-linger``: milliseconds from 0 to 1000, as seconds."""
    try:
        ms = float(value)
    except ValueError:
        ms = -1.0
    if not 0 <= ms <= MAX_ACK_LINGER * 1000:  # refuses nan too
        raise argparse.ArgumentTypeError(f"expected milliseconds from 0 to {MAX_ACK_LINGER * 1000:g}, got {value!r}")
    return ms / 1000.0


def add_parser(subparsers: argparse._SubParsersAction[Any]) -> argparse.ArgumentParser:
    """Register the ``worker`` subcommand (called by scheduler/shell/cli.py)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "worker", help="run job handlers: zsched worker MODULE:ATTR",
        description="Run the Worker object named by MODULE:ATTR (the current directory is on the import "
                    "path). Options given here override the Worker's own settings. SIGTERM/SIGINT stop "
                    "gracefully (a second signal exits at once).")
    p.add_argument("app", metavar="MODULE:ATTR", help="e.g. myapp.tasks:worker (a Worker, or a function returning one)")
    config.add_connection_options(
        p, redis_help=f"Redis URL (default: the Worker's, else ZSCHED_REDIS_URL, else {config.DEFAULT_REDIS_URL})",
        namespace_help=f"namespace (default: the Worker's, else ZSCHED_NAMESPACE, else {config.DEFAULT_NAMESPACE})")
    p.add_argument("--queues", metavar="A,B", type=_csv, help="queues to serve (default: the queues with handlers)")
    p.add_argument("--concurrency", metavar="N", type=_positive_int, help="handlers running at once (default 16)")
    p.add_argument("--prefetch", metavar="N", type=_count,
                   help="jobs handed off ahead of their due time (zsched scheduler --handoff-lead) that may wait "
                        f"for it on top of --concurrency (default {DEFAULT_PREFETCH}, a ceiling: a claim takes no more "
                        "than the handlers start within 50 ms of their due time; 0: they wait in handler slots)")
    p.add_argument("--metrics-port", metavar="PORT", type=port_arg,
                   help="serve Prometheus /metrics on this port, and the probes /livez (event loop turning) and "
                        "/readyz (connected to Redis and claiming)")
    p.add_argument("--metrics-host", metavar="ADDR", type=host_arg,
                   help="address for /metrics and the probes (default 127.0.0.1)")
    p.add_argument("--shutdown-grace", metavar="S", type=_seconds,
                   help="seconds running handlers get to finish on SIGTERM (default 30)")
    p.add_argument("--drain-timeout", metavar="S", type=_seconds,
                   help="seconds a stopping worker keeps retrying outcomes (acks, failures) Redis did not take "
                        "before it exits without them; their jobs run again after their leases (default 10)")
    p.add_argument("--registry-interval", metavar="S", type=_seconds,
                   help="seconds between refreshes of this worker's record in the worker registry (zsched "
                        "workers; default 5): a killed worker drops out of the list 3 intervals after its last")
    p.add_argument("--one-listener", action=argparse.BooleanOptionalAction, default=None,
                   help="of the workers serving the same queues only one waits on the doorbells, the others "
                        "sleep until it fills up or a burst rings them all (the default): less CPU per job "
                        "with many workers; --no-one-listener: every idle worker waits on them "
                        "(docs/scaling.md, Adding workers)")
    p.add_argument("--ack-linger", metavar="MS", type=_linger_ms,
                   help="an ack may wait up to MS (at most a tenth of its job's lease) for others of its "
                        "partition, to share one script call: less Redis and worker CPU per job under spread "
                        "traffic, a finished job shows as running up to MS longer (default 0, up to 1000)")
    p.set_defaults(func=main)
    return p


class NotAWorker(ZschedError, TypeError, ValueError):
    """``MODULE:ATTR`` names something that is not a :class:`~workers.Worker`: a wrong type, and a
    bad command-line value (``zsched`` reports ValueErrors as usage errors, exit status 2)."""


def load_worker(spec: str) -> Worker:
    """Import ``MODULE:ATTR`` (ATTR may be dotted) with the current directory on sys.path.
    ValueError if it cannot be found; :class:`NotAWorker` if it is not a Worker."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise ValueError(f"expected MODULE:ATTR (e.g. myapp.tasks:worker), got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name and (mod_name == exc.name or mod_name.startswith(exc.name + ".")):
            raise ValueError(f"cannot import module {mod_name!r} (from {spec!r}): {exc}; run from the directory "
                             "that contains it, or install it") from None
        raise
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"module {mod_name!r} has no attribute {attr!r} (from {spec!r})") from None
    if not isinstance(obj, Worker) and callable(obj):
        obj = obj()  # a factory
    if not isinstance(obj, Worker):
        raise NotAWorker(f"{spec!r} is a {type(obj).__name__}, expected a workers.Worker (or a function returning one)")
    return obj


def main(args: argparse.Namespace) -> int:
    worker = load_worker(args.app)
    worker.configure(redis_url=args.redis, namespace=args.namespace, queues=args.queues,
                     concurrency=args.concurrency, prefetch=args.prefetch, metrics_port=args.metrics_port,
                     metrics_host=args.metrics_host, shutdown_grace=args.shutdown_grace,
                     registry_interval=args.registry_interval, drain_timeout=args.drain_timeout,
                     one_listener=args.one_listener, ack_linger=args.ack_linger)
    args.redis = worker.redis_url  # the URL the worker uses, for zsched's error messages
    worker.run()
    return 0
