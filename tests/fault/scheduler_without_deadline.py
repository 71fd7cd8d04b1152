"""A scheduler replica with its local ownership deadline switched off, for the fault tests.

``python -m tests.fault.scheduler_without_deadline ARGS`` takes the arguments of ``zsched scheduler``
and runs that replica with ``SchedulerConfig.ignore_deadline``: a replica frozen past its lease then
acts again as soon as it resumes, so the epoch fence in Redis is the only thing that can stop it.
Production has no such switch; this launcher is how the tests reach it in a separate process.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence

from scheduler.tier.cli import add_parser, config_from_args
from scheduler.tier.process import run_forever


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="scheduler_without_deadline")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["scheduler", *argv])
    # the same log format as zsched's: the tests read this replica's log
    logging.basicConfig(level=os.environ.get("ZSCHED_LOG_LEVEL", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_forever(dataclasses.replace(config_from_args(args), ignore_deadline=True))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
