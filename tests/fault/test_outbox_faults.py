"""The outbox under faults: 10 000 rows committed by 4 concurrent producers arrive in zsched exactly
once each while 2 relays run, one of them is killed with SIGKILL while the table still holds rows,
and PostgreSQL is killed and restarted once. Commit-to-scheduled latency is printed (the surviving
relay's histogram), not asserted."""
from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from scheduler import Client
from scheduler.client import outbox
from scheduler.metrics import bucket_quantile, scrape_histogram
from scheduler.shell.servers import ZschedProc
from scheduler.shell.servers.postgres import PostgresServer
from tests.support.waits import wait_until

pytestmark = pytest.mark.fault

ROWS = 10_000
PRODUCERS = 4
PER_TX = 10  # rows per producer transaction
NS = "obxf"


def _produce(dsn: str, p: int, done: list[int], errors: list[str]) -> None:
    """Commit this producer's rows PER_TX at a time; a transaction that fails (PostgreSQL down) is
    tried again with the same keys, so a commit whose reply was lost at most doubles a row."""
    at = datetime.now(UTC) + timedelta(hours=1)  # stays scheduled: every job is counted
    n = 0
    conn: psycopg.Connection[tuple[object, ...]] | None = None
    deadline = time.monotonic() + 120
    while n < ROWS // PRODUCERS:
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(dsn, connect_timeout=5)
            with conn.transaction():
                for i in range(n, n + PER_TX):
                    outbox.schedule(conn, at, {"p": p, "i": i}, key=f"p{p}-{i}", namespace=NS, queue="q")
            n += PER_TX
            done[p] = n
            time.sleep(0.002)  # a few seconds in all: the faults land while rows flow
        except psycopg.OperationalError:
            if conn is not None:
                conn.close()
            conn = None
            if time.monotonic() > deadline:
                errors.append(f"producer {p}: PostgreSQL not back")
                return
            time.sleep(0.05)
    if conn is not None:
        conn.close()


def _waiting(dsn: str) -> int:
    try:
        with psycopg.connect(dsn, connect_timeout=5) as conn:
            row = conn.execute("SELECT count(*) FROM zsched_outbox").fetchone()
            return int(row[0]) if row else 0
    except psycopg.OperationalError:
        return -1


def test_committed_rows_arrive_exactly_once_through_a_relay_kill_and_a_postgres_restart(
        aof_redis: object, pg_server: PostgresServer, pg_dsn: str) -> None:
    redis_url = aof_redis.url  # type: ignore[attr-defined]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(outbox.ddl())
    env = {"ZSCHED_POSTGRES_URL": pg_dsn}
    relays = [ZschedProc(["relay", "--redis", redis_url, "--namespace", NS, "--batch", "200", "--poll", "1s"],
                         env=env).start() for _ in range(2)]
    done = [0] * PRODUCERS
    errors: list[str] = []
    producers = [threading.Thread(target=_produce, args=(pg_dsn, p, done, errors)) for p in range(PRODUCERS)]
    started = time.monotonic()
    try:
        for r in relays:
            wait_until(lambda r=r: "relay moving rows" in r.output(), 30, 0.05, r.tail)
        for t in producers:
            t.start()
        # SIGKILL one relay once it has moved rows and the table still holds some
        wait_until(lambda: sum(done) >= ROWS // 4 and (relays[0].try_metric("zsched_outbox_rows_moved_total")
                                                       or 0) > 0, 60, 0.01, relays[0].tail)
        wait_until(lambda: _waiting(pg_dsn) > 0, 30, 0.005, "rows in the outbox at the kill")
        os.kill(relays[0].pid, signal.SIGKILL)
        relays[0].wait(10)
        # crash PostgreSQL while the producers and the other relay run, then start it again
        wait_until(lambda: sum(done) >= ROWS // 2, 60, 0.01, "half the rows committed")
        pg_server.kill9()
        pg_server.restart()
        for t in producers:
            t.join(120)
        assert not errors, errors
        assert sum(done) == ROWS
        wait_until(lambda: _waiting(pg_dsn) == 0, 60, 0.05, relays[1].tail)
        took = time.monotonic() - started
        with Client.from_url(redis_url, namespace=NS).connect() as c:
            keys: Counter[str] = Counter()
            cursor: str | None = None
            while True:
                page, cursor = c.jobs(queue="q", state="scheduled", limit=1000, cursor=cursor)
                keys.update(j.key for j in page if j.key)
                if cursor is None:
                    break
            assert c.stats()["q"]["scheduled"] == ROWS
        expected = {f"p{p}-{i}" for p in range(PRODUCERS) for i in range(ROWS // PRODUCERS)}
        assert set(keys) == expected and max(keys.values()) == 1, "every committed row made exactly one job"
        out = relays[1].output()
        assert "relay: PostgreSQL at" in out and "reachable again" in out, relays[1].tail()
        assert "Traceback" not in out, relays[1].tail()
        buckets = sorted(scrape_histogram(relays[1].metrics_port, "zsched_outbox_delay_seconds").items())
        p50, p99 = bucket_quantile(buckets, 0.5), bucket_quantile(buckets, 0.99)
        print(f"\noutbox fault run: {ROWS} rows in {took:.1f}s; insert-to-scheduled by the surviving relay "
              f"(histogram buckets): p50 {p50:.3f}s, p99 {p99:.3f}s")
        assert relays[1].term() == 0, relays[1].tail()
    finally:
        for r in relays:
            r.stop()
        if not pg_server.running:  # the session's server, for the tests after this one
            pg_server.restart()
