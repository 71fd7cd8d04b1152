"""Every call of the clients works as the first call after Redis restarted (SIGKILL, then a new
server on the same port): the pooled connections died with the old server, and a call that met
one sends again on a new one instead of failing (``_direct`` in both clients; the scripts go
through the transport, which always did). Until 2026-12-04 the asyncio client's plain-command calls
(settings, pause, crons, get_by_key) failed once there with "Connection closed by server". The
plain-command calls of both clients also wait out a Redis that refuses commands as not run
(``BUSY`` here; ``LOADING`` after a restart and ``READONLY`` after a failover alike), as scripts
did, instead of raising it."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis import Redis
from redis.exceptions import ResponseError

from scheduler.client import AsyncClient, Client
from scheduler.protocol.codes import Outcome
from tests.support.servers import RedisServer

NS = "restart"


def _calls(c: Any) -> list[tuple[str, Callable[[], Any]]]:
    """Each call, named, on client ``c`` (the same names on both clients)."""
    return [
        ("set_rate_limit", lambda: c.set_rate_limit("q", 5)),
        ("rate_limits", lambda: c.rate_limits()),
        ("clear_rate_limit", lambda: c.clear_rate_limit("q")),
        ("set_dead_retention", lambda: c.set_dead_retention(max_dead=10)),
        ("dead_retention", lambda: c.dead_retention()),
        ("set_queue_retirement", lambda: c.set_queue_retirement(3600)),
        ("queue_retirement", lambda: c.queue_retirement()),
        ("set_tombstone_ttl", lambda: c.set_tombstone_ttl(120)),
        ("tombstone_ttl", lambda: c.tombstone_ttl()),
        ("reload_settings", lambda: c.reload_settings()),
        ("pause", lambda: c.pause("q")),
        ("paused", lambda: c.paused()),
        ("resume", lambda: c.resume("q")),
        ("add_cron", lambda: c.add_cron("nightly", "0 3 * * *", "x", queue="q")),
        ("crons", lambda: c.crons()),
        ("pause_cron", lambda: c.pause_cron("nightly")),
        ("resume_cron", lambda: c.resume_cron("nightly")),
        ("schedule", lambda: c.schedule(time.time() + 3600, "x", key="k1")),
        ("get_by_key", lambda: c.get_by_key("k1")),
        ("stats", lambda: c.stats()),
    ]


def _expected(name: str, got: Any) -> None:
    """What each call returns on the namespace this test builds call by call."""
    checks: dict[str, Callable[[Any], bool]] = {
        "rate_limits": lambda r: r == {"q": (5.0, 1.25)},
        "clear_rate_limit": lambda r: r is Outcome.DONE,
        "dead_retention": lambda r: r == (10, None),
        "queue_retirement": lambda r: r == 3600.0,
        "tombstone_ttl": lambda r: r == 120.0,
        "pause": lambda r: r is Outcome.DONE,
        "paused": lambda r: list(r) == ["q"],
        "resume": lambda r: r is Outcome.DONE,
        "crons": lambda r: [c.name for c in r] == ["nightly"],
        "pause_cron": lambda r: r is Outcome.DONE,
        "resume_cron": lambda r: r is Outcome.DONE,
        "get_by_key": lambda r: r is not None and r.payload == "x",
    }
    assert checks.get(name, lambda r: True)(got), f"{name} returned {got!r}"


def _restart(srv: RedisServer) -> None:
    """SIGKILL, then a new server on the same port and dir: its AOF brings the data back."""
    srv.kill()
    srv.start()


async def test_every_asyncio_client_call_works_as_the_first_call_after_a_redis_restart(
        aof_redis: RedisServer) -> None:
    c = AsyncClient.from_url(aof_redis.url, namespace=NS, partitions=4)
    try:
        await c.connect()
        for name, call in _calls(c):
            await c.stats()  # the pool holds a connection from before the restart
            _restart(aof_redis)
            got = call()
            _expected(name, await got if isinstance(got, Awaitable) else got)
    finally:
        await c.close()


def test_every_blocking_client_call_works_as_the_first_call_after_a_redis_restart(aof_redis: RedisServer) -> None:
    c = Client.from_url(aof_redis.url, namespace=NS, partitions=4)
    try:
        c.connect()
        for name, call in _calls(c):
            c.stats()
            _restart(aof_redis)
            _expected(name, call())
    finally:
        c.close()


def _busy_replies(r: Redis) -> int:
    return int(r.info("errorstats").get("errorstat_BUSY", {}).get("count", 0))


@contextmanager
def _busy(srv: RedisServer) -> Iterator[Redis]:
    """Redis running a script that never ends, past ``busy-reply-threshold`` (100 ms): every other
    command is answered ``BUSY`` until the script is killed (``SCRIPT KILL``, by the caller)."""
    admin = Redis.from_url(srv.url)
    admin.config_set("busy-reply-threshold", 100)
    runner = Redis.from_url(srv.url)

    def endless() -> None:
        try:
            runner.eval("while true do end", 0)
        except ResponseError:
            pass  # killed

    t = threading.Thread(target=endless, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while True:  # wait until Redis refuses a command as BUSY
        try:
            Redis.from_url(srv.url).ping()
        except ResponseError:
            break
        assert time.monotonic() < deadline, "Redis never became BUSY"
        time.sleep(0.05)
    try:
        yield admin
    finally:
        try:
            admin.script_kill()
        except ResponseError:
            pass  # already killed
        t.join(10)
        runner.close()
        admin.close()


@pytest.mark.parametrize("kind", ["asyncio", "blocking"])
async def test_a_settings_call_waits_out_a_busy_redis_instead_of_failing(fresh_redis: RedisServer,
                                                                       kind: str) -> None:
    sync = Client.from_url(fresh_redis.url, namespace=NS, partitions=4).connect()
    aio = await AsyncClient.from_url(fresh_redis.url, namespace=NS, partitions=4).connect()
    try:
        sync.set_rate_limit("q", 5)
        with _busy(fresh_redis) as admin:
            call = asyncio.create_task(aio.rate_limits() if kind == "asyncio" else asyncio.to_thread(sync.rate_limits))
            await asyncio.sleep(0.5)  # refused as BUSY meanwhile, sent again after each backoff
            assert not call.done(), call
            admin.script_kill()
            assert await asyncio.wait_for(call, 10) == {"q": (5.0, 1.25)}
        with Redis.from_url(fresh_redis.url) as r:  # the call was refused: BUSY for our PING and for it
            assert _busy_replies(r) >= 2
    finally:
        sync.close()
        await aio.close()
