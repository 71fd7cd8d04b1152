"""The PostgreSQL outbox (scheduler.client.outbox) and its relay, against a real PostgreSQL and a
real Redis: a job exists if and only if the producer's transaction commits; bad input is refused
before anything is written; ``zsched relay`` is woken by NOTIFY and stops cleanly."""
from __future__ import annotations

import asyncio
import dataclasses
import signal
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from scheduler import AsyncClient, Client, PayloadError
from scheduler.client import outbox
from scheduler.protocol.masking import mask_secrets
from scheduler.shell.relay import Relay, RelayMetrics
from scheduler.shell.servers import ZschedProc
from scheduler.testing.transitions import Ops
from tests.support.waits import wait_until

NS = "obx"
AT = datetime(2031, 5, 4, 3, 2, 1, 123000, tzinfo=UTC)


@pytest.fixture
def dsn(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(outbox.ddl())
    return pg_dsn


def _rows(dsn: str, where: str = "TRUE") -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT id, key, error FROM zsched_outbox WHERE {where} ORDER BY id").fetchall()


async def _drain(redis_url: str, dsn: str, **kw: object) -> Relay:
    async with AsyncClient.from_url(redis_url, namespace=NS) as client:
        relay = Relay(client, dsn, namespace=NS, table="zsched_outbox", **kw)  # type: ignore[arg-type]
        await relay.drain()
        await relay.close()
        return relay


def drain(redis_url: str, dsn: str, **kw: object) -> Relay:
    return asyncio.run(_drain(redis_url, dsn, **kw))


def test_a_rolled_back_transaction_schedules_nothing(redis_url: str, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("CREATE TABLE orders (id int)")
            outbox.schedule(conn, AT, {"order": 1}, key="order-1", namespace=NS, queue="mail")
            raise RuntimeError("the producer's own failure")
    assert drain(redis_url, dsn).moved == 0
    with Client.from_url(redis_url, namespace=NS).connect() as c:
        assert c.get_by_key("order-1") is None and c.stats() == {}


def test_a_committed_transaction_makes_exactly_one_job_with_its_queue_time_payload_and_key(
        redis_url: str, dsn: str) -> None:
    with psycopg.connect(dsn) as conn, conn.transaction():
        keyed = outbox.schedule(conn, AT, {"order": 7, "b": b"\x00"}, key="order-7", namespace=NS, queue="mail",
                                max_attempts=3, misfire="skip", misfire_grace=30)
        plain = outbox.schedule(conn, timedelta(hours=2), [1, 2], namespace=NS)
        before = time.time()
    relay = drain(redis_url, dsn)
    assert relay.moved == 2 and _rows(dsn) == [], "moved rows are deleted in the batch's transaction"
    with Client.from_url(redis_url, namespace=NS).connect() as c:
        job = c.get_by_key("order-7")
        assert job is not None and job.queue == "mail" and job.run_at == AT
        assert job.payload == {"order": 7, "b": b"\x00"}
        assert job.max_attempts == 3
        other = c.get_by_key(f"outbox:zsched_outbox:{plain}")
        assert other is not None and other.queue == "default" and other.payload == [1, 2]
        assert other.run_at is not None and abs(other.run_at.timestamp() - (before + 7200)) < 5
        assert c.stats()["mail"]["scheduled"] == 1 and c.stats()["default"]["scheduled"] == 1
    assert keyed < plain


def crash_after_schedule(redis_url: str, dsn: str) -> None:
    """A relay's batch is scheduled, then its transaction fails: as if it was killed before COMMIT."""
    async def run() -> None:
        async with AsyncClient.from_url(redis_url, namespace=NS) as client:
            relay = Relay(client, dsn, namespace=NS, table="zsched_outbox")
            relay.st = dataclasses.replace(relay.st, delete="SELECT 1 / 0 WHERE %s IS NOT NULL")
            with pytest.raises(psycopg.errors.DivisionByZero):
                await relay.drain()
            await relay.close()

    asyncio.run(run())


def test_a_relay_that_dies_before_its_commit_leaves_rows_whose_resend_makes_no_second_job(
        redis_url: str, dsn: str) -> None:
    with psycopg.connect(dsn) as conn, conn.transaction():
        for n in range(5):
            outbox.schedule(conn, AT, {"n": n}, namespace=NS, queue="q", key=None if n % 2 else f"k{n}")

    crash_after_schedule(redis_url, dsn)
    assert len(_rows(dsn)) == 5, "the rows stay for the next relay"
    assert drain(redis_url, dsn).moved == 5 and _rows(dsn) == []
    with Client.from_url(redis_url, namespace=NS).connect() as c:
        assert c.stats()["q"]["scheduled"] == 5, "the re-sent rows made no second job"


def test_a_resend_after_the_jobs_already_ran_makes_no_second_job(redis_url: str, dsn: str) -> None:
    """The window the ids derived from rows close: the relay dies before its COMMIT, the jobs (due
    now) run and finish meanwhile, then the next relay sends the rows again."""
    now = datetime.now(UTC)
    with psycopg.connect(dsn) as conn, conn.transaction():
        for n in range(4):
            outbox.schedule(conn, now, {"n": n}, namespace=NS, queue="q", key=None if n % 2 else f"k{n}")

    crash_after_schedule(redis_url, dsn)
    with Client.from_url(redis_url, namespace=NS).connect() as c:
        ops = Ops(c)
        jobs = ops.claim("q", 10)
        assert len(jobs) == 4
        for job in jobs:
            ops.ack(job)
        assert drain(redis_url, dsn).moved == 4 and _rows(dsn) == []
        left = c.stats()["q"]
        assert left.get("ready", 0) + left.get("scheduled", 0) + left.get("running", 0) == 0, \
            "the re-sent rows found the finished jobs' tombstones and made no second job"


@pytest.mark.parametrize("call, error, message", [
    (lambda c: outbox.schedule(c, datetime(2031, 1, 1), 1, namespace=NS), ValueError, "naive datetime"),
    (lambda c: outbox.schedule(c, 30, 1, namespace=NS), ValueError, "likely durations"),
    (lambda c: outbox.schedule(c, AT, "x" * 600_000, namespace=NS), PayloadError, "over the limit"),
    (lambda c: outbox.schedule(c, AT, 1, namespace=NS, max_attempts=0), ValueError, "max_attempts"),
    (lambda c: outbox.schedule(c, AT, 1, namespace=NS, lease_s=3), TypeError, "did you mean 'lease'"),
    (lambda c: outbox.schedule(c, AT, 1, namespace=NS, key="outbox:x"), ValueError, "reserved"),
    (lambda c: outbox.schedule(c, AT, 1, namespace=NS, table="Bad-Name"), outbox.OutboxError, "not 'name'"),
], ids=["naive-at", "at-as-duration", "payload-too-large", "bad-option", "unknown-option", "reserved-key",
        "bad-table-name"])
def test_bad_input_is_refused_as_client_schedule_refuses_it_and_nothing_is_written(
        dsn: str, call: object, error: type[Exception], message: str) -> None:
    with psycopg.connect(dsn) as conn:
        with conn.transaction():
            with pytest.raises(error, match=message):
                call(conn)  # type: ignore[operator]
            assert conn.info.transaction_status != psycopg.pq.TransactionStatus.INERROR
    assert _rows(dsn) == []


def test_an_autocommit_connection_outside_a_transaction_is_refused_and_nothing_is_written(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(outbox.OutboxError, match=r"autocommit mode outside one.*conn\.transaction\(\)"):
            outbox.schedule(conn, AT, 1, namespace=NS)
        with conn.transaction():  # the same connection inside a transaction block is fine
            outbox.schedule(conn, AT, 1, namespace=NS)
    assert len(_rows(dsn)) == 1


def test_a_missing_table_is_one_clear_error_and_nothing_is_written(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        with pytest.raises(outbox.OutboxTableMissing) as err:
            outbox.schedule(conn, AT, 1, namespace=NS, table="nope")
        assert "\n" not in str(err.value) and "zsched outbox apply" in str(err.value)
        conn.rollback()


def test_the_async_variant_writes_in_the_callers_transaction(redis_url: str, dsn: str) -> None:
    async def produce() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            async with conn.transaction():
                await outbox.schedule_async(conn, AT, {"a": 1}, key="async-1", namespace=NS, queue="aq")
            with pytest.raises(RuntimeError):
                async with conn.transaction():
                    await outbox.schedule_async(conn, AT, {"a": 2}, key="async-2", namespace=NS, queue="aq")
                    raise RuntimeError("rolled back")
            await conn.set_autocommit(True)
            with pytest.raises(outbox.OutboxError, match="autocommit"):
                await outbox.schedule_async(conn, AT, 3, namespace=NS)

    asyncio.run(produce())
    drain(redis_url, dsn)
    with Client.from_url(redis_url, namespace=NS).connect() as c:
        assert c.get_by_key("async-1") is not None and c.get_by_key("async-2") is None


def test_a_row_zsched_refuses_is_left_with_its_error_and_the_others_move(redis_url: str, dsn: str) -> None:
    with psycopg.connect(dsn) as conn, conn.transaction():
        outbox.schedule(conn, AT, 1, namespace=NS, key="good-1")
        conn.execute("INSERT INTO zsched_outbox (namespace, queue, run_at_ms, payload, key, options) "
                     "VALUES (%s, 'q', 1, '\\x01', 'bad-opts', '{\"max_attempts\": 0}')", (NS,))
        conn.execute("INSERT INTO zsched_outbox (namespace, queue, run_at_ms, payload, key) "
                     "VALUES (%s, 'default', 1, '\\xc1', 'bad-payload')", (NS,))
        outbox.schedule(conn, AT, 2, namespace=NS, key="good-2")
    metrics = RelayMetrics(NS, "zsched_outbox")
    relay = drain(redis_url, dsn, metrics=metrics)
    assert relay.moved == 4 and relay.rejected == 2
    left = _rows(dsn)
    assert [(k, "max_attempts" in e if k == "bad-opts" else "not valid msgpack" in e) for _i, k, e in left] == \
        [("bad-opts", True), ("bad-payload", True)]
    assert drain(redis_url, dsn).moved == 0, "a refused row is not tried again"
    with Client.from_url(redis_url, namespace=NS).connect() as c:
        assert c.get_by_key("good-1") is not None and c.get_by_key("good-2") is not None
    assert metrics.registry.get_sample_value("zsched_outbox_rows_moved_total",
                                             {"namespace": NS, "table": "zsched_outbox", "outcome": "rejected"}) == 2


def test_zsched_outbox_apply_and_a_relay_woken_by_notify_that_stops_on_sigterm(redis_url: str, pg_dsn: str) -> None:
    env = {"ZSCHED_POSTGRES_URL": pg_dsn}
    applied = ZschedProc(["outbox", "apply"], env=env, metrics=False).start()
    assert applied.wait(30) == 0 and "outbox table zsched_outbox ready" in applied.output()
    # --poll 1h: only the notification can wake it in time
    relay = ZschedProc(["relay", "--redis", redis_url, "--namespace", NS, "--poll", "1h"], env=env).start()
    try:
        wait_until(lambda: "relay moving rows" in relay.output(), 30, 0.05, relay.tail)
        wait_until(lambda: relay.try_metric("zsched_outbox_rows_waiting") == 0, 30, 0.05, relay.tail)
        with psycopg.connect(pg_dsn) as conn, conn.transaction():
            outbox.schedule(conn, AT, {"x": 1}, key="notified", namespace=NS)
        committed = time.monotonic()
        with Client.from_url(redis_url, namespace=NS).connect() as c:
            wait_until(lambda: c.get_by_key("notified") is not None, 10, 0.01, relay.tail)
        assert time.monotonic() - committed < 5, "woken by the notification, not by the poll"
        # counted once its DELETE committed, which follows the schedule call the job came from
        wait_until(lambda: relay.try_metric("zsched_outbox_rows_moved_total", outcome="scheduled") == 1, 10, 0.01,
                   relay.tail)
        relay.signal(signal.SIGTERM)
        assert relay.wait(10) == 0, relay.tail()
        out = relay.output()
        assert "relay stopped: moved 1 row(s)" in out and "Traceback" not in out
        assert pg_dsn not in out or mask_secrets(pg_dsn) == pg_dsn
    finally:
        relay.stop()


def test_the_relay_refuses_a_missing_table_with_one_line_and_exit_1(redis_url: str, pg_dsn: str) -> None:
    proc = ZschedProc(["relay", "--redis", redis_url, "--namespace", NS, "--postgres", pg_dsn], metrics=False).start()
    assert proc.wait(30) == 1, proc.tail()
    lines = proc.output().strip().splitlines()
    assert lines[-1].startswith("zsched: error: the outbox table zsched_outbox does not exist") and \
        "zsched outbox apply" in lines[-1], lines
    assert "Traceback" not in proc.output()
