"""JobOptions: one frozen value, checked once; the keyword form is cached."""
from __future__ import annotations

import dataclasses

import pytest

from scheduler import JobOptions
from scheduler.protocol import codec
from scheduler.protocol.options import DEFAULT_OPTIONS, with_overrides


def test_defaults_and_the_values_sent_to_the_scripts() -> None:
    o = JobOptions()
    assert o == DEFAULT_OPTIONS
    assert (o.queue, o.max_attempts, o.lease, o.misfire, o.misfire_grace, o.backoff, o.jitter) == (
        "default", 5, 30.0, "run_late", None, None, 0.0)
    assert (o.lease_ms, o.misfire_skip, o.misfire_grace_ms, o.jitter_ms) == (30_000, False, 0, 0)
    assert (o.backoff_base_ms, o.backoff_cap_ms) == (codec.DEFAULT_BACKOFF_BASE_MS, codec.DEFAULT_BACKOFF_CAP_MS)
    skip = JobOptions(misfire="skip", lease=0.25, backoff=(0.5, 10), jitter=1.5)
    assert (skip.misfire_skip, skip.misfire_grace_ms, skip.lease_ms) == (True, 60_000, 250)
    assert (skip.backoff_base_ms, skip.backoff_cap_ms, skip.jitter_ms) == (500, 10_000, 1500)


def test_record_fields_are_what_a_record_is_built_from() -> None:
    o = JobOptions(max_attempts=3, misfire="skip", misfire_grace=5)
    rec = codec.decode_record(codec.build_record(b"\x01", created_s=0, **o.record_fields()))
    assert (rec.max_attempts, rec.misfire_skip, rec.misfire_grace_ms, rec.lease_ms) == (3, True, 5000, 30_000)


def test_frozen_hashable_and_equal_by_value() -> None:
    o = JobOptions(queue="emails", backoff=[1, 2])  # a list is kept as a tuple
    assert o.backoff == (1, 2)
    same = JobOptions(queue="emails", backoff=(1, 2))
    assert o == same and hash(o) == hash(same)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.queue = "other"  # type: ignore[misc]


@pytest.mark.parametrize("kwargs,exc,words", [
    ({"queue": "a b"}, ValueError, "queue"),
    ({"queue": 3}, TypeError, "queue must be a str"),
    ({"max_attempts": True}, TypeError, "max_attempts must be an int"),
    ({"max_attempts": 0}, ValueError, "from 1 to 255"),
    ({"max_attempts": 256}, ValueError, "from 1 to 255"),
    ({"lease": 0.01}, ValueError, "lease must be from 0.1"),
    ({"lease": float("nan")}, ValueError, "finite"),
    ({"misfire": "later"}, ValueError, "misfire must be one of"),
    ({"misfire_grace": 5}, ValueError, "only applies to misfire='skip'"),
    ({"misfire": "skip", "misfire_grace": -1}, ValueError, "misfire_grace must be from 0"),
    ({"backoff": (5,)}, TypeError, "pair"),
    ({"backoff": (10, 5)}, ValueError, "0 < base <= cap"),
    ({"jitter": -1}, ValueError, "jitter must be >= 0"),
])
def test_bad_options_say_what_is_wrong(kwargs: dict, exc: type[Exception], words: str) -> None:
    with pytest.raises(exc, match=words):
        JobOptions(**kwargs)


def test_keyword_options_override_the_base_and_are_cached() -> None:
    assert with_overrides(None, {}) is DEFAULT_OPTIONS
    base = JobOptions(queue="q", max_attempts=2)
    assert with_overrides(base, {}) is base
    a = with_overrides(base, {"lease": 5.0})
    assert a == JobOptions(queue="q", max_attempts=2, lease=5.0)
    assert with_overrides(base, {"lease": 5.0}) is a, "the same keywords are checked once"
    assert with_overrides(None, {"backoff": [1, 2]}).backoff == (1, 2), "unhashable values skip the cache"


def test_the_cache_tells_true_from_1_and_refuses_what_is_not_an_option() -> None:
    assert with_overrides(None, {"max_attempts": 1}).max_attempts == 1
    with pytest.raises(TypeError, match="max_attempts must be an int"):
        with_overrides(None, {"max_attempts": True})
    with pytest.raises(TypeError, match="queu"):
        with_overrides(None, {"queu": "x"})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(TypeError, match="options must be a JobOptions"):
        with_overrides({"queue": "x"}, {})  # type: ignore[arg-type]
