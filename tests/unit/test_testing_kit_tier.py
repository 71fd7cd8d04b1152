"""scheduler.testing does the tier's and the worker's work as production does it: rate-limit tokens,
dead-letter retention and queue retirement reach the tick; a sync handler's timeout fails the
attempt as on a worker; relative reschedule and requeue times follow the stack's clock (Redis's)."""
from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

from scheduler import JobState
from scheduler.testing import TestStack
from workers import Job, PermanentError, Worker

T0 = datetime(2025, 1, 6, 12, 0, tzinfo=UTC)


def test_a_queue_limited_to_n_per_second_fires_at_most_n_in_any_second_of_an_advance() -> None:
    worker = Worker(namespace="app")
    started: list[int] = []  # stack ms at which each job's handler ran (the clock stops when it fires)

    with TestStack(now=T0) as stack:
        clock = stack.clock
        assert clock is not None

        @worker.handler("mail")
        def send(job: Job) -> None:
            started.append(clock.ms)

        stack.client.set_rate_limit("mail", 4, burst=1)
        stack.client.schedule_many([(timedelta(seconds=1), i) for i in range(100)], queue="mail")
        t0 = clock.ms
        report = stack.advance(seconds=11, worker=worker)

        assert report.outcomes == ["ok"] * len(started)
        assert all(t >= t0 + 1000 for t in started)
        for t in started:  # every window of one second (starting at a run) holds at most 4 runs
            assert sum(1 for u in started if t <= u < t + 1000) <= 4, [u - t0 for u in started]
        # ... and the limit paces the herd instead of stopping it: 4/s from its due time on
        assert len(started) == 4 * 10 + 1
        assert len(stack.scheduled("mail")) == 100 - len(started), "the rest waits, held, still scheduled"


def test_a_rate_limit_without_a_worker_holds_jobs_until_advance_reaches_their_tokens() -> None:
    with TestStack(now=T0) as stack:
        stack.client.set_rate_limit("q", 2, burst=1)
        stack.client.schedule_many([(timedelta(seconds=1), i) for i in range(10)], queue="q")
        stack.advance(seconds=1)
        assert len(stack.ready("q")) == 1
        stack.advance(seconds=2)  # tokens at +1.5 s, +2 s, +2.5 s, +3 s
        assert len(stack.ready("q")) == 5 and len(stack.scheduled("q")) == 5


def test_a_dead_letter_retention_of_k_keeps_only_k_dead_jobs_after_advance() -> None:
    worker = Worker(namespace="app")

    @worker.handler("q")
    def refuse(job: Job) -> None:
        raise PermanentError(f"no {job.payload}")

    with TestStack(now=T0, partitions=1) as stack:
        stack.client.set_dead_retention(max_dead=3)
        stack.client.schedule_many([(timedelta(0), i) for i in range(7)], queue="q")
        assert stack.run_due(worker).outcomes == ["permanent"] * 7
        assert len(stack.dead("q")) == 7, "the rule is applied by the tier's tick, not by the fail"
        stack.advance(seconds=1)
        assert len(stack.dead("q")) == 3


def test_a_dead_letter_ttl_drops_dead_jobs_older_than_it() -> None:
    worker = Worker(namespace="app")

    @worker.handler("q")
    def refuse(job: Job) -> None:
        raise PermanentError("no")

    with TestStack(now=T0) as stack:
        stack.client.set_dead_retention(dead_ttl=3600)
        old = stack.client.schedule(timedelta(0), "old", queue="q")
        stack.run_due(worker)
        stack.advance(minutes=30)
        young = stack.client.schedule(timedelta(0), "young", queue="q")
        stack.run_due(worker)
        stack.advance(minutes=31)
        assert [j.id for j in stack.dead("q")] == [young]
        assert stack.get(old) is None


def test_an_idle_queue_name_is_retired_as_the_tier_would() -> None:
    worker = Worker(namespace="app")

    @worker.handler("once")
    def handle(job: Job) -> None:
        pass

    with TestStack(now=T0) as stack:
        stack.client.set_queue_retirement(60)
        stack.client.schedule(timedelta(0), "x", queue="once")
        assert stack.run_due(worker).outcomes == ["ok"]
        stack.advance(seconds=30)
        assert "once" in stack.queues()
        stack.advance(seconds=31)
        assert "once" not in stack.queues()


def test_a_sync_handler_past_its_timeout_fails_as_a_timeout_with_backoff() -> None:
    worker = Worker(namespace="app", concurrency=1)
    release = threading.Event()
    attempts: list[int] = []

    @worker.handler("slow", timeout=0.05)
    def slow(job: Job) -> None:
        attempts.append(job.attempt)
        if job.attempt == 1:
            release.wait(30)  # stuck until the test lets it go

    with TestStack(now=T0, seed=3) as stack:
        jid = stack.client.schedule(timedelta(0), "x", queue="slow", backoff=(10, 60))
        report = stack.run_due(worker)
        [run] = report.runs
        assert (run.outcome, run.result) == ("timeout", "retry_scheduled")
        assert 0 <= run.delay_ms <= 20_000
        info = stack.assert_state(jid, "scheduled")
        assert info.last_error is not None and info.last_error.type == "HandlerTimeout"
        assert "did not finish within 0.05 s" in info.last_error.message
        assert info.run_at == stack.now + timedelta(milliseconds=run.delay_ms)
        release.set()  # the abandoned thread returns; its result is ignored
        assert stack.advance(seconds=61, worker=worker).outcomes == ["ok"]
        assert attempts == [1, 2] and stack.assert_state(jid, "done").attempts == 2


def test_a_timed_out_sync_handler_keeps_its_slot_until_its_thread_returns() -> None:
    worker = Worker(namespace="app", concurrency=2)
    release = threading.Event()
    still_ready: dict[str, list[str]] = {}

    with TestStack(now=T0) as stack:
        @worker.handler("q", timeout=0.05)
        def handle(job: Job) -> None:
            if job.payload == "stuck":
                release.wait(30)
            else:  # what the claim left on the ready list while this one runs
                still_ready[job.payload] = [j.payload for j in stack.ready("q")]

        stuck = stack.client.schedule(timedelta(0), "stuck", queue="q", max_attempts=1)
        assert stack.run_due(worker).outcomes == ["timeout"]
        stack.client.schedule_many([(timedelta(0), "a"), (timedelta(0), "b")], queue="q")
        assert stack.run_due(worker).outcomes == ["ok", "ok"]
        assert still_ready == {"a": ["b"], "b": []}, "one slot of two is held: one job per claim"
        release.set()
        [thread] = [t for t in threading.enumerate() if t.name == f"zsched-handler-{stuck}"]
        thread.join()
        stack.client.schedule_many([(timedelta(0), "c"), (timedelta(0), "d")], queue="q")
        assert stack.run_due(worker).outcomes == ["ok", "ok"]
        assert still_ready["c"] == [], "the thread returned: both slots are free again"


def test_a_sync_handler_that_finishes_in_time_keeps_its_own_outcome() -> None:
    worker = Worker(namespace="app")

    @worker.handler("q", timeout=5)
    def handle(job: Job) -> None:
        raise ValueError("bad input")

    with TestStack(now=T0) as stack:
        stack.client.schedule(timedelta(0), "x", queue="q", max_attempts=1)
        [run] = stack.run_due(worker).runs
        assert (run.outcome, run.result, type(run.error)) == ("failed", "dead", ValueError)


async def test_a_sync_handler_timeout_is_enforced_in_async_tests_without_blocking_the_loop() -> None:
    worker = Worker(namespace="app")
    release = threading.Event()

    @worker.handler("q", timeout=0.05)
    def stuck(job: Job) -> None:
        release.wait(30)

    with TestStack(now=T0) as stack:
        stack.client.schedule(timedelta(0), "x", queue="q")
        ticks = 0

        async def count() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        counter = asyncio.ensure_future(count())
        report = await stack.run_due_async(worker)
        counter.cancel()
        release.set()
        assert report.outcomes == ["timeout"] and ticks > 1


def test_relative_reschedule_and_requeue_times_follow_the_stack_clock() -> None:
    worker = Worker(namespace="app")

    @worker.handler("q")
    def refuse(job: Job) -> None:
        if job.payload == "dies":
            raise PermanentError("no")

    with TestStack(now=T0) as stack:
        stack.now = T0 + timedelta(days=3)  # far from the host's clock: a host-resolved time would show
        moved = stack.client.schedule(timedelta(hours=1), "moved", queue="q")
        assert stack.client.reschedule(moved, timedelta(hours=2))
        assert stack.get(moved).run_at == stack.now + timedelta(hours=2)
        dead = stack.client.schedule(timedelta(0), "dies", queue="q")
        stack.run_due(worker)
        assert stack.client.requeue(dead, at=timedelta(minutes=5))
        info = stack.assert_state(dead, "scheduled")
        assert info.run_at == stack.now + timedelta(minutes=5) and info.attempts == 0
        assert [r.job_id for r in stack.advance(hours=2, worker=worker)] == [dead, moved]


async def test_the_async_client_resolves_relative_reschedule_on_the_stack_clock() -> None:
    with TestStack(now=T0 + timedelta(days=3)) as stack:
        client = await stack.async_client()
        jid = await client.schedule(timedelta(hours=1), "x", queue="q")
        assert await client.reschedule(jid, timedelta(minutes=90))
        info = await client.get(jid)
        assert info is not None and info.state is JobState.SCHEDULED
        assert info.run_at == stack.now + timedelta(minutes=90)
