"""The watch (workers/listen_role.py): on one server one sleeper at a time checks for a dead
listener at every ``BELL_WAIT``; the other sleepers' waits last until their next chore is due, and
the chores ride on that one timeout, so an idle sleeper wakes about once per chore interval."""
from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis import Redis

import workers.doorbell
from scheduler import Client
from scheduler.protocol.keys import Keyspace
from scheduler.redisio.connection import async_redis, sync_redis
from tests.support.waits import wait_for
from tests.support.workers import one_listener_workers, serving
from workers.doorbell import BELL_WAIT, Doorbell
from workers.fetch import DoorbellFetch
from workers.listen_role import WATCH_TTL_MS
from workers.turns import Turns

NS = "watch"


def _recording(f: DoorbellFetch, loop: asyncio.AbstractEventLoop,
               sleeps: list[tuple[float, float]], tickets: list[asyncio.Future[Any]]) -> None:
    """Record ``f``'s sleeper waits (when, how long) and the chores' tickets from now on."""
    bells = f.bells
    assert bells.turns is not None
    sleep_s, ticket = bells.sleep_s, bells.turns.ticket

    def recorded_sleep() -> float:
        s = sleep_s()
        sleeps.append((loop.time(), s))
        return s

    def recorded_ticket(*args: Any, **kwargs: Any) -> Any:
        fut = ticket(*args, **kwargs)
        tickets.append(fut)
        return fut

    bells.sleep_s = recorded_sleep  # type: ignore[method-assign]
    bells.turns.ticket = recorded_ticket  # type: ignore[method-assign]


async def _one_watcher(url: str, namespace: str) -> tuple[list[tuple[float, float]], list[tuple[float, float]],
                                                          list[bool], float]:
    """Three idle workers of ``url``: the waits (when, how long) of the watcher and of the other
    sleeper over 11 s, the sleeper's chore turns (True: went without riding), and when it began."""
    client = Client.from_url(url, namespace=namespace).connect()
    ws, made = one_listener_workers(url, namespace, 3, idle_sweep=600.0)
    loop = asyncio.get_running_loop()
    watch_key = client.keyspace.listen_watch(["q"])
    try:
        async with serving(*ws):
            await wait_for(lambda: len(made) == 3 and sum(f.bells.listening for f in made) == 1
                           and sum(f.bells.role.watching for f in made) == 1, 10,
                           what="a listener and a watcher")
            [watcher] = [f for f in made if f.bells.role.watching]
            [sleeper] = [f for f in made if not (f.bells.listening or f.bells.role.watching)]
            assert client.redis.get(watch_key) == watcher.bells.role.id
            records: dict[str, tuple[list[tuple[float, float]], list[asyncio.Future[Any]]]] = {
                "watcher": ([], []), "sleeper": ([], [])}
            _recording(watcher, loop, *records["watcher"])
            _recording(sleeper, loop, *records["sleeper"])
            t0 = loop.time()
            await asyncio.sleep(11.0)
            # the sleeper's chore turns so far (a stop cancels the tickets still waiting)
            s_turns = [f.cancelled() or f.result() is None for f in records["sleeper"][1] if f.done()]
            assert watcher.bells.role.watching and not sleeper.bells.role.watching
            assert client.redis.get(watch_key) == watcher.bells.role.id and client.redis.pttl(watch_key) > 0
    finally:
        client.close()
    return records["watcher"][0], records["sleeper"][0], s_turns, t0


def _waits_follow_the_watch(w_sleeps: list[tuple[float, float]], s_sleeps: list[tuple[float, float]],
                            t0: float) -> None:
    assert w_sleeps and all(s == BELL_WAIT for _, s in w_sleeps), w_sleeps
    assert 5 <= len(w_sleeps) <= 7, f"the watcher's waits in 11 s: {w_sleeps}"
    # after the first chores it recorded (they set the pace), the sleeper waits as long as they let it
    late = [(round(t - t0, 2), s) for t, s in s_sleeps if t > t0 + 5.5]
    assert late and all(s > BELL_WAIT + 1.5 for _, s in late), f"the sleeper's waits (when, seconds): {s_sleeps}"
    assert 2 <= len(s_sleeps) <= 4, f"the sleeper's waits in 11 s: {s_sleeps}"


async def test_one_sleeper_watches_the_listener_and_the_others_wake_only_when_their_chores_are_due(
        redis_url: str) -> None:
    """Three idle workers: one listens, one sleeper holds the watch and its waits time out every
    BELL_WAIT, the third's waits last until its chores (registry and settings, every 5 s) are due,
    and every chore of that sleeper rides on its waits (none goes on a timer of its own)."""
    w_sleeps, s_sleeps, s_turns, t0 = await _one_watcher(redis_url, NS)
    _waits_follow_the_watch(w_sleeps, s_sleeps, t0)
    assert len(s_turns) >= 2, "two chore turns at least in 11 s"
    assert not any(s_turns), f"{sum(s_turns)} of the sleeper's {len(s_turns)} chore turns went on a timer of their own"


async def test_on_a_cluster_one_sleeper_watches_and_the_others_wake_only_when_their_chores_are_due(
        redis_cluster_url: str) -> None:
    """The same on a Redis Cluster, where the checks are pipelines of their own and nothing rides:
    one watcher waking every BELL_WAIT, the other sleeper's waits as long as its chores let them
    (its chores go on those wake-ups, each with its own round trip)."""
    w_sleeps, s_sleeps, s_turns, t0 = await _one_watcher(redis_cluster_url, NS + "c")
    _waits_follow_the_watch(w_sleeps, s_sleeps, t0)
    assert len(s_turns) >= 2, "two chore turns at least in 11 s"


async def test_a_lost_watch_is_taken_by_the_next_sleeper_to_check_and_a_watcher_keeps_short_waits(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watcher that died keeps the watch until it expires (WATCH_TTL_MS after its last check);
    until then the sleepers wait as long as their chores let them, and the first to check after
    the expiry takes the watch and waits BELL_WAIT (here 0.3 s) from then on; only one takes it."""
    monkeypatch.setattr(workers.doorbell, "SLEEP_WAIT_MAX", 1.0)
    ks = Keyspace("lostwatch", 16)
    redis = aioredis.Redis.from_url(redis_url)
    sync = Redis.from_url(redis_url)
    sync.set(ks.listener(["q"]), b"a-listener", px=60_000)
    sync.set(ks.listen_watch(["q"]), b"a-lost-watcher", px=1_500)
    bells = [Doorbell(redis, ks, ["q"], wait=0.3, one_listener=True, turns=Turns()) for _ in range(2)]
    loop = asyncio.get_running_loop()

    async def sleep_on(bell: Doorbell, stop: asyncio.Event) -> None:
        while not stop.is_set():
            assert await bell.take() is None

    stop = asyncio.Event()
    tasks = [asyncio.create_task(sleep_on(b, stop)) for b in bells]
    try:
        await wait_for(lambda: all(b.role.checked_until > 0 for b in bells), 5, what="the first checks")
        assert not any(b.role.watching for b in bells)
        assert all(b.sleep_s() == pytest.approx(0.7) for b in bells), \
            "no chore waits: a sleeper without the watch waits the longest a wait may last"
        t0 = loop.time()
        await wait_for(lambda: any(b.role.watching for b in bells), 1.5 + 1.0 + 1.0, what="a sleeper to take the watch")
        assert loop.time() - t0 <= 1.5 + 1.0 + 0.5
        [watcher] = [b for b in bells if b.role.watching]
        assert sync.get(ks.listen_watch(["q"])) == watcher.role.id
        assert watcher.sleep_s() == 0.3
        await asyncio.sleep(2.0)  # renewed at each check, held by one
        assert sum(b.role.watching for b in bells) == 1 and watcher.role.watching
        assert 0 < sync.pttl(ks.listen_watch(["q"])) <= WATCH_TTL_MS
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        for b in bells:
            await b.close()
        await redis.aclose()
        sync.close()


async def test_the_wait_of_a_sleeper_without_the_watch_ends_before_its_first_chore_must_go() -> None:
    """sleep_s: until the earliest riding chore's interval end, less RIDE_MARGIN, at least
    BELL_WAIT and at most SLEEP_WAIT_MAX less the margin; BELL_WAIT for the watcher."""
    turns = Turns()
    bell = Doorbell(aioredis.Redis(socket_timeout=10), Keyspace("sleeps", 16), ["q"], one_listener=True, turns=turns)
    margin = workers.doorbell.RIDE_MARGIN
    try:
        assert bell.sleep_s() == pytest.approx(4.7)  # 5 s less the margin, in tenths
        ride = functools.partial(list, [("PING",)])
        turns.ticket(4.0, ride)
        assert 3.6 <= bell.sleep_s() <= 4.0 - margin
        turns.ticket(2.1, ride)
        assert bell.sleep_s() == BELL_WAIT, "never shorter than BELL_WAIT"
        bell.role.watching = True
        assert bell.sleep_s() == BELL_WAIT
    finally:
        await bell.redis.aclose()


async def test_a_cluster_clients_socket_timeout_bounds_its_sleepers_waits() -> None:
    """A sleeper's wait lasts up to SLEEP_WAIT_MAX on a cluster too, so a shorter socket timeout
    in the cluster URL bounds it (half of it), as on one server: a read that outlasts the timeout
    would fail instead of returning empty. (No connection is made: nothing listens on port 1.)"""
    short = aioredis.RedisCluster.from_url("redis://127.0.0.1:1/?socket_timeout=3")
    plain = aioredis.RedisCluster.from_url("redis://127.0.0.1:1/?socket_timeout=10")  # the workers' default
    try:
        bell = Doorbell(short, Keyspace("timeouts", 16), ["q"], one_listener=True, turns=Turns())
        assert bell.kept is None and bell.wait_s == 1.5 and bell.sleep_max == 1.5
        assert bell.sleep_s() == 1.5
        bell = Doorbell(plain, Keyspace("timeouts", 16), ["q"], one_listener=True, turns=Turns())
        assert bell.wait_s == BELL_WAIT and bell.sleep_max == workers.doorbell.SLEEP_WAIT_MAX
    finally:
        await short.aclose()
        await plain.aclose()


@pytest.mark.parametrize("holds_watch", [False, True])
async def test_on_a_cluster_a_sleeper_woken_by_rings_checks_the_role_once_per_long_wait_unless_it_watches(
        redis_cluster_url: str, holds_watch: bool) -> None:
    """Bursts wake every sleeper before its wait times out. On a cluster each role check is a round
    trip of its own: a sleeper without the watch keeps its check about as long as its longest wait
    (4.45 s), the watcher keeps checking every BELL_WAIT. Rings every 0.3 s for 3.2 s: one check
    (the first) for the sleeper, two for the watcher."""
    ks = Keyspace("checks" + ("w" if holds_watch else ""), 16)
    sync = sync_redis(redis_cluster_url)
    redis = async_redis(redis_cluster_url)
    sync.set(ks.listener(["q"]), b"another-worker", px=60_000)
    if not holds_watch:
        sync.set(ks.listen_watch(["q"]), b"another-sleeper", px=60_000)
    bell = Doorbell(redis, ks, ["q"], one_listener=True, turns=Turns())
    trips = 0
    trip = bell.role.trip

    async def counted(renew: bool, sleeper: bool) -> list[Any]:
        nonlocal trips
        trips += 1
        return await trip(renew, sleeper)

    bell.role.trip = counted  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    try:
        end = loop.time() + 3.2
        n = 0
        while loop.time() < end:
            waiting = asyncio.create_task(bell.take_many(1))
            await asyncio.sleep(0.3)
            n += 1
            sync.zadd(ks.burst_bell("q"), {str(n).encode(): time.time() * 1000})
            assert [m for _, m, _ in await asyncio.wait_for(waiting, 5)] == [str(n).encode()]
        assert bell.role.watching == holds_watch
        assert trips == (2 if holds_watch else 1), f"{trips} role checks in 3.2 s of rings every 0.3 s"
    finally:
        await bell.close()
        await redis.aclose()
        sync.close()
