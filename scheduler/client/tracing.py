"""OpenTelemetry, optional (the ``otel`` extra: ``pip install -e '/path/to/zsched[otel]'``): the one
module that imports it.

A producer's ``schedule`` stores the trace context of its current span in the job
(:func:`current_trace`); a worker runs each attempt inside a CONSUMER span named ``process
QUEUE`` (:func:`start_attempt`), the first attempt a child of the producer's span, a retry a new
trace linked to it. Without the ``opentelemetry-api`` package every function here is a constant
answer, and with it but no active span ``schedule`` pays one check. docs/tracing.md has the why.

It sits in the client layer, the lowest one both producers and workers import
(tests/unit/test_architecture.py).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..protocol.codec import TRACE_ID_BYTES
from ..protocol.tracecontext import trace_headers, trace_section

if TYPE_CHECKING:
    from opentelemetry.trace import Span

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the extra is not installed: no tracing, at no cost
    AVAILABLE = False
else:
    AVAILABLE = True

log = logging.getLogger("zsched.tracing")

SYSTEM = "zsched"
"""``messaging.system`` of zsched's spans."""
TRACER_NAME = "zsched"
"""The instrumentation scope of zsched's spans (what ``trace.get_tracer`` is given)."""


if AVAILABLE:
    _PROPAGATOR = TraceContextTextMapPropagator()
    _get_current_span = trace.get_current_span
    _TRACER = trace.get_tracer(TRACER_NAME)  # a proxy until the application installs a provider

    def current_trace() -> bytes | None:
        """The trace section (``protocol.tracecontext``) of the current span's context, None when
        no span is active: what ``schedule`` stores in the job it makes."""
        if not _get_current_span().get_span_context().is_valid:  # no active trace: the one check
            return None
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)  # the W3C propagator, whatever the global one is: W3C is stored
        parent = carrier.get("traceparent")
        return None if parent is None else trace_section(parent, carrier.get("tracestate"))

    _installed = False

    def provider_installed() -> bool:
        """True once the application installed a tracer provider (the SDK's): then a worker makes
        a span for every attempt, also of jobs scheduled outside any trace. About 1 us until then
        (the API reads the environment), so a worker asks at most once a second; a provider is
        installed once per process, so True is kept."""
        global _installed
        if not _installed:
            provider = trace.get_tracer_provider()
            _installed = not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
        return _installed
else:
    def current_trace() -> bytes | None:
        """None: without OpenTelemetry no trace is active."""
        return None

    def provider_installed() -> bool:
        """False: without OpenTelemetry no tracer provider can be installed."""
        return False


def attempt_attributes(queue: str, job_id: str, attempt: int, fence: int, namespace: str) -> dict[str, Any]:
    """The attributes of an attempt's span: the messaging semantic conventions' (``process``
    operation on the queue as destination, the job id as message id) and zsched's own."""
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": job_id,
        "zsched.attempt": attempt,
        "zsched.fence": fence,
    }
    if namespace:
        attrs["zsched.namespace"] = namespace
    return attrs


def start_attempt(queue: str, job_id: str, attempt: int, fence: int, namespace: str,
                  trace_bytes: bytes | None) -> Span | None:
    """Start the CONSUMER span of one attempt (None without OpenTelemetry). The first attempt is
    a child of the producer's span (``trace_bytes``, the job's trace section); a later one starts
    a new trace with a link to it, so a job retried over hours does not stretch one trace."""
    if not AVAILABLE:
        return None
    attrs = attempt_attributes(queue, job_id, attempt, fence, namespace)
    parent = otel_context.Context()  # never the worker's own current context
    links = None
    # The schedule script admits only well-formed sections; one written around it (a direct write)
    # reads as no context: telemetry never stops a job from running.
    if trace_bytes is not None and len(trace_bytes) >= TRACE_ID_BYTES:
        producer = _PROPAGATOR.extract(trace_headers(trace_bytes))
        context = trace.get_current_span(producer).get_span_context()
        if not context.is_valid:
            pass  # the propagator found no W3C context in it: a root span, as for an untraced job
        elif attempt <= 1:
            parent = producer
        else:
            links = [trace.Link(context, {"zsched.link": "producer"})]
    try:
        return _TRACER.start_span(f"process {queue}", context=parent, kind=trace.SpanKind.CONSUMER,
                                  attributes=attrs, links=links)
    except Exception:  # a tracing SDK's failure must not stop the job: it runs untraced
        log.exception("starting the span of job %s (queue %r, attempt %d) failed", job_id, queue, attempt)
        return None


def enter(span: Span) -> object:
    """Make ``span`` the current one (for the handler's own spans); returns the token for :func:`leave`."""
    return otel_context.attach(trace.set_span_in_context(span))


def leave(token: object) -> None:
    """Undo :func:`enter`."""
    otel_context.detach(token)  # type: ignore[arg-type]


OUTCOMES_IN_ERROR = frozenset({"failed", "permanent", "timeout"})
"""Attempt outcomes whose span ends with status ERROR; the others (ok, retry, skipped, released)
leave it unset, as the semantic conventions ask of a span that did not fail."""


def end_attempt(span: Span, outcome: str, exc: BaseException | None = None, error_type: str | None = None,
                dead: bool = False, extra: Mapping[str, Any] | None = None) -> None:
    """End an attempt's span with its outcome (``zsched.outcome``); a failure records the
    exception and sets status ERROR and ``error.type``; ``dead``: the job was dead-lettered. An
    error of the tracing SDK is logged, never raised: the outcome is reported to Redis all the same."""
    try:
        _end(span, outcome, exc, error_type, dead, extra)
    except Exception:
        log.exception("ending an attempt's span (outcome %s) failed", outcome)


def _end(span: Span, outcome: str, exc: BaseException | None, error_type: str | None, dead: bool,
         extra: Mapping[str, Any] | None) -> None:
    span.set_attribute("zsched.outcome", outcome)
    if dead:
        span.set_attribute("zsched.dead_lettered", True)
    if extra:
        span.set_attributes(extra)
    if outcome in OUTCOMES_IN_ERROR:
        if exc is not None:
            span.record_exception(exc)
        etype = error_type or (type(exc).__qualname__ if exc is not None else outcome)
        span.set_attribute("error.type", etype)
        description = f"{etype}: {exc}" if exc is not None else etype
        span.set_status(trace.Status(trace.StatusCode.ERROR, description[:200]))
    span.end()


def record_firing(namespace: str, partition: int, replica: str, fired: int, moved: int, lateness_max_ms: int,
                  start_ns: int, end_ns: int) -> None:
    """Record one firing tick of the scheduler tier as an INTERNAL span ``fire NAMESPACE`` from
    ``start_ns`` to ``end_ns`` (epoch ns): ``fired`` jobs made ready (``messaging.batch.message_count``),
    ``moved`` timers taken, the latest job's lateness. Recorded only once a tracer provider is
    installed (e.g. by ``opentelemetry-instrument``); the replica samples which ticks it records
    (``zsched scheduler --trace-firing``). An error of the tracing SDK is logged, never raised."""
    if not provider_installed():
        return
    attrs: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.batch.message_count": fired,
        "zsched.namespace": namespace,
        "zsched.partition": partition,
        "zsched.replica": replica,
        "zsched.timers_moved": moved,
        "zsched.lateness_max_ms": lateness_max_ms,
    }
    try:
        span = _TRACER.start_span(f"fire {namespace}", context=otel_context.Context(),
                                  kind=trace.SpanKind.INTERNAL, attributes=attrs, start_time=start_ns)
        span.end(end_time=end_ns)
    except Exception:
        log.exception("recording the firing span of partition %d failed", partition)

