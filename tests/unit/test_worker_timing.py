"""The worker's start timing parts without Redis: the Redis clock bound (workers/clock.py) and the
timerfd alarm (workers/alarm.py)."""
from __future__ import annotations

import asyncio
import math
import random
import sys
import time

import pytest

from workers.alarm import Alarm, TimerFdAlarm, make_alarm
from workers.clock import MAX_AGE, MAX_RATE_DIFF, RedisClock

# -- the Redis clock bound ------------------------------------------------------------------------


def test_the_clock_bound_is_never_below_the_true_offset_and_tighter_than_each_claim() -> None:
    """Simulated claims against a Redis clock ``offset`` behind ours: Redis reads its clock
    anywhere inside each round trip, replies sit in the socket for up to 5 ms. The bound is
    never below the true offset (so no job starts early) and mostly much closer to it than each
    claim's own bound (received - redis)."""
    rnd = random.Random(3)
    offset = 1234.5
    clock = RedisClock()
    t = 10_000.0
    own, kept = [], []
    for _ in range(5000):
        t += rnd.uniform(0.0, 0.004)
        sent = t
        read = sent + rnd.uniform(0.00002, 0.0002)       # Redis ran the script
        received = read + rnd.expovariate(1 / 0.001)      # the reply waited for a busy loop
        bound = clock.offset(read - offset, sent, received)
        assert bound >= offset
        own.append(received - (read - offset) - offset)
        kept.append(bound - offset)
        t = received
    own.sort()
    kept.sort()
    assert kept[len(kept) // 2] < own[len(own) // 2] / 3
    assert kept[int(len(kept) * 0.99)] < own[int(len(own) * 0.99)] / 3


def test_an_old_bound_grows_by_the_rate_difference_and_expires() -> None:
    clock = RedisClock()
    assert clock.offset(100.0, 1000.0, 1000.001) == pytest.approx(900.001)
    # a looser claim 0.5 s later: the kept bound, grown by the rate difference over 0.5 s
    assert clock.offset(100.5, 1000.5, 1000.505) == pytest.approx(900.001 + 0.505 * MAX_RATE_DIFF)
    # past MAX_AGE the kept bound is dropped: this claim's own bound
    later = 1000.001 + MAX_AGE + 0.01
    assert clock.offset(later - 900.0 - 0.002, later - 0.003, later) == pytest.approx(900.002)


def test_a_claim_proving_the_offset_grew_replaces_the_bound() -> None:
    """Redis's clock stepped back by 50 ms (or another server answered): the next claim's send
    time is past the kept bound, so that bound is proven wrong and dropped at once."""
    clock = RedisClock()
    assert clock.offset(100.0, 1000.0, 1000.0005) == pytest.approx(900.0005)
    # Redis's clock now reads 50 ms less: the true offset is 900.05
    b = clock.offset(100.01 - 0.05, 1000.0095, 1000.0105)
    assert b >= 900.05 and b == pytest.approx(900.0505)


def test_forget_and_cluster_mode_use_each_claims_own_bound() -> None:
    clock = RedisClock()
    clock.offset(100.0, 1000.0, 1000.0001)
    clock.forget()
    assert clock.offset(100.1, 1000.09, 1000.104) == pytest.approx(900.004)
    single = RedisClock(keep=False)
    single.offset(100.0, 1000.0, 1000.0001)
    assert single.offset(100.1, 1000.09, 1000.104) == pytest.approx(900.004)


# -- the timerfd alarm ----------------------------------------------------------------------------

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux only")


@linux
async def test_timerfd_alarm_resolves_each_wait_at_its_time_in_order_never_before() -> None:
    loop = asyncio.get_running_loop()
    alarm = TimerFdAlarm(loop)
    t0 = time.monotonic()
    whens = [t0 + d for d in (0.03, 0.01, 0.02, 0.0, 0.0105, 0.0101)]
    woke: dict[int, float] = {}

    async def wait(i: int) -> None:
        await alarm.at(whens[i])
        woke[i] = time.monotonic()

    await asyncio.wait_for(asyncio.gather(*(wait(i) for i in range(len(whens)))), 2)
    assert all(woke[i] >= whens[i] for i in range(len(whens)))
    assert sorted(woke, key=woke.__getitem__) == [3, 1, 5, 4, 2, 0]
    cancelled = alarm.at(time.monotonic() + 0.01)
    cancelled.cancel()  # a cancelled wait is skipped quietly when its time comes
    await asyncio.sleep(0.03)
    alarm.close()
    alarm.close()  # twice is fine


@linux
async def test_timerfd_alarm_is_set_once_for_a_batch_due_nanoseconds_apart_and_wakes_none_early() -> None:
    """A batch due at one instant reaches the alarm with instants a few nanoseconds apart, falling
    (each claim's own clock bound): the timer is set once for them, not once per job; an instant
    a millisecond sooner sets it again. Every wait still ends at or after its own instant."""
    loop = asyncio.get_running_loop()
    alarm = TimerFdAlarm(loop)
    try:
        base = time.monotonic() + 0.02
        whens = [base - i * 2e-9 for i in range(50)]
        futs = [alarm.at(w) for w in whens]
        assert alarm.arms == 1
        sooner = base - 0.001
        futs.append(alarm.at(sooner))
        whens.append(sooner)
        assert alarm.arms == 2
        woke: dict[int, float] = {}
        for i, f in enumerate(futs):
            f.add_done_callback(lambda _, i=i: woke.setdefault(i, time.monotonic()))
        await asyncio.wait_for(asyncio.gather(*futs), 2)
        await asyncio.sleep(0)
        assert len(woke) == 51 and all(woke[i] >= whens[i] for i in range(51))
        # one more for the batch after the sooner one fired, unless the loop (on a loaded host) only
        # read the timer once the batch was due too: then both fired at that one expiry
        assert alarm.arms == 3 or (alarm.arms == 2 and woke[50] >= base), (alarm.arms, woke[50] - base)
    finally:
        alarm.close()


@linux
async def test_timerfd_alarm_waits_on_the_kernel_timer_not_on_an_asyncio_timer() -> None:
    """The wait is the timerfd's own expiry (nanoseconds), not an asyncio timer (whole
    milliseconds in epoll_wait): while a job waits the loop has no timer scheduled for it, and
    many waits close together are all met, none early."""
    loop = asyncio.get_running_loop()
    alarm = TimerFdAlarm(loop)
    try:
        before = len(loop._scheduled)  # type: ignore[attr-defined]
        base = time.monotonic() + 0.02
        whens = [base + i * 0.00037 for i in range(40)]
        futs = [alarm.at(w) for w in reversed(whens)]
        assert len(loop._scheduled) == before  # type: ignore[attr-defined]
        woke: list[float] = []
        for f in reversed(futs):
            f.add_done_callback(lambda _: woke.append(time.monotonic()))
        await asyncio.wait_for(asyncio.gather(*futs), 2)
        await asyncio.sleep(0)
        assert len(woke) == 40 and all(w >= when for w, when in zip(sorted(woke), whens))
    finally:
        alarm.close()



@pytest.mark.parametrize("kind", ["timerfd", "thread"])
async def test_alarm_next_at_is_the_earliest_pending_wait(kind: str) -> None:
    """What the runner's quiet() reads: no wait pending is infinity, then the earliest instant,
    then the next once it is met."""
    if kind == "timerfd" and not sys.platform.startswith("linux"):
        pytest.skip("timerfd is Linux only")
    loop = asyncio.get_running_loop()
    alarm = TimerFdAlarm(loop) if kind == "timerfd" else Alarm(loop)
    try:
        assert alarm.next_at() == math.inf
        t0 = time.monotonic()
        only = alarm.at(t0 + 0.01)
        assert alarm.next_at() == t0 + 0.01
        await asyncio.wait_for(only, 2)
        assert alarm.next_at() == math.inf
        t1 = time.monotonic()
        later, sooner = alarm.at(t1 + 60), alarm.at(t1 + 0.01)  # 60 s: met long after this test
        assert alarm.next_at() == t1 + 0.01
        await asyncio.wait_for(sooner, 2)
        assert alarm.next_at() == t1 + 60
        later.cancel()
    finally:
        alarm.close()

async def test_make_alarm_falls_back_to_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    monkeypatch.setenv("ZSCHED_TIMERFD", "0")
    a = make_alarm(loop)
    assert isinstance(a, Alarm)
    await a.at(time.monotonic() + 0.002)
    a.close()
    monkeypatch.delenv("ZSCHED_TIMERFD")
    b = make_alarm(loop)
    assert isinstance(b, TimerFdAlarm if sys.platform.startswith("linux") else Alarm)
    b.close()


@linux
async def test_timerfd_alarm_falls_back_to_the_thread_when_the_loop_cannot_watch_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()

    def refuse(*_: object) -> None:
        raise NotImplementedError

    monkeypatch.setattr(loop, "add_reader", refuse)
    alarm = TimerFdAlarm(loop)
    when = time.monotonic() + 0.003
    await asyncio.wait_for(alarm.at(when), 2)
    assert time.monotonic() >= when
    alarm.close()
