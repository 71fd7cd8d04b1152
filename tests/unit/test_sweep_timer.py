"""The safety-net sweep's timer (workers/sweep.py): a try for the sweep's turn waits its stretched
period, or rides on the first idle turn in that period's window, which wakes the claim loop."""
from __future__ import annotations

import asyncio

import pytest

from workers.sweep import SweepTimer
from workers.turns import Turns


def clocked(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The running loop's time as a list of one, set by the test."""
    loop = asyncio.get_running_loop()
    now = [loop.time()]
    monkeypatch.setattr(loop, "time", lambda: now[0])
    return now


async def test_an_idle_turn_in_the_window_makes_the_try_due_and_wakes_the_claim_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = clocked(monkeypatch)
    turns, wake = Turns(window=2.5), asyncio.Event()
    timer = SweepTimer(turns, wake)
    wait = timer.wait(2.0, 4)  # a sleeper: every 4 periods, at 0.8-1.0 of it
    assert 6.4 - 0.1 <= wait <= 8.0
    turns.pulse()  # at once: before the window
    await asyncio.sleep(0)
    assert not wake.is_set() and timer.wait(2.0, 4) > 0
    now[0] += wait - 2.4  # inside the last 2.5 s
    turns.pulse()
    await asyncio.sleep(0)  # the ticket's callback
    assert wake.is_set() and timer.wait(2.0, 4) == 0.0

    wake.clear()
    timer.swept()
    assert timer.wait(2.0, 4) > 6.0, "the period starts again after the sweep"
    turns.pulse()
    await asyncio.sleep(0)
    assert not wake.is_set()
    timer.swept()
    assert turns.waiting <= 1  # the cancelled ticket goes at the next ticket or pulse


async def test_without_idle_turns_the_try_comes_at_its_period() -> None:
    turns, wake = Turns(), asyncio.Event()
    timer = SweepTimer(turns, wake)
    timer.last -= 10.0  # the period (2 s, not stretched) long over
    assert timer.wait(2.0, 1) <= 0 and not wake.is_set()


async def test_a_try_that_rode_on_a_bell_wait_leaves_its_replies_for_the_sweep(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = clocked(monkeypatch)
    turns, wake = Turns(window=2.5), asyncio.Event()
    timer = SweepTimer(turns, wake, ride=lambda: [("SET", "turn", "tok", "NX", "PX", 2000, "GET")])
    wait = timer.wait(2.0, 4)
    now[0] += wait - 2.4
    turns.pulse(riding=True)  # a wait will take it: no turn yet
    await asyncio.sleep(0)
    assert not wake.is_set()
    [(cmds, ticket)] = turns.rides()
    assert list(cmds) == [("SET", "turn", "tok", "NX", "PX", 2000, "GET")]
    ticket.set_result([None])  # nobody held the turn
    await asyncio.sleep(0)
    assert wake.is_set() and timer.wait(2.0, 4) == 0.0
    assert timer.swept(fresh=1.0) == [None], "the sweep reads the replies instead of trying again"
    assert timer.swept(fresh=1.0) is None, "one try's replies serve one sweep"


async def test_a_try_whose_ride_failed_is_made_by_the_sweep_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    now = clocked(monkeypatch)
    turns, wake = Turns(window=2.5), asyncio.Event()
    timer = SweepTimer(turns, wake, ride=lambda: [("SET", "turn", "tok", "NX", "PX", 2000, "GET")])
    now[0] += timer.wait(2.0, 4) - 2.4
    turns.pulse(riding=True)
    [(_, ticket)] = turns.rides()
    ticket.set_result(None)  # the wait's round trip failed
    await asyncio.sleep(0)
    assert wake.is_set() and timer.wait(2.0, 4) == 0.0 and timer.swept(fresh=1.0) is None
