"""How many due jobs a claim takes past its handler slots (workers/pace.py): as many as the
handlers are expected to start within half a claim's round trip, none for slow handlers, none
before the queue has been measured."""
from __future__ import annotations

import math

from workers.pace import ALPHA, WARM_UP, DuePace


def _warmed(queue: str, handler_s: float, round_trip_s: float, concurrency: int = 4) -> DuePace:
    pace = DuePace(concurrency)
    for _ in range(WARM_UP):
        pace.ran(queue, handler_s)
    pace.claimed(round_trip_s)
    return pace


def test_no_allowance_until_the_queue_and_the_round_trips_are_measured() -> None:
    pace = DuePace(4)
    assert pace.extra("q", 32) == 0
    for _ in range(WARM_UP - 1):
        pace.ran("q", 0.0001)
    pace.claimed(0.001)
    assert pace.extra("q", 32) == 0  # one handler short of the warm-up
    pace.ran("q", 0.0001)
    assert pace.extra("q", 32) == 20  # 4 x 1 ms x 0.5 / 0.1 ms


def test_quick_handlers_take_what_they_start_within_half_a_round_trip_at_most_the_prefetch_slots() -> None:
    pace = _warmed("q", 0.0001, 0.001)
    assert pace.extra("q", 32) == 20
    assert pace.extra("q", 5) == 5
    assert pace.extra("q", 0) == 0
    assert _warmed("q", 0.00001, 0.001).extra("q", 32) == 32


def test_handlers_slower_than_half_a_round_trip_over_the_concurrency_take_none() -> None:
    assert _warmed("q", 0.002, 0.001).extra("q", 32) == 1  # 4 x 1 ms x 0.5 / 2 ms
    assert _warmed("q", 0.0021, 0.001).extra("q", 32) == 0
    assert _warmed("q", 0.5, 0.001).extra("q", 32) == 0


def test_the_allowance_follows_a_queue_whose_handlers_slow_down_and_each_queue_has_its_own() -> None:
    pace = _warmed("fast", 0.0001, 0.001)
    for _ in range(WARM_UP):
        pace.ran("slow", 0.05)
    assert pace.extra("fast", 32) == 20 and pace.extra("slow", 32) == 0
    for _ in range(40):  # a moving average: within ~1 / ALPHA samples the new time dominates
        pace.ran("fast", 0.05)
    assert pace.extra("fast", 32) == 0
    assert math.isclose(pace.handler_s["slow"], 0.05)
    assert 0 < ALPHA < 1


def test_samples_that_are_not_times_are_ignored() -> None:
    pace = _warmed("q", 0.0001, 0.001)
    for bad in (math.nan, math.inf, -1.0):
        pace.ran("q", bad)
        pace.claimed(bad)
    assert pace.extra("q", 32) == 20
