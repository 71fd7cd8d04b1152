"""``jobs()`` (the console's job lists and ``zsched job list``) in one order across partitions,
against a real redis-server: scheduled jobs by run_at (held jobs first), running by lease
deadline, dead by time of death, ties by id; every page in order and every job listed once,
whatever the page size."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from scheduler import AsyncClient, Client
from scheduler.protocol.tick import NO_RETENTION, tick_call
from scheduler.testing.transitions import Ops
from tests.support.ui import namespace_client
from tests.support.waits import wait_until_time

NS = "listorder"


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    yield from namespace_client(redis_url, NS, partitions=4)


def ms(dt: datetime | None) -> int:
    assert dt is not None
    return int(dt.timestamp() * 1000)


def listing(client: Client, limit: int, **kw: Any) -> list[list[Any]]:
    pages, cursor = [], None
    for _ in range(1000):
        page, cursor = client.jobs(limit=limit, cursor=cursor, **kw)
        pages.append(page)
        if cursor is None:
            return pages
    raise AssertionError("paging never ended")


def test_scheduled_jobs_are_listed_by_run_at_across_partitions_held_ones_first(client: Client) -> None:
    ops = Ops(client)
    now = time.time()
    held = client.schedule_many([(now + 0.05 + i * 0.001, i) for i in range(6)], queue="o")
    wait_until_time(now + 0.1)
    for p in range(4):  # due, and no rate token for 'o': held, listed before the timers
        ops.send(tick_call(ops.calls, p, 0, 1000, {"o": 0}, NO_RETENTION))
    base = float(int(now) + 3600)  # whole seconds: run_at is kept to the ms
    timers = client.schedule_many([(base + (i % 15), i) for i in range(60)], queue="o")  # 4 jobs per second
    client.schedule_many([(base + 0.5 + i, i) for i in range(30)], queue="other")
    parts = {client.calls.locate(j)[1] for j in timers}
    assert len(parts) == 4, "the jobs are spread over the partitions"
    expected = sorted(held, key=lambda j: (ms(client.get(j).run_at), bytes.fromhex(j)))  # type: ignore[union-attr]
    expected += sorted(timers, key=lambda j: (ms(client.get(j).run_at), bytes.fromhex(j)))  # type: ignore[union-attr]
    for limit in (1, 4, 7, 100):
        pages = listing(client, limit, queue="o", state="scheduled")
        assert all(len(p) == limit for p in pages[:-1]), [len(p) for p in pages]
        assert [j.id for p in pages for j in p] == expected, f"limit {limit}"
    # a run_at range: the same order, within it
    inside = [j for j in timers if base + 3 <= client.get(j).run_at.timestamp() <= base + 5]  # type: ignore[union-attr]
    pages = listing(client, 5, queue="o", state="scheduled", run_at_from=base + 3, run_at_to=base + 5)
    assert [j.id for p in pages for j in p] == [j for j in expected if j in inside] and len(inside) == 12


def test_running_by_lease_deadline_and_dead_by_death_across_partitions(client: Client) -> None:
    ops = Ops(client)
    client.schedule_many([(timedelta(0), i) for i in range(24)], queue="w")
    claimed = []
    for _ in range(6):  # claims at different times: leases end in that order
        claimed += ops.claim("w", 4)
    assert len(claimed) == 24
    running = [j for p in listing(client, 5, queue="w", state="running") for j in p]
    order = [(ms(j.lease_deadline), bytes.fromhex(j.id)) for j in running]
    assert len(running) == 24 and order == sorted(order)
    assert len({client.calls.locate(j.id)[1] for j in running[:8]}) > 1, "partitions interleave"
    for j in claimed[:12]:
        ops.fail(j, kind="p")
    dead = [j for p in listing(client, 5, queue="w", state="dead") for j in p]
    order = [(ms(j.died_at), bytes.fromhex(j.id)) for j in dead]
    assert len(dead) == 12 and order == sorted(order), "oldest death first"


def test_the_async_client_lists_in_the_same_order(redis_url: str, client: Client) -> None:
    client.schedule_many([(time.time() + 600 + (i % 7), i) for i in range(20)], queue="a")
    want = [j.id for p in listing(client, 3, queue="a", state="scheduled") for j in p]

    async def run() -> list[str]:
        ac = await AsyncClient.from_url(redis_url, namespace=NS, partitions=4).connect()
        try:
            got, cursor = [], None
            while True:
                page, cursor = await ac.jobs(queue="a", state="scheduled", limit=3, cursor=cursor)
                got += [j.id for j in page]
                if cursor is None:
                    return got
        finally:
            await ac.close()

    assert asyncio.run(run()) == want and len(want) == 20
