"""Both clients refuse bad input clearly and before writing anything: a time out of range is a
ValueError whatever its size or type (never OverflowError), an unknown option keyword is a
TypeError that lists the valid ones. Every time-taking method, sync and async."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import redis

from scheduler import AsyncClient, Client

NEAR_MAX = timezone(timedelta(hours=-14))  # the far west: 9999-12-31 there is already year 10000 in UTC
NEAR_MIN = timezone(timedelta(hours=14))
OUT_OF_RANGE = [
    1e308, -1e308, 10**400, -(10**400), 10**20, 253402300800, -0.5,
    timedelta.max, timedelta.min, timedelta(days=3_000_000),
    datetime.max.replace(tzinfo=NEAR_MAX), datetime.min.replace(tzinfo=NEAR_MIN),
    datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC),
]
NOT_FINITE = [math.inf, -math.inf, math.nan]
NAIVE = [datetime.max, datetime.min, datetime(2030, 1, 1)]


def _bad_times() -> list[tuple[Any, str]]:
    return ([(at, "between 1970-01-01 and 9999-12-31 UTC") for at in OUT_OF_RANGE]
            + [(at, "finite number of epoch seconds") for at in NOT_FINITE]
            + [(at, "naive datetime") for at in NAIVE])


BAD_TIMES = _bad_times()
IDS = [repr(at)[:40] for at, _ in BAD_TIMES]
# each of these takes a time: (method name, how to call it with the time)
TIME_TAKERS: list[tuple[str, Callable[[Any, Any, str], Any]]] = [
    ("schedule", lambda c, at, jid: c.schedule(at, 1)),
    ("schedule_many", lambda c, at, jid: c.schedule_many([(time.time() + 60, 1), (at, 2)])),
    ("reschedule", lambda c, at, jid: c.reschedule(jid, at)),
    ("requeue", lambda c, at, jid: c.requeue(jid, at)),
    ("jobs(run_at_from)", lambda c, at, jid: c.jobs(queue="q", state="scheduled", run_at_from=at)),
    ("jobs(run_at_to)", lambda c, at, jid: c.jobs(queue="q", state="scheduled", run_at_to=at)),
]


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def test_the_edges_of_the_range_are_accepted(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="edges", partitions=2)
    last = c.get(c.schedule(datetime.max.replace(tzinfo=UTC), 1))
    first = c.get(c.schedule(datetime(1970, 1, 1, tzinfo=UTC), 1))
    assert last is not None and last.run_at == datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    assert first is not None and first.run_at == datetime(1970, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("at, says", BAD_TIMES, ids=IDS)
def test_a_time_out_of_range_is_a_value_error_in_every_sync_method(redis_url: str, r: redis.Redis,
                                                                   at: Any, says: str) -> None:
    c = Client.from_url(redis_url, namespace="range", partitions=2)
    jid = c.schedule(time.time() + 60, 0, queue="q")
    before = r.dbsize()
    for name, call in TIME_TAKERS:
        with pytest.raises(ValueError, match=says) as err:
            call(c, at, jid)
        assert not isinstance(err.value, OverflowError), name
    assert r.dbsize() == before, "nothing is written"


@pytest.mark.parametrize("at, says", BAD_TIMES, ids=IDS)
async def test_a_time_out_of_range_is_a_value_error_in_every_async_method(redis_url: str, r: redis.Redis,
                                                                          at: Any, says: str) -> None:
    async with AsyncClient.from_url(redis_url, namespace="range", partitions=2) as c:
        jid = await c.schedule(time.time() + 60, 0, queue="q")
        before = r.dbsize()
        for _name, call in TIME_TAKERS:
            with pytest.raises(ValueError, match=says):
                await call(c, at, jid)
        assert r.dbsize() == before, "nothing is written"


UNKNOWN = "unknown job option 'grace' \\(did you mean 'misfire_grace'\\?\\); the job options are queue, " \
          "max_attempts, lease, misfire, misfire_grace, backoff, jitter"
OPTION_TAKERS: list[tuple[str, Callable[..., Any]]] = [
    ("schedule", lambda c, **kw: c.schedule(timedelta(0), 1, **kw)),
    ("schedule_many", lambda c, **kw: c.schedule_many([(timedelta(0), 1)], **kw)),
    ("add_cron", lambda c, **kw: c.add_cron("nightly", "0 3 * * *", **kw)),
]


def test_an_unknown_option_keyword_is_a_type_error_listing_the_options(redis_url: str, r: redis.Redis) -> None:
    c = Client.from_url(redis_url, namespace="opts", partitions=2).connect()
    before = r.dbsize()
    for _name, call in OPTION_TAKERS:
        with pytest.raises(TypeError, match=UNKNOWN):
            call(c, grace=1)
        with pytest.raises(TypeError, match="unknown job options 'queu', 'retries' \\(did you mean 'queue'\\?\\)"):
            call(c, queu="x", retries=3)
        with pytest.raises(TypeError, match="unknown job option 'lease_ms'"):
            call(c, lease_ms=5, backoff=[1, 2])  # an unhashable value takes the uncached path
    assert r.dbsize() == before, "nothing is written"


async def test_an_unknown_option_keyword_is_a_type_error_listing_the_options_async(redis_url: str,
                                                                                  r: redis.Redis) -> None:
    async with AsyncClient.from_url(redis_url, namespace="opts", partitions=2) as c:
        before = r.dbsize()
        for _name, call in OPTION_TAKERS:
            with pytest.raises(TypeError, match=UNKNOWN):
                await call(c, grace=1)
        assert r.dbsize() == before


def test_a_batch_entry_that_is_not_a_tuple_is_refused_by_position(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="batch", partitions=2)
    with pytest.raises(TypeError, match=r"job 1: expected an \(at, payload\) or \(at, payload, key\) tuple, got int"):
        c.schedule_many([(timedelta(0), 1), 5])
    with pytest.raises(TypeError, match="job 0: .* got str"):
        c.schedule_many(["ab"])
