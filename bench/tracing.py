"""``python -m bench tracing --other CHECKOUT [--quick]``: what OpenTelemetry support costs the
producer (W1) and the worker (W3) when it is not used, against another checkout of zsched (the
one before tracing), interleaved. Prints JSON; never a timed assertion.

Variants, each run in child processes (bench/tracing_child.py) with ``PYTHONPATH`` set to its tree
only: ``base`` (CHECKOUT), ``absent`` (this tree, OpenTelemetry not importable), ``idle`` (this
tree, OpenTelemetry installed, no span active, no tracer provider), and for scale ``span`` (this
tree, the producer inside an active span so every job stores its 26-byte context, the worker with
the SDK's tracer provider recording a span per attempt, exported nowhere).

* W1: one child per variant, all on one redis-server (no persistence), each its own namespace,
  warmed up with 500 calls; then ``slices`` times every child runs ``Client.schedule(now + 1 h)``
  ``slice`` times, one child after the other, the order rotating each slice so drift in the
  machine's load falls on all alike. A variant's rate is its calls / its summed slice time; the
  ratio to ``base`` is the median of the per-slice ratios.
* W3: ``runs`` rounds; in each, for every variant (order rotating), a fresh child schedules N
  jobs due now with ``schedule_many``, then drains them with an in-process ``Worker`` (concurrency
  64, a no-op async handler): N / seconds from ``serve()`` to the last ack. FLUSHALL between
  runs. The ratio to ``base`` is the median of the per-round ratios.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis

from bench.common import REPO, machine, redis_server

CHILD = Path(__file__).resolve().parent / "tracing_child.py"
VARIANTS = ("base", "absent", "idle", "span")


def child(root: Path, mode: str, variant: str, url: str, ns: str, jobs: int = 0) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(root))
    args = [sys.executable, str(CHILD), mode, "--root", str(root), "--variant", variant, "--url", url, "--ns", ns]
    if jobs:
        args += ["--jobs", str(jobs)]
    return subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def w1(roots: dict[str, Path], url: str, slices: int, size: int) -> dict[str, Any]:
    procs = {v: child(roots[v], "w1", v, url, f"w1{v}") for v in VARIANTS}
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        for v, p in procs.items():
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise SystemExit(f"bench tracing: the {v} child did not start (exit {p.wait()})")
        for i in range(slices):
            order = VARIANTS[i % len(VARIANTS):] + VARIANTS[:i % len(VARIANTS)]
            for v in order:
                p = procs[v]
                assert p.stdin is not None and p.stdout is not None
                p.stdin.write(f"{size}\n")
                p.stdin.flush()
                seconds[v].append(float(p.stdout.readline()))
    finally:
        for p in procs.values():
            if p.stdin is not None:
                p.stdin.close()
            p.wait(30)
    out: dict[str, Any] = {"calls_per_variant": slices * size, "slice": size}
    for v in VARIANTS:
        ratios = [b / s for b, s in zip(seconds["base"], seconds[v])]
        out[v] = {"jobs_per_s": round(slices * size / sum(seconds[v])),
                  "us_per_call": round(sum(seconds[v]) / (slices * size) * 1e6, 1),
                  "rate_vs_base_median_slice_ratio": round(statistics.median(ratios), 4)}
    return out


def w3(roots: dict[str, Path], url: str, runs: int, jobs: int) -> dict[str, Any]:
    r = redis.Redis.from_url(url)
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(runs):
        order = VARIANTS[i % len(VARIANTS):] + VARIANTS[:i % len(VARIANTS)]
        for v in order:
            r.flushall()
            p = child(roots[v], "w3", v, url, f"w3{v}", jobs)
            out, _ = p.communicate(timeout=300)
            if p.returncode != 0:
                raise SystemExit(f"bench tracing: the {v} drain failed (exit {p.returncode})")
            rates[v].append(jobs / json.loads(out)["seconds"])
    r.close()
    result: dict[str, Any] = {"jobs": jobs, "runs": runs, "concurrency": 64}
    for v in VARIANTS:
        ratios = [x / b for x, b in zip(rates[v], rates["base"])]
        result[v] = {"jobs_per_s_median": round(statistics.median(rates[v])),
                     "jobs_per_s_runs": [round(x) for x in rates[v]],
                     "rate_vs_base_median_run_ratio": round(statistics.median(ratios), 4)}
    return result


def run(quick: bool = False, other: Path | None = None) -> dict[str, Any]:
    """Both measurements against ``other`` (a checkout of zsched before tracing)."""
    if other is None or not (other / "scheduler" / "__init__.py").is_file():
        raise SystemExit("bench tracing: --other must be a checkout of zsched (the one to compare with)")
    roots = {"base": other.resolve(), "absent": REPO, "idle": REPO, "span": REPO}
    with redis_server() as srv:
        url = f"redis://127.0.0.1:{srv.port}/0"
        return {"machine": machine(), "other": str(roots["base"]),
                "w1": w1(roots, url, 8 if quick else 60, 500),
                "w3": w3(roots, url, 2 if quick else 7, 5000 if quick else 20_000)}


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m bench tracing", description=__doc__.split("\n\n")[0])
    p.add_argument("--other", type=Path, required=True, help="the checkout of zsched to compare with")
    p.add_argument("--quick", action="store_true", help="a smoke run: few slices and runs")
    a = p.parse_args(argv)
    print(json.dumps(run(a.quick, a.other), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
