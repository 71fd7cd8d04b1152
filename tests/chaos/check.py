"""Check a kept chaos history directory again: ``python -m tests.chaos.check DIR [SEED SECONDS]``."""
from __future__ import annotations

import sys
from pathlib import Path

from tests.chaos.checker import check, windows_summary
from tests.chaos.history import load


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    h = load(Path(argv[0]))
    v = check(h)
    seed = int(argv[1]) if len(argv) > 1 else -1
    seconds = float(argv[2]) if len(argv) > 2 else h.t_end - h.t_start
    print(v.summary(seed, seconds))
    print(v.report(limit=30))
    print("faults:\n" + windows_summary(h.faults))
    return 0 if v.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
