"""``python -m bench tracing --other CHECKOUT [--quick]``: what OpenTelemetry support costs the
producer (W1) and the worker (W3) when it is not used, against another checkout of zsched (the one
before tracing), interleaved, and what a stored context costs in memory (W2). Prints JSON; never
a timed assertion.

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
* W2: Redis memory per pending job (due in 1 h, the benchmark payload), 200 000 scheduled outside
  any span and 200 000 inside one (this tree only: the other stores no context).
* W3: ``runs`` rounds; in each, for every variant (order rotating), a fresh child 3 times
  schedules N jobs due now with ``schedule_many``, then drains them with an in-process ``Worker`` (concurrency
  64, a no-op async handler): N / seconds from ``serve()`` to the last ack, and the worker
  process's CPU per job meanwhile (a shared machine's load moves the wall time far more), the
  best of its 3 drains. FLUSHALL between runs. The ratios to ``base`` are the medians of the per-round ratios.
"""
from __future__ import annotations

import contextlib
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
    cpu_us: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for i in range(runs):
        order = VARIANTS[i % len(VARIANTS):] + VARIANTS[:i % len(VARIANTS)]
        for v in order:
            r.flushall()
            p = child(roots[v], "w3", v, url, f"w3{v}", jobs)
            out, _ = p.communicate(timeout=300)
            if p.returncode != 0:
                raise SystemExit(f"bench tracing: the {v} drain failed (exit {p.returncode})")
            got = json.loads(out)
            rates[v].append(jobs / got["seconds"])
            cpu_us[v].append(got["cpu_seconds"] / jobs * 1e6)
    r.close()
    result: dict[str, Any] = {"jobs": jobs, "runs": runs, "concurrency": 64}
    for v in VARIANTS:
        ratios = [x / b for x, b in zip(rates[v], rates["base"])]
        cpu_ratios = [x / b for x, b in zip(cpu_us[v], cpu_us["base"])]
        result[v] = {"jobs_per_s_median": round(statistics.median(rates[v])),
                     "jobs_per_s_runs": [round(x) for x in rates[v]],
                     "rate_vs_base_median_run_ratio": round(statistics.median(ratios), 4),
                     "worker_cpu_us_per_job_median": round(statistics.median(cpu_us[v]), 1),
                     "worker_cpu_vs_base_median_run_ratio": round(statistics.median(cpu_ratios), 4)}
    return result


def w2(url: str, jobs: int) -> dict[str, Any]:
    """Redis memory per pending job (``used_memory`` growth / jobs, due in 1 h, the benchmark
    payload), scheduled outside any span and inside one (every record then has a trace section)."""
    from datetime import timedelta

    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    from bench.common import PAYLOAD
    from scheduler import Client
    r = redis.Redis.from_url(url)
    span = NonRecordingSpan(SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=False,
                                        trace_flags=TraceFlags(1)))
    out: dict[str, Any] = {"jobs": jobs}
    for name in ("untraced", "traced"):
        r.flushall()
        with Client.from_url(url, namespace="w2").connect() as client:
            client.schedule(timedelta(hours=1), PAYLOAD)  # the namespace's own keys, before the baseline
            before = int(r.info("memory")["used_memory"])
            with trace.use_span(span, end_on_exit=False) if name == "traced" else contextlib.nullcontext():
                for s in range(0, jobs, 1000):
                    client.schedule_many([(timedelta(hours=1), PAYLOAD)] * min(1000, jobs - s))
            out[name] = {"bytes_per_pending_job": round((int(r.info("memory")["used_memory"]) - before) / jobs, 1)}
    r.close()
    return out


def run(quick: bool = False, other: Path | None = None) -> dict[str, Any]:
    """Both measurements against ``other`` (a checkout of zsched before tracing)."""
    if other is None or not (other / "scheduler" / "__init__.py").is_file():
        raise SystemExit("bench tracing: --other must be a checkout of zsched (the one to compare with)")
    roots = {"base": other.resolve(), "absent": REPO, "idle": REPO, "span": REPO}
    with redis_server() as srv:
        url = f"redis://127.0.0.1:{srv.port}/0"
        return {"machine": machine(), "other": str(roots["base"]),
                "w1": w1(roots, url, 8 if quick else 60, 500),
                "w3": w3(roots, url, 2 if quick else 9, 5000 if quick else 10_000),
                "w2": w2(url, 20_000 if quick else 200_000)}


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
