"""An application that uses zsched: sign-up reminders.

``sign_up`` schedules a reminder e-mail a day later and, keyed by the user, never twice; the
worker's handler "sends" it (here: appends to ``OUTBOX``, with the job's idempotency headers a real
mail API would dedupe on), counts it in the application's own Redis with a fenced write (once per
job, however often the job runs: docs/effects.md), retries when the mail service is down and gives
up on bad addresses. ``sign_up_in_transaction`` is the same sign-up for an application that keeps
its users in PostgreSQL: the reminder is written in the transaction that adds the user (the outbox),
so it exists if and only if the user does; ``zsched relay`` moves it into zsched. ``python
examples/reminders.py`` schedules one against the dev stack (``./scripts/dev``, or
``ZSCHED_REDIS_URL``); ``pytest examples/`` tests it with no server (and its PostgreSQL part
against ``ZSCHED_TEST_POSTGRES_URL`` when set).
"""
from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import redis

from scheduler import Client
from scheduler.client import outbox
from workers import Job, PermanentError, Retry, Worker
from workers.effects import fenced_write, idempotency_headers

REDIS_URL = os.environ.get("ZSCHED_REDIS_URL", "redis://127.0.0.1:16379/0")  # the dev stack's

worker = Worker.from_url(REDIS_URL, namespace="zsched")
APP_REDIS = redis.Redis.from_url(os.environ.get("APP_REDIS_URL", REDIS_URL))  # the application's own data
OUTBOX: list[dict[str, Any]] = []   # stands in for the mail service
MAIL_SERVICE_UP = [True]


class MailServiceDown(Exception):
    pass


def sign_up(client: Client, user_id: int, email: str) -> str:
    """Schedule the reminder for a new user (once per user, however often this is called)."""
    return client.schedule(timedelta(days=1), {"user": user_id, "email": email}, queue="reminders",
                           key=f"reminder:{user_id}", max_attempts=4, backoff=(60, 3600))


def sign_up_in_transaction(conn: Any, user_id: int, email: str) -> int:
    """Add the user and schedule the reminder in the caller's open transaction (a psycopg
    connection inside ``with conn.transaction():``); returns the outbox row's id."""
    conn.execute("INSERT INTO users (id, email) VALUES (%s, %s)", (user_id, email))
    return outbox.schedule(conn, timedelta(days=1), {"user": user_id, "email": email}, queue="reminders",
                           namespace="zsched", key=f"reminder:{user_id}", max_attempts=4, backoff=(60, 3600))


@worker.handler("reminders")
def send_reminder(job: Job) -> None:
    email = job.payload["email"]
    if "@" not in email:
        raise PermanentError(f"not an e-mail address: {email!r}")
    if not MAIL_SERVICE_UP[0]:
        raise Retry(timedelta(minutes=10), "mail service down")
    OUTBOX.append({"to": email, "job": job.id, "attempt": job.attempt,
                   "idempotency_key": idempotency_headers(job)["Idempotency-Key"]})
    # counted once per job even if this attempt runs again (worker killed before its ack)
    fenced_write(APP_REDIS, job, [("INCR", f"app:reminders_sent:{job.payload['user']}")])


if __name__ == "__main__":
    with Client.from_url(REDIS_URL, namespace="zsched") as client:
        job_id = sign_up(client, 42, "someone@example.com")
        print(job_id, client.get(job_id))
