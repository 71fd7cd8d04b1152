"""How many due jobs a claim takes past its handler slots (workers/pace.py): as many as the
handlers are expected to start within half a claim's round trip, none for slow handlers, none
before the queue has been measured."""
from __future__ import annotations

import math

from workers.pace import ALPHA, SLOW_AFTER, WARM_UP, DuePace


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


def test_handlers_are_judged_slow_after_two_runs_only_when_far_slower_than_the_claims() -> None:
    pace = DuePace(4)
    pace.claimed(0.001)
    pace.ran("q", 0.1)
    assert not pace.slow("q")  # one run is not a judgement
    for _ in range(SLOW_AFTER - 1):
        pace.ran("q", 0.1)
    assert pace.slow("q")  # 100 ms handlers against 1 ms claims: one listener could not keep up
    assert not DuePace(4).slow("q")  # nothing measured
    unmeasured_claims = DuePace(4)
    for _ in range(SLOW_AFTER):
        unmeasured_claims.ran("q", 0.1)
    assert not unmeasured_claims.slow("q")
    # the threshold: 4 x the allowance's (concurrency half round trips), 8 ms with 1 ms claims
    assert _warmed("q", 0.0081, 0.001).slow("q") and not _warmed("q", 0.0079, 0.001).slow("q")
    assert not _warmed("q", 0.0021, 0.001).slow("q")  # no allowance, yet far from slow
    assert not _warmed("q", 0.0001, 0.001).slow("q")


def test_a_queue_judged_slow_is_quick_again_once_its_handlers_speed_up() -> None:
    pace = _warmed("q", 0.1, 0.001)
    assert pace.slow("q") and not pace.slow("other")
    for _ in range(60):  # the moving average forgets the slow runs (ALPHA)
        pace.ran("q", 0.0001)
    assert not pace.slow("q")
