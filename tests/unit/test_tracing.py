"""A job's trace context (docs/tracing.md) without servers: the record's trace section, what
``schedule`` stores from the current span on the production scripts (fakeredis), what the
scripts refuse, and zsched working with OpenTelemetry absent."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import fakeredis
import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from scheduler import Client
from scheduler.client import tracing
from scheduler.protocol import codec
from scheduler.protocol.errors import ZschedError
from scheduler.protocol.tracecontext import TraceContextError, trace_headers, trace_section
from scheduler.testing.transitions import Ops

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
SPAN_ID = 0x00F067AA0BA902B7
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def client() -> Iterator[Client]:
    c = Client(fakeredis.FakeRedis(), namespace="tr", partitions=2)
    yield c
    c.close()


def producer_span(state: TraceState | None = None) -> trace.Span:
    """An active producer span without any tracer provider (what an instrumented request has)."""
    return NonRecordingSpan(SpanContext(TRACE_ID, SPAN_ID, is_remote=False, trace_flags=TraceFlags(1),
                                        trace_state=state))


# --------------------------------------------------------------------------- the trace section

def test_a_traceparent_packs_to_25_bytes_and_back() -> None:
    section = trace_section(TRACEPARENT)
    assert len(section) == codec.TRACE_ID_BYTES == 25
    assert trace_headers(section) == {"traceparent": TRACEPARENT}
    with_state = trace_section(TRACEPARENT, "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
    assert trace_headers(with_state) == {"traceparent": TRACEPARENT,
                                         "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"}


def test_a_tracestate_too_long_loses_members_from_the_right_until_it_fits() -> None:
    members = [f"k{i:02d}=" + "v" * 20 for i in range(20)]  # 24 bytes each, 499 in all
    section = trace_section(TRACEPARENT, ",".join(members))
    state = trace_headers(section)["tracestate"]
    assert len(section) <= 255 and len(state) <= codec.MAX_TRACESTATE
    assert state == ",".join(members[:len(state.split(","))]), "kept the leftmost members, whole"


@pytest.mark.parametrize("bad", [
    "", "garbage", TRACEPARENT.upper(), TRACEPARENT[:-1], TRACEPARENT + "-extra",
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
])
def test_a_traceparent_that_is_not_w3c_is_refused_saying_the_format(bad: str) -> None:
    with pytest.raises(TraceContextError, match="traceparent"):
        trace_section(bad)


def test_a_later_traceparent_version_is_read_by_its_first_four_fields() -> None:
    later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next"
    assert trace_headers(trace_section(later)) == {"traceparent": TRACEPARENT}


def test_a_record_carries_its_trace_section_between_the_options_and_the_payload() -> None:
    payload = codec.pack_payload({"a": 1}, 1000)
    section = trace_section(TRACEPARENT, "k=v")
    plain = codec.build_record(payload, max_attempts=3, created_s=1, key="k1", backoff_base_ms=5, backoff_cap_ms=9)
    rec = codec.build_record(payload, max_attempts=3, created_s=1, key="k1", backoff_base_ms=5, backoff_cap_ms=9,
                             trace=section)
    assert len(rec) - len(plain) == 1 + len(section), "the section's bytes, counted in the record (W2)"
    got = codec.decode_record(rec)
    assert got.trace == section and got.payload_bytes == payload and got.key == "k1" and got.backoff_base_ms == 5
    assert codec.decode_record(plain).trace is None
    with pytest.raises(ValueError, match="trace"):
        codec.split_template(codec.build_record(payload, max_attempts=1, created_s=1, trace=section))


# --------------------------------------------------------------------------- schedule, on the scripts

def test_schedule_stores_the_active_spans_context_and_the_claim_hands_it_back(client: Client) -> None:
    with trace.use_span(producer_span(TraceState([("vendor", "x1")])), end_on_exit=False):
        one = client.schedule(timedelta(0), {"n": 1})
        many = client.schedule_many([(timedelta(0), {"n": 2}), (timedelta(0), {"n": 3})])
    claimed = {c.raw_id: c for c in Ops(client).claim("default", 10)}
    assert len(claimed) == 3
    for c in claimed.values():
        assert c.record is not None and c.record.trace is not None
        assert trace_headers(c.record.trace) == {"traceparent": TRACEPARENT, "tracestate": "vendor=x1"}
    assert {client.get(j).payload["n"] for j in [one, *many]} == {1, 2, 3}  # type: ignore[union-attr]


def test_schedule_stores_no_trace_context_without_an_active_span(client: Client) -> None:
    assert tracing.current_trace() is None
    client.schedule(timedelta(0), 1)
    client.schedule_many([(timedelta(0), 2)])
    claimed = Ops(client).claim("default", 10)
    assert len(claimed) == 2 and all(c.record is not None and c.record.trace is None for c in claimed)
    assert all(not c.raw_record[4] & codec.F_TRACE for c in claimed)


def test_the_schedule_script_refuses_a_bad_trace_section_and_writes_nothing(client: Client) -> None:
    calls = client.calls
    good = calls.prepare_one(timedelta(minutes=5), None, None, client_default_options(), trace_section(TRACEPARENT))
    name, keys, args = good
    blob = args[-3]
    assert isinstance(blob, bytes) and blob[15 + 4] & codec.F_TRACE
    at = blob.index(trace_section(TRACEPARENT)) - 1  # the section's length byte
    zero_trace = blob[:at + 1] + bytes(16) + blob[at + 17:]
    bad_char = blob[:at] + bytes((26,)) + blob[at + 1:at + 26] + b"\x01" + blob[at + 26:]
    too_short = blob[:at] + bytes((24,)) + blob[at + 1:]
    for bad in (zero_trace, bad_char, too_short):
        with pytest.raises(ZschedError, match="trace section is a W3C trace context"):
            client.transport.call(name, keys, [*args[:-3], bad, *args[-2:]])
    assert client.stats() == {} or client.stats().get("default", {}).get("scheduled", 0) == 0
    client.transport.call(*good)
    assert client.stats()["default"]["scheduled"] == 1


def client_default_options():  # type: ignore[no-untyped-def]
    from scheduler.protocol.options import DEFAULT_OPTIONS
    return DEFAULT_OPTIONS


# --------------------------------------------------------------------------- without OpenTelemetry

NO_OTEL = textwrap.dedent("""
    import sys
    from datetime import timedelta
    sys.modules["opentelemetry"] = None  # as if the extra were not installed: every import of it fails

    import fakeredis
    from scheduler import Client
    from scheduler.client import tracing
    from scheduler.testing.transitions import Ops
    import workers  # the worker runtime imports too

    assert not tracing.AVAILABLE and tracing.current_trace() is None and not tracing.provider_installed()
    assert tracing.start_attempt("q", "id", 1, 1, "ns", None) is None
    client = Client(fakeredis.FakeRedis(), namespace="no", partitions=1)
    client.schedule(timedelta(0), {"n": 1})
    (job,) = Ops(client).claim("default", 1)
    assert job.record.trace is None
    assert not any(m == "opentelemetry" or m.startswith("opentelemetry.") for m in sys.modules if sys.modules[m])
    print("ok")
""")


def test_zsched_schedules_and_claims_with_opentelemetry_absent() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", NO_OTEL], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# --------------------------------------------------------------------------- the worker's side

def test_an_attempt_of_a_traced_job_continues_the_producers_context() -> None:
    section = trace_section(TRACEPARENT)
    first = tracing.start_attempt("q", "id", 1, 7, "ns", section)
    # without a tracer provider the API's no-op span carries its parent's context; with one (the
    # integration tests install the SDK's in this process) it is a child: the same trace either way
    assert first is not None and first.get_span_context().trace_id == TRACE_ID
    assert getattr(first, "parent", None) is None or first.parent.span_id == SPAN_ID  # type: ignore[attr-defined]
    retry = tracing.start_attempt("q", "id", 2, 8, "ns", section)
    assert retry is not None and retry.get_span_context().trace_id != TRACE_ID, "a retry is not the producer's child"
    for span in (first, retry):
        span.end()


@pytest.mark.parametrize("section", [b"\x01\x02", bytes(25), bytes(16) + b"\x01" * 9])
def test_a_malformed_trace_section_starts_an_untraced_attempt_instead_of_failing_the_job(section: bytes) -> None:
    span = tracing.start_attempt("q", "id", 1, 7, "ns", section)
    assert span is not None and getattr(span, "parent", None) is None, "a root span (or none: no provider)"
    assert span.get_span_context().trace_id != TRACE_ID
    tracing.end_attempt(span, "failed", ValueError("x"), dead=True)


class BrokenSpan(NonRecordingSpan):
    """A span whose SDK fails at every call."""

    def set_attribute(self, key: str, value: object) -> None:
        raise RuntimeError("exporter queue is gone")


def test_an_error_of_the_tracing_sdk_is_logged_and_never_reaches_the_job(caplog: pytest.LogCaptureFixture) -> None:
    tracing.end_attempt(BrokenSpan(SpanContext(TRACE_ID, SPAN_ID, is_remote=False)), "ok")
    assert "ending an attempt's span (outcome ok) failed" in caplog.text
