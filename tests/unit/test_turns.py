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


async def test_a_chore_that_can_ride_is_left_at_a_pulse_for_the_next_bell_wait_to_take(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    turns = Turns(window=2.5)
    built = []

    def ride() -> list[tuple[str, ...]]:
        built.append(clock.now)  # built when a wait takes it, not when the ticket is made
        return [("HGETALL", "cfg")]

    ticket = turns.ticket(5.0, ride)
    assert turns.rides() == [] and not built, "its window has not opened"
    clock.now += 3.0
    turns.pulse(riding=True)
    assert not ticket.done(), "a pulse whose next wait takes rides leaves it to that wait"
    taken = turns.rides()
    assert [(list(cmds), fut) for cmds, fut in taken] == [([("HGETALL", "cfg")], ticket)] and built == [clock.now]
    assert turns.rides() == [] and turns.waiting == 0, "taken once"
    ticket.set_result([{b"k": b"v"}])


async def test_without_a_wait_to_ride_on_a_pulse_gives_a_riding_chore_its_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    # a cluster: the doorbell keeps no connection, and its pulses say so
    clock = Clock(monkeypatch)
    turns = Turns(window=2.5)
    ticket = turns.ticket(5.0, lambda: [("PING",)])
    plain = turns.ticket(5.0)
    clock.now += 3.0
    turns.pulse(riding=True)
    assert plain.done() and plain.result() is None, "a chore that cannot ride goes at the pulse"
    turns.pulse(riding=False)
    assert ticket.done() and ticket.result() is None and turns.rides() == []


async def test_sleep_returns_the_replies_of_the_commands_it_rode_with() -> None:
    turns = Turns(window=0.2)
    sleeping = asyncio.ensure_future(turns.sleep(0.3, lambda: [("HGETALL", "cfg")]))
    await asyncio.sleep(0.16)  # its window opened after 0.15 s
    [(cmds, ticket)] = turns.rides()
    assert list(cmds) == [("HGETALL", "cfg")]
    ticket.set_result([[b"tombstone_ttl_ms", b"5000"]])
    assert await asyncio.wait_for(sleeping, 0.1) == [[b"tombstone_ttl_ms", b"5000"]]
    # a ride whose round trip failed gets None: the chore makes its own
    sleeping = asyncio.ensure_future(turns.sleep(0.3, lambda: [("PING",)]))
    await asyncio.sleep(0.16)
    [(_, ticket)] = turns.rides()
    ticket.set_result(None)
    assert await asyncio.wait_for(sleeping, 0.1) is None


async def test_a_wait_looks_through_the_tickets_only_once_a_ride_may_be_due(monkeypatch: pytest.MonkeyPatch) -> None:
    # a listener sends a wait per ring: most find no ride due and must not build or scan anything
    clock = Clock(monkeypatch)
    turns = Turns(window=2.5)
    built: list[str] = []
    first = turns.ticket(5.0, lambda: built.append("a") or [("PING",)])  # type: ignore[func-returns-value]
    turns.ticket(9.0, lambda: built.append("b") or [("PING",)])  # type: ignore[func-returns-value]
    turns.ticket(3.0)  # cannot ride: never taken by a wait
    assert turns.rides() == [] and not built
    clock.now += 2.5
    assert [fut for _, fut in turns.rides()] == [first] and built == ["a"]
    assert turns.rides() == [] and built == ["a"], "the next ride's window opens at 6.5 s"
    clock.now += 4.0
    assert len(turns.rides()) == 1 and built == ["a", "b"]
    first.cancel()


async def test_ride_due_is_the_end_of_the_first_riding_interval_that_still_waits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sleeper without the watch waits until just before ride_due: the chores that may ride and
    wait for their turn, not those that went, rode, or cannot ride."""
    clock = Clock(monkeypatch)
    turns = Turns(window=2.5)
    assert turns.ride_due() == float("inf")
    turns.ticket(3.0)  # cannot ride: a pulse gives it its turn, no wait is shaped for it
    assert turns.ride_due() == float("inf")
    later = turns.ticket(7.0, lambda: [("PING",)])
    sooner = turns.ticket(5.0, lambda: [("PING",)])
    assert turns.ride_due() == 1005.0
    clock.now += 2.6  # the sooner one's window is open: a wait takes it, the later one's end is next
    assert [fut for _cmds, fut in turns.rides()] == [sooner]
    assert turns.ride_due() == 1007.0
    later.cancel()  # its chore went on its own
    assert turns.ride_due() == float("inf")
