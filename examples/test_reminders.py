"""Tests of examples/reminders.py with zsched's test kit: no server, no sleeping.

Run them with ``pytest examples/`` (the ``zsched_stack`` fixture comes with zsched).
"""
from __future__ import annotations

import os
from datetime import timedelta

import fakeredis
import pytest
import reminders

from scheduler.client import outbox
from scheduler.testing import TestStack
from workers.effects import AlreadyApplied, fenced_write


@pytest.fixture(autouse=True)
def fresh_outbox():
    reminders.OUTBOX.clear()
    reminders.MAIL_SERVICE_UP[0] = True
    reminders.APP_REDIS = fakeredis.FakeRedis()  # the application's own Redis, in memory


def test_a_reminder_is_sent_a_day_after_sign_up(zsched_stack: TestStack) -> None:
    job_id = reminders.sign_up(zsched_stack.client, 1, "ada@example.com")
    assert reminders.sign_up(zsched_stack.client, 1, "ada@example.com") == job_id  # once per user
    zsched_stack.assert_scheduled("reminders", payload={"user": 1, "email": "ada@example.com"},
                                  at=timedelta(days=1))

    zsched_stack.advance(hours=23, worker=reminders.worker)
    assert reminders.OUTBOX == []
    zsched_stack.advance(hours=1, worker=reminders.worker)
    assert reminders.OUTBOX == [{"to": "ada@example.com", "job": job_id, "attempt": 1, "idempotency_key": job_id}]
    zsched_stack.assert_state(job_id, "done")
    assert reminders.APP_REDIS.get("app:reminders_sent:1") == b"1"


def test_the_sent_counter_is_fenced_a_repeat_of_the_job_counts_nothing(zsched_stack: TestStack) -> None:
    reminders.sign_up(zsched_stack.client, 4, "cy@example.com")
    report = zsched_stack.advance(days=1, worker=reminders.worker)
    job = report.runs[0].job
    with pytest.raises(AlreadyApplied):  # what a second run of the same job meets
        fenced_write(reminders.APP_REDIS, job, [("INCR", "app:reminders_sent:4")])
    assert reminders.APP_REDIS.get("app:reminders_sent:4") == b"1"


def test_a_reminder_waits_for_the_mail_service(zsched_stack: TestStack) -> None:
    reminders.sign_up(zsched_stack.client, 2, "bob@example.com")
    reminders.MAIL_SERVICE_UP[0] = False
    report = zsched_stack.advance(days=1, worker=reminders.worker)
    assert report.outcomes == ["retry"]
    reminders.MAIL_SERVICE_UP[0] = True
    assert zsched_stack.advance(minutes=10, worker=reminders.worker).outcomes == ["ok"]
    assert [m["attempt"] for m in reminders.OUTBOX] == [2]


def test_a_bad_address_is_dead_lettered(zsched_stack: TestStack) -> None:
    reminders.sign_up(zsched_stack.client, 3, "not-an-address")
    zsched_stack.advance(days=1, worker=reminders.worker)
    zsched_stack.assert_dead("reminders", error="not an e-mail address")
    assert reminders.OUTBOX == []


@pytest.mark.skipif(not os.environ.get("ZSCHED_TEST_POSTGRES_URL"),
                    reason="needs a PostgreSQL: set ZSCHED_TEST_POSTGRES_URL (zsched's own suite does)")
def test_a_reminder_written_with_the_user_exists_only_if_the_user_does() -> None:
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(os.environ["ZSCHED_TEST_POSTGRES_URL"]) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS users (id int PRIMARY KEY, email text)")
        conn.execute(outbox.ddl())
        conn.commit()
        with conn.transaction():
            reminders.sign_up_in_transaction(conn, 5, "dee@example.com")
        with pytest.raises(ZeroDivisionError), conn.transaction():
            reminders.sign_up_in_transaction(conn, 6, "eve@example.com")
            _ = 1 / 0  # the sign-up fails after the reminder was written: neither stays
        rows = conn.execute("SELECT key, queue FROM zsched_outbox ORDER BY id").fetchall()
        users = conn.execute("SELECT id FROM users ORDER BY id").fetchall()
    assert rows == [("reminder:5", "reminders")] and users == [(5,)]

