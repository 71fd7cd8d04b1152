"""What ``bench.cluster`` runs on and measures: a fresh Redis per run for each side (one
redis-server, or a 3-master :class:`ClusterSet` with the partitions spread evenly or all on one
master) and the measurement window (Redis CPU per master from INFO cpu, the replicas' and workers'
CPU, commandstats, read events, cluster-bus messages, the machine's busy time), with the per-shard
figures computed from it. See ``bench/cluster.py`` for the workloads."""
from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import PAYLOAD, cpu_seconds
from bench.stack import Stack, redis_args, redis_cpu, redis_nodes
from scheduler.shell.servers import ClusterSet, RedisServer, slot_of

MASTERS = 3
QUEUE = "bench"
POLL_S = 0.01
IDLE_S = 1.0  # the idle window before T0
# every way a client runs a script or a function (INFO commandstats names)
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")


# -- the two sides ---------------------------------------------------------------------------------

def partition_key(ns: str, p: int) -> str:
    return "{%s:%d}:t" % (ns, p)


def placement(srv: RedisServer | ClusterSet, ns: str, partitions: int) -> dict[int, list[int]]:
    """Port of each data-holding server -> the partitions whose slot it owns."""
    nodes = redis_nodes(srv)
    out: dict[int, list[int]] = {n.port: [] for n in nodes}
    for p in range(partitions):
        port = srv.node_for_key(partition_key(ns, p)).port if isinstance(srv, ClusterSet) else nodes[0].port
        out[port].append(p)
    return out


def balance(c: ClusterSet, ns: str, partitions: int, one_master: bool = False) -> dict[str, Any]:
    """Move partitions' slots (empty: before any job) from the fullest master to the emptiest until
    they differ by at most one partition (``one_master``: all onto the fullest); what it did."""
    before = placement(c, ns, partitions)
    moves = []
    while True:
        place = placement(c, ns, partitions)
        full = max(place, key=lambda k: len(place[k]))
        if one_master:
            src = next((k for k in place if k != full and place[k]), None)
            if src is None:
                break
            p, dst = place[src][-1], full
        else:
            src = full
            dst = min(place, key=lambda k: len(place[k]))
            if len(place[src]) - len(place[dst]) <= 1:
                break
            p = place[src][-1]
        by_port = {m.port: m for m in c.masters()}
        slot = slot_of(partition_key(ns, p))
        c.move_slots([slot], by_port[src], by_port[dst])
        moves.append({"partition": p, "slot": slot, "from": src, "to": dst})
    return {"before": {k: len(v) for k, v in before.items()}, "after": {k: len(v) for k, v in place.items()},
            "moves": moves}


@contextmanager
def side_redis(side: str, ns: str, partitions: int) -> Iterator[tuple[RedisServer | ClusterSet, dict[str, Any]]]:
    """A fresh Redis for one run: a redis-server, or a 3-master cluster with the partitions spread
    evenly (``cluster``) or all on one master (``cluster1``); same options."""
    t = time.monotonic()
    if side == "single":
        srv = RedisServer(extra_args=redis_args())
        srv.start()
        info: dict[str, Any] = {}
    else:
        c = ClusterSet(MASTERS, 0, redis_args=redis_args())
        c.start()
        try:
            info = {"balance": balance(c, ns, partitions, one_master=side == "cluster1")}
        except BaseException:
            c.stop()
            raise
        srv = c
    info["start_s"] = round(time.monotonic() - t, 2)
    try:
        yield srv, info
    finally:
        srv.stop()


# -- measuring -------------------------------------------------------------------------------------

def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat: everything but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def own_pids(st: Stack) -> list[int]:
    """This process and every process the run started (Redis nodes, etcd, replicas, workers)."""
    pids = [os.getpid()]
    nodes = st.redis_srv.nodes if isinstance(st.redis_srv, ClusterSet) else [st.redis_srv]
    pids += [n.pid for n in [*nodes, st.etcd] if n.pid]
    pids += [s.pid for s in st.schedulers if s.proc and s.proc.poll() is None]
    pids += [p.pid for p, _ in st.workers if p.proc and p.proc.poll() is None]
    return pids


class Window:
    """Everything measured between two instants: CPU of each master, of the replicas and workers,
    EVALSHA stats and bus messages per master, the machine's busy time and ours."""

    def __init__(self, st: Stack) -> None:
        self.st = st
        for n in redis_nodes(st.redis_srv):
            n.command("CONFIG", "RESETSTAT")
        self.t = time.monotonic()
        self.redis = redis_cpu(st.redis_srv)
        self.tier = st.cpu()
        self.bus = bus_messages(st.redis_srv)
        self.reads = reads_processed(st.redis_srv)
        self.busy = machine_busy_s()
        self.ours = sum(cpu_seconds(p) for p in own_pids(st))

    def close(self) -> dict[str, Any]:
        st = self.st
        redis1, tier1, bus1 = redis_cpu(st.redis_srv), st.cpu(), bus_messages(st.redis_srv)
        reads1 = reads_processed(st.redis_srv)
        ours = sum(cpu_seconds(p) for p in own_pids(st)) - self.ours
        busy = machine_busy_s() - self.busy
        seconds = time.monotonic() - self.t
        stats = [command_stats(n) for n in redis_nodes(st.redis_srv)]
        return {"seconds": seconds,
                "redis_cpu_s": {port: redis1[port] - v for port, v in self.redis.items()},
                "schedulers_cpu_s": tier1["schedulers"] - self.tier["schedulers"],
                "workers_cpu_s": tier1["workers"] - self.tier["workers"],
                "bus_messages": sum(bus1.values()) - sum(self.bus.values()),
                "reads": sum(reads1.values()) - sum(self.reads.values()),
                "evalsha_calls": sum(x.get("evalsha", (0, 0))[0] for x in stats),
                "evalsha_usec": sum(x.get("evalsha", (0, 0))[1] for x in stats),
                "script_calls": sum(x.get(c, (0, 0))[0] for x in stats for c in SCRIPT_COMMANDS),
                # the scripts' ready and wake notifications (counted in commandstats from Lua too)
                "publishes": sum(x.get(c, (0, 0))[0] for x in stats for c in ("publish", "spublish")),
                # command -> (calls, usec inside the command) over the masters: where Redis's CPU
                # went, the rest of INFO cpu being its event loop and the sockets
                "commands": {c: (sum(x.get(c, (0, 0))[0] for x in stats), sum(x.get(c, (0, 0))[1] for x in stats))
                             for c in sorted({c for x in stats for c in x})},
                "foreign_cpu_s": max(0.0, busy - ours)}


def bus_messages(srv: RedisServer | ClusterSet) -> dict[int, int]:
    """Cluster-bus messages sent so far by each master (0 for a single node)."""
    if not isinstance(srv, ClusterSet):
        return {srv.port: 0}
    return {n.port: int(n.cluster_info().get("cluster_stats_messages_sent", 0)) for n in srv.masters()}


def reads_processed(srv: RedisServer | ClusterSet) -> dict[int, int]:
    """Read events each master processed so far (INFO stats): about one per client round trip."""
    return {n.port: int(n.info("stats").get("total_reads_processed", 0)) for n in redis_nodes(srv)}


def command_stats(n: RedisServer) -> dict[str, tuple[int, int]]:
    """Command -> (calls, usec) since the last CONFIG RESETSTAT (INFO commandstats)."""
    out = {}
    for key, raw in n.info("commandstats").items():
        kv = dict(x.split("=", 1) for x in raw.split(",") if "=" in x)
        out[key.removeprefix("cmdstat_")] = (int(kv.get("calls", 0)), int(kv.get("usec", 0)))
    return out


def poll(st: Stack, event: str, target: int, timeout: float) -> list[tuple[float, int]]:
    """(time, count) of ``event`` every :data:`POLL_S` until it reaches ``target``."""
    samples: list[tuple[float, int]] = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        n = st.counter(event, QUEUE)
        samples.append((time.time(), n))
        if n >= target:
            return samples
        time.sleep(POLL_S)
    raise RuntimeError(f"only {samples[-1][1] if samples else 0} of {target} {event} after {timeout}s")


def idle_window(st: Stack, until: float) -> dict[str, Any]:
    """A window before T0 with the same counter polling as the measurement: the baseline cost."""
    w = Window(st)
    while time.time() < until:
        st.counter("fired", QUEUE)
        time.sleep(POLL_S)
    return w.close()


def used_memory(srv: RedisServer | ClusterSet) -> dict[int, int]:
    return {n.port: int(n.info("memory")["used_memory"]) for n in redis_nodes(srv)}


def per_node(st: Stack, place: dict[int, list[int]], event: str, w: dict[str, Any],
             idle: dict[str, Any]) -> dict[str, Any]:
    """Per master: partitions, jobs, CPU, CPU per 1 000 of its jobs raw and net of the idle rate."""
    counts = st.counters(event, QUEUE)
    out = {}
    for port, parts in place.items():
        jobs = sum(counts[p] for p in parts)
        cpu = w["redis_cpu_s"][port]
        idle_rate = idle["redis_cpu_s"][port] / idle["seconds"]
        net = max(0.0, cpu - idle_rate * w["seconds"])
        out[str(port)] = {"partitions": len(parts), "jobs": jobs, "cpu_s": round(cpu, 4),
                          "idle_cpu_s_per_s": round(idle_rate, 4),
                          "cpu_s_per_1000_jobs": round(cpu / jobs * 1000, 5) if jobs else None,
                          "net_cpu_s_per_1000_jobs": round(net / jobs * 1000, 5) if jobs else None}
    return out


def shard_figures(nodes: dict[str, Any], jobs: int, w: dict[str, Any], idle: dict[str, Any]) -> dict[str, Any]:
    """The per-job Redis figures of one run: whole side, per shard (median and spread over masters)."""
    total = sum(w["redis_cpu_s"].values())
    idle_total = sum(idle["redis_cpu_s"].values()) / idle["seconds"] * w["seconds"]
    per = [v["net_cpu_s_per_1000_jobs"] for v in nodes.values() if v["net_cpu_s_per_1000_jobs"] is not None]
    raw = [v["cpu_s_per_1000_jobs"] for v in nodes.values() if v["cpu_s_per_1000_jobs"] is not None]
    shards = sum(1 for v in nodes.values() if v["partitions"])
    return {
        "redis_cpu_s_per_1000_jobs": round(total / jobs * 1000, 5),
        "redis_net_cpu_s_per_1000_jobs": round(max(0.0, total - idle_total) / jobs * 1000, 5),
        # what one shard pays per 1 000 jobs of its own partitions (the per-shard cost)
        "per_shard_net_cpu_s_per_1000_jobs": {"median": round(statistics.median(per), 5),
                                              "min": round(min(per), 5), "max": round(max(per), 5)},
        "per_shard_cpu_s_per_1000_jobs_median": round(statistics.median(raw), 5),
        # the load each shard carries per 1 000 jobs of the namespace (spread over `shards`)
        "redis_net_cpu_s_per_shard_per_1000_namespace_jobs": round(
            max(0.0, total - idle_total) / shards / jobs * 1000, 5),
        "shards": shards,
        "evalsha_calls_per_1000_jobs": round(w["evalsha_calls"] / jobs * 1000, 1),
        "script_us_per_job": round(w["evalsha_usec"] / jobs, 2),
        "publishes_per_1000_jobs": round(w["publishes"] / jobs * 1000, 1),
        "redis_reads_per_1000_jobs": round(w["reads"] / jobs * 1000, 1),
        "bus_messages_per_s": round(w["bus_messages"] / w["seconds"], 1),
        "idle_bus_messages_per_s": round(idle["bus_messages"] / idle["seconds"], 1),
    }


def rate_10_90(samples: list[tuple[float, int]], jobs: int) -> float | None:
    lo = next((t for t, n in samples if n >= 0.1 * jobs), None)
    hi = next((t for t, n in samples if n >= 0.9 * jobs), None)
    return round(0.8 * jobs / (hi - lo)) if lo is not None and hi is not None and hi > lo else None


def schedule_at(st: Stack, t0: float, jobs: int) -> tuple[set[str], float]:
    """N jobs due at ``t0`` with ``schedule_many`` in batches of 20 000; the ids and jobs/s."""
    ids: set[str] = set()
    t = time.monotonic()
    for s in range(0, jobs, 20_000):
        ids |= set(st.client.schedule_many([(t0, PAYLOAD)] * min(20_000, jobs - s), queue=QUEUE))
    rate = jobs / (time.monotonic() - t)
    if time.time() > t0 - IDLE_S - 0.3:
        raise RuntimeError(f"scheduling {jobs} jobs ({rate:.0f}/s) ran into the idle window before T0; "
                           "raise lead_time()")
    return ids, rate


def lead_time(jobs: int) -> float:
    """How far ahead T0 is: scheduling N jobs (about 100 000/s here), then the idle window."""
    return 2.5 + IDLE_S + jobs / 40_000
