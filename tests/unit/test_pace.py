"""How many due jobs a claim takes past its handler slots (workers/pace.py): as many as the
handlers are expected to start within half a claim's round trip, none for slow handlers, none
before the queue has been measured; how many jobs in all a claim asks for (early ones too), and
how many rings one bell wait takes."""
from __future__ import annotations

import math

from workers.pace import (
    ALPHA,
    EARLY_WAIT_S,
    RING_JOBS,
    SLOW_AFTER,
    TAKE_MAX,
    UNMEASURED_EARLY,
    WARM_UP,
    DuePace,
    rings_to_take,
)


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


def test_a_claim_asks_for_its_handler_slots_and_the_jobs_its_handlers_start_within_the_early_wait() -> None:
    """Early jobs are limited by the handlers' pace too (EARLY_WAIT_S), not by the prefetch slots
    alone: 100 ms handlers take their handler slots and about 2 more, however many prefetch
    slots are free."""
    slow = _warmed("q", 0.100, 0.001)
    assert slow.claim_size("q", 260, 4) == 4 + int(4 * EARLY_WAIT_S / 0.100)
    assert slow.claim_size("q", 260, 0) == max(1, int(4 * EARLY_WAIT_S / 0.100))
    assert _warmed("q", 1.0, 0.001).claim_size("q", 260, 0) == 1, "at least one: a claim still probes"
    quick = _warmed("q", 0.0001, 0.001)
    assert quick.claim_size("q", 260, 4) == 260  # 4 x 50 ms / 0.1 ms = 2 000 > 256 prefetch slots
    assert quick.claim_size("q", 10, 4) == 10, "never more than asked for"
    medium = _warmed("q", 0.005, 0.001)
    assert medium.claim_size("q", 260, 4) == 4 + int(4 * EARLY_WAIT_S / 0.005)
    # the early wait is a floor: with round trips longer than 2 x EARLY_WAIT_S, half a round trip
    assert _warmed("q", 0.005, 0.2).claim_size("q", 260, 4) == 4 + int(4 * 0.1 / 0.005)


def test_jobs_already_held_count_against_a_claims_early_jobs() -> None:
    """A worker with free handler slots keeps taking rings: what it holds already on prefetch
    slots counts, else its held jobs pile up past what its handlers start in time."""
    medium = _warmed("q", 0.005, 0.001)  # 40 early jobs within EARLY_WAIT_S
    allowed = int(4 * EARLY_WAIT_S / 0.005)
    assert medium.claim_size("q", 260, 4, held=allowed - 10) == 4 + 10
    assert medium.claim_size("q", 260, 4, held=allowed + 50) == 4, "never fewer than its handler slots"
    assert medium.claim_size("q", 260, 0, held=allowed + 50) == 1


def test_before_the_queue_is_measured_a_claim_takes_what_the_old_default_prefetch_allowed() -> None:
    pace = DuePace(4)
    assert not pace.measured("q")
    assert pace.claim_size("q", 260, 4) == 4 + UNMEASURED_EARLY
    assert pace.claim_size("q", 260, 4, held=UNMEASURED_EARLY - 2) == 4 + 2
    assert pace.claim_size("q", 260, 0, held=UNMEASURED_EARLY) == 1
    pace.claimed(0.001)
    for _ in range(WARM_UP - 1):
        pace.ran("q", 0.100)
    assert pace.claim_size("q", 260, 2) == 2 + UNMEASURED_EARLY
    pace.ran("q", 0.100)
    assert pace.measured("q") and pace.claim_size("q", 260, 2) == 2 + int(4 * EARLY_WAIT_S / 0.100)


def test_a_bell_wait_takes_one_ring_per_ring_jobs_of_room_up_to_take_max() -> None:
    quick = _warmed("q", 0.0001, 0.001)
    assert rings_to_take(quick, ["q"], 4, 256) == TAKE_MAX
    assert rings_to_take(quick, ["q"], 4, RING_JOBS * 2 - 4) == 2
    assert rings_to_take(quick, ["q"], 4, 0) == 1, "no prefetch room: one ring, as before"
    assert rings_to_take(_warmed("q", 0.005, 0.001), ["q"], 4, 256) == (4 + int(4 * EARLY_WAIT_S / 0.005)) // RING_JOBS
    assert rings_to_take(quick, ["q"], 4, 200, held=56) == TAKE_MAX, "held jobs count, but quick handlers have room"
    assert rings_to_take(_warmed("q", 0.100, 0.001), ["q"], 4, 256) == 1, "slow handlers: one at a time"
    assert rings_to_take(DuePace(4), ["q"], 4, 256) == 1, "not measured yet: one at a time"
    # several queues: the slowest decides (the rings of one wait may all be the slow queue's)
    both = _warmed("slow", 0.100, 0.001)
    for _ in range(WARM_UP):
        both.ran("fast", 0.0001)
    assert rings_to_take(both, ["fast"], 4, 256) == TAKE_MAX
    assert rings_to_take(both, ["slow", "fast"], 4, 256) == 1
    assert rings_to_take(both, [], 4, 256) == 1
