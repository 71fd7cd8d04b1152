"""``python -m bench.lateness_compare --other OTHER_CHECKOUT``: W4's handler lateness, this checkout
against another, interleaved.

W4 (``bench.workloads.w4_lateness``: jobs due at random moments over 20 s, handler start minus due
time, exact) at each rate (100 and 1 000 jobs/s) and each number of worker processes (1 and 8),
run once per side per round, the sides' order alternating by round; each run in a child process
with ``PYTHONPATH`` and the working directory at that side's checkout, so its replicas, workers and
producer run that side's code (``--other`` is a worktree of zsched with ``scheduler/lua`` linked to
``../lua``, as for ``bench fanout --compare``). Prints one JSON document: every run, and per
(workers, rate, side) the medians over rounds of p50 and p99, the runs' p99s, and the counts of
early starts, missing and duplicated jobs (all zero in a good run). ``--worker-args`` and
``--scheduler-args`` (and ``--other-...``) add arguments to a side's workers and replicas, e.g. the
settings for spread traffic of docs/scaling.md against the other side's defaults.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import compile_checkout
from bench.stack import ROOT

SPAN_S = 20.0
_CHILD = """
import json, sys
from bench.workloads import w4_lateness
# each passed on only when not empty: an older checkout's w4_lateness lacks them
extra, sched = json.loads(sys.argv[4]), json.loads(sys.argv[5])
more = {**({"worker_args": extra} if extra else {}), **({"scheduler_args": sched} if sched else {})}
r = w4_lateness(int(sys.argv[1]), float(sys.argv[2]), workers=int(sys.argv[3]), **more)
print(json.dumps({"early": r["started_before_run_at"], "missing": r.get("missing"), "duplicates": r.get("duplicates"),
                  "lateness_ms": r["handler_lateness_ms"]}))
"""


def one(code: Path, rate: int, workers: int, worker_args: Sequence[str] = (),
        scheduler_args: Sequence[str] = ()) -> dict[str, Any]:
    """One W4 run with ``code``'s checkout, its workers started with ``worker_args`` too and its
    replicas with ``scheduler_args``."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    p = subprocess.run([sys.executable, "-c", _CHILD, str(int(rate * SPAN_S)), str(SPAN_S), str(workers),
                        json.dumps(list(worker_args)), json.dumps(list(scheduler_args))],
                       cwd=code, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode:
        raise RuntimeError(f"W4 with {code} failed:\n{p.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[int, int, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        groups[(r["workers"], r["rate"], r["side"])].append(r)
    out = []
    for (w, rate, side), rs in sorted(groups.items()):
        out.append({"workers": w, "rate_per_s": rate, "side": side, "rounds": len(rs),
                    "p50_ms": statistics.median(r["lateness_ms"]["p50"] for r in rs),
                    "p99_ms": statistics.median(r["lateness_ms"]["p99"] for r in rs),
                    "p99_runs_ms": [r["lateness_ms"]["p99"] for r in rs],
                    "early": sum(r["early"] for r in rs), "missing": sum(r["missing"] or 0 for r in rs),
                    "duplicates": sum(r["duplicates"] or 0 for r in rs)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.lateness_compare", description=__doc__.split("\n\n")[0])
    p.add_argument("--other", type=Path, required=True, help="the other checkout of zsched")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", default="1,8", help="worker process counts, comma-separated")
    p.add_argument("--rates", default="100,1000", help="jobs per second, comma-separated")
    p.add_argument("--worker-args", metavar="ARGS", default="",
                   help="extra arguments of this side's workers, e.g. --worker-args=--no-one-listener")
    p.add_argument("--other-worker-args", metavar="ARGS", default="", help="the same for the other side's")
    p.add_argument("--scheduler-args", metavar="ARGS", default="",
                   help="extra arguments of this side's replicas, e.g. --scheduler-args='--coalesce-lead 320'")
    p.add_argument("--other-scheduler-args", metavar="ARGS", default="", help="the same for the other side's")
    a = p.parse_args(argv)
    try:
        workers = [int(x) for x in a.workers.split(",")]
        rates = [int(x) for x in a.rates.split(",")]
    except ValueError:
        print("bench.lateness_compare: error: --workers and --rates are comma-separated whole numbers", file=sys.stderr)
        return 2
    other = a.other.resolve()
    if not (other / "bench" / "workloads.py").is_file():
        print(f"bench.lateness_compare: error: {other} is not a checkout of zsched", file=sys.stderr)
        return 2
    sides = {"this": ROOT, "other": other}
    extra = {"this": shlex.split(a.worker_args), "other": shlex.split(a.other_worker_args)}
    sched = {"this": shlex.split(a.scheduler_args), "other": shlex.split(a.other_scheduler_args)}
    for code in sides.values():
        compile_checkout(code)
    runs = []
    for rnd in range(a.rounds):
        for w in workers:
            for rate in rates:
                for side in (("this", "other") if rnd % 2 == 0 else ("other", "this")):
                    r = one(sides[side], rate, w, extra[side], sched[side])
                    runs.append({"round": rnd, "side": side, "workers": w, "rate": rate, **r})
                    print(f"  round {rnd} {side} W={w} {rate}/s: p50 {r['lateness_ms']['p50']} ms, "
                          f"p99 {r['lateness_ms']['p99']} ms, early {r['early']}", file=sys.stderr)
    print(json.dumps({"sides": {k: str(v) for k, v in sides.items()}, "worker_args": extra, "scheduler_args": sched,
                      "span_s": SPAN_S,
                      "runs": runs, "summary": summarize(runs)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
