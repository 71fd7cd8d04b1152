"""``python -m bench [SUITE ...] [--quick]``: benchmarks on loopback servers they start themselves.
Prints JSON; ``all`` also writes bench/out/results.json and bench/RESULTS.md.

Suites: core (W1 enqueue, W2 memory, tick), drain (W3), lateness (W4), herd (W5), scale (W6),
failover (W7), pg (the seed's PostgreSQL design), transport (old vs new script transport, W1 and
W3 side by side; not part of all), soak (30 min at 2 000 jobs/s: memory must stay flat; not part
of all; ``python -m bench.soak --results`` also writes its section of RESULTS.md), cluster (1
redis-server vs a 3-master Redis Cluster: firing, drain, Redis CPU per job per shard; not part of
all; without --quick it writes its section of RESULTS.md), migrate (``zsched migrate-partitions``
16 -> 64 partitions with 1 M jobs on 1 node and 300 000 on a 3-master cluster: moved/s, Redis CPU,
memory; not part of all), kit (the in-process test kit, scheduler.testing on fakeredis: 1 000
schedule -> run_due -> ack cycles, batched and one by one; no server; not part of all), fanout
(per-job worker, Redis and replica CPU, script calls, notifications and lateness at 1-16 worker
processes, spread and batched, one redis-server and a 3-master cluster; without --quick it writes
its section of RESULTS.md and its curves in docs/img; ``python -m bench fanout --help`` for its own
options, ``--compare OTHER_CHECKOUT`` among them), idle_cost (what a round trip and a job cost a
process that was idle: redis-py round trips back to back and after 1-50 ms sleeps, one worker's CPU
per job at 20, 75 and 300 jobs/s; not part of all), tracing (what OpenTelemetry support costs W1 and W3
unused, against another checkout: ``python -m bench tracing --other CHECKOUT [--quick]``; not part
of all), all.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench import common

SUITES = ("core", "drain", "lateness", "herd", "scale", "failover", "pg", "peers", "fanout", "transport", "soak",
          "cluster", "migrate", "kit", "effects", "outbox", "idle_cost", "tracing")
# transport needs git and the old commit (minutes of interleaved runs); soak runs 30 minutes;
# cluster needs redis-cli and takes about 15 minutes of alternating rounds
# migrate fills 2.6 M jobs over 4 fresh servers (an admin operation, not a workload)
NOT_IN_ALL = ("transport", "soak", "cluster", "migrate", "kit", "idle_cost", "tracing")
RUN_QUICK = {"peers": "bench.peers", "transport": "bench.transport_compare", "kit": "bench.kit",
             "effects": "bench.effects", "outbox": "bench.outbox", "idle_cost": "bench.idle_cost"}


def run_suite(name: str, quick: bool, memory_sizes: list[int]) -> Any:
    from bench import workloads as w
    if name == "core":
        from bench import core
        return core.run(argparse.Namespace(memory_sizes=memory_sizes))
    if name == "drain":
        n = 5000 if quick else 20_000
        return [w.w3_drain(n, workers=k) for k in (1, 2)]
    if name == "lateness":
        return [w.w4_lateness(200 if quick else 2000, 2 if quick else 20),
                w.w4_lateness(2000 if quick else 20_000, 2 if quick else 20)]
    if name == "herd":
        n = 20_000 if quick else 100_000
        return [w.w5_herd(n), w.w5_herd(n, limit=5000)]
    if name == "scale":
        big = 200_000 if quick else 10_000_000
        small = w.w6_scale(10_000, 2000 if quick else 20_000, 2 if quick else 20)
        large = w.w6_scale(big, 2000 if quick else 20_000, 2 if quick else 20)
        # exact percentiles from the handler records (the firing histogram's buckets are too coarse
        # for a ratio: a p99 either side of the 2 ms bucket boundary reads as 2.0 or 2.9 ms)
        ratio = round(large["handler_lateness_ms"]["p99"] / max(small["handler_lateness_ms"]["p99"], 0.1), 2)
        tick_small, tick_large = small.get("tick_jobs_per_redis_cpu_s"), large.get("tick_jobs_per_redis_cpu_s")
        return {"small": small, "large": large, "p99_lateness_ratio": ratio,
                "tick_throughput_ratio": round(tick_small / tick_large, 2) if tick_small and tick_large else None}
    if name == "failover":
        return w.w7_failover()
    if name == "pg":
        from bench import pg_baseline
        return pg_baseline.run(argparse.Namespace(quick=quick))
    if name in RUN_QUICK:  # modules whose run(quick) is the suite
        return importlib.import_module(RUN_QUICK[name]).run(quick)
    if name == "soak":
        from bench import soak
        return soak.run(3.0 if quick else 30.0)
    if name == "cluster":
        from bench import cluster
        out = cluster.run(quick)
        cluster.save(out)
        if not quick:  # a smoke run's figures do not replace the measured ones
            cluster.write_section(out)
        return out
    if name == "fanout":  # writes its JSON, its RESULTS.md section and its curves itself
        from bench import fanout
        return fanout.run_suite(quick)
    if name == "migrate":
        from bench import migrate
        result = migrate.run(quick)
        if not quick:
            migrate.write_section(result)
        return result
    raise SystemExit(f"unknown suite {name!r}; choose from {SUITES} or all")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suites", nargs="*", default=["core"], help=f"{', '.join(SUITES)} or all (default core)")
    p.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    p.add_argument("--report", metavar="JSON", help="only write bench/RESULTS.md from a saved results.json")
    p.add_argument("--memory-sizes", type=lambda s: [int(x) for x in s.split(",")], default=None,
                   help="pending-job counts for the memory benchmark (default 1000000,10000000; quick: 100000)")
    if sys.argv[1:2] == ["fanout"]:  # the suite alone takes its own options (--compare, --workers, --help, ...)
        from bench import fanout
        fanout.main(sys.argv[2:])
        return
    if sys.argv[1:2] == ["tracing"]:  # needs --other, the checkout to compare with
        from bench import tracing
        sys.exit(tracing.main(sys.argv[2:]))
    args = p.parse_args()
    if args.report:
        from bench.report import write_markdown
        write_markdown(json.loads(Path(args.report).read_text()), Path(__file__).resolve().parent / "RESULTS.md")
        return
    names = [s for s in SUITES if s not in NOT_IN_ALL] if "all" in args.suites else args.suites
    sizes = args.memory_sizes or ([100_000] if args.quick else [1_000_000, 10_000_000])
    result: dict[str, Any] = {"machine": common.machine()}
    for name in names:
        t = time.time()
        result[name] = run_suite(name, args.quick, sizes)
        result.setdefault("seconds", {})[name] = round(time.time() - t, 1)
        common.emit({name: result[name]})
    if "all" in args.suites:
        out = Path(__file__).resolve().parent / "out"
        out.mkdir(exist_ok=True)
        (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
        from bench.report import write_markdown
        write_markdown(result, Path(__file__).resolve().parent / "RESULTS.md")
        if result.get("peers"):  # ratios against zsched's core, drain and lateness of the same run
            from bench.peers.report import write_section
            write_section(result["peers"], result)


if __name__ == "__main__":
    main()
