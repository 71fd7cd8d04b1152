"""``python -m bench migrate [--quick]``: what ``zsched migrate-partitions`` costs (not part of all).

For each backend, on a fresh Redis started the way ``bench.cluster`` starts its sides
(``bench.cluster_measure.side_redis``: redis-server with AOF everysec and hz 10 on loopback;
``cluster`` is a 3-master :class:`ClusterSet` without replicas whose 16 source partitions are first
spread evenly over the masters):

* fill namespace ``bench`` created with 16 partitions: N jobs due in 1 h to 1 h 23 min
  (``schedule_many`` in batches of 20 000, payload ``{"i": i}``) plus N / 100 ready jobs (due at 0,
  queue ``rq``); N = 1 000 000 on the single node and 300 000 on the cluster (``--quick``: 50 000 and
  20 000);
* time :class:`scheduler.shell.migrate.Migration` from 16 to 64 partitions (3 jobs in 4 change
  partition): wall seconds, jobs moved per second, rounds of ``migrate_out``/``migrate_in``, Redis CPU
  (INFO cpu ``used_cpu_sys + used_cpu_user``, summed over the masters; per master too on the
  cluster) in total and per 1 000 moved jobs, the migrating client's own CPU, ``used_memory`` before
  and after (summed over the masters), and other processes' CPU on the machine meanwhile;
* check the result cheaply: a new client (no ``partitions=``) sees 64 partitions and the timer sets
  ``{bench:p}:t`` of the 64 partitions hold N entries in all (``verified``).

2 rounds per backend (1 with ``--quick``), a fresh Redis for every run, the order of the backends
reversed every round; every run and the medians per backend are in the output.
"""
from __future__ import annotations

import os
import statistics
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench.cluster_measure import machine_busy_s, placement, side_redis, used_memory
from bench.common import cpu_seconds
from bench.stack import NS, redis_cpu, redis_nodes
from scheduler import Client
from scheduler.shell.migrate import Migration
from scheduler.shell.servers import ClusterSet, RedisServer

FROM, TO = 16, 64
RESULTS = Path(__file__).with_name("RESULTS.md")
BATCH = 20_000
READY_QUEUE = "rq"
BACKENDS = ("single", "cluster")
JOBS = {"single": 1_000_000, "cluster": 300_000}
QUICK_JOBS = {"single": 50_000, "cluster": 20_000}
MEDIAN_FIGURES = ("jobs", "moved", "seconds", "moved_per_s", "rounds", "redis_cpu_s",
                  "redis_cpu_s_per_1000_moved", "client_cpu_s_per_1000_moved", "used_memory_before",
                  "used_memory_after", "fill_jobs_per_s", "foreign_cpu_s_per_s")


def fill(client: Client, jobs: int) -> int:
    """``jobs`` scheduled jobs due in about 1 h and ``jobs // 100`` ready ones; returns how many
    are scheduled (in the timer sets)."""
    now = time.time()
    for s in range(0, jobs, BATCH):
        client.schedule_many([(now + 3600 + i % 5000, {"i": i}) for i in range(s, min(jobs, s + BATCH))])
    ready = jobs // 100
    for s in range(0, ready, BATCH):
        client.schedule_many([(timedelta(0), i) for i in range(s, min(ready, s + BATCH))], queue=READY_QUEUE)
    return jobs


def verify(url: str, scheduled: int) -> dict[str, Any]:
    """A new client sees :data:`TO` partitions and their timer sets hold ``scheduled`` entries."""
    client = Client.from_url(url, namespace=NS).connect()
    try:
        ks = client.keyspace
        pipe = client.redis.pipeline(transaction=False)
        for p in range(ks.partitions):
            pipe.zcard(ks.key(p, "t"))
        timers = sum(int(n) for n in pipe.execute())
        return {"partitions_seen": ks.partitions, "timer_entries": timers,
                "verified": ks.partitions == TO and timers == scheduled}
    finally:
        client.close()


def pids(srv: RedisServer | ClusterSet) -> list[int]:
    return [n.pid for n in redis_nodes(srv) if n.pid]


def run_once(backend: str, jobs: int) -> dict[str, Any]:
    with side_redis(backend, NS, FROM) as (srv, info):
        client = Client.from_url(srv.url, namespace=NS, partitions=FROM).connect()
        try:
            t = time.monotonic()
            scheduled = fill(client, jobs)
            fill_s = time.monotonic() - t
            ready = jobs // 100
            old_place = placement(srv, NS, FROM)
            mem0, cpu0 = used_memory(srv), redis_cpu(srv)
            busy0, ours0 = machine_busy_s(), sum(cpu_seconds(p) for p in [os.getpid(), *pids(srv)])
            client_cpu0 = time.process_time()
            report = Migration(client, TO).run()
            client_cpu = time.process_time() - client_cpu0
            cpu1 = redis_cpu(srv)
            foreign = max(0.0, machine_busy_s() - busy0 - (sum(cpu_seconds(p) for p in [os.getpid(), *pids(srv)])
                                                            - ours0))
            mem1 = used_memory(srv)
        finally:
            client.close()
        check = verify(srv.url, scheduled)
        new_place = placement(srv, NS, TO)
    cpu = {port: cpu1[port] - cpu0[port] for port in cpu0}
    moved = report.moved
    k = 1000 / moved if moved else 0.0
    out: dict[str, Any] = {
        "backend": backend, "jobs": scheduled + ready, "scheduled": scheduled, "ready": ready,
        "from_partitions": FROM, "to_partitions": TO,
        "fill_s": round(fill_s, 2), "fill_jobs_per_s": round((scheduled + ready) / fill_s),
        "moved": moved, "skipped": report.skipped, "seconds": round(report.seconds, 3),
        "moved_per_s": round(moved / report.seconds) if report.seconds else None, "rounds": report.rounds,
        "redis_cpu_s": round(sum(cpu.values()), 3), "redis_cpu_s_per_1000_moved": round(sum(cpu.values()) * k, 5),
        "client_cpu_s": round(client_cpu, 3), "client_cpu_s_per_1000_moved": round(client_cpu * k, 5),
        "used_memory_before": sum(mem0.values()), "used_memory_after": sum(mem1.values()),
        "foreign_cpu_s_per_s": round(foreign / report.seconds, 3) if report.seconds else None,
        **check, **info}
    if backend == "cluster":
        out["masters"] = {
            str(port): {"partitions_before": len(old_place[port]), "partitions_after": len(new_place[port]),
                        "moved_in": sum(report.by_target.get(p, 0) for p in new_place[port]),
                        "redis_cpu_s": round(cpu[port], 3),
                        "redis_cpu_s_per_1000_moved": round(cpu[port] * k, 5),
                        "used_memory_before": mem0[port], "used_memory_after": mem1[port]}
            for port in cpu}
    return out


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in MEDIAN_FIGURES:
        vals = [r[key] for r in runs if r.get(key) is not None]
        out[key] = statistics.median(vals) if vals else None
    out["verified"] = all(r["verified"] for r in runs)
    return out


def run(quick: bool) -> dict[str, Any]:
    rounds = 1 if quick else 2
    sizes = QUICK_JOBS if quick else JOBS
    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in BACKENDS}
    for i in range(rounds):
        for backend in BACKENDS if i % 2 == 0 else BACKENDS[::-1]:
            r = run_once(backend, sizes[backend])
            r["round"] = i
            runs[backend].append(r)
    return {"rounds": rounds, "runs": runs, "median": {b: medians(rs) for b, rs in runs.items()},
            "verified": all(r["verified"] for rs in runs.values() for r in rs)}


def markdown(r: dict[str, Any]) -> str:
    """The ``migrate`` section of bench/RESULTS.md."""
    from bench.report import num

    med = r["median"]
    names = {"single": "1 redis-server", "cluster": "3-master cluster"}
    rows = [
        ("jobs in the namespace", "jobs", 1.0), ("jobs moved", "moved", 1.0), ("wall seconds", "seconds", 1.0),
        ("moved per second", "moved_per_s", 1.0), ("Redis CPU ms per 1 000 moved (all masters)",
                                                  "redis_cpu_s_per_1000_moved", 1000.0),
        ("migrating client's CPU ms per 1 000 moved", "client_cpu_s_per_1000_moved", 1000.0),
        ("used_memory before, MB", "used_memory_before", 1e-6), ("used_memory after, MB", "used_memory_after", 1e-6),
        ("other processes' CPU meanwhile (cores)", "foreign_cpu_s_per_s", 1.0),
    ]
    lines = [
        "## Partition migration (`python -m bench migrate`)", "",
        f"`zsched migrate-partitions` from {FROM} to {TO} partitions (3 jobs in 4 move), medians of "
        f"{r['rounds']} rounds, a fresh Redis (AOF everysec) per run, on the machine's 2 cores. Every run "
        f"verified: {'yes' if r['verified'] else 'NO'}.", "",
        "| measure | " + " | ".join(names[b] for b in med) + " |",
        "|---|" + "---|" * len(med),
    ]
    for label, key, scale in rows:
        lines.append(f"| {label} | " + " | ".join(
            num(med[b][key] * scale) if med[b].get(key) is not None else "n/a" for b in med) + " |")
    return "\n".join(lines)


def write_section(r: dict[str, Any]) -> None:
    """Write the run's section of bench/RESULTS.md."""
    from bench.report import update_section
    update_section(RESULTS, "migrate", markdown(r))


if __name__ == "__main__":
    import argparse

    from bench.common import emit
    ap = argparse.ArgumentParser(prog="python -m bench.migrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    emit({"migrate": run(ap.parse_args().quick)})
