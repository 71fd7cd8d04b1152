"""What an idle worker sends Redis: its readiness rides on the bell waits it sends anyway (no PING
of its own while they are answered), and the listener renews its role inside the role check's one
round trip. 1 000 idle workers are what these round trips cost Redis, jobs or not."""
from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
from redis import Redis

from scheduler import Client
from scheduler.protocol.keys import Keyspace
from scheduler.shell.servers import RedisServer, free_port
from tests.support.helpers import http_get
from tests.support.waits import wait_for
from tests.support.workers import serving
from workers import Job, Worker
from workers.doorbell import LISTEN_CHECK_S, LISTEN_TTL_MS, Doorbell
from workers.health import ANSWER_FRESH_S


def calls(r: Redis, command: str) -> int:
    """How many ``command`` calls Redis served since the last CONFIG RESETSTAT."""
    stats = r.info("commandstats").get(f"cmdstat_{command}")
    return int(stats["calls"]) if stats else 0


async def test_an_idle_workers_readiness_rides_on_its_bell_waits_and_a_busy_one_pings(
        fresh_redis: RedisServer) -> None:
    port = free_port()
    gate = asyncio.Event()
    w = Worker.from_url(fresh_redis.url, namespace="upkeep", queues=["q"], concurrency=1, metrics_port=port,
                        shutdown_grace=2.0)

    @w.handler("q")
    async def handle(job: Job) -> None:
        await gate.wait()

    sync = Redis.from_url(fresh_redis.url)
    client = Client.from_url(fresh_redis.url, namespace="upkeep").connect()
    try:
        async with serving(w):
            await wait_for(lambda: http_get(port, "/readyz")[0] == 200, 10, what="the worker to be ready")
            # from the first bell wait's answer on (the start-up sweep's claims answered before it)
            await wait_for(lambda: calls(sync, "bzpopmin") >= 1, 3 * ANSWER_FRESH_S, what="a bell wait")
            sync.config_resetstat()
            # two bell waits answered (each blocks BELL_WAIT s): more than ANSWER_FRESH_S of readiness checks
            await wait_for(lambda: calls(sync, "bzpopmin") >= 2, 3 * ANSWER_FRESH_S, what="two bell waits")
            assert calls(sync, "ping") == 0, "an idle worker pinged although its bell waits were answered"
            assert http_get(port, "/readyz") == (200, "ok: Redis answers; claiming jobs of q\n")

            # its only slot busy, the worker sends no bell wait: the readiness check pings again
            client.schedule(timedelta(0), "hold", queue="q")
            await wait_for(lambda: w.stats.claimed == 1, 10, what="the job to hold the slot")
            sync.config_resetstat()
            await wait_for(lambda: calls(sync, "ping") >= 1, 3 * ANSWER_FRESH_S, what="a PING from the busy worker")
            assert http_get(port, "/readyz")[0] == 200
            gate.set()
    finally:
        gate.set()
        client.close()
        sync.close()


class Trips:
    """Counts an asyncio client's pipelined round trips (their sizes) and its direct PEXPIRE calls."""

    def __init__(self, redis: Any) -> None:
        self.pipelines: list[int] = []
        self.pexpires = 0
        pipeline, pexpire = redis.pipeline, redis.pexpire

        def counted_pipeline(*args: Any, **kwargs: Any) -> Any:
            pipe = pipeline(*args, **kwargs)
            execute = pipe.execute

            async def counted_execute(*a: Any, **k: Any) -> Any:
                self.pipelines.append(len(pipe.command_stack))
                return await execute(*a, **k)

            pipe.execute = counted_execute
            return pipe

        async def counted_pexpire(*args: Any, **kwargs: Any) -> Any:
            self.pexpires += 1
            return await pexpire(*args, **kwargs)

        redis.pipeline, redis.pexpire = counted_pipeline, counted_pexpire


async def test_a_listener_renews_its_role_in_the_checks_own_round_trip_and_gives_it_up_when_taken(
        redis_url: str) -> None:
    ks = Keyspace("renew", 16)
    redis = aioredis.Redis.from_url(redis_url)
    bell = Doorbell(redis, ks, ["q"], wait=0.1, one_listener=True)
    trips = Trips(redis)
    sync = Redis.from_url(redis_url)
    key = ks.listener(["q"])
    sync.delete(key)

    async def next_check() -> None:
        """Wait (taking nothing: no ring) until the bell checks its role again."""
        seen = len(trips.pipelines)
        for _ in range(int(LISTEN_CHECK_S / 0.1) + 20):
            assert await bell.take() is None
            if len(trips.pipelines) > seen:
                return
        raise AssertionError("no role check within its period")

    try:
        await next_check()
        assert bell.listening and sync.get(key) == bell.id, "the free role is taken"
        for _ in range(3):
            sync.pexpire(key, 1_000)  # shortened: only a renewal lengthens it again
            await next_check()
            assert bell.listening and sync.get(key) == bell.id
            assert sync.pttl(key) > LISTEN_TTL_MS - 1_000, "the role was not renewed"
        assert trips.pexpires == 0, "a renewal took a round trip of its own"
        assert trips.pipelines[1:] == [2, 2, 2], "SET NX GET and PEXPIRE in one round trip"

        sync.set(key, b"another-worker", px=1_000)  # ours expired while this one stalled; another took it
        await next_check()
        assert not bell.listening
        assert sync.get(key) == b"another-worker", "the other's role stays with it"
        assert trips.pexpires == 0
    finally:
        await bell.close()
        await redis.aclose()
        sync.close()
