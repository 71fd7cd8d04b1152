"""scheduler.testing: an application's tests run zsched in-process, on fakeredis with a fake clock,
with the production scripts and the workers package's own outcome rules (no servers, no sleeping)."""
from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from scheduler import JobState
from scheduler.testing import TestStack
from workers import Job, PermanentError, Retry, Worker

T0 = datetime(2025, 1, 6, 12, 0, tzinfo=UTC)


def make_worker(queue: str = "q", fn: Any = None, **kw: Any) -> tuple[Worker, list[Job]]:
    """A worker whose handler on ``queue`` records each Job it gets, then calls ``fn(job)``."""
    worker = Worker(namespace="app", **kw)
    seen: list[Job] = []

    @worker.handler(queue)
    def handle(job: Job) -> None:
        seen.append(job)
        if fn is not None:
            fn(job)

    return worker, seen


@pytest.fixture
def stack() -> Any:
    with TestStack(now=T0) as s:
        yield s


def fail_twice(job: Job) -> None:
    if job.attempt < 3:
        raise RuntimeError(f"flaky {job.attempt}")


def test_a_handler_that_fails_twice_then_succeeds_runs_three_times_across_advances_with_its_backoff(
        stack: TestStack) -> None:
    worker, seen = make_worker(fn=fail_twice)
    jid = stack.client.schedule(timedelta(0), {"n": 1}, queue="q", backoff=(10, 300))
    first = stack.run_due(worker)
    assert first.outcomes == ["failed"] and first.runs[0].result == "retry_scheduled"
    d1 = first.runs[0].delay_ms
    assert 0 <= d1 <= 20_000  # full jitter: uniform in [0, min(cap, base * 2**attempt)]
    info = stack.assert_state(jid, "scheduled")
    assert info.run_at == stack.now + timedelta(milliseconds=d1) and info.last_error is not None
    assert info.last_error.message == "flaky 1"

    stack.advance(milliseconds=d1 - 1)
    assert len(stack.run_due(worker)) == 0, "not due before its backoff"
    stack.advance(milliseconds=1)
    second = stack.run_due(worker)
    assert second.outcomes == ["failed"] and 0 <= second.runs[0].delay_ms <= 40_000

    stack.advance(milliseconds=second.runs[0].delay_ms)
    assert stack.run_due(worker).outcomes == ["ok"]
    assert [j.attempt for j in seen] == [1, 2, 3] and {j.id for j in seen} == {jid}
    assert stack.assert_state(jid, "done").attempts == 3


def test_the_backoff_jitter_follows_the_stack_seed() -> None:
    delays = []
    for _ in range(2):
        with TestStack(now=T0, seed=42) as s:
            worker, _ = make_worker(fn=fail_twice)
            s.client.schedule(timedelta(0), None, queue="q", backoff=(10, 300))
            report = s.advance(minutes=5, worker=worker)
            delays.append([r.delay_ms for r in report])
    assert delays[0] == delays[1] and len(delays[0]) == 3


def test_a_job_with_one_attempt_that_raises_ends_dead_with_its_error(stack: TestStack) -> None:
    def boom(job: Job) -> None:
        raise ValueError(f"bad input {job.payload['id']}")

    worker, seen = make_worker(fn=boom)
    jid = stack.client.schedule(timedelta(0), {"id": 7}, queue="q", max_attempts=1)
    report = stack.run_due(worker)
    assert report.outcomes == ["failed"] and report.runs[0].result == "dead"
    assert isinstance(report.runs[0].error, ValueError)
    dead = stack.assert_dead("q", payload={"id": 7}, error="ValueError")
    assert dead.id == jid and dead.last_error is not None and dead.last_error.message == "bad input 7"
    assert "boom" in (dead.last_error.traceback or "")
    assert [d.id for d in stack.dead("q")] == [jid] and len(seen) == 1


def test_permanent_error_dead_letters_at_once_and_retry_waits_its_delay(stack: TestStack) -> None:
    def decide(job: Job) -> None:
        if job.payload == "permanent":
            raise PermanentError("cannot ever work")
        if job.attempt == 1:
            raise Retry(timedelta(seconds=30))

    worker, seen = make_worker(fn=decide)
    perm = stack.client.schedule(timedelta(0), "permanent", queue="q", max_attempts=5)
    retry = stack.client.schedule(timedelta(0), "retry", queue="q")
    report = stack.run_due(worker)
    assert sorted(report.outcomes) == ["permanent", "retry"]
    assert stack.assert_state(perm, "dead").attempts == 1
    stack.assert_scheduled("q", payload="retry", at=timedelta(seconds=30))
    assert stack.advance(seconds=30, worker=worker).outcomes == ["ok"]
    assert stack.assert_state(retry, "done").attempts == 2 and len(seen) == 3


def test_a_cron_every_15_minutes_fires_4_times_in_an_hour(stack: TestStack) -> None:
    worker, seen = make_worker(queue="reports")
    stack.client.add_cron("quarterly", "*/15 * * * *", {"kind": "sum"}, queue="reports")
    report = stack.advance(hours=1, worker=worker)
    assert report.outcomes == ["ok"] * 4
    assert [j.cron_nominal for j in seen] == [T0 + timedelta(minutes=15 * i) for i in (1, 2, 3, 4)]
    assert [j.run_at for j in seen] == [j.cron_nominal for j in seen]  # fired on time, not at the end
    assert all(j.payload == {"kind": "sum"} for j in seen)


def test_a_cron_fires_without_a_worker_and_waits_ready_until_one_runs(stack: TestStack) -> None:
    stack.client.add_cron("quarterly", "*/15 * * * *", None, queue="reports")
    stack.advance(hours=1)
    assert len(stack.ready("reports")) == 4
    worker, seen = make_worker(queue="reports")
    assert len(stack.run_due(worker)) == 4 and len(stack.ready("reports")) == 0


def test_a_cron_honours_its_time_zone_across_a_dst_change() -> None:
    # New York springs forward on 2025-03-09: 09:00 local is 14:00 UTC before, 13:00 UTC after.
    with TestStack(now=datetime(2025, 3, 7, 12, 0, tzinfo=UTC)) as stack:
        worker, seen = make_worker(queue="digest")
        stack.client.add_cron("digest", "0 9 * * *", None, queue="digest", tz="America/New_York")
        stack.advance(days=3, worker=worker)
        assert [j.run_at for j in seen] == [datetime(2025, 3, 7, 14, tzinfo=UTC), datetime(2025, 3, 8, 14, tzinfo=UTC),
                                            datetime(2025, 3, 9, 13, tzinfo=UTC)]


def test_reschedule_and_cancel_behave_as_in_production(stack: TestStack) -> None:
    worker, seen = make_worker()
    moved = stack.client.schedule(timedelta(hours=1), "moved", queue="q")
    gone = stack.client.schedule(timedelta(hours=1), "gone", queue="q")
    assert stack.client.reschedule(moved, stack.now + timedelta(hours=2))
    assert stack.client.cancel(gone)
    assert not stack.client.cancel(gone), "a second cancel changes nothing"
    stack.assert_state(gone, "cancelled")
    stack.assert_scheduled("q", payload="moved", at=timedelta(hours=2))
    assert len(stack.advance(hours=1, worker=worker)) == 0
    assert stack.advance(hours=1, worker=worker).outcomes == ["ok"]
    assert [j.payload for j in seen] == ["moved"]
    assert not stack.client.reschedule(moved, stack.now + timedelta(hours=1)), "a done job cannot move"


def test_a_lease_expiring_during_advance_causes_exactly_one_more_run(stack: TestStack) -> None:
    worker, seen = make_worker()
    jid = stack.client.schedule(timedelta(0), "x", queue="q", lease=30)
    crashed = stack.claim("q")  # a worker claims it and dies
    assert [c.raw_id for c in crashed] and stack.running("q")[0].id == jid
    assert len(stack.advance(seconds=29, worker=worker)) == 0, "the lease still holds"
    report = stack.advance(seconds=60, worker=worker)
    assert report.outcomes == ["ok"] and [j.attempt for j in seen] == [2]
    assert seen[0].run_at == T0 + timedelta(seconds=30), "reaped at its deadline, not at the end of the span"
    assert len(stack.advance(minutes=30, worker=worker)) == 0  # (within the 1 h tombstone ttl)
    done = stack.assert_state(jid, "done")
    assert done.attempts == 2 and done.last_error is not None and done.last_error.type == "LeaseExpired"


def test_a_lease_expiring_on_the_last_attempt_dead_letters_the_job(stack: TestStack) -> None:
    jid = stack.client.schedule(timedelta(0), "x", queue="q", lease=5, max_attempts=1)
    stack.claim("q")
    stack.advance(seconds=5)
    assert stack.assert_dead("q", error="LeaseExpired").id == jid


def test_jobs_of_a_queue_without_a_handler_are_dead_lettered_as_no_handler(stack: TestStack) -> None:
    worker, _ = make_worker(queue="a", queues=["a", "b"])
    stack.client.schedule(timedelta(0), 1, queue="b")
    assert stack.run_due(worker).outcomes == ["poison"]
    stack.assert_dead("b", error="NoHandler")


def test_two_stacks_have_independent_clocks_and_key_ttls_follow_each() -> None:
    with TestStack(now=T0) as a, TestStack(now=T0 + timedelta(days=1)) as b:
        a.redis.set("k", 1, px=1000)
        b.redis.set("k", 1, px=1000)
        a.advance(seconds=2)
        assert a.now == T0 + timedelta(seconds=2) and b.now == T0 + timedelta(days=1)
        assert a.redis.get("k") is None and b.redis.get("k") == b"1"
        secs, _ = b.redis.time()
        assert secs == int((T0 + timedelta(days=1)).timestamp())


def test_setting_now_jumps_without_firing_so_misfire_policies_apply(stack: TestStack) -> None:
    worker, seen = make_worker()
    skipped = stack.client.schedule(timedelta(minutes=1), "s", queue="q", misfire="skip", misfire_grace=60)
    late = stack.client.schedule(timedelta(minutes=1), "l", queue="q")
    stack.now = T0 + timedelta(hours=1)  # the tier was down for an hour
    assert stack.run_due(worker).outcomes == ["ok"]
    stack.assert_state(skipped, "misfired")
    assert stack.assert_state(late, "done") and [j.payload for j in seen] == ["l"]


def test_assertions_say_what_was_there_instead(stack: TestStack) -> None:
    stack.client.schedule(timedelta(hours=4), {"to": "a@example.com"}, queue="emails")
    stack.assert_scheduled("emails", payload={"to": "a@example.com"}, at=timedelta(hours=4))
    with pytest.raises(AssertionError, match=r"(?s)expected a scheduled job on queue 'emails' with "
                                             r"payload=\{'to': 'b@example.com'\}.*found 1 scheduled.*a@example.com"):
        stack.assert_scheduled("emails", payload={"to": "b@example.com"})
    with pytest.raises(AssertionError, match="at=2025-01-06T17:00:00"):
        stack.assert_scheduled("emails", at=timedelta(hours=5))


def test_a_handler_that_keeps_making_due_work_fails_the_test_instead_of_hanging(stack: TestStack) -> None:
    worker, _ = make_worker(fn=lambda job: stack.client.schedule(timedelta(0), None, queue="q"))
    stack.client.schedule(timedelta(0), None, queue="q")
    with pytest.raises(RuntimeError, match="keeps making due work"):
        stack.run_due(worker, max_runs=50)


async def test_async_handlers_and_the_async_client_in_an_async_test() -> None:
    worker = Worker()
    seen: list[int] = []

    @worker.handler("q")
    async def handle(job: Job) -> None:
        await asyncio.sleep(0)
        seen.append(job.payload)

    @worker.handler("slow", timeout=0.01)
    async def never(job: Job) -> None:
        await asyncio.Event().wait()

    with TestStack(now=T0) as stack:
        client = await stack.async_client()
        await client.schedule(timedelta(minutes=5), 1, queue="q")
        await client.schedule(timedelta(0), "x", queue="slow", max_attempts=1)
        with pytest.raises(RuntimeError, match="run_due_async"):
            stack.run_due(worker)
        report = await stack.run_due_async(worker)
        assert report.outcomes == ["timeout"]
        stack.assert_dead("slow", error="HandlerTimeout")
        assert (await stack.advance_async(minutes=5, worker=worker)).outcomes == ["ok"] and seen == [1]


def test_async_handlers_run_from_sync_tests_too(stack: TestStack) -> None:
    worker = Worker()

    @worker.handler("q")
    async def handle(job: Job) -> None:
        if job.attempt == 1:
            raise Retry(5)

    stack.client.schedule(timedelta(0), None, queue="q")
    assert stack.advance(seconds=5, worker=worker).outcomes == ["retry", "ok"]


def test_the_fixture_gives_a_fresh_in_memory_stack(zsched_stack: TestStack) -> None:
    assert zsched_stack.clock is not None and zsched_stack.queues() == []
    zsched_stack.client.schedule(timedelta(days=1), None, queue="q")
    assert len(zsched_stack.scheduled()) == 1


@pytest.mark.zsched(partitions=4, now=T0, seed=3)
def test_the_marker_configures_the_fixture(zsched_stack: TestStack) -> None:
    assert zsched_stack.now == T0 and zsched_stack.client.keyspace.partitions == 4
    worker, seen = make_worker()
    zsched_stack.client.schedule_many([(timedelta(0), i) for i in range(20)], queue="q")
    assert len(zsched_stack.run_due(worker)) == 20 and sorted(j.payload for j in seen) == list(range(20))


def test_advancing_backwards_is_refused_and_says_how_to_jump(stack: TestStack) -> None:
    with pytest.raises(ValueError, match="set stack.now"):
        stack.advance(timedelta(seconds=-1))
    assert JobState.SCHEDULED.value == "scheduled"
