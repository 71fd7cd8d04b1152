"""``python -m bench [core] [--memory-sizes 1000000]``: runs benchmarks on loopback servers it
starts itself and prints JSON."""
from __future__ import annotations

import argparse

from bench import common


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench")
    p.add_argument("suite", nargs="?", default="core", choices=["core"])
    p.add_argument("--memory-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1_000_000],
                   help="pending-job counts for the memory benchmark (comma-separated)")
    args = p.parse_args()
    from bench import core
    result = {"machine": common.machine(), args.suite: core.run(args)}
    common.emit(result)


if __name__ == "__main__":
    main()
