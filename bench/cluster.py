"""``python -m bench cluster [--quick]``: one redis-server against a 3-master Redis Cluster, side by
side in one run (issue 13). ``python -m bench.cluster --report bench/out/cluster.json [MORE.json ...]``
rewrites the RESULTS.md section from saved runs (several: their rounds pooled).

Both sides run the same namespace layout (:data:`PARTITIONS` partitions, ``bench.common.PAYLOAD``,
queue ``bench``) on redis-server with AOF everysec and hz 10, an etcd, 2 scheduler replicas and (for
the drain) 1 worker process, all on loopback; every stack, and its Redis, is fresh. On the cluster
side (:class:`ClusterSet`, 3 masters, no replicas) the slots of the partitions' hash tags
``{bench:p}`` are first moved so that every master holds the same number of partitions
(``bench.cluster_measure.balance``): CRC16 puts 12 partitions 5/4/3 on the default slot ranges.

* **fire**: N jobs due at one instant T0, no worker; the tier (2 replicas) moves them to the ready
  lists. Jobs/s from T0 until the partitions' ``fired`` counters reach N (and between 10 % and 90 %),
  and Redis CPU (INFO cpu ``used_cpu_sys + used_cpu_user``) of each master from T0 - 0.3 s to the
  end. Per master, CPU per 1 000 of the jobs *its* partitions fired: the per-shard cost, which
  the issue wants within 10 % of a single node's (no cross-node chatter per job). Also the CPU of
  the same window length before T0 with the same counter polling (``idle``: AOF, cron, cluster
  gossip, idle ticks, the poll itself) and the per-job figures net of it, the EVALSHA calls and
  script µs per job, cluster-bus messages per second, bytes of ``used_memory`` per pending job.
* **drain**: W3 as ``bench.workloads.w3_drain`` runs it: N jobs due at T0, no-op handler, 1 worker
  process at concurrency 64; jobs/s from T0 until all are acked, CPU per 1 000 jobs of Redis (per
  master too), the scheduler replicas and the worker, duplicates and missing.
* **spread**: 2 000 jobs/s due uniformly over 6 s, no worker: about one ``tick`` per job instead
  of one per 1 000, so the fixed cost of a tick (Redis and replica CPU per tick) shows, with the
  firing lateness from the replicas' histograms.
* **fanout** (once, one redis-server): what a ready notification costs Redis and an idle worker
  process (:func:`fanout`).

Sides: ``single`` (one redis-server), ``cluster`` (3 masters, partitions spread evenly) and
``cluster1`` (the same cluster with every partition on one master: what cluster mode costs without
the split over nodes). Rounds run the sides in an order reversed every round (single, cluster,
cluster1, cluster1, cluster, single, ...), each side its three workloads; the output gives per-side
runs and medians, ratios to single of the medians and the median of the per-round ratios.
The machine has 2 cores: the 3 masters, 2 replicas, a worker and etcd share them, so wall-clock
throughput shows contention; CPU per job is the figure that scales. Other processes on the
machine (tests run concurrently) are measured: ``foreign_cpu`` is the machine's busy CPU time
during each measurement window minus that of every process the run started and of itself.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.cluster_measure import (
    IDLE_S,
    MASTERS,
    QUEUE,
    Window,
    command_stats,
    idle_window,
    lead_time,
    per_node,
    placement,
    poll,
    rate_10_90,
    schedule_at,
    shard_figures,
    side_redis,
    used_memory,
)
from bench.common import PAYLOAD, emit, machine, redis_server
from bench.stack import Stack, bucket_summary, redis_cpu
from bench.workloads import DRAIN_CONCURRENCY, records_summary
from scheduler import Client
from scheduler.protocol.tick import NO_RETENTION, tick_call
from scheduler.testing.transitions import Ops

PARTITIONS = 12
REPLICAS = 2
SPREAD_S = 6.0  # the spread workload's span
SPREAD_RATE = 2000  # its jobs per s: about one tick per job, the replicas well below the 2 cores
# single: one redis-server; cluster: 3 masters, 4 partitions each; cluster1: the same cluster with
# every partition on one master (a control: what cluster mode costs without the split over nodes)
SIDES = ("single", "cluster", "cluster1")
WORKLOADS = ("fire", "drain", "spread", "fanout", "tickcost")
OUT = Path(__file__).resolve().parent / "out" / "cluster.json"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
TARGET = 1.10  # per-shard Redis CPU per job, cluster / single


# -- the workloads -----------------------------------------------------------------------------

def fire_once(side: str, jobs: int) -> dict[str, Any]:
    """N jobs due at T0, fired by 2 replicas into the ready lists (no worker)."""
    from bench.stack import NS
    with side_redis(side, NS, PARTITIONS) as (srv, info), Stack(partitions=PARTITIONS, redis=srv) as st:
        place = placement(srv, NS, PARTITIONS)
        st.start_schedulers(REPLICAS)
        mem0 = used_memory(srv)
        t0 = time.time() + lead_time(jobs)
        cpu0 = sum(redis_cpu(srv).values())
        _, sched_rate = schedule_at(st, t0, jobs)
        sched_cpu = sum(redis_cpu(srv).values()) - cpu0
        mem1 = used_memory(srv)
        time.sleep(max(0.0, t0 - IDLE_S - 0.3 - time.time()))
        idle = idle_window(st, t0 - 0.3)
        w = Window(st)
        samples = poll(st, "fired", jobs, 120)
        win = w.close()
        done = samples[-1][0]
        nodes = per_node(st, place, "fired", win, idle)
        out = {"side": side, "jobs": jobs, "partitions": PARTITIONS, "replicas": REPLICAS,
               "seconds_from_t0": round(done - t0, 3), "jobs_per_s": round(jobs / (done - t0)),
               "jobs_per_s_10_90": rate_10_90(samples, jobs), "schedule_many_jobs_per_s": round(sched_rate),
               "schedule_many_redis_cpu_s_per_1000_jobs": round(sched_cpu / jobs * 1000, 5),
               "bytes_per_pending_job": round((sum(mem1.values()) - sum(mem0.values())) / jobs, 1),
               "schedulers_cpu_s_per_1000_jobs": round(win["schedulers_cpu_s"] / jobs * 1000, 4),
               "foreign_cpu_s_per_s": round(win["foreign_cpu_s"] / win["seconds"], 3),
               "nodes": nodes, **info}
        out.update(shard_figures(nodes, jobs, win, idle))
        return out


def drain_once(side: str, jobs: int, concurrency: int = DRAIN_CONCURRENCY) -> dict[str, Any]:
    """W3: N jobs due at T0, 2 replicas, 1 worker process at ``concurrency`` (64), until all are acked."""
    from bench.stack import NS
    with side_redis(side, NS, PARTITIONS) as (srv, info), Stack(partitions=PARTITIONS, redis=srv) as st:
        place = placement(srv, NS, PARTITIONS)
        st.start_schedulers(REPLICAS)
        st.start_workers(1, concurrency=concurrency)
        t0 = time.time() + lead_time(jobs)
        ids, sched_rate = schedule_at(st, t0, jobs)
        time.sleep(max(0.0, t0 - IDLE_S - 0.3 - time.time()))
        idle = idle_window(st, t0 - 0.3)
        w = Window(st)
        samples = poll(st, "acked", jobs, 180)
        win = w.close()
        done = samples[-1][0]
        nodes = per_node(st, place, "acked", win, idle)
        records = st.stop_workers()
        k = 1000 / jobs
        out = {"side": side, "jobs": jobs, "partitions": PARTITIONS, "replicas": REPLICAS, "worker_processes": 1,
               "concurrency": concurrency, "seconds_from_t0": round(done - t0, 3),
               "jobs_per_s": round(jobs / (done - t0)), "schedule_many_jobs_per_s": round(sched_rate),
               "cpu_s_per_1000_jobs": {"redis": round(sum(win["redis_cpu_s"].values()) * k, 4),
                                       "schedulers": round(win["schedulers_cpu_s"] * k, 4),
                                       "workers": round(win["workers_cpu_s"] * k, 4)},
               "foreign_cpu_s_per_s": round(win["foreign_cpu_s"] / win["seconds"], 3),
               "nodes": nodes, **info}
        out.update(shard_figures(nodes, jobs, win, idle))
        out.update({k: v for k, v in records_summary(records, ids).items() if k != "handler_lateness_ms"})
        return out


def spread_once(side: str, jobs: int, seconds: float = SPREAD_S) -> dict[str, Any]:
    """N jobs due uniformly over ``seconds`` (no two in the same partition and millisecond, mostly),
    fired by 2 replicas (no worker): what a tick costs when it moves a job or two, not a batch."""
    from bench.stack import NS
    with side_redis(side, NS, PARTITIONS) as (srv, info), Stack(partitions=PARTITIONS, redis=srv) as st:
        place = placement(srv, NS, PARTITIONS)
        st.start_schedulers(REPLICAS)
        start = time.time() + 2.5 + IDLE_S + jobs / 40_000
        rnd = random.Random(13)
        times = sorted(start + rnd.random() * seconds for _ in range(jobs))
        for i in range(0, jobs, 20_000):
            st.client.schedule_many([(t, PAYLOAD) for t in times[i:i + 20_000]], queue=QUEUE)
        time.sleep(max(0.0, start - IDLE_S - 0.3 - time.time()))
        idle = idle_window(st, start - 0.3)
        before = st.firing_buckets()
        w = Window(st)
        poll(st, "fired", jobs, seconds + 30)
        win = w.close()
        after = st.firing_buckets()
        nodes = per_node(st, place, "fired", win, idle)
        ticks = win["evalsha_calls"]
        out = {"side": side, "jobs": jobs, "seconds": seconds, "rate_per_s": round(jobs / seconds),
               "partitions": PARTITIONS, "replicas": REPLICAS, "jobs_per_s": round(jobs / seconds),
               "ticks_per_1000_jobs": round(ticks / jobs * 1000, 1),
               "schedulers_cpu_s_per_1000_jobs": round(win["schedulers_cpu_s"] / jobs * 1000, 4),
               "schedulers_cpu_us_per_tick": round(win["schedulers_cpu_s"] / ticks * 1e6, 1) if ticks else None,
               "firing_lateness": bucket_summary(before, after),
               "foreign_cpu_s_per_s": round(win["foreign_cpu_s"] / win["seconds"], 3), "nodes": nodes, **info}
        out.update(shard_figures(nodes, jobs, win, idle))
        return out


def tick_cost(n: int = 3000) -> dict[str, Any]:
    """Redis time of one ``tick`` on a quiet redis-server (1 partition, AOF off, no tier): moving
    nothing, and moving the one job that was just made due; also the Redis commands it runs
    (the rest is the Lua script itself) and a one-job ``schedule``. INFO commandstats, median µs
    per call."""
    with redis_server("--appendonly", "no") as srv:
        client = Client.from_url(srv.url, namespace="tickcost", partitions=1).connect()
        ops, r = Ops(client), srv

        def per_call(fn: Any, prepare: Any = None) -> tuple[float, float]:
            """Median over ``n`` calls (a preempted call on a shared machine is an outlier)."""
            script, inner = [], []
            for _ in range(n):
                if prepare:
                    prepare()
                r.command("CONFIG", "RESETSTAT")
                fn()
                stats = command_stats(r)
                script.append(stats["evalsha"][1])
                inner.append(sum(u for name, (_, u) in stats.items() if name not in ("evalsha", "config|resetstat")))
            return statistics.median(script), statistics.median(inner)

        def tick() -> None:
            ops.send(tick_call(ops.calls, 0, 0, 1000, {}, NO_RETENTION))

        def one_due() -> None:
            client.schedule_many([(time.time() - 0.001, PAYLOAD)], queue=QUEUE)

        empty, empty_inner = per_call(tick)
        one, one_inner = per_call(tick, one_due)
        sched, _ = per_call(lambda: client.schedule_many([(time.time() + 3600, PAYLOAD)], queue=QUEUE))
        client.close()
        return {"calls": n, "tick_empty_us": empty, "tick_empty_redis_commands_us": empty_inner,
                "tick_one_job_us": one, "tick_one_job_redis_commands_us": one_inner, "schedule_one_job_us": sched}


def fanout_once(workers: int, messages: int, rate: float = 5000.0) -> dict[str, Any]:
    """What a ring of a doorbell costs when nothing is ready: ``messages`` rings of the queue's bell
    (one per round trip, ``rate`` per s, member a partition number, as ``tick`` rings it) with
    ``workers`` idle worker processes waiting on it; Redis hands each ring to one of them, which
    marks the partition and sends a claim that finds nothing. Before the doorbells this was a
    PUBLISH that every worker received and answered with a claim."""
    with Stack(partitions=PARTITIONS) as st:
        if workers:
            st.start_workers(workers, concurrency=DRAIN_CONCURRENCY)
        bell = st.client.keyspace.bell(QUEUE)
        deadline = time.time() + 60  # workers importing and sweeping on a busy machine
        while (waiting := int(st.r.info("clients")["blocked_clients"])) != workers:
            if time.time() > deadline:
                raise RuntimeError(f"{waiting} workers wait on {bell} after 60 s, expected {workers}")
            time.sleep(0.1)
        w = Window(st)
        t = time.monotonic()
        for i in range(messages):
            st.r.zadd(bell, {str(i % PARTITIONS): i}, nx=True)
            if i % 50 == 49:
                time.sleep(max(0.0, t + (i + 1) / rate - time.monotonic()))
        time.sleep(0.5)  # the workers' last claims
        win = w.close()
        deliveries = messages if workers else 0  # one worker per ring, however many wait
        return {"workers": workers, "messages": messages, "rate_per_s": rate,
                "redis_cpu_us_per_message": round(sum(win["redis_cpu_s"].values()) / messages * 1e6, 2),
                "worker_cpu_us_per_delivery": round(win["workers_cpu_s"] / deliveries * 1e6, 1) if workers else None,
                "claims_per_delivery": round(win["evalsha_calls"] / deliveries, 3) if workers else None,
                "foreign_cpu_s_per_s": round(win["foreign_cpu_s"] / win["seconds"], 3)}


def fanout(messages: int, counts: tuple[int, ...] = (0, 1, 4)) -> dict[str, Any]:
    """:func:`fanout_once` for 0, 1 and 4 waiting workers: Redis CPU per ring (the ring, the hand-over
    to one worker and its empty claim) at 1 and at 4 workers, and how it grows per worker (the
    slope between them; about 0 with doorbells, where each ring wakes one worker)."""
    runs = [fanout_once(n, messages) for n in counts]
    base, one, top = runs[0], runs[1], runs[-1]
    slope = (top["redis_cpu_us_per_message"] - one["redis_cpu_us_per_message"]) / (top["workers"] - one["workers"])
    return {"runs": runs, "redis_cpu_us_per_delivery": round(one["redis_cpu_us_per_message"]
                                                              - base["redis_cpu_us_per_message"], 2),
            "redis_cpu_us_per_added_worker": round(slope, 2),
            "worker_cpu_us_per_delivery": top["worker_cpu_us_per_delivery"],
            "claims_per_delivery": top["claims_per_delivery"]}


# -- the suite -------------------------------------------------------------------------------------

def order(rounds: int, sides: tuple[str, ...] = SIDES) -> list[tuple[int, str]]:
    """single, cluster, cluster1, cluster1, cluster, single, ...: the order reverses every round."""
    out = []
    for i in range(rounds):
        out += [(i, s) for s in (sides if i % 2 == 0 else sides[::-1])]
    return out


def get(r: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The figure at ``path`` of one run, None when that run did not measure it (older runs)."""
    for k in path:
        if not isinstance(r, dict) or k not in r:
            return None
        r = r[k]
    return r


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def paired(runs: dict[str, list[dict[str, Any]]], side: str, path: tuple[str, ...]) -> float | None:
    """Median over rounds of side / single within the round (drift-proof on a loaded machine)."""
    rs = [get(x, path) / get(s, path) for s, x in zip(runs["single"], runs[side], strict=False)
          if get(s, path) and get(x, path) is not None]
    return round(statistics.median(rs), 3) if rs else None


FIRE_FIGURES = {"jobs_per_s": ("jobs_per_s",), "jobs_per_s_10_90": ("jobs_per_s_10_90",),
                "redis_cpu_s_per_1000_jobs": ("redis_cpu_s_per_1000_jobs",),
                "redis_net_cpu_s_per_1000_jobs": ("redis_net_cpu_s_per_1000_jobs",),
                "per_shard_net_cpu_s_per_1000_jobs": ("per_shard_net_cpu_s_per_1000_jobs", "median"),
                "per_shard_cpu_s_per_1000_jobs": ("per_shard_cpu_s_per_1000_jobs_median",),
                "redis_net_cpu_s_per_shard_per_1000_namespace_jobs":
                    ("redis_net_cpu_s_per_shard_per_1000_namespace_jobs",),
                "script_us_per_job": ("script_us_per_job",),
                "evalsha_calls_per_1000_jobs": ("evalsha_calls_per_1000_jobs",),
                "publishes_per_1000_jobs": ("publishes_per_1000_jobs",),
                "schedulers_cpu_s_per_1000_jobs": ("schedulers_cpu_s_per_1000_jobs",),
                "bytes_per_pending_job": ("bytes_per_pending_job",),
                "schedule_many_jobs_per_s": ("schedule_many_jobs_per_s",),
                "schedule_many_redis_cpu_s_per_1000_jobs": ("schedule_many_redis_cpu_s_per_1000_jobs",),
                "redis_reads_per_1000_jobs": ("redis_reads_per_1000_jobs",),
                "bus_messages_per_s": ("bus_messages_per_s",),
                "idle_bus_messages_per_s": ("idle_bus_messages_per_s",),
                "foreign_cpu_s_per_s": ("foreign_cpu_s_per_s",)}
DRAIN_FIGURES = {"jobs_per_s": ("jobs_per_s",),
                 "redis_cpu_s_per_1000_jobs": ("cpu_s_per_1000_jobs", "redis"),
                 "redis_net_cpu_s_per_1000_jobs": ("redis_net_cpu_s_per_1000_jobs",),
                 "per_shard_net_cpu_s_per_1000_jobs": ("per_shard_net_cpu_s_per_1000_jobs", "median"),
                 "redis_net_cpu_s_per_shard_per_1000_namespace_jobs":
                     ("redis_net_cpu_s_per_shard_per_1000_namespace_jobs",),
                 "schedulers_cpu_s_per_1000_jobs": ("cpu_s_per_1000_jobs", "schedulers"),
                 "workers_cpu_s_per_1000_jobs": ("cpu_s_per_1000_jobs", "workers"),
                 "script_us_per_job": ("script_us_per_job",),
                 "evalsha_calls_per_1000_jobs": ("evalsha_calls_per_1000_jobs",),
                 "publishes_per_1000_jobs": ("publishes_per_1000_jobs",),
                 "redis_reads_per_1000_jobs": ("redis_reads_per_1000_jobs",),
                 "foreign_cpu_s_per_s": ("foreign_cpu_s_per_s",)}


SPREAD_FIGURES = {"per_shard_net_cpu_s_per_1000_jobs": ("per_shard_net_cpu_s_per_1000_jobs", "median"),
                  "redis_net_cpu_s_per_1000_jobs": ("redis_net_cpu_s_per_1000_jobs",),
                  "ticks_per_1000_jobs": ("ticks_per_1000_jobs",),
                  "publishes_per_1000_jobs": ("publishes_per_1000_jobs",),
                  "schedulers_cpu_s_per_1000_jobs": ("schedulers_cpu_s_per_1000_jobs",),
                  "schedulers_cpu_us_per_tick": ("schedulers_cpu_us_per_tick",),
                  "firing_lateness_p99_ms": ("firing_lateness", "p99_ms_est"),
                  "firing_share_le_5ms": ("firing_lateness", "share_le_5ms"),
                  "foreign_cpu_s_per_s": ("foreign_cpu_s_per_s",)}


def summarize(runs: dict[str, list[dict[str, Any]]], figures: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """Per figure: each side's median and runs, and per side other than single the ratio of the
    medians to single's and the median of the per-round ratios."""
    out: dict[str, Any] = {}
    for name, path in figures.items():
        fig: dict[str, Any] = {}
        for side, rs in runs.items():
            vals = [v for v in (get(r, path) for r in rs) if v is not None]
            fig[side] = round(statistics.median(vals), 5) if vals else None
        for side in runs:
            if side != "single":
                fig[f"{side}_over_single"] = ratio(fig[side], fig["single"])
                fig[f"{side}_over_single_paired"] = paired(runs, side, path)
        fig["runs"] = {side: [get(r, path) for r in rs] for side, rs in runs.items()}
        out[name] = fig
    return out


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of the suite as one: the rounds of the runs at the default drain concurrency
    pooled per side and workload, medians and ratios recomputed (a figure older runs lack is
    summarized over the runs that have it); runs at another drain concurrency become
    ``drain_variants``; ``fanout`` and ``tick_cost`` are the latest run's that has them."""
    def conc(r: dict[str, Any]) -> int:
        return int(r.get("drain_concurrency", DRAIN_CONCURRENCY))

    main = [r for r in results if "fire" in r and conc(r) == DRAIN_CONCURRENCY]
    if not main:
        raise SystemExit("--report needs at least one run with the fire workload at the default drain concurrency")
    last = main[-1]
    out = {**last, "rounds": sum(r["rounds"] for r in main), "seconds": sum(r["seconds"] for r in main),
           "runs_merged": len(main), "order": [o for r in main for o in r["order"]]}
    out["machine"] = {**last["machine"], "loadavg_start": main[0]["machine"]["loadavg_start"]}
    for one_off in ("fanout", "tick_cost"):
        found = [r[one_off] for r in results if one_off in r]
        if found:
            out[one_off] = found[-1]
    for name, figures in (("fire", FIRE_FIGURES), ("drain", DRAIN_FIGURES), ("spread", SPREAD_FIGURES)):
        have = [r[name]["runs"] for r in main if name in r]
        if have:
            runs = {side: [x for h in have for x in h[side]] for side in have[-1]}
            out[name] = {"summary": summarize(runs, figures), "runs": runs}
    variants = sorted({conc(r) for r in results if "drain" in r and conc(r) != DRAIN_CONCURRENCY})
    out["drain_variants"] = []
    for c in variants:
        have = [r["drain"]["runs"] for r in results if "drain" in r and conc(r) == c]
        runs = {side: [x for h in have for x in h[side]] for side in have[-1]}
        out["drain_variants"].append({"concurrency": c, "rounds": len(runs["single"]),
                                      "summary": summarize(runs, DRAIN_FIGURES)})
    if "within_10_percent" in last:
        out["within_10_percent"] = {
            f"{name}_{kind}": (out[name]["summary"]["per_shard_net_cpu_s_per_1000_jobs"][f"cluster_over_{kind}"]
                               or 99) <= TARGET
            for name in ("fire", "drain") for kind in ("single", "single_paired")}
    return out


def run(quick: bool = False, rounds: int | None = None, sides: tuple[str, ...] = SIDES,
        workloads: tuple[str, ...] = WORKLOADS, concurrency: int = DRAIN_CONCURRENCY) -> dict[str, Any]:
    t_start = time.time()
    jobs = {"fire": 20_000 if quick else 200_000, "drain": 20_000 if quick else 100_000,
            "spread": int((1000 if quick else SPREAD_RATE) * SPREAD_S)}
    rounds = rounds or (2 if quick else 5)
    m = machine()
    m["loadavg_start"] = os.getloadavg()
    result: dict[str, Any] = {"machine": m, "jobs": jobs, "rounds": rounds, "partitions": PARTITIONS,
                              "masters": MASTERS, "replicas": REPLICAS, "sides": list(sides),
                              "spread_seconds": SPREAD_S, "drain_concurrency": concurrency,
                              "order": [f"{i}:{s}" for i, s in order(rounds, sides)]}
    todo = [w for w in (("fire", fire_once, FIRE_FIGURES),
                        ("drain", functools.partial(drain_once, concurrency=concurrency), DRAIN_FIGURES),
                        ("spread", spread_once, SPREAD_FIGURES)) if w[0] in workloads]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {name: {s: [] for s in sides} for name, _, _ in todo}
    for rnd, side in order(rounds, sides):
        for name, fn, _ in todo:
            r = fn(side, jobs[name])
            runs[name][side].append(r)
            print(f"  round {rnd} {name} {side}: {r['jobs_per_s']} jobs/s, Redis net CPU ms per 1000 jobs "
                  f"{r['redis_net_cpu_s_per_1000_jobs'] * 1000:.2f}, per shard "
                  f"{r['per_shard_net_cpu_s_per_1000_jobs']['median'] * 1000:.2f}, "
                  f"foreign CPU {r['foreign_cpu_s_per_s']} s/s", file=sys.stderr, flush=True)
    for name, _, figures in todo:
        result[name] = {"summary": summarize(runs[name], figures), "runs": runs[name]}
    if "fanout" in workloads:
        result["fanout"] = fanout(4000 if quick else 20_000)
        print(f"  fanout: {result['fanout']}", file=sys.stderr, flush=True)
    if "tickcost" in workloads:
        result["tick_cost"] = tick_cost(1000 if quick else 3000)
        print(f"  tick cost: {result['tick_cost']}", file=sys.stderr, flush=True)
    m["loadavg_end"] = os.getloadavg()
    result["target"] = (f"per-shard Redis CPU per job (net of idle), cluster / single <= {TARGET} "
                        "(no cross-node chatter per job)")
    if "cluster" in sides and {"fire", "drain"} <= set(workloads):
        result["within_10_percent"] = {
            f"{name}_{kind}": (result[name]["summary"]["per_shard_net_cpu_s_per_1000_jobs"][f"cluster_over_{kind}"]
                               or 99) <= TARGET
            for name in ("fire", "drain") for kind in ("single", "single_paired")}
    result["seconds"] = round(time.time() - t_start, 1)
    return result


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="20 000 jobs per fire and drain run, 2 rounds")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 5, quick 2)")
    p.add_argument("--sides", default=",".join(SIDES), help=f"comma-separated, from {','.join(SIDES)}; single first")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated, from {','.join(WORKLOADS)}")
    p.add_argument("--concurrency", type=int, default=DRAIN_CONCURRENCY, help="the drain's worker concurrency")
    p.add_argument("--out", metavar="JSON", default=str(OUT), help="where to keep the run (default %(default)s)")
    p.add_argument("--report", metavar="JSON", nargs="+",
                   help="only rewrite the RESULTS.md section from saved runs (several: their rounds pooled)")
    a = p.parse_args()
    if a.report:
        r = merge([json.loads(Path(f).read_text()) for f in a.report])
    else:
        r = run(a.quick, a.rounds, tuple(a.sides.split(",")), tuple(a.workloads.split(",")), a.concurrency)
        save(r, Path(a.out))
        emit({"cluster": r})
    # only a full default run replaces the figures in RESULTS.md (a variant keeps its JSON only)
    full = (not a.quick and a.sides == ",".join(SIDES) and a.workloads == ",".join(WORKLOADS)
            and a.concurrency == DRAIN_CONCURRENCY)
    if a.report or full:
        write_section(r)


def save(r: dict[str, Any], path: Path = OUT) -> None:
    """Keep the run in bench/out/cluster.json (the RESULTS.md section can be rebuilt from it)."""
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(r, indent=2, default=str))


def write_section(r: dict[str, Any]) -> None:
    """Write the run's section of bench/RESULTS.md."""
    from bench.report import cluster_markdown, update_section
    update_section(RESULTS, "cluster", cluster_markdown(r))


if __name__ == "__main__":
    main()
