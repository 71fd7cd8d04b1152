"""An idle worker's periodic chores ride on its bell waits (workers/turns.py "Riding"): the
registry refresh and the settings read go ahead of a wait, in its write, on the connection the
doorbell keeps (workers/kept.py), and make no round trip of their own; a ride that fails or is
refused falls back to the chore's own round trip."""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis import Redis
from redis.exceptions import ConnectionError, ResponseError

import workers.namespace
from scheduler import Client
from scheduler.protocol.keys import Keyspace
from scheduler.redisio.batch import is_noscript
from scheduler.shell.servers import free_port
from tests.support.waits import wait_for
from tests.support.workers import chore_worker, serving
from workers.kept import KeptConnection
from workers.namespace import config_of


@pytest.mark.parametrize("protocol", [2, 3])
async def test_commands_sent_ahead_of_a_wait_are_answered_before_it_blocks_and_the_connection_stays_in_step(
        redis_url: str, protocol: int) -> None:
    redis = aioredis.Redis.from_url(redis_url, protocol=protocol)
    kept = KeptConnection(redis.connection_pool)
    sync = Redis.from_url(redis_url)
    sync.hset("cfg", mapping={"tombstone_ttl_ms": "600000"})
    loop = asyncio.get_running_loop()
    first: asyncio.Future[list[Any] | None] = loop.create_future()
    second: asyncio.Future[list[Any] | None] = loop.create_future()
    wait: asyncio.Future[list[Any]] | None = None
    try:
        wait = asyncio.ensure_future(kept.exchange(
            "w", lambda: [("BZPOPMIN", "bell", 0.5)], 1,
            ahead=[([("HGETALL", "cfg"), ("EVALSHA", "0" * 40, 0)], first), ([("INCR", "n")], second)]))
        got = await asyncio.wait_for(asyncio.shield(first), 2)
        assert not wait.done(), "the replies ahead come while the wait still blocks"
        assert got is not None and config_of(got) == {b"tombstone_ttl_ms": b"600000"}
        assert isinstance(got[1], ResponseError) and is_noscript(got[1]), \
            "an error reply is its group's value, the others read all the same"
        assert await asyncio.wait_for(second, 2) == [1]
        sync.zadd("bell", {"3": 7})
        [[key, member, score]] = await asyncio.wait_for(wait, 2)
        assert (key, member, float(score)) == (b"bell", b"3", 7.0)  # the score: bytes in RESP2, a float in RESP3
        # in step: the next exchange on the kept connection reads its own replies
        assert await kept.exchange(None, lambda: [("GET", "n")], 1) == [b"1"]
    finally:
        if wait is not None and not wait.done():
            wait.cancel()
        await kept.release()
        await redis.aclose()
        sync.close()


async def test_the_commands_ahead_of_a_round_trip_that_failed_get_none() -> None:
    redis = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}", socket_connect_timeout=1)  # nobody there
    kept = KeptConnection(redis.connection_pool)
    fut: asyncio.Future[list[Any] | None] = asyncio.get_running_loop().create_future()
    try:
        with pytest.raises(ConnectionError):
            await kept.exchange("w", lambda: [("BZPOPMIN", "bell", 0.1)], 1, ahead=[([("PING",)], fut)])
        assert fut.done() and fut.result() is None, "its owner then sends the commands itself"
    finally:
        await redis.aclose()


def test_a_ridden_settings_read_is_read_as_either_protocol_returns_it() -> None:
    assert config_of([[b"a", b"1", b"b", b"2"]]) == {b"a": b"1", b"b": b"2"}  # RESP2: flat
    assert config_of([{b"a": b"1"}]) == {b"a": b"1"}  # RESP3: a map
    assert config_of([[]]) == {}, "no settings stored: the defaults"
    assert config_of(None) is None and config_of([ResponseError("NOPERM")]) is None, "read again as usual"


class Monitor:
    """Every command Redis runs, as (time, client port, command words), from MONITOR in a thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: list[tuple[float, str, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        with Redis.from_url(self.url).monitor() as m:
            while not self._stop.is_set():
                cmd = m.next_command()
                self.seen.append((cmd["time"], str(cmd.get("client_port", "")), cmd["command"].split()))

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        with Redis.from_url(self.url) as r:
            r.ping()  # gives the monitor a line to return on
        self._thread.join(10)


async def test_an_idle_workers_registry_beats_and_settings_reads_go_ahead_of_its_bell_waits_in_their_write(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen from Redis (MONITOR): after the first of each, every registry refresh and settings read
    of an idle worker comes from the connection its bell waits use, and the next command on that
    connection is a bell wait (they were written together). A chore making a round trip of its own
    goes out on another of the pool's connections (the doorbell holds its own for the waits)."""
    monkeypatch.setattr(workers.namespace, "SETTINGS_INTERVAL", 3.0)
    ns = "chorerides"
    ks = Keyspace(ns, 16)
    w = chore_worker(redis_url, ns)
    workers_key, config_key = ks.workers_key, ks.config_key

    def what(words: list[str]) -> str | None:
        if words[0] == "EVALSHA" and any(workers_key in a for a in words):
            return "beat"
        if words[0] == "HGETALL" and config_key in words[1]:
            return "settings"
        if words[0] in ("BZPOPMIN", "BZMPOP"):
            return "wait"
        return None

    with Monitor(redis_url) as mon:
        async with serving(w):
            t0 = time.time()

            def chores() -> list[int]:
                return [i for i, (t, _, words) in enumerate(list(mon.seen))
                        if t > t0 + 1 and what(words) in ("beat", "settings")]
            await wait_for(lambda: sum(what(mon.seen[i][2]) == "beat" for i in chores()) >= 2
                           and sum(what(mon.seen[i][2]) == "settings" for i in chores()) >= 2, 20,
                           what="two registry beats and two settings reads")
            # each chore's next command on its connection, once that came (the wait after it)
            await wait_for(lambda: all(any(port == mon.seen[i][1] for _, port, _ in mon.seen[i + 1:])
                                       for i in chores()), 10, what="the commands after the chores")
            seen, found = list(mon.seen), chores()
    rows = []
    for i in found:
        _, port, words = seen[i]
        after = next(w for _, p, w in seen[i + 1:] if p == port)
        rows.append((what(words), what(after) or after[0]))
    # two chores may share one write (beat and settings in the same window): the first is then
    # followed by the second, the second by the wait
    assert all(nxt in ("wait", "beat", "settings") for _, nxt in rows), rows
    ports = {seen[i][1] for i in found}
    waits = {p for _, p, words in seen if what(words) == "wait"}
    assert ports <= waits, f"chores came from connections {ports}, bell waits from {waits}: {rows}"


async def test_a_refused_ride_falls_back_to_the_chores_own_round_trip(redis_url: str) -> None:
    """A ridden registry refresh that Redis answers NOSCRIPT (its script cache flushed: a restart,
    ``SCRIPT FLUSH``) is sent again through the transport, which loads the script: the record
    stays live, refreshed every interval."""
    ns = "ridefallback"
    ks = Keyspace(ns, 16)
    w = chore_worker(redis_url, ns)
    sync = Redis.from_url(redis_url)
    client = Client.from_url(redis_url, namespace=ns).connect()
    try:
        async with serving(w):
            await wait_for(lambda: sync.zcard(ks.workers_live_key) == 1, 10, what="the worker's record")
            [(wid, first)] = sync.zrange(ks.workers_live_key, 0, -1, withscores=True)
            for _ in range(2):
                sync.script_flush()
                before = sync.zscore(ks.workers_live_key, wid)
                await wait_for(lambda b=before: (sync.zscore(ks.workers_live_key, wid) or 0) > b, 10,  # type: ignore[misc]
                               what="a refresh after SCRIPT FLUSH")
            assert w.stats.claimed == 0
    finally:
        client.close()
        sync.close()
