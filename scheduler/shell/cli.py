"""The ``zsched`` command. Each subcommand lives in its own module and registers itself here."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

# (module, function) pairs; each function adds one subparser and sets ``func`` on it.
_SUBCOMMANDS: list[tuple[str, str]] = [
    ("scheduler.tier.cli", "add_parser"),
    ("workers.cli", "add_parser"),
    ("scheduler.shell.dev", "add_parser"),
    ("scheduler.shell.cli_jobs", "add_parsers"),
    ("scheduler.shell.cli_epochs", "add_parsers"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zsched", description="zsched: distributed job scheduler")
    parser.add_argument("--log-level", default=os.environ.get("ZSCHED_LOG_LEVEL", "INFO"),
                        help="logging level (default INFO; env ZSCHED_LOG_LEVEL)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    import importlib

    for module, func in _SUBCOMMANDS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                continue  # subcommand not built yet
            raise
        adder: Callable[[argparse._SubParsersAction], None] = getattr(mod, func)
        adder(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, TypeError) as exc:
        print(f"zsched: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
