"""The PostgreSQL outbox (issue 28): commit-to-scheduled latency at a steady rate, and relay
throughput with batches, side by side with scheduling straight from the producer.

* latency: one producer commits one row per transaction (``outbox.schedule``) at RATE rows/s for
  SECONDS; a relay (``scheduler.shell.relay.Relay``, in this process on its own event loop
  thread, batch 1000, woken by LISTEN/NOTIFY) moves them; per row, the time from the producer's
  COMMIT returning to the relay's batch having scheduled it (taken after the relay's own COMMIT:
  an upper bound). Beside it: ``Client.schedule`` per job at the same rate (its call time).
* throughput: N rows already committed, drained by one relay (batch 1000): rows/s from the first
  SELECT to the last COMMIT; beside it ``Client.schedule_many`` of the same N jobs in batches of
  1000 from the producer.

PostgreSQL runs with its durability defaults (fsync on) on a free loopback port
(``scheduler/shell/servers/postgres.py``), Redis without persistence. ``python -m bench outbox``
(``--quick``: 3 s and 20 000 rows instead of 10 s and 100 000) prints JSON.
"""
from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from bench import common
from scheduler import AsyncClient, Client
from scheduler.client import outbox
from scheduler.shell.relay import Relay
from scheduler.shell.servers.postgres import PostgresServer

NS = "bench-outbox"
RATE = 1000  # rows/s
BATCH = 1000


class _RelayThread:
    """A relay on an event loop of its own thread; records when each key was scheduled."""

    def __init__(self, redis_url: str, dsn: str) -> None:
        self.scheduled: dict[str, float] = {}
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.relay: Relay | None = None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(redis_url, dsn),))

    def _moved(self, keys: list[str]) -> None:
        now = time.perf_counter()
        for k in keys:
            self.scheduled[k] = now

    async def _main(self, redis_url: str, dsn: str) -> None:
        async with AsyncClient.from_url(redis_url, namespace=NS) as client:
            self.relay = Relay(client, dsn, namespace=NS, table=outbox.DEFAULT_TABLE, batch=BATCH, poll=1.0,
                               on_moved=self._moved)
            self.ready.set()
            await self.relay.run(self.stop)

    def __enter__(self) -> _RelayThread:
        self.thread.start()
        self.ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)
        self.loop.close()


def _at() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


def latency(redis_url: str, dsn: str, seconds: float) -> dict[str, Any]:
    n = int(RATE * seconds)
    committed: dict[str, float] = {}
    with psycopg.connect(dsn) as conn, _RelayThread(redis_url, dsn) as relay:
        time.sleep(0.5)  # the listener is up
        start = time.perf_counter()
        for i in range(n):
            due = start + i / RATE
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            with conn.transaction():
                outbox.schedule(conn, _at(), common.PAYLOAD, key=f"lat-{i}", namespace=NS)
            committed[f"lat-{i}"] = time.perf_counter()
        deadline = time.monotonic() + 30
        while len(relay.scheduled) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        ms = [(relay.scheduled[k] - t) * 1000 for k, t in committed.items() if k in relay.scheduled]
    direct = []
    with Client.from_url(redis_url, namespace=NS + "-direct").connect() as c:
        start = time.perf_counter()
        for i in range(n):
            pause = start + i / RATE - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            t = time.perf_counter()
            c.schedule(_at(), common.PAYLOAD, key=f"lat-{i}")
            direct.append((time.perf_counter() - t) * 1000)
    return {"rate_rows_per_s": RATE, "rows": n, "moved": len(ms),
            "outbox_commit_to_scheduled_ms": common.percentiles(ms),
            "client_schedule_call_ms": common.percentiles(direct)}


def throughput(redis_url: str, dsn: str, n: int) -> dict[str, Any]:
    with psycopg.connect(dsn) as conn:
        t = time.perf_counter()
        with conn.transaction(), conn.pipeline():
            for i in range(n):
                outbox.schedule(conn, _at(), common.PAYLOAD, key=f"tp-{i}", namespace=NS)
        fill_s = time.perf_counter() - t

    async def drain() -> tuple[int, float]:
        async with AsyncClient.from_url(redis_url, namespace=NS) as client:
            relay = Relay(client, dsn, namespace=NS, table=outbox.DEFAULT_TABLE, batch=BATCH)
            t = time.perf_counter()
            moved = await relay.drain()
            took = time.perf_counter() - t
            await relay.close()
            return moved, took

    moved, took = asyncio.run(drain())
    with Client.from_url(redis_url, namespace=NS + "-many").connect() as c:
        jobs = [(_at(), common.PAYLOAD, f"tp-{i}") for i in range(n)]
        t = time.perf_counter()
        for s in range(0, n, BATCH):
            c.schedule_many(jobs[s:s + BATCH])
        direct_s = time.perf_counter() - t
    return {"rows": n, "batch": BATCH, "moved": moved, "producer_fill_rows_per_s": round(n / fill_s),
            "relay_rows_per_s": round(moved / took), "client_schedule_many_jobs_per_s": round(n / direct_s)}


def run(quick: bool) -> dict[str, Any]:
    """The suite (see the module docstring)."""
    with PostgresServer() as pg, common.redis_server() as redis_srv:
        with psycopg.connect(pg.conninfo, autocommit=True) as conn:
            conn.execute(outbox.ddl())
        return {"suite": "outbox", "machine": common.machine(), "postgres": "fsync on (defaults)",
                "latency": latency(redis_srv.url, pg.conninfo, 3.0 if quick else 10.0),
                "throughput": throughput(redis_srv.url, pg.conninfo, 20_000 if quick else 100_000)}


if __name__ == "__main__":
    import sys
    common.emit(run("--quick" in sys.argv))
