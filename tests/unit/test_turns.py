"""Idle turns (workers/turns.py): a chore goes at the first pulse in the last window of its
interval, never before half of it, and at the end of its interval when no pulse comes."""
from __future__ import annotations

import asyncio

import pytest

from workers.doorbell import BELL_WAIT
from workers.turns import WINDOW_S, Turns


class Clock:
    """The running loop's time, set by the test (asyncio.BaseEventLoop.time is a plain method)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr(asyncio.get_running_loop(), "time", lambda: self.now)


def test_every_idle_workers_window_holds_a_bell_wait_timeout() -> None:
    # an idle worker's waits time out every BELL_WAIT: a window this long always holds one
    assert BELL_WAIT < WINDOW_S < 2 * BELL_WAIT


async def test_a_pulse_before_the_window_opens_does_not_give_the_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    turns = Turns(window=2.5)
    ticket = turns.ticket(5.0)
    clock.now += 2.4
    turns.pulse()
    assert not ticket.done()
    clock.now += 0.1  # the window opens 2.5 s before the end
    turns.pulse()
    assert ticket.done() and turns.waiting == 0


async def test_a_short_interval_goes_no_earlier_than_its_half(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    turns = Turns(window=2.5)
    ticket = turns.ticket(1.0)  # shorter than the window: a pulse at once must not run it again
    turns.pulse()
    assert not ticket.done()
    clock.now += 0.5
    turns.pulse()
    assert ticket.done()


async def test_one_pulse_gives_the_turn_to_every_chore_in_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    turns = Turns(window=2.5)
    beat, settings, later = turns.ticket(5.0), turns.ticket(4.0), turns.ticket(9.0)
    clock.now += 3.0
    turns.pulse()
    assert beat.done() and settings.done() and not later.done()
    assert turns.waiting == 1


async def test_chores_that_went_on_their_own_do_not_pile_up() -> None:
    # a busy worker's bell waits never time out: no pulse comes, each chore goes at its end
    turns = Turns(window=2.5)
    for _ in range(50):
        turns.ticket(5.0).cancel()
    live = turns.ticket(5.0)
    assert turns.waiting == 1
    live.cancel()


async def test_sleep_ends_at_its_interval_without_a_pulse_and_early_with_one() -> None:
    loop = asyncio.get_running_loop()
    turns = Turns(window=0.2)
    t0 = loop.time()
    await turns.sleep(0.05)  # no pulse: the whole interval (asyncio may end a timer a hair early)
    assert loop.time() - t0 >= 0.04
    waiting = asyncio.ensure_future(turns.sleep(60.0))  # its window opens after 59.8 s...
    await asyncio.sleep(0)
    turns.pulse()
    await asyncio.sleep(0.01)
    assert not waiting.done()
    waiting.cancel()
    short = asyncio.ensure_future(turns.sleep(0.3))  # ...this one's after 0.15 s
    await asyncio.sleep(0.16)
    turns.pulse()
    await asyncio.wait_for(short, 0.1)  # long before its 0.3 s
    assert turns.waiting == 0
