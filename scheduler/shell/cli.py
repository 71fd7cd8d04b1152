"""The ``zsched`` command: the top-level parser; each subcommand lives in its own module and registers itself here."""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from workers import cli as worker_cli

from ..protocol import config
from ..protocol.masking import mask_secrets
from ..runtime import entry_point_logging
from ..tier import cli as tier_cli
from . import (
    cli_cron,
    cli_dead,
    cli_effects,
    cli_epochs,
    cli_jobs,
    cli_migrate,
    cli_namespace,
    cli_outbox,
    cli_queue,
    cli_stats,
    cli_ui,
    cli_workers,
    dev,
)
from .cli_common import DEBUG_HELP, LOG_LEVEL_HELP, add_process_options, patch_errors
from .cli_errors import explain, interrupt_on_sigterm, interrupted_line
from .servers import watch_lifeline


def build_parser() -> argparse.ArgumentParser:
    """The ``zsched`` parser with every subcommand; each sets ``func`` (args -> exit code).

    ``--log-level`` and ``--debug`` go before the subcommand or after it (``zsched dev --log-level DEBUG``,
    ``zsched job show ID --debug``); given in both places, the later one wins."""
    parser = argparse.ArgumentParser(prog="zsched", description="zsched: distributed job scheduler")
    parser.add_argument("--log-level", default=config.log_level(), help=LOG_LEVEL_HELP)
    parser.add_argument("--debug", action="store_true", default=config.debug(), help=DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    tier_cli.add_parser(sub)
    worker_cli.add_parser(sub)
    dev.add_parser(sub)
    # in --help order
    for module in (cli_jobs, cli_dead, cli_stats, cli_workers, cli_queue, cli_cron, cli_namespace, cli_effects,
                   cli_outbox, cli_epochs, cli_migrate, cli_ui):
        module.add_parsers(sub)
    for command in (parser, *sub.choices.values()):  # scheduler, worker, dev: argparse's errors as ours too
        patch_errors(command)
    for name in ("scheduler", "worker", "dev", "ui"):  # the others take them with the common options
        add_process_options(sub.choices[name])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``zsched ARGV`` (default: the process's arguments); returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    restore_sigterm = interrupt_on_sigterm()  # one-shot commands: SIGTERM stops them as Ctrl-C does
    try:
        entry_point_logging(args.log_level, whole_process=True)
        watch_lifeline()  # started by zsched dev: stop once it is gone, even if it was SIGKILLed
        return int(args.func(args) or 0)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM in a one-shot command: 130 or 143
        line, code = interrupted_line(exc)
        print(line, file=sys.stderr)
        return code
    except BrokenPipeError:  # `zsched dead list | head`
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
    except Exception as exc:
        # A known condition (server unreachable, bad URL or credentials, port in use, ...): one
        # line and its exit code (scheduler/shell/cli_errors.py); anything else is a bug and keeps
        # its traceback, masked as every output is, and exits 1 as an uncaught exception does.
        known = explain(exc, args)
        if known is None:
            sys.stderr.write(mask_secrets(traceback.format_exc()))
            return 1
        if args.debug:
            sys.stderr.write(mask_secrets(traceback.format_exc()))
        print(f"zsched: error: {known[0]}", file=sys.stderr)
        return known[1]
    finally:
        restore_sigterm()


if __name__ == "__main__":
    sys.exit(main())
