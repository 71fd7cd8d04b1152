"""A job's time: ``schedule(30, p)`` meant "in 30 seconds" and ran at once (it is epoch seconds,
1970-01-01T00:00:30Z). Epoch seconds below 1e9 (before 2001-09-09) are refused wherever a job's time is given
(``schedule``, ``schedule_many``, ``reschedule``, ``requeue``, sync and asyncio, and the CLI's
``--at``), with the spelling that was probably meant; nothing is written. Datetimes of any year,
timedeltas (``timedelta(0)`` is now) and real epoch times stay accepted."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from scheduler import Client
from scheduler.protocol.timeutil import MIN_EPOCH_S, job_time_ms, to_ms
from scheduler.shell.admin.inputs import BadInput, parse_schedule_when
from scheduler.testing import TestStack

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def stack() -> Iterator[TestStack]:
    with TestStack(now=T0) as s:
        yield s


@pytest.mark.parametrize("at, says", [
    (30, r'pass timedelta\(seconds=30\) for "in 30 seconds"'),
    (0, r"pass timedelta\(0\) for now"),
    (1.5, r"1970-01-01T00:00:01Z"),
    (MIN_EPOCH_S - 1, r"2001-09-09T01:46:39Z"),
])
def test_a_small_number_for_a_jobs_time_is_refused_with_what_was_meant(stack: TestStack, at: float,
                                                                      says: str) -> None:
    client: Client = stack.client
    live = client.schedule(timedelta(hours=1), "live")
    dead_id = client.schedule(timedelta(0), "d", max_attempts=1)
    for call in (lambda: client.schedule(at, "p"),
                 lambda: client.schedule_many([(timedelta(0), "ok"), (at, "p")]),
                 lambda: client.reschedule(live, at),
                 lambda: client.requeue(dead_id, at)):
        with pytest.raises(ValueError, match=says):
            call()
    assert [j.id for j in stack.scheduled()] == [live], "nothing written, nothing moved"
    assert [j.id for j in stack.ready()] == [dead_id]


async def test_the_asyncio_client_refuses_them_too(stack: TestStack) -> None:
    client = await stack.async_client()
    live = await client.schedule(timedelta(hours=1), "live")
    with pytest.raises(ValueError, match="likely durations"):
        await client.schedule(30, "p")
    with pytest.raises(ValueError, match="likely durations"):
        await client.schedule_many([(60, "p")])
    with pytest.raises(ValueError, match="likely durations"):
        await client.reschedule(live, 10)
    assert [j.id for j in stack.scheduled()] == [live]


def test_datetimes_of_any_year_timedeltas_and_real_epoch_times_are_taken(stack: TestStack) -> None:
    client: Client = stack.client
    old = client.schedule(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), "explicitly old")
    now = client.schedule(timedelta(0), "now")
    epoch = client.schedule(T0.timestamp() + 60, "epoch")
    assert {j.id for j in stack.ready()} == {old, now}
    assert [j.id for j in stack.scheduled()] == [epoch]
    assert job_time_ms(MIN_EPOCH_S) == MIN_EPOCH_S * 1000
    assert to_ms(30, name="run_at_from") == 30_000, "listing ranges are times, not a job's time: any epoch"


@pytest.mark.parametrize("text, says", [("30", r"\+30s is 30 seconds from now"), ("0", r"1970-01-01T00:00:00Z")])
def test_the_cli_refuses_them_and_names_the_duration_form(text: str, says: str) -> None:
    with pytest.raises(BadInput, match=says):
        parse_schedule_when(text)
    assert parse_schedule_when("1767225600") == 1_767_225_600_000
    assert parse_schedule_when("+30s") == timedelta(seconds=30)
