"""Property test: random sequences of every transition against a real redis-server. After each
step every live job is in exactly one state, and no job is lost or invented."""
from __future__ import annotations

import random
import types

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from scheduler import Client
from scheduler.protocol.ids import encode_id
from scheduler.testing.transitions import Ops
from tests.support.helpers import snapshot, tombstones

TERMINAL = "terminal"


# Fixed times and a seeded id source: the same rule choices must lead to the same jobs (ids decide
# partitions, and thus which jobs a claim takes), or Hypothesis sees a different draw on replay
# and reports its data generation as flaky.
DUE, LATER = 1_000_000_000.0, 4_000_000_000.0


class Machine(RuleBasedStateMachine):
    """Every transition as a rule; the invariant checks the whole namespace after each step.

    Bound to a server by a subclass (see the test): ``redis_url``, ``r`` (a connection to it) and
    ``rng`` (the seeded source of job ids' random bytes)."""

    redis_url: str
    r: redis.Redis
    rng: random.Random

    def __init__(self) -> None:
        super().__init__()
        self.rng.seed(1)
        self.r.flushall()
        self.client = Client.from_url(self.redis_url, namespace="prop", partitions=3)
        self.ops = Ops(self.client)
        self.live: set[str] = set()      # ids that must be in some live state
        self.gone: set[str] = set()      # ids that must not be anywhere
        self.finished: dict[str, str] = {}  # acked / cancelled ids -> the state their tombstone says
        self.claimed: list = []          # claims (possibly stale) to act on

    def teardown(self) -> None:
        self.client.close()

    @rule(n=st.integers(1, 4), due=st.booleans(), queue=st.sampled_from(["a", "b"]),
          max_attempts=st.integers(1, 3), key=st.sampled_from([None, "k1", "k2"]))
    def schedule(self, n, due, queue, max_attempts, key):
        at = DUE if due else LATER
        items = [(at, i, key) if key else (at, i) for i in range(n)]
        ids = self.client.schedule_many(items, queue=queue, max_attempts=max_attempts)
        for i in ids:
            self.live.add(i)
            self.gone.discard(i)

    @rule()
    def tick(self):
        self.ops.tick_all()

    @rule(queue=st.sampled_from(["a", "b"]), n=st.integers(1, 5))
    def claim(self, queue, n):
        self.claimed.extend(self.ops.claim(queue, n))

    @precondition(lambda self: self.claimed)
    @rule(data=st.data())
    def ack(self, data):
        job = data.draw(st.sampled_from(self.claimed))
        if self.ops.ack(job) == 1:
            self._finished(job)

    @precondition(lambda self: self.claimed)
    @rule(data=st.data(), kind=st.sampled_from(["f", "r", "p"]), later=st.booleans())
    def fail(self, data, kind, later):
        job = data.draw(st.sampled_from(self.claimed))
        self.ops.fail(job, kind=kind, delay_ms=3_600_000 if later else 0)

    @precondition(lambda self: self.claimed)
    @rule(data=st.data())
    def extend(self, data):
        self.ops.extend(data.draw(st.sampled_from(self.claimed)))

    @precondition(lambda self: self.claimed)
    @rule(data=st.data())
    def release(self, data):
        self.ops.release(data.draw(st.sampled_from(self.claimed)))

    @rule()
    def expire_leases_and_reap(self):
        # simulate time passing for every lease, then reap
        for p in range(3):
            k = self.client.keyspace.key(p, "i")
            for member in self.r.zrange(k, 0, -1):
                self.r.zadd(k, {member: 0})
        self.ops.reap_all()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def cancel(self, data):
        jid = data.draw(st.sampled_from(sorted(self.live)))
        if self.client.cancel(jid):
            self.live.discard(jid)
            self.gone.add(jid)
            self.finished[jid] = "cancelled"

    @precondition(lambda self: self.live)
    @rule(data=st.data(), now=st.booleans())
    def reschedule(self, data, now):
        jid = data.draw(st.sampled_from(sorted(self.live)))
        self.client.reschedule(jid, DUE if now else LATER + 7200)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def requeue(self, data):
        self.client.requeue(data.draw(st.sampled_from(sorted(self.live))))

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def purge(self, data):
        jid = data.draw(st.sampled_from(sorted(self.live)))
        if self.client.purge(jid):
            self.live.discard(jid)
            self.gone.add(jid)

    def _finished(self, job) -> None:
        jid = encode_id(job.raw_id)
        self.live.discard(jid)
        self.gone.add(jid)
        self.finished[jid] = "done"

    @invariant()
    def every_job_in_exactly_one_state(self):
        states = snapshot(self.r, self.client)  # asserts structural invariants
        assert self.live == set(states), (
            f"lost: {sorted(self.live - set(states))[:3]} invented: {sorted(set(states) - self.live)[:3]}")
        assert not (self.gone & set(states))
        tombs = tombstones(self.r, self.client)
        wrong = {j: (s, tombs.get(j)) for j, s in self.finished.items() if tombs.get(j) != s}
        assert not wrong, f"finished jobs without their tombstone: {list(wrong.items())[:3]}"


def test_random_transitions_keep_every_job_in_exactly_one_state(redis_url: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import scheduler.protocol.ids

    r = redis.Redis.from_url(redis_url)
    rng = random.Random()
    monkeypatch.setattr(scheduler.protocol.ids, "os", types.SimpleNamespace(urandom=lambda n: rng.randbytes(n)))

    bound = type("Machine", (Machine,), {"redis_url": redis_url, "r": r, "rng": rng})
    run_state_machine_as_test(
        bound,
        settings=settings(max_examples=40, stateful_step_count=30, deadline=None,
                          suppress_health_check=list(HealthCheck)),
    )
