"""What an idle worker sends Redis: its readiness probes ride on the bell waits it sends anyway (no
PING of its own while they are answered), the listener renews its role inside the role check's one
round trip, and the sleepers seldom try for the safety-net sweep's turn. 1 000 idle workers are
what these round trips cost Redis, jobs or not."""
from __future__ import annotations

import asyncio
import functools
import time
from datetime import timedelta
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis import Redis

import workers.health
import workers.namespace
from scheduler import Client
from scheduler.health import CHECK_TIMEOUT_S, Health
from scheduler.protocol.keys import Keyspace
from scheduler.shell.servers import RedisServer, free_port
from tests.support.helpers import command_calls as calls
from tests.support.helpers import probing, ready
from tests.support.waits import wait_for
from tests.support.workers import chore_worker, one_listener_workers, serving
from workers import Job, Worker
from workers.doorbell import SLEEPER_SWEEP_STRETCH, Doorbell
from workers.fetch import DoorbellFetch, FetchContext
from workers.health import ANSWER_FRESH_S
from workers.listen_role import LISTEN_CHECK_S, LISTEN_TTL_MS
from workers.turns import Turns


async def test_an_idle_workers_readiness_rides_on_its_bell_waits_and_a_busy_one_pings(
        fresh_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # What is proved is which round trips the checks ride on, not how fast Redis answers: a PING
    # held up over the 2 s default by a loaded VM (once in 6 full-suite runs) must not fail it.
    monkeypatch.setattr(workers.health, "Health", functools.partial(Health, timeout=CHECK_TIMEOUT_S * 5))
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
            await wait_for(lambda: ready(port), 10, what="the worker to be ready")
            # from the first bell wait's answer on (the start-up sweep's claims answered before it)
            await wait_for(lambda: calls(sync, "bzpopmin") >= 1, 3 * ANSWER_FRESH_S, what="a bell wait")
            sync.config_resetstat()
            # probed while two bell waits are answered (each blocks BELL_WAIT s): more than
            # ANSWER_FRESH_S of readiness checks
            with probing(port, timeout=CHECK_TIMEOUT_S * 5 + 1) as seen:
                await wait_for(lambda: calls(sync, "bzpopmin") >= 2, 3 * ANSWER_FRESH_S, what="two bell waits")
            assert calls(sync, "ping") == 0, "an idle worker pinged although its bell waits were answered"
            assert len(seen) >= 6 and set(seen) == {(200, "ok: Redis answers; claiming jobs of q\n")}, seen

            # its only slot busy, the worker sends no bell wait: the readiness check pings again
            client.schedule(timedelta(0), "hold", queue="q")
            await wait_for(lambda: w.stats.claimed == 1, 10, what="the job to hold the slot")
            sync.config_resetstat()
            # the probe waits as long as the check may take: a PING held up past 2 s by a loaded VM
            # (once in a full-suite run) timed the probe out on the client's side
            with probing(port, timeout=CHECK_TIMEOUT_S * 5 + 1) as seen:
                await wait_for(lambda: calls(sync, "ping") >= 1, 3 * ANSWER_FRESH_S, what="a PING from the busy worker")
            assert seen and all(code == 200 for code, _ in seen), [s for s in seen if s[0] != 200]
            gate.set()
    finally:
        gate.set()
        client.close()
        sync.close()


class Trips:
    """Counts a doorbell's role-check round trips (their commands) and its client's direct PEXPIRE
    calls."""

    def __init__(self, bell: Doorbell, redis: Any) -> None:
        self.pipelines: list[int] = []
        self.pexpires = 0
        role_trip, pexpire = bell.role.trip, redis.pexpire

        async def counted_trip(renew: bool, read_bells: bool) -> Any:
            replies = await role_trip(renew, read_bells)
            self.pipelines.append(len(replies))
            return replies

        async def counted_pexpire(*args: Any, **kwargs: Any) -> Any:
            self.pexpires += 1
            return await pexpire(*args, **kwargs)

        bell.role.trip, redis.pexpire = counted_trip, counted_pexpire  # type: ignore[method-assign]


async def test_a_listener_renews_its_role_in_the_checks_own_round_trip_and_gives_it_up_when_taken(
        redis_url: str) -> None:
    ks = Keyspace("renew", 16)
    redis = aioredis.Redis.from_url(redis_url)
    bell = Doorbell(redis, ks, ["q"], wait=0.1, one_listener=True)
    trips = Trips(bell, redis)
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
        assert bell.listening and sync.get(key) == bell.role.id, "the free role is taken"
        for _ in range(3):
            sync.pexpire(key, 1_000)  # shortened: only a renewal lengthens it again
            await next_check()
            assert bell.listening and sync.get(key) == bell.role.id
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


async def test_with_one_listener_the_sleepers_seldom_try_for_the_sweep_turn_and_the_queue_is_still_swept(
        redis_url: str) -> None:
    """The listener, awake anyway, takes the safety-net sweep's turn each period and keeps it (a
    try renews the turn it held); the sleepers try only every SLEEPER_SWEEP_STRETCH periods, and
    seldom take a turn, and the queue is still swept about once per period."""
    ns, period, n = "sweepturns", 0.4, 3
    made: list[DoorbellFetch] = []

    def fetch(ctx: FetchContext) -> DoorbellFetch:
        made.append(DoorbellFetch(ctx))
        return made[-1]

    ws = [Worker.from_url(redis_url, namespace=ns, queues=["q"], idle_sweep=period, fetch=fetch,
                          shutdown_grace=2.0, one_listener=True) for _ in range(n)]
    for w in ws:
        w.handler("q")(_noop)
    client = Client.from_url(redis_url, namespace=ns).connect()
    tries: dict[int, int] = {}
    taken: dict[int, int] = {}
    try:
        async with serving(*ws):
            await wait_for(lambda: len(made) == n and all(f.hungry.is_set() for f in made), 10, what="idle workers")
            await wait_for(lambda: sum(f.bells.listening for f in made) == 1, 10, what="one listener")
            for i, f in enumerate(made):
                tries[i] = taken[i] = 0
                f.bells.sweep_turns = _counting(f.bells.sweep_turns, tries, i, taken)  # type: ignore[method-assign]
            claims0 = sum(w.stats.claims for w in ws)
            t0 = time.monotonic()
            await asyncio.sleep(10 * period)  # a rate over ten periods: what is measured is how often
            periods = (time.monotonic() - t0) / period
            sweeps = (sum(w.stats.claims for w in ws) - claims0) / client.keyspace.partitions
            listener = next(i for i, f in enumerate(made) if f.bells.listening)
    finally:
        client.close()
    sleepers = [tries[i] for i in tries if i != listener]
    assert tries[listener] >= periods / 2, \
        f"the listener ({listener}) tried {tries[listener]} times in {periods:.1f} periods: {tries}"
    assert all(t <= periods / SLEEPER_SWEEP_STRETCH + 2 for t in sleepers), \
        f"sleepers tried {sleepers} times in {periods:.1f} periods (every period would be ~{periods:.0f})"
    # a try of the listener finds the turn taken only when a sleeper took it (its own last turn
    # counts as held): a sleeper's turn lasts one period and the listener tries every 0.8-1.0
    # period, so each turn a sleeper took can cost it two tries (one in flight at either end of the
    # window may count on one side only). The sweeps are the turns taken: about one per period,
    # however late a loaded host ran the listener's tries (their rate is the bound above)
    # the listener renews its turn at each try, so a sleeper takes one only when a try of the
    # listener came late (after a whole period; a loaded host)
    assert sum(taken[i] for i in taken if i != listener) <= 2, f"sleepers took turns: {taken}, listener {listener}"
    missed = tries[listener] - taken[listener]
    assert missed <= 2 * (sum(taken.values()) - taken[listener]) + 1, f"the tries {tries}, turns taken {taken}"
    assert sum(taken.values()) - 2 <= sweeps <= 1.5 * periods, \
        f"{sweeps:.1f} sweeps in {periods:.1f} periods; tries {tries}, turns taken {taken}, listener {listener}"


async def _noop(job: Job) -> None:
    return None


def _counting(fn: Any, tries: dict[int, int], i: int, taken: dict[int, int] | None = None) -> Any:
    async def counted(*args: Any, **kwargs: Any) -> Any:
        tries[i] += 1
        mine = await fn(*args, **kwargs)
        if taken is not None and mine:
            taken[i] += 1
        return mine
    return counted


@pytest.mark.parametrize("protocol", [2, 3])
async def test_a_sleepers_role_check_reads_the_oldest_rings_in_one_round_trip_on_the_kept_connection(
        redis_url: str, protocol: int) -> None:
    """One server: the role check (and the watch, taken when free) goes out packed on the
    connection the bell waits use (RESP2 and RESP3 replies read alike), and leaves it in step for
    the wait that follows."""
    ks = Keyspace(f"roletrip{protocol}", 16)
    redis = aioredis.Redis.from_url(redis_url, protocol=protocol)
    bell = Doorbell(redis, ks, ["q", "r"], wait=0.2, one_listener=True)
    sync = Redis.from_url(redis_url)
    sync.set(ks.listener(["q", "r"]), b"another-worker", px=60_000)
    rung = time.time() * 1000 - 10_000
    sync.zadd(ks.bell("r"), {"3": rung})  # a ring nobody took for 10 s: the listener stalls
    try:
        before, *oldest, watch = await bell.role.trip(False, True)
        assert before == b"another-worker" and oldest == [[], [(b"3", rung)]]
        assert watch is None and sync.get(ks.listen_watch(["q", "r"])) == bell.role.id  # the watch was free: taken
        assert await bell.take() == ("r", b"3", rung), "a sleeper that sees a stale ring helps at once"
        assert bell.helping and not bell.listening
        assert sync.get(ks.listener(["q", "r"])) == b"another-worker"
    finally:
        await bell.close()
        await redis.aclose()
        sync.close()


async def test_a_sleepers_role_check_rides_on_its_bell_waits_and_sees_the_role_as_it_is_when_they_end(
        redis_url: str) -> None:
    """One server: a sleeper's role check (SET NX GET of the role, the oldest ring of each bell)
    goes out behind each of its bell waits and comes back with the wait's answer. After its first
    check it makes no round trip of its own, whether bursts wake it or its waits time out (an idle
    sleeper wakes once per wait, not twice), and what the check sees is the role when the wait
    ended: a role freed meanwhile is taken, a stale ring makes it help, and a sleeper woken by a
    hand-off takes the role in that same answer."""
    ks = Keyspace("rides-role", 16)
    redis = aioredis.Redis.from_url(redis_url)
    bell = Doorbell(redis, ks, ["q"], wait=0.3, one_listener=True)
    other = Doorbell(redis, ks, ["q"], wait=0.3, one_listener=True)
    trips, other_trips = Trips(bell, redis), Trips(other, redis)
    sync = Redis.from_url(redis_url)
    key = ks.listener(["q"])
    sync.set(key, b"another-worker", px=60_000)

    async def blocked(n: int) -> None:
        await wait_for(lambda: int(sync.info("clients")["blocked_clients"]) == n, 5, what=f"{n} blocked wait(s)")

    try:
        sync.config_resetstat()
        for _ in range(3):  # woken by bursts
            sync.zadd(ks.burst_bell("q"), {"1": time.time() * 1000})
            got = await bell.take()
            assert got is not None and got[:2] == ("q", b"1"), got
        for _ in range(3):  # idle: each wait times out
            assert await bell.take() is None
        # the first check: the role's SET, the oldest ring, the watch's SET (free: taken)
        assert trips.pipelines == [3], "only the first check is a round trip of its own"
        # each check sets the role and the watch (renewed by the watcher along: PEXPIRE)
        assert calls(sync, "bzpopmin") == 6 and calls(sync, "set") == 14 and calls(sync, "zrange") == 7
        assert calls(sync, "pexpire") == 6 and bell.role.watching
        assert not (bell.listening or bell.helping) and sync.get(key) == b"another-worker"

        # a ring nobody took for a second, seen when the wait ends: help (wait on the bells) at once
        task = asyncio.create_task(bell.take())
        await blocked(1)
        sync.zadd(ks.bell("q"), {"4": time.time() * 1000 - 1_000})
        assert await task is None and bell.helping and not bell.listening
        assert await bell.take() == ("q", b"4", pytest.approx(time.time() * 1000 - 1_000, abs=1_000))
        while bell.helping:  # no more rings: back to sleep after HELP_S
            assert await bell.take() is None

        # the role freed during a wait: taken when the wait ends, in its answer
        task = asyncio.create_task(bell.take())
        await blocked(1)
        sync.delete(key)
        assert await task is None and bell.listening and sync.get(key) == bell.role.id
        assert trips.pipelines == [3]
        # a watcher that takes the role gives the watch up, for another sleeper to take at once
        assert not bell.role.watching and sync.get(ks.listen_watch(["q"])) is None

        # the listener hands the role on: the sleeper woken by it takes it in the same answer
        task = asyncio.create_task(other.take())
        await blocked(1)
        assert other_trips.pipelines == [3] and not other.listening and other.role.watching
        await bell.hand_off()
        assert await asyncio.wait_for(task, 5) is None
        assert other.listening and sync.get(key) == other.role.id and other_trips.pipelines == [3]
    finally:
        await bell.close()
        await other.close()
        await redis.aclose()
        sync.close()


async def test_an_idle_workers_registry_beats_and_settings_reads_ride_on_its_role_checks(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each periodic chore of an idle worker goes in the wake-up of a bell-wait timeout, beside
    the role check (workers/turns.py), not on a timer of its own: each wake-up of an idle process
    costs it about as much CPU as the round trip it makes. Seen from Redis (MONITOR): every
    registry beat and settings read after the first comes within a few ms of a role check (on
    one server they go ahead of the next bell wait, in its write: test_worker_chore_rides.py). With
    the 3 s intervals here and checks every BELL_WAIT (2 s), chores on timers of their own came
    there about once in twenty."""
    import threading

    monkeypatch.setattr(workers.namespace, "SETTINGS_INTERVAL", 3.0)
    ns = "rides"
    ks = Keyspace(ns, 16)
    w = chore_worker(redis_url, ns)
    seen: list[tuple[float, str]] = []  # (Redis's time, what)
    stop = threading.Event()
    listener, workers_key, config_key = ks.listener(["q"]), ks.workers_key, ks.config_key

    def watch() -> None:
        with Redis.from_url(redis_url).monitor() as m:
            while not stop.is_set():
                cmd = m.next_command()
                args = cmd["command"].split()
                if args[0] == "SET" and listener in args[1]:
                    seen.append((cmd["time"], "role"))
                elif args[0] == "EVALSHA" and any(workers_key in a for a in args):
                    seen.append((cmd["time"], "beat"))
                elif args[0] == "HGETALL" and config_key in args[1]:
                    seen.append((cmd["time"], "settings"))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        async with serving(w):
            t0 = time.time()
            # each chore twice after its first run at start (3 s apart: one every other role check)
            await wait_for(lambda: sum(1 for t, what in seen if what == "beat" and t > t0 + 1) >= 2
                           and sum(1 for t, what in seen if what == "settings" and t > t0 + 1) >= 2, 20,
                           what="two registry beats and two settings reads")
            t1 = time.time()  # before the stop (its registry removal is an EVALSHA of those keys too)
    finally:
        stop.set()
        Redis.from_url(redis_url).ping()  # gives the monitor a line to return on
        watcher.join(10)
    roles = [t for t, what in seen if what == "role"]
    chores = [(t, what) for t, what in seen if what != "role" and t0 + 1 < t < t1]
    far = [(round(t - t0, 3), what, round(min(abs(t - r) for r in roles), 3)) for t, what in chores]
    assert all(gap < 0.05 for _, _, gap in far), f"chores (time, what, distance to a role check): {far}"


async def test_a_sleepers_tries_for_the_sweep_turn_ride_on_its_bell_wait_timeouts(redis_url: str) -> None:
    """A sleeper tries for the safety-net sweep's turn every SLEEPER_SWEEP_STRETCH periods: on an
    idle turn (workers/sweep.py), in the wake-up of its bell wait's timeout (which brings its role
    check along), not on a timer of its own. With a 1 s period a sleeper tries every 3.2-4 s; on a
    timer, a try fell within 50 ms of one of its timeouts (every 2 s) about once in ten. On one
    server the try's commands go ahead of the next bell wait, in its write: the sleeper makes no
    round trip of its own for them (``sweep_turns``)."""
    ws, made = one_listener_workers(redis_url, "sweeprides", 2, idle_sweep=1.0)
    loop = asyncio.get_running_loop()
    timeouts: dict[int, list[float]] = {0: [], 1: []}
    tries: dict[int, list[float]] = {0: [], 1: []}
    trips: dict[int, int] = {0: 0, 1: 0}

    def stamped(fn: Any, times: list[float]) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            times.append(loop.time())
            return fn(*args, **kwargs)
        return call

    def stamped_pulse(turns: Turns, times: list[float]) -> None:
        pulse = turns.pulse

        def call(riding: bool = False) -> None:
            times.append(loop.time())
            pulse(riding)
        turns.pulse = call  # type: ignore[method-assign]

    async with serving(*ws):
        await wait_for(lambda: len(made) == 2 and sum(f.bells.listening for f in made) == 1, 10, what="one listener")
        for i, f in enumerate(made):
            assert f.bells.turns is not None
            stamped_pulse(f.bells.turns, timeouts[i])
            # a try's answer is read by sweep_mine, whether the try rode or made its round trip
            f.bells.sweep_mine = stamped(f.bells.sweep_mine, tries[i])  # type: ignore[method-assign]
            f.bells.sweep_turns = _counting_trips(f.bells.sweep_turns, trips, i)  # type: ignore[method-assign]
        sleeper = next(i for i, f in enumerate(made) if not f.bells.listening)
        await wait_for(lambda: len(tries[sleeper]) >= 2 and timeouts[sleeper], 20, what="two tries of the sleeper")
        assert not made[sleeper].bells.listening, "the roles changed during the test"
    far = [round(min(abs(t - r) for r in timeouts[sleeper]), 3) for t in tries[sleeper]]
    assert all(gap < 0.05 for gap in far), f"the sleeper's tries, seconds from its nearest bell-wait timeout: {far}"
    assert trips[sleeper] == 0, f"{trips[sleeper]} of the sleeper's {len(tries[sleeper])} tries made a round trip"


def _counting_trips(sweep_turns: Any, trips: dict[int, int], i: int) -> Any:
    """``Doorbell.sweep_turns``, counting the calls that make a round trip (no ridden replies)."""
    async def counted(queues: Any, period: float, token: str, ridden: Any = None) -> Any:
        if ridden is None:
            trips[i] += 1
        return await sweep_turns(queues, period, token, ridden)
    return counted
