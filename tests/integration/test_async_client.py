"""AsyncClient against a real redis-server: the same behaviour as Client, as coroutines."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
import redis

from scheduler import AsyncClient, Client, ConfigError, JobState, Outcome
from scheduler.protocol.transitions import claim_call
from scheduler.testing.transitions import Ops
from tests.support.helpers import snapshot


async def test_async_client_full_cycle(redis_url: str) -> None:
    async with AsyncClient.from_url(redis_url, namespace="a", partitions=4) as c:
        jid = await c.schedule(timedelta(minutes=5), {"n": 1}, queue="emails")
        assert (await c.get(jid)).state is JobState.SCHEDULED
        assert await c.reschedule(jid, timedelta(0))
        assert (await c.get(jid)).state is JobState.READY
        ids = await c.schedule_many([(time.time() + 60, i) for i in range(100)], queue="bulk")
        assert len(set(ids)) == 100
        assert (await c.get(ids[42])).payload == 42
        assert await c.cancel(ids[0]) and not await c.cancel(ids[0])
        st = await c.stats()
        assert st["bulk"]["scheduled"] == 99 and st["emails"]["ready"] == 1
        same = await c.schedule(timedelta(0), 1, key="k")
        assert await c.schedule(timedelta(0), 2, key="k") == same
    sync = Client.from_url(redis_url, namespace="a")
    ops = Ops(sync)
    for j in ops.claim("emails"):
        ops.fail(j, kind="p")
    async with AsyncClient.from_url(redis_url, namespace="a") as c:
        [dead] = await c.dead(queue="emails")
        assert dead.id == jid
        assert await c.requeue(jid) and not await c.requeue(jid)
        assert (await c.get(jid)).state is JobState.READY
        assert await c.purge(jid) is Outcome.NOT_DEAD
    snapshot(redis.Redis.from_url(redis_url), sync)


async def test_async_client_refuses_partition_mismatch(redis_url: str) -> None:
    Client.from_url(redis_url, namespace="am", partitions=3).connect()
    c = AsyncClient.from_url(redis_url, namespace="am", partitions=4)
    with pytest.raises(ConfigError, match="has 3 partitions"):
        await c.schedule(timedelta(0), 1)
    await c.close()


async def test_async_client_crons_and_rate_limits(redis_url: str) -> None:
    async with AsyncClient.from_url(redis_url, namespace="acron", partitions=4) as c:
        pid = await c.add_cron("daily", "0 9 * * *", {"a": 1}, queue="q", tz="Europe/Berlin")
        [info] = await c.crons()
        assert (info.name, info.pending_id, info.payload) == ("daily", pid, {"a": 1})
        assert info.next_fire is not None and info.next_fire.astimezone(
            __import__("zoneinfo").ZoneInfo("Europe/Berlin")).hour == 9
        assert await c.remove_cron("daily") and await c.crons() == []
        await c.set_rate_limit("q", 10)
        assert await c.rate_limits() == {"q": (10.0, 2.5)}
        assert await c.clear_rate_limit("q") is Outcome.DONE and await c.rate_limits() == {}


async def test_async_client_pauses_and_resumes_queues_and_crons_like_the_sync_client(redis_url: str) -> None:
    from scheduler.protocol.replies import claim_paused

    sync = Client.from_url(redis_url, namespace="apause", partitions=2).connect()
    async with AsyncClient.from_url(redis_url, namespace="apause") as c:
        jid = await c.schedule(timedelta(0), {"n": 1}, queue="q", key="order-1")  # due now: ready
        assert await c.paused() == {}
        assert await c.pause("q") is Outcome.DONE
        assert await c.pause("q") is Outcome.UNCHANGED, "a second pause keeps the first"
        since = (await c.paused())["q"]
        assert sync.paused() == {"q": since}, "the sync client reads the same pause"
        p = c.calls.locate(jid)[1]
        reply = await c.transport.call(*claim_call(c.calls, p, "q", 10))
        assert claim_paused(reply) == int(since.timestamp() * 1000), "workers get nothing from a paused queue"
        assert await c.resume("q") is Outcome.DONE and await c.resume("q") is Outcome.UNCHANGED
        assert await c.paused() == {} and sync.paused() == {}
        assert sync.pause("q") is Outcome.DONE and await c.resume("q") is Outcome.DONE, "either client undoes the other"

        found = await c.get_by_key("order-1")
        assert found is not None and found.id == jid and found.state is JobState.READY
        assert await c.get_by_key("no-such-key") is None
        with pytest.raises(ValueError, match="key must be"):
            await c.get_by_key("")

        await c.add_cron("every-minute", "* * * * *", None, queue="q")
        assert await c.pause_cron("every-minute") is Outcome.DONE
        assert await c.pause_cron("every-minute") is Outcome.UNCHANGED
        [info] = await c.crons()
        assert info.paused is not None and info.pending_id is None
        assert await c.resume_cron("every-minute") is Outcome.DONE
        assert await c.resume_cron("every-minute") is Outcome.UNCHANGED
        [info] = await c.crons()
        assert info.paused is None and info.next_fire is not None and info.next_fire.timestamp() > time.time() - 1
        for act in (c.pause_cron, c.resume_cron, c.remove_cron):
            assert await act("nope") is Outcome.NO_CRON
    snapshot(redis.Redis.from_url(redis_url), sync)


async def test_async_client_lists_scheduled_jobs_in_a_run_at_range(redis_url: str) -> None:
    async with AsyncClient.from_url(redis_url, namespace="arange", partitions=4) as c:
        base = int(time.time()) + 86400
        ids = await c.schedule_many([(base + 60 * i, i) for i in range(30)], queue="q")
        got: list[str] = []
        cursor = None
        while True:
            page, cursor = await c.jobs(queue="q", state="scheduled", limit=4, cursor=cursor,
                                        run_at_from=base + 600, run_at_to=base + 60 * 19)
            got += [j.id for j in page]
            if cursor is None:
                break
        assert sorted(got) == sorted(ids[10:20])
        with pytest.raises(ValueError, match="only supported for scheduled"):
            await c.jobs(queue="q", state="ready", run_at_from=base)
