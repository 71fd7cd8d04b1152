"""A number too large for a float (a 400-digit int) is refused like any value out of range:
ValueError (TypeError where the setting already refuses non-finite numbers so), never the
OverflowError that converting it raises. Every setting that takes seconds or a count checks it."""
from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from scheduler import Client, JobOptions
from scheduler.client.settings import rate_limit_fields, retention_fields
from scheduler.protocol.timeutil import to_ms
from scheduler.redisio.connection import sync_redis
from workers import Retry
from workers.options import WorkerOptions

HUGE = 10**400


def _client(**kw: Any) -> Client:
    return Client(sync_redis("redis://127.0.0.1:1/0"), **kw)  # checks its arguments; sends nothing


@pytest.mark.parametrize("make, error, says", [
    (lambda: JobOptions(lease=HUGE), ValueError, "lease must be a finite number, got 1000"),
    (lambda: JobOptions(jitter=HUGE), ValueError, "jitter must be a finite number"),
    (lambda: JobOptions(backoff=(1, HUGE)), ValueError, "backoff cap must be a finite number"),
    (lambda: JobOptions(misfire="skip", misfire_grace=-HUGE), ValueError, "misfire_grace must be a finite number"),
    (lambda: WorkerOptions(shutdown_grace=HUGE), ValueError, "shutdown_grace must be a finite number"),
    (lambda: WorkerOptions(idle_sweep=HUGE), ValueError, "idle_sweep must be a finite number"),
    (lambda: WorkerOptions(handler_timeouts={"q": HUGE}), ValueError, r"handler_timeouts\['q'\] must be a finite"),
    (lambda: WorkerOptions(metrics_port=HUGE), ValueError, "metrics_port must be a TCP port number from 1 to 65535"),
    (lambda: Retry(HUGE), TypeError, "Retry delay must be a finite number of seconds"),
    (lambda: _client(durable="replica", durable_timeout=HUGE), ValueError, "durable_timeout must be > 0"),
    (lambda: rate_limit_fields("q", HUGE, None), ValueError, "per_second must be a finite number"),
    (lambda: retention_fields(None, HUGE), ValueError, "dead_ttl must be a finite number"),
    (lambda: to_ms(HUGE), ValueError, "at must be between 1970-01-01 and 9999-12-31 UTC, got 1000"),
], ids=["lease", "jitter", "backoff", "misfire_grace", "shutdown_grace", "idle_sweep", "handler_timeouts",
        "metrics_port", "Retry", "durable_timeout", "rate", "dead_ttl", "at"])
def test_a_number_beyond_any_float_is_refused_as_out_of_range(make: Callable[[], object], error: type[Exception],
                                                              says: str) -> None:
    with pytest.raises(error, match=says) as err:
        make()
    assert not isinstance(err.value, OverflowError)
    assert len(str(err.value)) < 300, "the number is not quoted whole"


@pytest.mark.parametrize("port", [0, -1, 65536, True, 80.0, "9100"])
def test_a_metrics_port_of_the_library_is_checked_like_the_cli_one(port: object) -> None:
    with pytest.raises(ValueError, match="metrics_port must be a TCP port number from 1 to 65535"):
        WorkerOptions(metrics_port=port)  # type: ignore[arg-type]


@pytest.mark.parametrize("move, says", [
    (lambda c, s: c.advance(1e308), "cannot advance the clock by 1e\\+308 s: it would pass 9999-12-31 UTC"),
    (lambda c, s: c.advance(math.inf), "delta must be finite"),
    (lambda c, s: c.advance(HUGE), "delta must be a finite number"),
    (lambda c, s: c.set(HUGE), "the clock's time must be between 1970-01-01 and 9999-12-31 UTC"),
    (lambda c, s: c.set(-1e308), "the clock's time must be between 1970-01-01 and 9999-12-31 UTC"),
    (lambda c, s: s.advance(1e308), "advance\\(\\) takes a finite number of seconds up to timedelta.max"),
    (lambda c, s: s.advance(timedelta.max), "would move the clock past 9999-12-31 UTC"),
], ids=["advance 1e308", "advance inf", "advance huge int", "set huge int", "set -1e308", "stack 1e308",
        "stack timedelta.max"])
def test_the_testing_kits_clock_refuses_times_out_of_range(move: Callable[[Any, Any], object], says: str) -> None:
    from scheduler.testing import TestStack
    from scheduler.testing.clock import FakeClock

    clock, stack = FakeClock(0), TestStack()
    with pytest.raises(ValueError, match=says):
        move(clock, stack)
    assert clock.ms == 0, "a refused move leaves the clock where it was"
