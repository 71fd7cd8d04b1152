"""``python -m bench.peers [--quick] [--with-zsched] [--lateness-rounds N] [--only huey|celery] [--out FILE]``: huey and
Celery through W1-W4 (``bench.peers``), JSON on stdout."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import emit


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    p.add_argument("--quick", action="store_true", help="10x fewer jobs, W4 over 2 s, one W3 run per side")
    p.add_argument("--with-zsched", action="store_true",
                   help="also run zsched's W3/W4 (bench.workloads), alternating with the peers' runs")
    p.add_argument("--lateness-rounds", type=int, default=1, metavar="N",
                   help="W4 runs per side and rate, alternating; the median-p99 run is reported (default 1)")
    p.add_argument("--only", choices=("huey", "celery"), help="one peer alone, its workloads in sequence")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args()
    if args.only:
        from bench.peers import celery_peer, huey_peer
        mod = huey_peer if args.only == "huey" else celery_peer
        result = {args.only: mod.run(args.quick)}
    else:
        from bench.peers import run
        result = run(args.quick, with_zsched=args.with_zsched, lateness_rounds=args.lateness_rounds)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, default=str))
    emit(result)


if __name__ == "__main__":
    main()
