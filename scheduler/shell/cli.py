"""The ``zsched`` command: the top-level parser; each subcommand lives in its own module and registers itself here."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from workers import cli as worker_cli

from ..tier import cli as tier_cli
from . import cli_cron, cli_dead, cli_epochs, cli_jobs, cli_migrate, cli_stats, dev


def build_parser() -> argparse.ArgumentParser:
    """The ``zsched`` parser with every subcommand; each sets ``func`` (args -> exit code)."""
    parser = argparse.ArgumentParser(prog="zsched", description="zsched: distributed job scheduler")
    parser.add_argument("--log-level", default=os.environ.get("ZSCHED_LOG_LEVEL", "INFO"),
                        help="logging level (default INFO; env ZSCHED_LOG_LEVEL)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    tier_cli.add_parser(sub)
    worker_cli.add_parser(sub)
    dev.add_parser(sub)
    for module in (cli_jobs, cli_dead, cli_stats, cli_cron, cli_epochs, cli_migrate):  # in the order of --help
        module.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zsched ARGV`` (default: the process's arguments); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ValueError as exc:
        # How the subcommands refuse input that parsing could not check (a bad --batch, a
        # MODULE:ATTR that does not import, ConfigError for --redis/--namespace): one line, exit 2.
        # Any other exception is a bug and keeps its traceback.
        print(f"zsched: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
