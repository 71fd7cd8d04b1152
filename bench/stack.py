"""A benchmark stack: redis-server (AOF everysec by default: durable like a production setup),
etcd, scheduler replicas and worker processes, all on loopback, stopped by PID.

``Stack(redis=...)`` runs on a Redis the caller started instead (a :class:`RedisServer` or a
:class:`ClusterSet`, through its ``.url``: ``redis+cluster://`` for a cluster); the stack neither
starts nor stops it, and reads CPU and counters from its masters. ``Stack(code=PATH)`` runs the
replicas and workers from another checkout of zsched (``PYTHONPATH`` and working directory PATH),
for old-vs-new comparisons; this process's own client stays on the running code."""
from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import run_seconds
from scheduler import Client
from scheduler.metrics import bucket_quantile, scrape_histogram
from scheduler.redisio.connection import sync_redis
from scheduler.shell.servers import ClusterSet, EtcdServer, Lifeline, RedisServer, ZschedProc, scheduler_proc

NS = "bench"
ROOT = Path(__file__).resolve().parent.parent  # the checkout this bench runs from


def redis_args(aof: bool = True) -> list[str]:
    """The redis-server options of every benchmark stack: hz 10 (as Redis ships), AOF everysec or none."""
    extra = ["--hz", "10"]
    return extra + (["--appendonly", "yes", "--appendfsync", "everysec"] if aof else ["--appendonly", "no"])


def redis_nodes(srv: RedisServer | ClusterSet) -> list[RedisServer]:
    """The servers that hold data: the one redis-server, or the masters of a cluster."""
    # a new list: a list[ClusterServer] is not a list[RedisServer] (lists are invariant)
    return [*srv.masters()] if isinstance(srv, ClusterSet) else [srv]


def redis_cpu(srv: RedisServer | ClusterSet) -> dict[int, float]:
    """Port -> CPU seconds (INFO cpu ``used_cpu_sys + used_cpu_user``) of each data-holding server."""
    out = {}
    for n in redis_nodes(srv):
        info = n.info("cpu")
        out[n.port] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return out


# The replicas and workers a bench starts stop by themselves once the bench process is gone, however
# it ended: a bench killed mid-run (SIGTERM skips the stack's cleanup, SIGKILL everything) left them
# running, retrying a Redis that was gone, through the next measurements.
LIFELINE = Lifeline(grace=10.0)


class Stack:
    def __init__(self, partitions: int = 16, aof: bool = True, lease_ttl: float = 2.0,
                 redis: RedisServer | ClusterSet | None = None, code: Path = ROOT) -> None:
        # an external Redis (started by the caller, left running by us) or our own redis-server
        self.own_redis = redis is None
        self.redis_srv: RedisServer | ClusterSet = RedisServer(extra_args=redis_args(aof)) if redis is None else redis
        self.etcd = EtcdServer()
        self.partitions = partitions
        self.lease_ttl = lease_ttl
        self.schedulers: list[ZschedProc] = []
        self.workers: list[tuple[ZschedProc, Path]] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="zsched-bench-"))
        self.code = code  # where the replicas' and workers' code comes from

    def __enter__(self) -> Stack:
        if self.own_redis:
            self.redis_srv.start()
        self.etcd.start()
        self.url = self.redis_srv.url
        # the namespace gets its partition count now, before any scheduler process could give it the default
        self.client = Client.from_url(self.url, namespace=NS, partitions=self.partitions).connect()
        self.r = sync_redis(self.url)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_workers()
        for s in self.schedulers:
            s.stop()
        self.client.close()
        self.r.close()
        self.etcd.stop()
        if self.own_redis:
            self.redis_srv.stop()
        # the workers' records, read by stop_workers (a run used to leave one directory per stack in /tmp)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start_schedulers(self, n: int, extra: Sequence[str] = ()) -> None:
        for _ in range(n):
            proc = scheduler_proc(self.url, self.etcd.endpoint, NS, f"s{len(self.schedulers)}",
                                  ttl=self.lease_ttl, extra=extra, env={"PYTHONPATH": str(self.code)},
                                  lifeline=LIFELINE)
            proc.cwd = str(self.code)  # `python -m` puts the working directory first on sys.path
            self.schedulers.append(proc.start())
        self.wait_owned()

    def owners(self) -> dict[int, str]:
        import asyncio

        from scheduler.coord import EtcdCoordinator

        async def read() -> dict[int, str]:
            async with EtcdCoordinator.from_endpoints(self.etcd.endpoint) as c:
                kvs, _ = await c.get_prefix(f"/zsched/{NS}/owners/")
            return {int(kv.key.rsplit("/", 1)[1]): kv.value.decode() for kv in kvs}
        return asyncio.run(read())

    def wait_owned(self, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        live = {f"s{i}" for i, s in enumerate(self.schedulers) if s.proc and s.proc.poll() is None}
        while time.monotonic() < deadline:
            own = self.owners()
            if len(own) == self.partitions and set(own.values()) <= live and len(set(own.values())) == len(live):
                time.sleep(0.3)
                return
            time.sleep(0.1)
        raise RuntimeError(f"partitions not settled: {self.owners()}")

    def start_workers(self, n: int, concurrency: int = 16, extra: Sequence[str] = (), settle: float = 1.5,
                      handler_ms: float = 0.0) -> None:
        """Start ``n`` worker processes and give them ``settle`` s to import, connect and subscribe;
        their handlers return at once, or after ``handler_ms`` (bench/handlers.py)."""
        for _ in range(n):
            rec = self.tmp / f"worker-{len(self.workers)}.txt"
            p = ZschedProc(["worker", "bench.handlers:worker", "--redis", self.url, "--namespace", NS, *extra],
                           env={"BENCH_RECORD": str(rec), "BENCH_CONCURRENCY": str(concurrency),
                                "BENCH_HANDLER_MS": f"{handler_ms:g}", "PYTHONPATH": str(self.code)},
                           cwd=str(self.code), lifeline=LIFELINE).start()
            self.workers.append((p, rec))
        time.sleep(settle)

    def stop_workers(self) -> list[tuple[str, int, float]]:
        records: list[tuple[str, int, float]] = []
        for p, rec in self.workers:
            p.stop()
            if rec.exists():
                for line in rec.read_text().splitlines():
                    jid, due, start = line.split()
                    records.append((jid, int(due), float(start)))
                rec.unlink()  # the next worker of that number writes its own
        self.workers = []
        return records

    def counters(self, event: str, queue: str = "bench") -> list[int]:
        """The partitions' event counters (element p is partition p's), in one pipeline (per node)."""
        pipe = self.r.pipeline(transaction=False)
        for p in range(self.partitions):
            pipe.hget(self.client.keyspace.key(p, "c"), f"{event}:{queue}")
        return [int(v or 0) for v in pipe.execute()]

    def counter(self, event: str, queue: str = "bench") -> int:
        return sum(self.counters(event, queue))

    def cpu(self) -> dict[str, float]:
        out = {"redis": sum(redis_cpu(self.redis_srv).values())}
        # to the nanosecond: /proc/PID/stat's 10 ms ticks blur a window's cost over 16 processes
        out["schedulers"] = sum(run_seconds(s.pid) for s in self.schedulers if s.proc and s.proc.poll() is None)
        out["workers"] = sum(run_seconds(p.pid) for p, _ in self.workers if p.proc and p.proc.poll() is None)
        return out

    def firing_buckets(self) -> dict[float, float]:
        total: dict[float, float] = {}
        for s in self.schedulers:
            if s.proc and s.proc.poll() is None:
                assert s.metrics_port is not None
                for le, c in scrape_histogram(s.metrics_port, "zsched_firing_lateness_seconds").items():
                    total[le] = total.get(le, 0.0) + c
        return total


def bucket_summary(before: dict[float, float], after: dict[float, float]) -> dict[str, Any]:
    """Firing lateness from histogram bucket deltas: share within 1/2/5/10 ms and estimated quantiles."""
    delta = sorted((le, after.get(le, 0.0) - before.get(le, 0.0)) for le in after)
    n = delta[-1][1] if delta else 0.0
    if n <= 0:
        return {"n": 0}

    def share(limit: float) -> float:
        return round(next((c for le, c in delta if le >= limit), n) / n, 4)

    def quant(q: float) -> float:
        return bucket_quantile(delta, q) or 0.0

    return {"n": int(n), "p50_ms_est": round(quant(0.5) * 1000, 2), "p99_ms_est": round(quant(0.99) * 1000, 2),
            "share_le_1ms": share(0.001), "share_le_2ms": share(0.002), "share_le_5ms": share(0.005),
            "share_le_10ms": share(0.01)}
