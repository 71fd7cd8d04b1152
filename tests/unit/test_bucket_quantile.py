"""Quantiles of the replicas' lateness histogram as ``zsched dev`` shows them: interpolated inside a
bucket, and past the top bucket (jobs overdue since the stack was stopped, fired at its start) shown
as "over 300 s", not as a measured 300000.0 ms."""
from __future__ import annotations

import math

from scheduler.metrics import LATENESS_BUCKETS, bucket_quantile, past_top
from scheduler.shell.dev_view import Sample, compact_line

INF = float("inf")


def cumulative(counts: dict[float, int]) -> list[tuple[float, float]]:
    """Cumulative (le, count) buckets over LATENESS_BUCKETS and +Inf from per-bucket counts."""
    out, total = [], 0.0
    for le in (*LATENESS_BUCKETS, INF):
        total += counts.get(le, 0)
        out.append((le, total))
    return out


def test_a_quantile_inside_the_buckets_is_interpolated_and_not_past_the_top() -> None:
    b = cumulative({0.001: 50, 0.002: 50})
    assert bucket_quantile(b, 0.5) == 0.001
    assert math.isclose(bucket_quantile(b, 0.99) or 0, 0.00198)
    assert not past_top(b, 0.5) and not past_top(b, 0.99)


def test_a_quantile_in_the_inf_bucket_is_past_the_top_and_only_that_one() -> None:
    b = cumulative({0.001: 98, INF: 2})  # 2 % of the jobs fired over 300 s late
    assert not past_top(b, 0.5) and not past_top(b, 0.98)
    assert past_top(b, 0.99)
    assert bucket_quantile(b, 0.99) == LATENESS_BUCKETS[-1]  # Prometheus' answer: the top bound


def test_no_observations_are_neither_a_quantile_nor_past_the_top() -> None:
    assert bucket_quantile([], 0.5) is None and not past_top([], 0.5)
    empty = cumulative({})
    assert bucket_quantile(empty, 0.5) is None and not past_top(empty, 0.99)


def test_the_dev_views_line_says_over_the_top_bound_instead_of_a_made_up_figure() -> None:
    s = Sample("18:55:15", {}, None, 0.0005, math.inf, {}, {}, [])
    line = compact_line(s)
    assert "lateness p50 0.5 ms p99 over 300 s;" in line
    assert "300000.0" not in line
