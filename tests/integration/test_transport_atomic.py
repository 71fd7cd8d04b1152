"""``AsyncScriptTransport.call_many(atomic=True)`` on a real redis-server (the replica's tick batches,
scheduler/tier/coalesce.py): the calls run in one MULTI/EXEC, so a client blocked on the keys they
write is served once, after the last of them; a server busy with a script refuses the whole
transaction, which then runs once the server is free, each call once."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from redis import Redis

from scheduler.protocol.calls import Calls
from scheduler.protocol.keys import Keyspace
from scheduler.redisio.transport import RedisRetry
from scheduler.redisio.transport_async import AsyncScriptTransport
from tests.support.servers import RedisServer
from tests.support.waits import wait_for

NS = "atomic"
PARTS = 8


def calls_for(ks: Keyspace) -> Calls:
    return Calls(ks, max_payload_bytes=1 << 20, tombstone_ttl=60.0)


async def wait_blocked(sync: Redis, n: int) -> None:
    await wait_for(lambda: int(sync.info("clients")["blocked_clients"]) == n, 5, what=f"{n} blocked clients")


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic", "pipelined"])
async def test_a_client_blocked_on_the_burst_bell_is_served_after_the_last_call_of_an_atomic_batch(
        redis_url: str, atomic: bool) -> None:
    """``resume`` on every partition rings the queue's burst bell once per partition. A client
    waiting in ``BZMPOP ... COUNT 8`` gets all 8 rings when the calls ran as one transaction, and
    only the first when they were pipelined (Redis serves blocked clients after each command):
    the difference between one worker woken per tick step and one per partition."""
    ks = Keyspace(NS, PARTS)
    redis = aioredis.Redis.from_url(redis_url)
    waiter = aioredis.Redis.from_url(redis_url)
    sync = Redis.from_url(redis_url)
    transport = AsyncScriptTransport(redis)
    try:
        wait = asyncio.create_task(waiter.execute_command("BZMPOP", 5, 1, ks.burst_bell("q"), "MIN", "COUNT", PARTS))
        await wait_blocked(sync, 1)
        replies = await transport.call_many(calls_for(ks).resume_calls("q"), atomic=atomic)
        assert replies == [0] * PARTS  # nothing was paused; each still rang
        key, rings = await asyncio.wait_for(wait, 5)
        assert key == ks.burst_bell("q").encode()
        assert len(rings) == (PARTS if atomic else 1)
        assert sync.zcard(ks.burst_bell("q")) == (0 if atomic else PARTS - 1)
    finally:
        await transport.close()
        await redis.aclose()
        await waiter.aclose()
        sync.close()


async def test_an_atomic_batch_refused_busy_runs_once_the_script_ends_each_call_once(fresh_redis: RedisServer) -> None:
    """A script holding the server past ``busy-reply-threshold`` makes Redis answer ``BUSY`` to
    MULTI, to every queued call and to EXEC: nothing ran, so the transport waits and sends the
    transaction again; each call then runs once (``pause`` answers 1 the first time only)."""
    ks = Keyspace(NS, PARTS)
    redis = aioredis.Redis.from_url(fresh_redis.url)
    sync = Redis.from_url(fresh_redis.url)
    transport = AsyncScriptTransport(redis, RedisRetry(budget=10.0, attempts=200, base=0.02, cap=0.1))
    calls = calls_for(ks)
    try:
        await transport.call_many([calls.stats_call(0)])  # the connection and the scripts are there first
        with fresh_redis.stall(600, busy_after_ms=50) as stall:
            t0 = time.monotonic()
            await asyncio.sleep(0.15)  # past busy_after_ms: the server answers BUSY now
            replies = await transport.call_many(calls.pause_calls("q", 1_000), atomic=True)
        assert replies == [1] * PARTS, "each partition paused once, by one run of the transaction"
        assert time.monotonic() - t0 >= stall.ms / 1000 - 0.2, "it ran only after the script ended"
        assert await transport.call_many(calls.pause_calls("q", 1_000), atomic=True) == [0] * PARTS
    finally:
        await transport.close()
        await redis.aclose()
        sync.close()


async def test_atomic_calls_cannot_carry_a_command_after_them(redis_url: str) -> None:
    redis = aioredis.Redis.from_url(redis_url)
    transport = AsyncScriptTransport(redis)
    try:
        with pytest.raises(ValueError, match="atomic"):
            await transport.call_many(calls_for(Keyspace(NS, PARTS)).resume_calls("q"), atomic=True,
                                      then=("WAIT", 1, 0))
    finally:
        await transport.close()
        await redis.aclose()
