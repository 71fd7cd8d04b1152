"""Traces from producer to handler (docs/tracing.md) against a real redis-server, with in-process
workers and the OpenTelemetry SDK's in-memory exporter: the first attempt is a child of the
producer's span, a retry a new trace linked to it, the handler's own spans nest in its attempt's,
failures end in ERROR, and a job scheduled outside any trace carries no context."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from scheduler import Client
from scheduler.protocol import codec
from tests.support.waits import wait_for
from tests.support.workers import TierStandIn, serving
from workers import Job, PermanentError, Retry, Worker

EXPORTER = InMemorySpanExporter()


class Gate(SimpleSpanProcessor):
    """Exports to :data:`EXPORTER` only while a test of this module runs: a tracer provider is
    installed once per process, and the tests that run after these must not fill the exporter."""

    open = False

    def on_end(self, span: ReadableSpan) -> None:
        if Gate.open:
            super().on_end(span)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(Gate(EXPORTER))
        trace.set_tracer_provider(provider)
    EXPORTER.clear()
    Gate.open = True
    yield EXPORTER
    Gate.open = False
    EXPORTER.clear()


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    c = Client.from_url(redis_url, namespace="tr", partitions=2)
    yield c
    c.close()


def worker(url: str) -> Worker:
    return Worker.from_url(url, namespace="tr", concurrency=4, shutdown_grace=5.0)


def attempts(exporter: InMemorySpanExporter, job_id: str) -> list[ReadableSpan]:
    found = [s for s in exporter.get_finished_spans() if (s.attributes or {}).get("messaging.message.id") == job_id]
    return sorted(found, key=lambda s: (s.attributes or {})["zsched.attempt"])


async def test_the_first_attempt_is_a_child_of_the_producers_span_and_the_handlers_spans_nest_in_it(
        redis_url: str, client: Client, spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("app")
    w = worker(redis_url)

    @w.handler("mail")
    async def send(job: Job) -> None:
        with tracer.start_as_current_span("smtp"):
            pass

    with tracer.start_as_current_span("POST /signup", kind=SpanKind.SERVER) as request:
        jid = client.schedule(timedelta(0), {"to": "a"}, queue="mail")
    async with serving(w):
        await wait_for(lambda: len(attempts(spans, jid)) == 1, 10, what="the attempt's span")
        await wait_for(lambda: any(s.name == "smtp" for s in spans.get_finished_spans()), 5, what="the handler's span")
    (span,) = attempts(spans, jid)
    producer = request.get_span_context()
    assert span.name == "process mail" and span.kind is SpanKind.CONSUMER
    assert span.context is not None and span.context.trace_id == producer.trace_id
    assert span.parent is not None and span.parent.span_id == producer.span_id and not span.links
    attrs = dict(span.attributes or {})
    assert attrs["messaging.system"] == "zsched" and attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.destination.name"] == "mail" and attrs["messaging.message.id"] == jid
    assert attrs["zsched.attempt"] == 1 and isinstance(attrs["zsched.fence"], int) and attrs["zsched.fence"] >= 1
    assert attrs["zsched.outcome"] == "ok" and span.status.status_code is StatusCode.UNSET
    (smtp,) = [s for s in spans.get_finished_spans() if s.name == "smtp"]
    assert smtp.parent is not None and smtp.parent.span_id == span.context.span_id, "handler span nests in the attempt"


async def test_a_retry_is_a_new_trace_linked_to_the_producers_span_and_failures_end_in_error(
        redis_url: str, client: Client, spans: InMemorySpanExporter) -> None:
    tracer = trace.get_tracer("app")
    w = worker(redis_url)

    @w.handler("flaky")
    def handle(job: Job) -> None:  # a sync handler: its spans nest too (it runs in a pool thread)
        with tracer.start_as_current_span("inner"):
            if job.attempt == 1:
                raise ConnectionError("smtp down")
            if job.attempt == 2:
                raise Retry(0.01)
        raise PermanentError("bad address")

    with tracer.start_as_current_span("producer") as producer_span:
        jid = client.schedule(timedelta(0), None, queue="flaky", backoff=(0.01, 0.01))
    producer = producer_span.get_span_context()
    async with TierStandIn(redis_url, namespace="tr"), serving(w):
        await wait_for(lambda: len(attempts(spans, jid)) == 3, 15, what="three attempts' spans")
    first, second, third = attempts(spans, jid)
    assert first.context is not None and first.context.trace_id == producer.trace_id
    assert first.parent is not None and first.parent.span_id == producer.span_id
    for retry in (second, third):
        assert retry.context is not None and retry.context.trace_id != producer.trace_id, "a new trace"
        assert retry.parent is None, "a root span"
        (link,) = retry.links
        assert link.context.trace_id == producer.trace_id and link.context.span_id == producer.span_id
    a1, a2, a3 = (dict(s.attributes or {}) for s in (first, second, third))
    assert first.status.status_code is StatusCode.ERROR and a1["error.type"] == "ConnectionError"
    assert [e.name for e in first.events] == ["exception"]
    assert a1["zsched.outcome"] == "failed" and "zsched.dead_lettered" not in a1 and "zsched.retry_delay_ms" in a1
    assert a2["zsched.outcome"] == "retry" and second.status.status_code is StatusCode.UNSET
    assert third.status.status_code is StatusCode.ERROR and a3["zsched.dead_lettered"] is True
    assert a3["zsched.outcome"] == "permanent" and a3["error.type"] == "workers.errors.PermanentError"
    fences = [a["zsched.fence"] for a in (a1, a2, a3)]
    assert fences == sorted(set(fences)), "each attempt's fence is a new, larger token"
    inner = {s.parent.span_id for s in spans.get_finished_spans() if s.name == "inner" and s.parent is not None}
    assert inner == {s.context.span_id for s in (first, second, third) if s.context is not None}


async def test_a_job_scheduled_outside_any_trace_stores_no_context_and_its_attempt_is_a_root_span(
        redis_url: str, client: Client, spans: InMemorySpanExporter) -> None:
    r = redis.Redis.from_url(redis_url)
    assert not trace.get_current_span().get_span_context().is_valid
    jid = client.schedule(timedelta(hours=1), {"x": 1}, queue="plain")
    with trace.get_tracer("app").start_as_current_span("producer"):
        traced = client.schedule(timedelta(hours=1), {"x": 1}, queue="plain")
    members = {m[:15]: m[15:] for p in range(2) for m in r.zrange(f"{{tr:{p}}}:t", 0, -1)}
    r.close()
    plain_rec, traced_rec = members[client.calls.locate(jid)[0]], members[client.calls.locate(traced)[0]]
    assert not plain_rec[4] & codec.F_TRACE and codec.decode_record(plain_rec).trace is None
    assert len(traced_rec) - len(plain_rec) == 26, "25 bytes of context and a length byte, nothing when untraced"
    client.reschedule(jid, timedelta(0))
    w = worker(redis_url)
    done: asyncio.Event = asyncio.Event()

    @w.handler("plain")
    async def handle(job: Job) -> Any:
        done.set()

    async with serving(w):
        await wait_for(lambda: len(attempts(spans, jid)) == 1, 10, what="the attempt's span")
    (span,) = attempts(spans, jid)
    assert span.parent is None and not span.links, "a worker with a provider traces every attempt, as a root"


async def test_the_tier_records_the_share_of_its_firing_ticks_it_is_asked_to(
        redis_url: str, etcd_endpoint: str, spans: InMemorySpanExporter) -> None:
    """``zsched scheduler --trace-firing``: by default no tick is recorded; at 1.0 every tick that
    fires jobs is an INTERNAL span ``fire NAMESPACE`` (a root: no job's trace is stretched over it)
    naming the partition, the replica and how many jobs it fired."""
    from scheduler.tier import SchedulerConfig, SchedulerProcess
    from scheduler.tier.runner import RunnerConfig

    def fired(ns: str) -> list[ReadableSpan]:
        return [s for s in spans.get_finished_spans() if s.name == f"fire {ns}"]

    for ns, ratio in (("trf0", RunnerConfig.trace_firing), ("trf1", 1.0)):
        c = Client.from_url(redis_url, namespace=ns, partitions=2)
        runner = RunnerConfig(trace_firing=ratio)
        proc = SchedulerProcess(SchedulerConfig(redis_url=redis_url, etcd_endpoints=etcd_endpoint, namespace=ns,
                                                replica_id="r1", lease_ttl=2.0, runner=runner))
        task = asyncio.create_task(proc.run())
        try:
            ids = c.schedule_many([(timedelta(seconds=0.3), i) for i in range(5)])
            await wait_for(lambda c=c, ids=ids: all(c.get(j).state.value == "ready" for j in ids), 15,
                           what="the jobs fired")
        finally:
            proc.stop()
            await asyncio.wait_for(task, 10)
            c.close()
        if ratio == 0:
            assert fired(ns) == [], "no tick is recorded by default"
            continue
        got = fired(ns)
        assert sum(s.attributes["messaging.batch.message_count"] for s in got) == 5, got
        for s in got:
            assert s.kind is SpanKind.INTERNAL and s.parent is None and s.end_time >= s.start_time
            assert s.attributes["zsched.partition"] in (0, 1) and s.attributes["zsched.replica"] == "r1"
            assert s.attributes["messaging.system"] == "zsched" and s.attributes["zsched.namespace"] == ns
