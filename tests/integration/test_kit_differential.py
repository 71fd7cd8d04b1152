"""The test kit on fakeredis behaves like a real redis-server: the same random sequence of operations
(schedule due now / in the past / far ahead, with and without idempotency keys and misfire
policies; cancel, reschedule, tick, claim, ack, fail as retry / failure / permanent, reap) run on
both gives the same replies, job states and queue gauges.

Only what both clocks agree on is used: the real server's clock moves while the fake one stands
still, so times are a day away or an hour past, never milliseconds (leases do not expire here:
tests/unit/test_testing_kit.py covers expiry on the fake clock). One partition keeps the order of
ready lists independent of the random bits in job ids.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler import JobInfo
from scheduler.protocol.codes import FailKind
from scheduler.protocol.ids import encode_id
from scheduler.protocol.replies import Claimed
from scheduler.testing import TestStack

WHEN = {"now": timedelta(0), "past": timedelta(hours=-1), "future": timedelta(days=1)}
QUEUES = ("a", "b")

schedule = st.tuples(st.just("schedule"), st.sampled_from(sorted(WHEN)), st.sampled_from([None, "k1", "k2"]),
                     st.sampled_from(QUEUES), st.sampled_from(["run_late", "skip"]), st.integers(1, 3))
pick = st.integers(0, 50)
ops = st.lists(st.one_of(
    schedule, schedule,
    st.tuples(st.just("cancel"), pick),
    st.tuples(st.just("reschedule"), pick, st.sampled_from(["past", "future"])),
    st.tuples(st.just("tick")),
    st.tuples(st.just("claim"), st.sampled_from(QUEUES)),
    st.tuples(st.just("ack"), pick),
    st.tuples(st.just("fail"), pick, st.sampled_from([FailKind.FAILED, FailKind.RETRY, FailKind.PERMANENT])),
    st.tuples(st.just("reap")),
), min_size=8, max_size=40)


@dataclass
class Side:
    """One backend's stack and its job ids by the index of the schedule call that made them."""

    stack: TestStack
    ids: list[str] = field(default_factory=list)
    running: list[Claimed] = field(default_factory=list)

    def index(self, job_id: str) -> int:
        if job_id not in self.ids:
            self.ids.append(job_id)
        return self.ids.index(job_id)

    def apply(self, op: tuple[Any, ...]) -> Any:
        """Run ``op``; returns its reply in a form both backends can agree on."""
        s, name = self.stack, op[0]
        if name == "schedule":
            _, when, key, queue, misfire, attempts = op
            try:
                jid = s.client.schedule(WHEN[when], {"n": len(self.ids)}, key=key, queue=queue, misfire=misfire,
                                        misfire_grace=60, max_attempts=attempts)
            except Exception as exc:  # noqa: BLE001 - the error is the reply compared
                return type(exc).__name__
            return self.index(jid)
        if name in ("cancel", "reschedule"):
            if not self.ids:
                return None
            jid = self.ids[op[1] % len(self.ids)]
            if name == "cancel":
                return s.client.cancel(jid).name
            return s.client.reschedule(jid, s.now + WHEN[op[2]]).name
        if name == "tick":
            return s.ops.tick_all()
        if name == "reap":
            return s.ops.reap_all()
        if name == "claim":
            claimed = s.ops.claim(op[1], 1000)
            self.running += claimed
            return sorted(self.index(encode_id(c.raw_id)) for c in claimed)
        if not self.running:
            return None
        self.running.sort(key=lambda c: self.index(encode_id(c.raw_id)))
        job = self.running.pop(op[1] % len(self.running))
        if name == "ack":
            return s.ops.ack(job).name
        return s.ops.fail(job, op[2], delay_ms=0, msg="boom").name

    def states(self) -> list[tuple[Any, ...]]:
        infos: dict[str, JobInfo | None] = self.stack.client.get_many(self.ids) if self.ids else {}
        out = []
        for jid in self.ids:
            i = infos[jid]
            out.append(None if i is None else (i.state, i.queue, i.key, i.attempts, i.max_attempts, i.payload,
                                               i.last_error.type if i.last_error else None))
        return out


@pytest.fixture
def real_url(redis_url: str) -> Iterator[str]:
    yield redis_url


@settings(max_examples=80, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sequence=ops)
def test_the_kit_on_fakeredis_and_a_redis_server_agree(real_url: str, sequence: list[tuple[Any, ...]]) -> None:
    with ExitStack() as cleanup:
        fake = Side(cleanup.enter_context(TestStack()))
        real = Side(cleanup.enter_context(TestStack(redis_url=real_url)))
        for step, op in enumerate(sequence):
            assert fake.apply(op) == real.apply(op), f"step {step}: {op}"
            assert fake.states() == real.states(), f"after step {step}: {op}"
        assert fake.stack.client.stats() == real.stack.client.stats()


def test_time_travel_on_a_real_redis_says_what_to_do_instead(redis_url: str) -> None:
    from scheduler.testing import TimeTravelUnavailable

    with TestStack(redis_url=redis_url) as stack:
        with pytest.raises(TimeTravelUnavailable, match="(?s)real Redis.*TIME.*in-memory backend"):
            stack.advance(hours=1)
        with pytest.raises(TimeTravelUnavailable):
            stack.now = stack.now + timedelta(hours=1)
        # run_due still works there: it fires what is due now
        from workers import Worker
        worker = Worker()
        seen: list[Any] = []
        worker.handler("q")(lambda job: seen.append(job.payload))
        stack.client.schedule(timedelta(minutes=-1), "late", queue="q")
        assert stack.run_due(worker).outcomes == ["ok"] and seen == ["late"]
