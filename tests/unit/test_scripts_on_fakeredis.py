"""The production Lua scripts run unchanged on fakeredis (with its Lua extra): the in-memory Redis
users test their own code against. Every behaviour here is also tested against a real
redis-server in tests/integration; these guard that nothing zsched sends needs a real server."""
from __future__ import annotations

from datetime import timedelta

import fakeredis
import pytest

from scheduler import Client, JobState


@pytest.fixture
def client() -> Client:
    return Client(fakeredis.FakeRedis(), namespace="fk", partitions=4)


def test_a_future_job_is_scheduled_and_read_back_with_its_payload(client: Client) -> None:
    jid = client.schedule(timedelta(hours=4), {"to": "a@example.com"}, queue="mail", key="welcome-1")
    info = client.get(jid)
    assert info is not None and info.state is JobState.SCHEDULED
    assert info.payload == {"to": "a@example.com"} and info.queue == "mail" and info.key == "welcome-1"
    assert client.schedule(timedelta(hours=4), {"to": "b"}, queue="mail", key="welcome-1") == jid, "idempotency key"
    assert client.stats()["mail"]["scheduled"] == 1


def test_a_due_job_goes_straight_to_ready_and_is_listed(client: Client) -> None:
    ids = client.schedule_many([(timedelta(0), i) for i in range(5)], queue="q")
    assert {client.get(j).state for j in ids} == {JobState.READY}  # type: ignore[union-attr]
    listed: list[str] = []
    cursor: str | None = None
    while True:
        page, cursor = client.jobs(queue="q", state="ready", limit=2, cursor=cursor)
        listed += [j.id for j in page]
        if cursor is None:
            break
    assert sorted(listed) == sorted(ids)


def test_cancel_removes_a_scheduled_job_once(client: Client) -> None:
    jid = client.schedule(timedelta(minutes=5), None)
    assert client.cancel(jid)
    assert not client.cancel(jid)
    info = client.get(jid)
    assert info is None or info.state is not JobState.SCHEDULED
    assert client.stats().get("default", {}).get("scheduled", 0) == 0
