"""The worker's parts on their own, without Redis: options, handler registry, claim planner,
outbox batching, heartbeats and the handler runner's outcomes."""
from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from typing import Any

import pytest

from scheduler.protocol import codec
from scheduler.protocol.codes import FailKind
from scheduler.protocol.errors import ScriptArgumentError
from scheduler.protocol.replies import Claimed
from workers import Job, PermanentError, Retry, Worker, WorkerStats
from workers.alarm import Alarm
from workers.attempt import DONE, RELEASED, RUNNING, Attempt
from workers.heartbeat import Heartbeats
from workers.lifecycle import Lifecycle
from workers.options import WorkerOptions
from workers.outbox import CALL_BATCH, FLUSH_DELAY, Outbox
from workers.pace import held_slots
from workers.planner import CLAIM_CHUNK, ClaimPlanner
from workers.registry import HandlerRegistry
from workers.runner import HandlerRunner, ThreadCount
from workers.slots import Slots

# -- helpers --------------------------------------------------------------------------------------


class FakeCalls:
    """Stands in for a namespace's Calls: the partition in the keys, the arguments as given."""

    def __init__(self, tomb_ms: int) -> None:
        self.tomb_ms = tomb_ms

    def call(self, name: str, p: int, *args: Any) -> tuple[str, list[str], list[Any]]:
        return name, [f"p{p}"], list(args)


def claimed(n: int = 0, *, record: bool = True, payload: Any = None, attempt: int = 1, max_attempts: int = 3,
            lease_ms: int = 30_000, raw_payload: bytes | None = None) -> Claimed:
    body = raw_payload if raw_payload is not None else codec.pack_payload(payload, codec.DEFAULT_MAX_PAYLOAD)
    raw = codec.build_record(body, max_attempts=max_attempts, created_s=0, attempt=attempt, lease_ms=lease_ms)
    rec = codec.decode_record(raw) if record else None
    return Claimed(n.to_bytes(15, "big"), raw, rec, None if record else "bad record", 100 + n, 0, 1_700_000_000_000)


def attempt(n: int = 0, p: int = 0, queue: str = "q", t0: float = 0.0, **kw: Any) -> Attempt:
    return Attempt(p, queue, claimed(n, **kw), None, WorkerStats(), t0)


class Refusals:
    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []

    def __call__(self, r: Attempt, what: str) -> None:
        self.seen.append((int.from_bytes(r.raw_id, "big"), what))


def outbox(tomb_ms: int = 5000) -> tuple[Outbox, Refusals]:
    refused = Refusals()
    return Outbox(FakeCalls(tomb_ms), refused), refused


# -- options --------------------------------------------------------------------------------------


def test_options_normalise_and_stay_immutable() -> None:
    o = WorkerOptions(queues=["b", "a", "b"], handler_timeouts={"a": 2}, shutdown_grace=0, redis_options={"x": 1})
    assert o.queues == ("b", "a")
    assert o.handler_timeouts == {"a": 2.0} and isinstance(o.handler_timeouts["a"], float)
    assert o.shutdown_grace == 0.0 and o.concurrency == 16 and o.metrics_host == "127.0.0.1"
    assert o.drain_timeout == 10.0 and o.updated(drain_timeout=0).drain_timeout == 0.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.concurrency = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        o.redis_options["y"] = 2  # type: ignore[index]
    assert hash(o) == hash(WorkerOptions(queues=["b", "a"], handler_timeouts={"a": 2}, shutdown_grace=0))


@pytest.mark.parametrize("kwargs, error", [
    (dict(concurrency=0), ValueError), (dict(concurrency=2.5), TypeError), (dict(concurrency=True), TypeError),
    (dict(queues="default"), TypeError), (dict(queues=[]), ValueError), (dict(queues=["no spaces"]), ValueError),
    (dict(handler_timeouts={"q": 0}), ValueError), (dict(handler_timeouts={"q": "1"}), TypeError),
    (dict(shutdown_grace=-1), ValueError), (dict(shutdown_grace=math.inf), ValueError),
    (dict(shutdown_grace=True), ValueError), (dict(drain_timeout=-0.5), ValueError),
    (dict(drain_timeout=math.nan), ValueError), (dict(drain_timeout="10"), ValueError),
    (dict(metrics_port=70000), ValueError),
    (dict(metrics_port=True), ValueError), (dict(metrics_host=""), ValueError),
    (dict(max_payload_bytes=0), ValueError), (dict(max_payload_bytes=1.5), ValueError),
    (dict(idle_sweep=0), ValueError), (dict(idle_sweep=math.nan), ValueError),
    (dict(redis_url="http://nope"), ValueError),
    (dict(ack_linger=-0.001), ValueError), (dict(ack_linger=1.001), ValueError),
    (dict(ack_linger=math.nan), ValueError), (dict(ack_linger=True), ValueError), (dict(ack_linger="0.1"), ValueError),
])
def test_options_refuse_bad_values(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        WorkerOptions(**kwargs)


def test_options_updated_changes_only_given_settings_and_merges_timeouts() -> None:
    o = WorkerOptions(namespace="ns", concurrency=3, handler_timeouts={"a": 1, "b": 2})
    u = o.updated(concurrency=7, namespace=None, handler_timeouts={"b": 5, "c": 6})
    assert (u.namespace, u.concurrency) == ("ns", 7)
    assert dict(u.handler_timeouts) == {"a": 1.0, "b": 5.0, "c": 6.0}
    assert o.concurrency == 3 and dict(o.handler_timeouts) == {"a": 1.0, "b": 2.0}  # the original is unchanged
    with pytest.raises(ValueError):
        o.updated(concurrency=-1)


def test_worker_exposes_its_options_and_checks_the_fetch_argument() -> None:
    w = Worker(queues=["a"], concurrency=4, idle_sweep=0.5)
    assert w.options.concurrency == 4 and w.idle_sweep == 0.5 and w.queues == ["a"]
    w.configure(metrics_host="0.0.0.0")
    assert w.metrics_host == "0.0.0.0" and w.options.metrics_host == "0.0.0.0"
    with pytest.raises(AttributeError):
        w.concurrency = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        w.handler_timeouts["a"] = 1  # type: ignore[index]  # a change that would be lost fails loudly
    with pytest.raises(TypeError, match="fetch"):
        Worker(fetch=42)  # type: ignore[arg-type]


# -- registry -------------------------------------------------------------------------------------


def test_registry_detects_async_callables_and_applies_timeout_overrides() -> None:
    reg = HandlerRegistry()

    class AsyncCallable:
        async def __call__(self, job: Job) -> None:
            pass

    reg.register("a", AsyncCallable(), timeout=3)
    reg.register("s", lambda job: None)
    assert reg["a"].is_async and reg["a"].timeout == 3.0
    assert not reg["s"].is_async and reg["s"].timeout is None
    assert list(reg) == ["a", "s"] and "a" in reg and "x" not in reg
    specs = reg.for_queues(["a", "s", "x"], {"s": 9})
    assert specs["a"] is reg["a"] and specs["s"] is not None and specs["s"].timeout == 9.0 and specs["x"] is None
    with pytest.raises(TypeError, match="callable"):
        reg.register("n", 42)  # type: ignore[arg-type]


# -- planner --------------------------------------------------------------------------------------


def test_planner_full_claims_make_a_partition_hot_and_short_ones_drop_it() -> None:
    planner = ClaimPlanner(["q"], 4)
    planner.notify("q", 1)
    [(q, p, n, gen)] = planner.plan(16)
    assert (q, p, n) == ("q", 1, 16)
    planner.claimed(q, p, n, gen, got=n)
    assert planner.hot["q"] == {1} and 1 in planner.candidates["q"]
    [(_, _, n2, gen2)] = planner.plan(40)
    assert n2 == CLAIM_CHUNK  # hot: a big batch, capped
    planner.claimed("q", 1, n2, gen2, got=3)
    assert planner.hot["q"] == set() and planner.candidates["q"] == {}
    assert not planner.has_candidates() and planner.plan(16) == []


def test_planner_keeps_a_candidate_notified_after_its_claim_was_planned() -> None:
    planner = ClaimPlanner(["q"], 4)
    planner.notify("q", 2)
    [(_, _, n, gen)] = planner.plan(4)
    planner.notify("q", 2)  # a job landed while the claim was in flight
    planner.claimed("q", 2, n, gen, got=0)
    assert 2 in planner.candidates["q"]
    planner.failed("q", 2)
    assert planner.candidates["q"] == {}


def test_planner_sweep_marks_every_queue_and_partition_and_zero_slots_plan_nothing() -> None:
    planner = ClaimPlanner(["a", "b"], 3)
    planner.mark_all()
    assert planner.candidates == {"a": {0: 1, 1: 1, 2: 1}, "b": {0: 1, 1: 1, 2: 1}}
    assert planner.plan(0) == []
    assert sum(n for *_, n, _ in planner.plan(100)) == 100  # unknown depth: the slots are spread over all six
    assert not planner.notify("a", -1) and planner.notify("b", 0)


def test_planner_serves_rings_taken_while_busy_before_its_rotation_and_once() -> None:
    planner = ClaimPlanner(["a", "b"], 8)
    for p in (0, 1, 2):
        planner.notify("a", p)
    planner.notify("b", 6, first=True)
    planner.notify("a", 5, first=True)
    planner.notify("b", 6, first=True)  # taken twice: planned once
    steps = planner.plan(2)
    assert [(q, p) for q, p, *_ in steps] == [("b", 6), ("a", 5)]
    assert planner.first == []
    later = planner.plan(8)  # then the rotation, every candidate once
    assert sorted((q, p) for q, p, *_ in later) == [("a", 0), ("a", 1), ("a", 2), ("a", 5), ("b", 6)]


# -- outbox ---------------------------------------------------------------------------------------


def test_outbox_batches_per_partition_in_order_and_bounds_each_call() -> None:
    box, _ = outbox(tomb_ms=5000)
    acks = [attempt(i, p=0) for i in range(CALL_BATCH * 2 + 50)]
    for r in acks:
        box.ack(r)
    box.ack(attempt(999, p=3))
    fails = [attempt(1000 + i, p=1) for i in range(CALL_BATCH // 2 + 1)]
    for r in fails:
        box.fail(r, FailKind.FAILED, -5, b"err")
    ext = attempt(2000, p=2)
    box.extend(ext)
    rel = attempt(3000, p=2)
    box.release(rel)
    assert box.n == len(acks) + 1 + len(fails) + 2
    calls, meta = box.take()
    assert box.n == 0 and box.take() == ([], [])
    assert [(c[0], c[1][0]) for c in calls] == [("extend", "p2"), ("fail", "p1"), ("fail", "p1"),
                                                ("ack", "p0"), ("ack", "p0"), ("ack", "p0"), ("ack", "p3"),
                                                ("release", "p2")]
    assert [len(items) for _, items in meta] == [1, CALL_BATCH // 2, 1, CALL_BATCH, CALL_BATCH, 50, 1, 1]
    assert calls[0][2] == [ext.raw_id, ext.token, 0]
    assert calls[1][2][:5] == [fails[0].raw_id, fails[0].token, FailKind.FAILED, 0, b"err"]  # negative delay: 0
    assert calls[3][2][:3] == [5000, acks[0].raw_id, acks[0].token]  # ack: tombstone TTL first
    assert calls[-1][2] == [rel.raw_id, rel.token]


def test_outbox_drops_extensions_of_finished_or_lost_attempts() -> None:
    box, _ = outbox()
    done, lost, live = attempt(1), attempt(2), attempt(3)
    done.state = DONE
    lost.lost = True
    for r in (done, lost, live):
        box.extend(r)
    calls, meta = box.take()
    assert meta == [("extend", [live])] and calls[0][2] == [live.raw_id, live.token, 0]


def test_outbox_requeue_marks_outcomes_uncertain_and_keeps_them() -> None:
    box, _ = outbox()
    a, f, e, gone = attempt(1), attempt(2), attempt(3), attempt(4)
    box.ack(a)
    box.fail(f, FailKind.RETRY, 10, b"x")
    box.extend(e)
    box.extend(gone)
    _, meta = box.take()
    gone.state = RELEASED  # ended while the round trip failed: its extension is not worth sending
    box.requeue(meta)
    assert box.n == 3 and box.wake.is_set()
    assert a.uncertain and f.uncertain and e.uncertain
    calls, meta2 = box.take()
    assert [k for k, _ in meta2] == ["extend", "fail", "ack"] and meta2[0][1] == [e]
    assert meta2[1][1] == [(f, FailKind.RETRY, 10, b"x")]


def test_outbox_applies_replies_to_counters_and_reports_refusals() -> None:
    box, refused = outbox()
    acked, refused_ack = attempt(1), attempt(2)
    retried, dead, refused_fail = attempt(3), attempt(4), attempt(5)
    extended, refused_ext = attempt(6), attempt(7)
    released = attempt(8)
    for r in (acked, refused_ack):
        box.ack(r)
    for r in (retried, dead, refused_fail):
        box.fail(r, FailKind.FAILED, 0, b"")
    for r in (extended, refused_ext):
        r.hb_pending = True
        box.extend(r)
    box.release(released)
    _, meta = box.take()
    box.apply(meta, [[1_700_000_000_000, 0], [1, 2, 0], [1, 0], [1]])
    assert (acked.stats.acked, refused_ack.stats.acked) == (1, 0)
    assert (retried.stats.retried, dead.stats.dead, refused_fail.stats.retried + refused_fail.stats.dead) == (1, 1, 0)
    assert released.stats.released == 1
    assert not extended.hb_pending and not refused_ext.hb_pending
    assert sorted(refused.seen) == [(2, "ack"), (5, "fail"), (7, "lease extension")]
    assert box.n == 0


def test_outbox_queues_again_the_items_of_a_call_that_errored() -> None:
    box, refused = outbox()
    a, b = attempt(1, p=0), attempt(2, p=1)
    box.ack(a)
    box.ack(b)
    _, meta = box.take()
    box.apply(meta, [RuntimeError("ERR script"), [1]])
    assert b.stats.acked == 1 and a.stats.acked == 0 and refused.seen == []
    _, again = box.take()
    assert again == [("ack", [a])] and a.uncertain


def test_outbox_drops_a_call_whose_arguments_redis_refused_instead_of_retrying_it_forever(
        caplog: pytest.LogCaptureFixture) -> None:
    box, refused = outbox()
    a, b = attempt(1, p=0), attempt(2, p=1)
    box.ack(a)
    box.ack(b)
    _, meta = box.take()
    bad = ScriptArgumentError("ZSCHED_ARG ack ARGV[4] ttl: expected ..., got \"x\"", script="ack",
                              argument="ARGV[4]", name="ttl")
    box.apply(meta, [bad, [1]])
    assert b.stats.acked == 1 and a.stats.acked == 0 and refused.seen == []
    assert box.take() == ([], []), "not queued again"
    assert "ack of 1 job(s) refused by Redis and not sent again" in caplog.text and "ZSCHED_ARG ack" in caplog.text


def test_outbox_retry_wait_is_the_backoff_bounded_by_a_tenth_of_the_shortest_queued_lease() -> None:
    import workers.outbox as outbox_mod

    box, _ = outbox()
    assert box.retry_wait(4.0) == 4.0, "nothing queued: the outage's backoff"
    box.ack(attempt(1, lease_ms=30_000))
    assert box.retry_wait(4.0) == pytest.approx(3.0)
    box.fail(attempt(2, lease_ms=3_000), FailKind.RETRY, 0, b"e")
    assert box.retry_wait(4.0) == pytest.approx(0.3) and box.retry_wait(0.05) == 0.05
    box.extend(attempt(3, lease_ms=100))
    assert box.retry_wait(4.0) == pytest.approx(0.01)
    box.release(attempt(4, lease_ms=1))
    assert box.retry_wait(4.0) == outbox_mod.RETRY_FLOOR, "a 1 ms lease: the floor, not a busy loop"


def run_outbox_until_acked(monkeypatch: pytest.MonkeyPatch, box: Outbox, a: Attempt, send: Any,
                           quiet: Any = None) -> list[float]:
    """Run the outcome loop with ``send`` until ``a`` is acked (or 1 000 loop turns); returns
    every wait it asked asyncio.sleep for (each is made a single loop turn)."""
    import workers.outbox as outbox_mod

    waits: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        waits.append(delay)
        await real_sleep(0)

    async def main() -> None:
        monkeypatch.setattr(outbox_mod.asyncio, "sleep", sleep)
        task = asyncio.create_task(box.run(send, Lifecycle(), None, quiet))
        try:
            for _ in range(1000):
                if a.stats.acked:
                    break
                await real_sleep(0)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())
    return waits


def test_outbox_delivers_an_ack_within_a_tenth_of_its_lease_after_a_long_outage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis refuses every round trip for a while (a cluster failover: CLUSTERDOWN on every node),
    then answers. The outage's backoff doubles up to 1 s; the outcome loop must not sleep that
    long while a finished job's 3 s lease runs out, or the job runs again once Redis is back."""
    box, _ = outbox()
    a = attempt(1, lease_ms=3000)
    box.ack(a)
    sent = 0

    async def send(calls: Any, lane: str) -> list[Any]:
        nonlocal sent
        sent += 1
        if sent <= 12:  # 12 refusals: the backoff alone would reach its 1 s cap
            raise ConnectionError("CLUSTERDOWN The cluster is down")
        return [[1]]

    waits = run_outbox_until_acked(monkeypatch, box, a, send)
    assert a.stats.acked == 1 and sent == 13
    retries = [w for w in waits if w != FLUSH_DELAY]
    assert len(retries) == 12 and max(retries) <= 0.3 + 1e-9, retries


@pytest.mark.parametrize("quiet", [True, False])
def test_outbox_sends_at_once_when_the_worker_is_quiet_else_waits_for_outcomes_to_share_the_trip(
        monkeypatch: pytest.MonkeyPatch, quiet: bool) -> None:
    """A worker running one job at a time: waiting FLUSH_DELAY for company that cannot come cost a
    sleep and a wake-up of its own per job. Busy (a handler running), the outcome waits."""
    box, _ = outbox()
    a = attempt(1)
    box.ack(a)
    asked: list[float] = []

    async def send(calls: Any, lane: str) -> list[Any]:
        return [[1]]

    def is_quiet(horizon: float) -> bool:
        asked.append(horizon)
        return quiet

    waits = run_outbox_until_acked(monkeypatch, box, a, send, is_quiet)
    assert a.stats.acked == 1 and asked == [FLUSH_DELAY]
    assert waits == ([] if quiet else [FLUSH_DELAY])


class Flushes:
    """The outcome loop of a lingering outbox, run for real (its waits are the linger's): each
    round trip's time and its calls as (script, partition, jobs); every job succeeds."""

    def __init__(self, linger: float) -> None:
        self.box = Outbox(FakeCalls(5000), Refusals(), linger)
        self.life = Lifecycle()
        self.sent: list[tuple[float, list[tuple[str, str, int]]]] = []
        self._task: asyncio.Task[None] | None = None

    async def send(self, calls: Any, lane: str) -> list[Any]:
        jobs = [(len(c[2]) - 1) // 2 if c[0] == "ack" else len(c[2]) // 5 for c in calls]
        self.sent.append((time.monotonic(), [(c[0], c[1][0], n) for c, n in zip(calls, jobs)]))
        return [[1] * n for n in jobs]

    async def __aenter__(self) -> Flushes:
        self._task = asyncio.create_task(self.box.run(self.send, self.life, None))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def until_sent(self, n: int = 1) -> None:
        for _ in range(2000):  # 10 s; the linger is at most 1 s
            if len(self.sent) >= n:
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"{len(self.sent)} round trips, expected {n}")


async def test_lingering_acks_wait_for_their_linger_and_share_one_call_per_partition() -> None:
    """Spread traffic: jobs finish one by one, and each ack was a script call of its own."""
    async with Flushes(linger=0.05) as f:
        t0 = time.monotonic()
        f.box.ack(attempt(1, p=0))
        await asyncio.sleep(0.01)  # a later finish, within the first one's linger
        f.box.ack(attempt(2, p=0))
        f.box.ack(attempt(3, p=1))
        await f.until_sent()
        await asyncio.sleep(0.06)  # nothing else goes: all three went in that round trip
    assert len(f.sent) == 1 and f.sent[0][0] - t0 >= 0.05
    assert f.sent[0][1] == [("ack", "p0", 2), ("ack", "p1", 1)]


async def test_a_lingering_ack_waits_at_most_a_tenth_of_its_jobs_lease() -> None:
    """The lease runs on while the ack waits (the same share as for retries in an outage)."""
    async with Flushes(linger=1.0) as f:
        t0 = time.monotonic()
        f.box.ack(attempt(1, lease_ms=30_000))
        f.box.ack(attempt(2, lease_ms=200))  # due 20 ms from now: the earlier due time wakes the loop
        await f.until_sent()
    assert 0.02 <= f.sent[0][0] - t0 < 0.5 and f.sent[0][1] == [("ack", "p0", 2)]


async def test_another_outcome_takes_the_lingering_acks_along_at_once() -> None:
    async with Flushes(linger=1.0) as f:
        t0 = time.monotonic()
        f.box.ack(attempt(1, p=0))
        f.box.fail(attempt(2, p=1), FailKind.FAILED, 0, b"err")
        await f.until_sent()
    assert f.sent[0][0] - t0 < 0.5 and f.sent[0][1] == [("fail", "p1", 1), ("ack", "p0", 1)]


async def test_a_stopping_worker_sends_its_lingering_acks_at_once() -> None:
    async with Flushes(linger=1.0) as f:
        f.box.ack(attempt(1))
        await asyncio.sleep(0.01)  # the loop waits for the linger
        t0 = time.monotonic()
        f.life.stopping = True
        f.box.wake.set()  # as Outbox.drain does
        await f.until_sent()
    assert f.sent[0][0] - t0 < 0.5


async def test_an_ack_queued_again_after_a_failed_round_trip_does_not_linger_again() -> None:
    async with Flushes(linger=1.0) as f:
        a = attempt(1)
        f.box.ack(a)
        _, meta = f.box.take()
        t0 = time.monotonic()
        f.box.requeue(meta)
        await f.until_sent()
    assert f.sent[0][0] - t0 < 0.5 and a.uncertain


def test_claims_leave_lingering_acks_queued_and_take_the_other_outcomes() -> None:
    box = Outbox(FakeCalls(5000), Refusals(), linger=0.5)
    a, f = attempt(1, p=0), attempt(2, p=1)
    box.ack(a)
    assert box.take(with_acks=False) == ([], [])
    box.fail(f, FailKind.FAILED, 0, b"err")
    calls, meta = box.take(with_acks=False)
    assert [k for k, _ in meta] == ["fail"] and box.n == box.n_acks == 1
    assert box.take()[1] == [("ack", [a])] and box.n == box.n_acks == 0 and box.ack_due == math.inf


# -- heartbeats -----------------------------------------------------------------------------------


def test_heartbeats_queue_due_extensions_once_until_answered() -> None:
    box, _ = outbox()
    due, later, lost = attempt(1, t0=0.0, lease_ms=3000), attempt(2, t0=0.0, lease_ms=30_000), attempt(3)
    lost.lost = True
    hb = Heartbeats({due, later, lost}, box)
    assert due.next_hb == 1.0 and later.next_hb == 10.0
    assert hb.due(1.5) == 2.5  # due was extended; its next heartbeat is a third of its lease later
    assert hb.due(3.0) == 4.0  # due again, but the first extension is unanswered: not queued twice
    _, meta = box.take()
    assert meta == [("extend", [due])]


async def test_heartbeat_loop_waits_when_every_running_lease_is_lost() -> None:
    box, _ = outbox()
    lost = attempt(1)
    lost.lost = True
    hb = Heartbeats({lost}, box)
    rounds = 0
    real_due = hb.due

    def counting_due(now: float) -> float:
        nonlocal rounds
        rounds += 1
        if rounds > 100:
            raise RuntimeError("the heartbeat loop spins")
        return real_due(now)

    hb.due = counting_due  # type: ignore[method-assign]
    task = asyncio.create_task(hb.run())
    await asyncio.sleep(0.05)
    assert not task.done() and rounds == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# -- runner ---------------------------------------------------------------------------------------


def make_runner(reg: HandlerRegistry, queue: str = "q", concurrency: int = 4,
                prefetch: int = 0) -> tuple[HandlerRunner, Outbox, Slots]:
    box, _ = outbox()
    running: set[Attempt] = set()
    slots = Slots(concurrency, prefetch)
    runner = HandlerRunner(
        loop=asyncio.get_running_loop(), specs=reg.for_queues([queue], {}), qstats={queue: WorkerStats()},
        running=running, slots=slots, outbox=box, heartbeats=Heartbeats(running, box), life=Lifecycle(),
        metrics=None, max_payload_bytes=codec.DEFAULT_MAX_PAYLOAD, threads=ThreadCount(), concurrency=concurrency)
    return runner, box, slots


async def settle(runner: HandlerRunner) -> None:
    for _ in range(20):
        if not runner.running:
            return
        await asyncio.sleep(0.01)


def fail_items(box: Outbox) -> list[tuple[str, int, bytes]]:
    return [(kind, delay, err) for items in box.fails.values() for _, kind, delay, err in items]


async def test_runner_turns_what_a_handler_did_into_outcomes() -> None:
    reg = HandlerRegistry()
    seen: list[Any] = []

    async def handler(job: Job) -> None:
        seen.append(job.payload)
        what = job.payload["do"]
        if what == "retry":
            raise Retry(2.5)
        if what == "permanent":
            raise PermanentError("bad input")
        if what == "boom":
            raise ValueError("boom")

    reg.register("q", handler)
    runner, box, slots = make_runner(reg)
    jobs = [claimed(i, payload={"do": d}) for i, d in enumerate(["ok", "retry", "permanent", "boom"])]
    slots.free -= len(jobs)  # the claimer takes the slots before the round trip
    runner.dispatch("q", 0, jobs, 0.0)
    assert len(runner.running) == 4
    await settle(runner)
    assert len(seen) == 4 and not runner.running and slots.free == 4
    assert [int.from_bytes(r.raw_id, "big") for r in box.acks[0]] == [0]
    kinds = sorted(fail_items(box), key=lambda f: f[0])
    assert [(k, d) for k, d, _ in kinds if k != FailKind.FAILED] == [(FailKind.PERMANENT, 0), (FailKind.RETRY, 2500)]
    [(_, boom_delay, boom_err)] = [f for f in kinds if f[0] == FailKind.FAILED]
    assert 0 <= boom_delay <= 1000 * 2 and boom_err.startswith(b"ValueError\0boom\0")
    stats = runner.qstats["q"]
    assert (stats.claimed, stats.failed) == (4, 2)  # Retry is not a failure


async def test_runner_dead_letters_poison_without_running_a_handler() -> None:
    reg = HandlerRegistry()
    calls: list[Job] = []

    async def handler(job: Job) -> None:
        calls.append(job)

    reg.register("q", handler)
    runner, box, slots = make_runner(reg)
    runner.dispatch("q", 0, [claimed(1, record=False), claimed(2, raw_payload=b"\xc1")], 0.0)
    assert calls == [] and not runner.running and slots.free == 4 + 2  # no slots were taken in this test
    errs = fail_items(box)
    assert [k for k, _, _ in errs] == [FailKind.PERMANENT, FailKind.PERMANENT]
    assert errs[0][2].startswith(b"PoisonJob\0job record cannot be decoded")
    assert errs[1][2].startswith(b"PoisonJob\0payload cannot be decoded")
    assert runner.qstats["q"].poison == 2


async def test_runner_reports_a_timeout_as_a_failure() -> None:
    reg = HandlerRegistry()

    async def slow(job: Job) -> None:
        await asyncio.Event().wait()  # until the timeout cancels it

    reg.register("q", slow, timeout=0.02)
    runner, box, _ = make_runner(reg)
    runner.dispatch("q", 0, [claimed(1, payload=None)], 0.0)
    await settle(runner)
    [(kind, _, err)] = fail_items(box)
    assert kind == FailKind.FAILED
    assert err.startswith(b"HandlerTimeout\0handler for queue 'q' did not finish within 0.02 s")


async def test_runner_hands_back_running_jobs_at_shutdown() -> None:
    reg = HandlerRegistry()

    async def forever(job: Job) -> None:
        await asyncio.Event().wait()

    reg.register("q", forever)
    runner, box, _ = make_runner(reg)
    runner.dispatch("q", 0, [claimed(1), claimed(2)], 0.0)
    await asyncio.sleep(0)
    cancelled = runner.hand_back()
    assert len(cancelled) == 2 and not runner.running
    await asyncio.wait(cancelled, timeout=1)
    assert all(t.done() and not t.cancelled() for t in cancelled)  # released: the handler ends quietly
    assert len(box.releases[0]) == 2 and not box.acks and not box.fails
    assert all(r.state == RELEASED for r in box.releases[0])


def handed_off(n: int, due_in: float, redis_now_us: int = 1_700_000_000_000_000) -> tuple[Claimed, float]:
    """A claim reply's job due ``due_in`` s after the claim's Redis time, and the dispatch clock
    (this host's monotonic time minus that Redis time) as if the reply arrived just now."""
    c = dataclasses.replace(claimed(n), due_ms=redis_now_us // 1000 + round(due_in * 1000))
    return c, time.monotonic() - redis_now_us / 1_000_000


async def test_a_job_handed_off_ahead_of_time_starts_at_its_due_time_never_before() -> None:
    reg = HandlerRegistry()
    started: list[float] = []

    async def handler(job: Job) -> None:
        started.append(time.monotonic())

    reg.register("q", handler)
    runner, box, slots = make_runner(reg)
    c, clock = handed_off(1, 0.05)
    due_local = c.due_ms / 1000 + clock  # the due time on this host's monotonic clock
    slots.free -= 1
    runner.dispatch("q", 0, [c], time.monotonic(), clock)
    assert len(runner.running) == 1 and not started  # claimed, holding its slot, not started
    await settle(runner)
    assert len(started) == 1 and started[0] >= due_local, f"started {due_local - started[0]:.6f} s early"
    assert started[0] - due_local < 0.05  # and not long after (a loose bound: the machine may be busy)
    assert [int.from_bytes(r.raw_id, "big") for r in box.acks[0]] == [1] and slots.free == 4
    # a job already due when its claim came back starts at once
    late, clock = handed_off(2, -0.5)
    runner.dispatch("q", 0, [late], time.monotonic(), clock)
    await asyncio.sleep(0.01)
    assert len(started) == 2
    runner.close()



async def test_runner_is_quiet_only_while_no_handler_runs_and_no_held_job_starts_within_the_horizon() -> None:
    """What the outbox asks before sending an outcome at once (Outbox.run)."""
    reg = HandlerRegistry()
    go = asyncio.Event()

    async def handler(job: Job) -> None:
        if job.payload == "wait":
            await go.wait()

    reg.register("q", handler)
    runner, box, slots = make_runner(reg)
    assert runner.quiet(0.001) and runner.executing == 0
    slots.free -= 1
    runner.dispatch("q", 0, [claimed(1, payload="wait")], time.monotonic())
    await asyncio.sleep(0)
    assert runner.executing == 1 and not runner.quiet(0.001)  # its outcome may come any moment
    go.set()
    await settle(runner)
    assert runner.executing == 0 and runner.quiet(0.001) and len(box.acks[0]) == 1
    # a job handed off ahead of its time: quiet until its start comes within the horizon
    c, clock = handed_off(2, 0.3)
    slots.free -= 1
    runner.dispatch("q", 0, [c], time.monotonic(), clock)
    await asyncio.sleep(0)  # its task sets the alarm
    assert runner.executing == 0 and runner.quiet(0.001) and not runner.quiet(1.0)
    await asyncio.wait_for(asyncio.gather(*runner.tasks()), 5)
    assert runner.executing == 0 and runner.quiet(1.0) and len(box.acks[0]) == 2
    # a handler handed back at shutdown no longer counts
    slots.free -= 1
    runner.dispatch("q", 0, [claimed(3, payload="wait")], time.monotonic())
    go.clear()
    await asyncio.sleep(0)
    assert runner.executing == 1
    await asyncio.wait(runner.hand_back(), timeout=1)
    assert runner.executing == 0 and runner.quiet(1.0)
    runner.close()

async def test_a_job_held_for_its_due_time_is_handed_back_unrun_at_shutdown() -> None:
    reg = HandlerRegistry()
    ran: list[Job] = []

    async def handler(job: Job) -> None:
        ran.append(job)

    reg.register("q", handler)
    runner, box, _ = make_runner(reg)
    c, clock = handed_off(1, 30.0)
    runner.dispatch("q", 0, [c], time.monotonic(), clock)
    await asyncio.sleep(0.01)
    cancelled = runner.hand_back()
    await asyncio.wait(cancelled, timeout=1)
    assert all(t.done() and not t.cancelled() for t in cancelled)
    assert not ran and [r.state for r in box.releases[0]] == [RELEASED] and not box.acks and not box.fails
    runner.close()


async def test_alarm_resolves_each_wait_at_its_time_in_order() -> None:
    alarm = Alarm(asyncio.get_running_loop())
    t0 = time.monotonic()
    whens = [t0 + d for d in (0.03, 0.01, 0.02, 0.0)]
    woke: dict[int, float] = {}

    async def wait(i: int) -> None:
        await alarm.at(whens[i])
        woke[i] = time.monotonic()

    await asyncio.wait_for(asyncio.gather(*(wait(i) for i in range(4))), 2)
    assert all(woke[i] >= whens[i] for i in range(4))
    assert sorted(woke, key=woke.__getitem__) == [3, 1, 2, 0]
    cancelled = alarm.at(time.monotonic() + 0.01)
    cancelled.cancel()  # a cancelled wait is skipped quietly when its time comes
    await asyncio.sleep(0.03)
    alarm.close()


async def test_runner_releases_jobs_claimed_while_stopping() -> None:
    reg = HandlerRegistry()
    reg.register("q", lambda job: None)
    runner, box, slots = make_runner(reg)
    runner.life.stopping = True
    slots.free -= 1
    runner.dispatch("q", 0, [claimed(1)], 0.0)
    assert slots.free == 4 and not runner.running and [r.state for r in box.releases[0]] == [RELEASED]
    runner.close()


def test_attempt_starts_running_with_its_first_heartbeat_a_third_into_the_lease() -> None:
    r = attempt(1, t0=100.0, lease_ms=9000)
    assert r.state == RUNNING and r.lease_s == 9.0 and r.next_hb == pytest.approx(103.0)
    assert not r.lost and not r.uncertain and r.job is None



# -- prefetch slots -------------------------------------------------------------------------------


def test_claimed_jobs_ahead_of_their_time_go_on_prefetch_slots_latest_first() -> None:
    now = 1_700_000_000_000

    def job(n: int, due_in_ms: int) -> Claimed:
        return dataclasses.replace(claimed(n), due_ms=now + due_in_ms)

    due, soon, later = job(1, -5), job(2, 3), job(3, 8)
    assert held_slots([due, soon, later], now, handler=1, hold=2) == [False, True, True]
    # fewer prefetch slots than ahead jobs: the earliest ahead job waits on a handler slot
    assert held_slots([due, soon, later], now, handler=2, hold=1) == [False, False, True]
    # a re-sent claim answered from its receipt may bring more due jobs than handler slots: the
    # extra ones wait on prefetch slots for a handler
    assert held_slots([job(4, -9), due], now, handler=1, hold=1) == [False, True]
    assert held_slots([due], now, handler=1, hold=0) == [False]


def test_a_round_trips_claims_share_the_handler_slots_so_none_is_left_unable_to_take_a_due_job() -> None:
    # Before: the first claim of a round trip took every free handler slot, so the next claims
    # could take only jobs handed off ahead of time and came back empty on a due one (0.9 empty
    # claims per job at 1 000 jobs/s).
    slots = Slots(16, 32)
    hs = slots.reserve_many([15, 15, 18])
    assert hs == [6, 5, 5] and (slots.free, slots.hold) == (0, 0)
    slots = Slots(2, 32)
    assert slots.reserve_many([10, 10, 10]) == [1, 1, 0]  # fewer handler slots than claims
    assert (slots.free, slots.hold) == (0, 4)
    slots = Slots(16, 32)
    assert slots.reserve_many([1, 20]) == [1, 15]  # a claim gets no more than it asks for
    assert (slots.free, slots.hold) == (0, 27)
    slots = Slots(4, 0)
    assert slots.reserve_many([]) == [] and (slots.free, slots.hold) == (4, 0)
    for free, hold, ns in [(3, 5, [2, 2, 4]), (16, 32, [16, 16, 16]), (0, 8, [4, 4]), (5, 0, [1, 1, 3])]:
        slots = Slots(free, hold)
        hs = slots.reserve_many(ns)
        assert sum(hs) == min(free, sum(ns)) and all(0 <= h <= n for h, n in zip(hs, ns))
        assert slots.free >= 0 and slots.hold >= 0 and slots.free + slots.hold == free + hold - sum(ns)


async def test_slots_hand_a_returning_handler_slot_to_the_held_job_waiting_first() -> None:
    slots = Slots(1, 2)
    assert slots.reserve(3) == 1 and (slots.free, slots.hold) == (0, 0)
    first = asyncio.ensure_future(slots.take_for_held())
    second = asyncio.ensure_future(slots.take_for_held())
    await asyncio.sleep(0)
    assert not first.done() and not second.done()
    slots.give_back()  # a handler ended: its slot goes to the first waiter, not to the claimer
    await asyncio.sleep(0)
    assert first.done() and not second.done() and (slots.free, slots.hold) == (0, 1)
    second.cancel()  # e.g. its lease was lost: it takes nothing, its prefetch slot stays with the job
    await asyncio.sleep(0)
    slots.give_back()
    assert (slots.free, slots.hold) == (1, 1)
    slots.put_back(0, 1)
    assert (slots.free, slots.hold) == (1, 2)


async def test_held_jobs_wait_on_prefetch_slots_and_take_a_handler_slot_only_when_due() -> None:
    reg = HandlerRegistry()
    started: list[tuple[int, float]] = []
    release = asyncio.Event()

    async def handler(job: Job) -> None:
        started.append((job.payload or 0, time.monotonic()))
        if job.payload == 0:
            await release.wait()  # keeps the only handler slot busy

    reg.register("q", handler)
    runner, box, slots = make_runner(reg, concurrency=1, prefetch=2)
    busy = dataclasses.replace(claimed(10, payload=0), due_ms=0)
    redis_now_us = 1_700_000_000_000_000
    clock = time.monotonic() - redis_now_us / 1_000_000
    a, b = (dataclasses.replace(claimed(n, payload=n), due_ms=redis_now_us // 1000 + 30) for n in (1, 2))
    assert slots.reserve(3) == 1
    runner.dispatch("q", 0, [busy, a, b], time.monotonic(), clock, [False, True, True])
    await asyncio.sleep(0.01)
    assert [p for p, _ in started] == [0]  # the two held jobs wait on prefetch slots, not due yet
    due_local = a.due_ms / 1000 + clock
    await asyncio.sleep(due_local - time.monotonic() + 0.02)
    assert [p for p, _ in started] == [0], "due, but the handler slot is busy: they wait for it"
    release.set()  # the busy handler ends: its slot goes to the held jobs, one after the other
    for _ in range(100):
        if len(started) == 3:
            break
        await asyncio.sleep(0.005)
    assert sorted(p for p, _ in started) == [0, 1, 2]
    assert all(t >= due_local for p, t in started[1:]), "a held job never starts before its due time"
    await settle(runner)
    assert not runner.running and (slots.free, slots.hold) == (1, 2)
    runner.close()


async def test_a_held_job_that_comes_due_takes_the_handler_slot_of_a_job_due_later() -> None:
    # A worker whose prefetch allowance is full takes its next claim's early jobs onto handler
    # slots; the held jobs due before them must not wait until those run (before: up to the whole
    # hand-off lead late). The two trade slots; both start at their own due times, none early.
    reg = HandlerRegistry()
    started: list[tuple[int, float]] = []

    async def handler(job: Job) -> None:
        started.append((job.payload, time.monotonic()))

    reg.register("q", handler)
    runner, box, slots = make_runner(reg, concurrency=1, prefetch=1)
    redis_now_us = 1_700_000_000_000_000
    clock = time.monotonic() - redis_now_us / 1_000_000
    now_ms = redis_now_us // 1000
    soon = dataclasses.replace(claimed(1, payload=1), due_ms=now_ms + 40)   # on the prefetch slot
    assert slots.reserve(1) == 1  # a first claim: one handler slot, no prefetch slot was asked for
    slots.hold -= 1               # and a second one took the prefetch slot
    later = dataclasses.replace(claimed(2, payload=2), due_ms=now_ms + 140)  # on the handler slot
    runner.dispatch("q", 0, [soon], time.monotonic(), clock, [True])
    runner.dispatch("q", 0, [later], time.monotonic(), clock, [False])
    await asyncio.sleep(0.01)
    assert started == [] and len(runner.parked) == 1 and (slots.free, slots.hold) == (0, 0)
    soon_local, later_local = soon.due_ms / 1000 + clock, later.due_ms / 1000 + clock
    await asyncio.sleep(soon_local - time.monotonic() + 0.03)
    assert [p for p, _ in started] == [1], "the job due first ran at its time, not after the later one"
    assert started[0][1] >= soon_local and started[0][1] < later_local - 0.05
    for _ in range(100):
        if len(started) == 2:
            break
        await asyncio.sleep(0.005)
    assert [p for p, _ in started] == [1, 2] and started[1][1] >= later_local, "never before its due time"
    await settle(runner)
    assert not runner.running and not runner.parked and (slots.free, slots.hold) == (1, 1)
    runner.close()


async def test_a_parked_job_handed_back_leaves_the_parked_set() -> None:
    reg = HandlerRegistry()
    reg.register("q", lambda job: None)
    runner, box, slots = make_runner(reg, concurrency=1)
    c, clock = handed_off(1, 30.0)
    assert slots.reserve(1) == 1
    runner.dispatch("q", 0, [c], time.monotonic(), clock, [False])
    await asyncio.sleep(0.01)
    assert len(runner.parked) == 1
    await asyncio.gather(*runner.hand_back(), return_exceptions=True)
    assert not runner.parked
    runner.close()


async def test_a_held_job_handed_back_at_shutdown_returns_its_prefetch_slot() -> None:
    reg = HandlerRegistry()
    reg.register("q", lambda job: None)
    runner, box, slots = make_runner(reg)
    slots.hold = 1
    c, clock = handed_off(1, 30.0)
    assert slots.reserve(1) == 1 and slots.free == 3
    slots.free += 1
    slots.hold -= 1  # taken as a prefetch slot instead
    runner.dispatch("q", 0, [c], time.monotonic(), clock, [True])
    await asyncio.sleep(0.01)
    cancelled = runner.hand_back()
    await asyncio.wait(cancelled, timeout=1)
    assert [r.state for r in box.releases[0]] == [RELEASED] and (slots.free, slots.hold) == (4, 0)
    runner.close()


def test_an_outage_is_logged_once_and_again_when_a_migration_refusal_turns_into_restart_it(
        caplog: pytest.LogCaptureFixture) -> None:
    from redis.exceptions import ResponseError

    from workers.wire import Outage

    migrating = ResponseError("ZSCHED_LAYOUT migrating: zsched migrate-partitions is moving this namespace")
    changed = ResponseError("ZSCHED_LAYOUT changed: the namespace now has 8 partitions, this process uses 4 "
                            "(zsched migrate-partitions ran); restart it so it reads the new count")
    outage = Outage("claim")
    with caplog.at_level("WARNING", logger="zsched.worker"):
        for exc in (migrating, migrating, migrating, changed, changed):
            outage.failed(exc)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "migrating" in lines[0] and "restart it" in lines[1], lines


def test_a_worker_loop_backs_off_from_50_ms_to_at_most_a_second_apart() -> None:
    from workers.wire import BACKOFF_CAP, Outage

    outage = Outage("claim")
    waits = [outage.failed(OSError("refused")) for _ in range(30)]
    assert 0.025 <= waits[0] <= 0.05 and max(waits) <= BACKOFF_CAP == 1.0
    assert min(waits[10:]) >= 0.5, "jittered between half the cap and the cap once it is reached"


def test_the_worker_takes_redis_options_as_the_client_does_and_the_old_name_with_a_warning() -> None:
    from workers import Worker
    assert Worker(redis_options={"socket_timeout": 1}).options.redis_options == {"socket_timeout": 1}
    with pytest.warns(DeprecationWarning, match="call it redis_options"):
        w = Worker(redis_kwargs={"socket_timeout": 2})
    assert w.options.redis_options == {"socket_timeout": 2}
    with pytest.raises(TypeError, match="not both"):
        Worker(redis_options={}, redis_kwargs={})
