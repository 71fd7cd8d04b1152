"""W6 tick cost in isolation: jobs moved per Redis CPU-second by tick calls alone, with 10 000 vs
10 000 000 far-future jobs pending (3 repetitions each). ``python -m bench.tick_scale``"""
import time

import redis

from bench.common import PAYLOAD, redis_server
from scheduler import Client
from scheduler.testing.transitions import Ops


def run(backlog):
    with redis_server() as s:
        c = Client.from_url(s.url, namespace="b", partitions=16)
        r = redis.Redis.from_url(s.url)
        far = time.time() + 30*86400
        for st in range(0, backlog, 50000):
            c.schedule_many([(far + (i % 86400), PAYLOAD) for i in range(st, min(backlog, st+50000))], queue="backlog")
        out = []
        for _ in range(3):
            due = time.time() + 1.0
            c.schedule_many([(due, PAYLOAD)] * 100_000, queue="tickbench")
            time.sleep(max(0, due - time.time()) + 0.1)
            r.config_resetstat()
            moved = Ops(c).tick_all(limit=1000)
            st = r.info("commandstats")["cmdstat_evalsha"]
            out.append(round(moved / (st["usec"] / 1e6)))
            r.delete(*[c.keyspace.ready(p, "tickbench") for p in range(16)])
            r.delete(*[c.keyspace.key(p, "j") for p in range(16)])
        return out
if __name__ == "__main__":
    print("10k", run(10_000))
    print("10M", run(10_000_000))
