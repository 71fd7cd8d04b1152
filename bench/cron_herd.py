"""10 000 crons due in the same minute ("daily at 09:00"), jitter 60 s, with a queue rate limit (issue 6):
measured fire-time spread (jitter) and drain rate. ``python -m bench.cron_herd [--crons N]``"""
from __future__ import annotations

import argparse
import time
from typing import Any

import redis

from bench.common import emit, machine, percentiles, redis_server
from bench.stack import LIFELINE
from scheduler import Client
from scheduler.shell.servers import EtcdServer, scheduler_proc
from scheduler.testing.transitions import Ops

NS = "cronherd"


def run(crons: int = 10_000, jitter: float = 60.0, rate: float = 250.0, replicas: int = 2) -> dict[str, Any]:
    with redis_server() as rs, EtcdServer() as etcd:
        client = Client.from_url(rs.url, namespace=NS, partitions=16)
        r = redis.Redis.from_url(rs.url)
        client.set_rate_limit("digest", rate)
        # one herd in the window: every cron is "daily at minute M", M at least 40 s away
        nominal = (int(time.time() + 40) // 60 + 1) * 60
        tm = time.gmtime(nominal)
        expr = f"{tm.tm_min} {tm.tm_hour} * * *"
        t0 = time.perf_counter()
        for i in range(crons):
            client.add_cron(f"c{i}", expr, {"i": i}, queue="digest", jitter=jitter)
        add_s = time.perf_counter() - t0
        if time.time() > nominal - 2:
            raise SystemExit("adding the crons took too long for the chosen minute; use fewer --crons")
        procs = [scheduler_proc(rs.url, etcd.endpoint, NS, f"r{i}", ttl=5.0, lifeline=LIFELINE).start()
                 for i in range(replicas)]
        try:
            time.sleep(max(0.0, nominal - time.time()))
            samples = []
            deadline = time.time() + jitter + crons / rate + 60
            fired = 0
            while fired < crons and time.time() < deadline:
                fired = sum(int(r.hget(client.keyspace.key(p, "c"), "fired:digest") or 0) for p in range(16))
                samples.append((time.time() - nominal, fired))
                time.sleep(0.5)
            jobs = Ops(client).claim("digest", crons * 2)
            herd = [j for j in jobs if j.record.cron_nominal_ms == nominal * 1000]
            offsets = [(j.due_ms - nominal * 1000) / 1000 for j in herd]
            lo = next((t for t, n in samples if n >= 0.1 * crons), None)
            hi = next((t for t, n in samples if n >= 0.9 * crons), None)
            return {
                "crons": crons, "jitter_s": jitter, "rate_limit_per_s": rate, "replicas": replicas,
                "add_cron_per_s": round(crons / add_s),
                "herd_jobs_fired": len(herd),
                "jitter_offset_s": percentiles(offsets),
                "drain_rate_10_90_per_s": round(0.8 * crons / (hi - lo), 1) if lo is not None and hi else None,
                "drained_after_s": round(samples[-1][0], 1),
                "fired_timeline": [(round(t, 1), n) for t, n in samples[:: max(1, len(samples) // 40)]],
            }
        finally:
            for p in procs:
                p.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--crons", type=int, default=10_000)
    ap.add_argument("--jitter", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=250.0)
    a = ap.parse_args()
    emit({"machine": machine(), "cron_herd": run(a.crons, a.jitter, a.rate)})


if __name__ == "__main__":
    main()
