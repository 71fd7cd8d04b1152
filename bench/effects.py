"""What a fenced effect costs: one worker's handler throughput with its write plain and fenced.

``python -m bench effects [--quick]`` (prints JSON; also ``python -m bench effects`` in the suite
list). One redis-server, one PostgreSQL server with its durability defaults (fsync and
synchronous_commit on: each commit waits for the WAL to reach the disk, as a user's does), one
in-process worker (asyncio, concurrency 8, a sync handler with one connection per handler thread).
Each job's handler inserts one row; the sides:

- ``plain``: ``with conn.transaction(): INSERT`` (BEGIN, INSERT, COMMIT);
- ``fenced``: ``with fenced(conn, job): INSERT`` (BEGIN, the fence's INSERT ... ON CONFLICT,
  INSERT, COMMIT: one statement more, inside the same transaction and the same commit);
- ``fenced_redis``: ``fenced_write(r, job, [("RPUSH", ...)])`` on a second redis-server (one
  script call in place of the transaction).

Rounds alternate the sides (plain, fenced, fenced_redis, plain, ...): jobs/s per round, the
median per side, and the ratio of each fenced side to plain. Statements per job (BEGIN and COMMIT
included) are PostgreSQL's own count (``pg_stat_statements``, reset before each side).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import redis

from bench.common import emit, machine
from scheduler import Client
from scheduler.shell.servers import RedisServer
from scheduler.shell.servers.postgres import PostgresServer
from workers import Worker
from workers.effects import ddl, fenced, fenced_write

CONCURRENCY = 8
SIDES = ("plain", "fenced", "fenced_redis")


class Side:
    """One side's handler, with a connection per handler thread."""

    def __init__(self, name: str, dsn: str, store: redis.Redis) -> None:
        self.name = name
        self.dsn = dsn
        self.store = store
        self.local = threading.local()

    def conn(self) -> psycopg.Connection[Any]:
        c: psycopg.Connection[Any] | None = getattr(self.local, "conn", None)
        if c is None:
            c = self.local.conn = psycopg.connect(self.dsn)
        return c

    def handler(self) -> Callable[[Any], None]:
        def plain(job: Any) -> None:
            c = self.conn()
            with c.transaction():
                c.execute("INSERT INTO sink (job_id) VALUES (%s)", (job.id,))

        def with_fence(job: Any) -> None:
            c = self.conn()
            with fenced(c, job):
                c.execute("INSERT INTO sink (job_id) VALUES (%s)", (job.id,))

        def redis_fence(job: Any) -> None:
            fenced_write(self.store, job, [("RPUSH", "sink", job.id)])

        return {"plain": plain, "fenced": with_fence, "fenced_redis": redis_fence}[self.name]


async def _drain(url: str, namespace: str, side: Side, jobs: int) -> float:
    client = Client.from_url(url, namespace=namespace, partitions=4).connect()
    try:
        worker = Worker.from_url(url, namespace=namespace, concurrency=CONCURRENCY)
        worker.handler("fx")(side.handler())
        task = asyncio.create_task(worker.serve())
        await worker.wait_ready(10)
        client.schedule_many([(timedelta(0), {"n": i}) for i in range(jobs)], queue="fx")
        t0 = time.perf_counter()
        while worker.stats.acked < jobs:
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - t0
        await worker.stop()
        await task
        return elapsed
    finally:
        client.close()


def _statements(dsn: str, reset: bool = False) -> int:
    """Statements the handlers ran since the last reset (this query and the reset not counted)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        if reset:
            c.execute("SELECT pg_stat_statements_reset()")
            return 0
        row = c.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements "
                        "WHERE query NOT LIKE '%pg_stat_statements%'").fetchone()
        return int(row[0]) if row else 0


def run(quick: bool = False) -> dict[str, Any]:
    jobs, rounds = (300, 2) if quick else (2000, 3)
    with RedisServer() as zs, RedisServer() as user_redis, \
            PostgresServer({"shared_preload_libraries": "pg_stat_statements"}) as pg:
        dsn = pg.conninfo
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            c.execute(ddl())
            c.execute("CREATE TABLE sink (id bigserial PRIMARY KEY, job_id text NOT NULL)")
        store = redis.Redis.from_url(user_redis.url)
        per_side: dict[str, list[float]] = {s: [] for s in SIDES}
        statements: dict[str, float] = {}
        for r in range(rounds):
            for name in SIDES:
                side = Side(name, dsn, store)
                _statements(dsn, reset=True)
                seconds = asyncio.run(_drain(zs.url, f"fx{r}{name.replace('_', '')}", side, jobs))
                per_side[name].append(jobs / seconds)
                statements[name] = round(_statements(dsn) / jobs, 2)
        store.close()
    med = {s: statistics.median(v) for s, v in per_side.items()}
    return {
        "machine": machine(),
        "jobs_per_round": jobs, "rounds": rounds, "worker_concurrency": CONCURRENCY,
        "postgres_settings": "fsync on, synchronous_commit on (durable defaults)",
        "jobs_per_s": {s: [round(x) for x in v] for s, v in per_side.items()},
        "jobs_per_s_median": {s: round(v) for s, v in med.items()},
        "ratio_over_plain": {s: round(med[s] / med["plain"], 3) for s in SIDES if s != "plain"},
        "postgres_statements_per_job": statements,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.effects", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="300 jobs, 2 rounds (a smoke run)")
    emit(json.loads(json.dumps(run(p.parse_args().quick))))


if __name__ == "__main__":
    main()
