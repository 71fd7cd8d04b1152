"""The tier's wake-up grid and a busy partition's widened hand-off lead (scheduler/tier/coalesce.py)."""
from __future__ import annotations

import math

import pytest

from scheduler.tier.coalesce import (
    GRID_S,
    JOBS_PER_STEP,
    MIN_JOBS_PER_STEP,
    RATE_SPAN_S,
    RATE_WINDOW_S,
    HandoffLead,
    aligned_sleep,
    grid_step,
)
from scheduler.tier.runner import RunnerConfig

BASE, WIDEST = RunnerConfig.handoff_lead, 0.160  # zsched scheduler --coalesce-lead 160


def window(lead: HandoffLead, rate: float, at: float) -> float:
    """Feed ``lead`` one window of ticks at ``rate`` jobs/s (100 ticks); returns the time reached."""
    moved = rate * RATE_WINDOW_S
    for i in range(1, 101):
        lead.observe(round(moved * i / 100) - round(moved * (i - 1) / 100), at + RATE_WINDOW_S * i / 100)
    return at + RATE_WINDOW_S


def settle(lead: HandoffLead, rate: float, at: float = 100.0) -> float:
    """Feed ``lead`` ticks at ``rate`` jobs/s for as many windows as it has levels."""
    lead.observe(0, at)  # an idle tick first: a window starts at a tick (the first one, or its last change)
    for _ in lead.levels:
        at = window(lead, rate, at)
    return at


@pytest.mark.parametrize("now", [0.0, 1234.5671, 99999.00001])
@pytest.mark.parametrize("seconds", [0.0004, 0.0031, 0.01, 0.25])
@pytest.mark.parametrize("step", [0.0025, 0.01, 0.08])
def test_a_wake_up_lands_on_the_next_point_of_its_grid(now: float, seconds: float, step: float) -> None:
    wake = now + aligned_sleep(seconds, now, step)
    assert wake >= now + seconds - 1e-9
    assert wake < now + seconds + step + 1e-9
    assert math.isclose(wake / step, round(wake / step), abs_tol=1e-6)


def test_no_grid_without_a_hand_off_lead() -> None:
    assert grid_step(0.0) == 0.0
    assert aligned_sleep(0.0123, 55.5, 0.0) == 0.0123


def test_the_grid_step_is_at_most_half_the_lead() -> None:
    assert grid_step(0.020) == GRID_S == 0.010
    assert grid_step(0.005) == 0.0025
    assert grid_step(0.500) == GRID_S


def test_the_grids_of_all_levels_nest_so_partitions_on_different_leads_share_round_trips() -> None:
    lead = HandoffLead(BASE, WIDEST)
    steps = [grid_step(BASE) * lv / BASE for lv in lead.levels]
    for fine, coarse in zip(steps, steps[1:]):
        assert math.isclose(coarse / fine, 2.0)
    now = 777.7777
    for coarse in steps:
        wake = now + aligned_sleep(0.003, now, coarse)
        assert math.isclose(wake / steps[0], round(wake / steps[0]), abs_tol=1e-6)


def test_the_levels_double_from_the_configured_lead_up_to_the_ceiling() -> None:
    assert HandoffLead(0.020, 0.160).levels == pytest.approx([0.020, 0.040, 0.080, 0.160])
    assert HandoffLead(0.020, 0.300).levels == pytest.approx([0.020, 0.040, 0.080, 0.160])
    assert HandoffLead(0.005, 0.040).levels == pytest.approx([0.005, 0.010, 0.020, 0.040])


@pytest.mark.parametrize("base, widest", [(0.0, 0.160), (0.020, 0.020), (0.020, 0.0), (0.100, 0.160)])
def test_the_lead_never_widens_when_widening_is_off(base: float, widest: float) -> None:
    assert RunnerConfig.coalesce_lead == 0.0, "off unless asked for: the tier cannot see the workers' prefetch"
    lead = HandoffLead(base, widest)
    settle(lead, 300.0)
    settle(lead, 19.0, 200.0)
    assert lead.lead == base and not lead.widened
    assert lead.step == grid_step(base)


@pytest.mark.parametrize("rate, want", [
    (0.0, 0.020),     # idle
    (5.0, 0.020),     # quiet: even the widest step would hold under half a job
    (19.0, 0.160),    # 300 jobs/s over 16 partitions: two per step needs 105 ms of step, capped
    (40.0, 0.160),    # a 50 ms step holds 2; the next level up (80 ms step) is where it fits
    (62.5, 0.080),    # 1 000 jobs/s over 16 partitions: a 40 ms step holds 2.5
    (150.0, 0.040),   # a 20 ms step holds 3
    (250.0, 0.020),   # a 10 ms step already holds 2.5: no need to hand off earlier
    (5000.0, 0.020),
])
def test_a_partition_takes_the_narrowest_lead_whose_step_holds_a_few_jobs(rate: float, want: float) -> None:
    lead = HandoffLead(BASE, WIDEST)
    assert lead.choose(rate) == pytest.approx(want)
    settle(lead, rate)
    assert lead.lead == pytest.approx(want)
    assert lead.step == pytest.approx(grid_step(BASE) * want / BASE)
    assert lead.widened == (want > BASE)


@pytest.mark.parametrize("rate", [0.5, 3.0, 12.0, 13.0, 19.0, 30.0, 62.5, 100.0, 199.0, 1000.0])
def test_a_job_is_always_handed_off_at_least_half_the_configured_lead_ahead(rate: float) -> None:
    # a tick hands off what is due within the lead; the partition wakes on its grid at most a step
    # after a timer entered the window: it is handed off at least lead - step ahead of its due time
    lead = HandoffLead(BASE, WIDEST)
    settle(lead, rate)
    assert lead.lead - lead.step >= BASE - grid_step(BASE) - 1e-12
    # the tick wakes wake_ahead before the next timer is due, rounded up to the grid: that timer is
    # handed off at least wake_ahead - step ahead, as much as an unwidened partition's
    assert lead.wake_ahead - lead.step >= BASE - grid_step(BASE) - 1e-12
    assert lead.wake_ahead <= lead.next_lead + 1e-12, "the tick reaches past the timer that woke it"
    if lead.widened:  # and each step then holds at least the minimum
        assert rate * lead.step >= MIN_JOBS_PER_STEP
        narrower = lead.lead / 2
        assert rate * grid_step(BASE) * narrower / BASE < JOBS_PER_STEP, "a narrower lead would do"


@pytest.mark.parametrize("base, widest", [(BASE, WIDEST), (0.100, 0.400), (0.005, 0.040), (0.0, 0.0), (BASE, 0.0)])
def test_an_unwidened_partition_wakes_a_whole_lead_ahead_of_its_next_timer(base: float, widest: float) -> None:
    lead = HandoffLead(base, widest)
    assert lead.wake_ahead == pytest.approx(base)
    lead.look_ahead(10_000, 10_000)  # a burst next: the burst lead, as before
    assert lead.wake_ahead == pytest.approx(lead.next_lead)


@pytest.mark.parametrize("base, widest", [(BASE, WIDEST), (0.100, 0.400), (0.005, 0.040)])
def test_a_widened_partition_wakes_later_and_its_tick_reaches_further_past_the_timer(base: float,
                                                                                    widest: float) -> None:
    # The tick wakes on the grid at most a step after wake_ahead before the timer and hands off what
    # is due within the lead: its window ends lead - wake_ahead to that plus a step past the timer.
    # Waking a whole lead ahead, the window ended at most a step past it (half a step on average),
    # which at 19 jobs/s and 160 ms held 1.8 jobs per tick.
    lead = HandoffLead(base, widest)
    settle(lead, base / (grid_step(base) * widest))  # the widest step holds 1 job on average: the ceiling
    assert lead.lead == pytest.approx(widest), "widened to the ceiling"
    reach_min = lead.lead - lead.wake_ahead
    assert reach_min == pytest.approx(lead.lead - lead.step - base + grid_step(base))
    assert reach_min >= lead.step / 2 - 1e-12, "at least half a step past the timer, where it ended on average"
    assert lead.wake_ahead - lead.step == pytest.approx(base - grid_step(base)), "handed off as far ahead as unwidened"


def test_the_lead_widens_one_level_per_window() -> None:
    lead = HandoffLead(BASE, WIDEST)
    lead.observe(0, 100.0)
    seen = []
    at = 100.0
    for _ in range(5):
        at = window(lead, 19.0, at)
        seen.append(round(lead.lead, 3))
    assert seen == [0.040, 0.080, 0.160, 0.160, 0.160]


def test_the_lead_changes_at_most_once_per_window_and_returns_when_traffic_stops() -> None:
    lead = HandoffLead(BASE, WIDEST)
    at = settle(lead, 19.0)
    assert lead.lead == pytest.approx(0.160)
    assert not lead.observe(50, at + RATE_WINDOW_S / 2)  # a burst inside the window changes nothing yet
    assert lead.lead == pytest.approx(0.160)
    assert lead.observe(0, at + 20.0)  # then 19.9 quiet seconds (idle ticks): changed
    assert lead.lead == pytest.approx(BASE)  # 50 jobs over 20 s: 2.5/s, too few to widen
    assert lead.step == pytest.approx(grid_step(BASE))


def test_a_partition_whose_traffic_starts_reaches_its_level_within_a_second() -> None:
    # 300 jobs/s over 16 partitions begin: 20, 40, 80, 160 ms, a level per quarter-second window
    lead = HandoffLead(BASE, WIDEST)
    lead.observe(0, 100.0)
    at = 100.0
    while lead.lead < WIDEST:
        at = window(lead, 19.0, at)
    assert at - 100.0 == pytest.approx(3 * RATE_WINDOW_S) and at - 100.0 <= 1.0


def test_a_quiet_window_amid_steady_traffic_keeps_the_lead() -> None:
    # a quarter second with one job of a partition firing 19 jobs/s (one window in twenty): the
    # last second still asks for the widest level, so the lead stays (it would drop to 20 ms and
    # climb back over three windows)
    lead = HandoffLead(BASE, WIDEST)
    at = settle(lead, 19.0)
    assert lead.lead == pytest.approx(WIDEST)
    assert not lead.observe(1, at + RATE_WINDOW_S)
    assert lead.lead == pytest.approx(WIDEST)
    at = window(lead, 19.0, at + RATE_WINDOW_S)
    assert lead.lead == pytest.approx(WIDEST)


def test_the_lead_narrows_once_the_last_second_is_quiet_too() -> None:
    lead = HandoffLead(BASE, WIDEST)
    at = settle(lead, 19.0)
    changed_at = None
    for i in range(1, 13):  # idle ticks a quarter second apart (the partition's idle checks)
        if lead.observe(0, at + i * RATE_WINDOW_S):
            changed_at = i * RATE_WINDOW_S
            break
    assert lead.lead == pytest.approx(BASE)
    assert changed_at is not None and RATE_WINDOW_S < changed_at <= RATE_SPAN_S


def test_traffic_too_dense_for_a_wide_lead_narrows_it_at_once() -> None:
    # a partition at 160 ms whose rate jumps to 1 000 jobs/s: a 10 ms step already holds 2.5
    # jobs, and both the window and the last second say so at the next window's end
    lead = HandoffLead(BASE, WIDEST)
    at = settle(lead, 19.0)
    window(lead, 1000.0, at)
    assert lead.lead == pytest.approx(BASE)


def test_a_burst_at_one_instant_does_not_widen_the_lead() -> None:
    # batched traffic: 1 000 jobs in one tick is a high rate: the configured lead is narrow enough
    lead = HandoffLead(BASE, WIDEST)
    lead.observe(0, 10.0)
    lead.observe(1000, 10.001)
    lead.observe(0, 11.0)
    assert lead.lead == BASE


# ------------------------------------------------------------------- the burst lead (--burst-lead)

BURST = RunnerConfig.burst_lead


def test_a_burst_ahead_is_handed_off_with_the_burst_lead_and_the_next_tick_goes_back() -> None:
    assert BURST == 0.050 > BASE, "on by default, wider than the configured lead"
    lead = HandoffLead(BASE, 0.0, BURST)
    assert lead.next_lead == BASE  # nothing seen yet
    lead.look_ahead(10_000, 10_000)  # the fourth earliest timer due with the first: a burst
    assert lead.burst_ahead and lead.next_lead == BURST
    lead.look_ahead(10_000, 10_000 + round(grid_step(BASE) * 1000))  # within one grid step: one tick's worth
    assert lead.next_lead == BURST
    lead.look_ahead(10_000, 10_000 + round(grid_step(BASE) * 1000) + 1)  # spread: the usual lead
    assert not lead.burst_ahead and lead.next_lead == BASE
    for nothing in ((None, None), (10_000, None)):  # no timer left, or fewer than four
        lead.look_ahead(10_000, 10_000)
        lead.look_ahead(*nothing)
        assert lead.next_lead == BASE
    assert lead.step == grid_step(BASE), "the grid stays: partitions still share round trips"


@pytest.mark.parametrize("base, burst", [(0.0, 0.050), (0.020, 0.0), (0.050, 0.050), (0.080, 0.050)])
def test_no_burst_lead_when_it_is_off_or_not_wider_than_the_lead(base: float, burst: float) -> None:
    # --burst-lead 0, or at or below --handoff-lead; no hand-off lead at all: every job fires at its
    # due time, bursts too
    lead = HandoffLead(base, 0.0, burst)
    lead.look_ahead(10_000, 10_000)
    assert lead.next_lead == base


def test_a_widened_lead_wider_than_the_burst_lead_is_kept_for_bursts() -> None:
    lead = HandoffLead(BASE, WIDEST, BURST)
    settle(lead, 19.0)
    assert lead.lead == pytest.approx(0.160)
    lead.look_ahead(10_000, 10_000)
    assert lead.next_lead == pytest.approx(0.160), "a burst never gets a narrower lead than the partition has"
