"""Every transition script and client method against a real redis-server, including refusals."""
from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

import pytest
import redis

from scheduler import Client, ConfigError, JobState, Outcome, PayloadError
from scheduler.protocol.errors import MisfiredAtSchedule
from scheduler.protocol.ids import decode_id, encode_id, partition_of
from scheduler.protocol.tick import NO_RETENTION, tick_call
from scheduler.protocol.transitions import claim_call
from scheduler.testing.transitions import Ops
from tests.support.helpers import snapshot


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


@pytest.fixture
def client(redis_url: str) -> Client:
    c = Client.from_url(redis_url, namespace="t", partitions=4).connect()
    yield c
    c.close()


@pytest.fixture
def ops(client: Client) -> Ops:
    return Ops(client)


def test_future_job_is_scheduled_with_its_payload(client: Client, r: redis.Redis) -> None:
    at = datetime.now(UTC) + timedelta(hours=1)
    jid = client.schedule(at, {"to": "a@example.com"}, queue="emails", max_attempts=3)
    info = client.get(jid)
    assert info.state is JobState.SCHEDULED
    assert info.queue == "emails" and info.payload == {"to": "a@example.com"}
    assert info.attempts == 0 and info.max_attempts == 3
    assert abs((info.run_at - at).total_seconds()) < 0.002
    assert snapshot(r, client)[jid] == "scheduled"


def test_due_job_goes_straight_to_ready(client: Client, r: redis.Redis) -> None:
    jid = client.schedule(time.time() - 5, "x")
    assert client.get(jid).state is JobState.READY
    assert snapshot(r, client)[jid] == "ready"


def test_overdue_skip_job_is_misfired_not_fired_and_the_caller_is_told(client: Client, ops: Ops,
                                                                        r: redis.Redis) -> None:
    with pytest.raises(MisfiredAtSchedule) as err:
        client.schedule(time.time() - 10, "x", misfire="skip", misfire_grace=1)
    jid = err.value.job_id
    assert jid is not None and err.value.misfired == [jid] and "will not run" in str(err.value)
    assert client.get(jid).state is JobState.MISFIRED
    with pytest.raises(MisfiredAtSchedule) as many:
        client.schedule_many([(time.time() - 10, "a"), (time.time() + 60, "b"), (time.time() - 20, "c")],
                             misfire="skip", misfire_grace=1)
    ids = many.value.ids
    assert len(ids) == 3 and many.value.misfired == [ids[0], ids[2]]
    assert client.get(ids[1]).state is JobState.SCHEDULED
    late_ok = client.schedule(time.time() - 10, "y", misfire="skip", misfire_grace=60)
    assert client.get(late_ok).state is JobState.READY
    assert jid not in snapshot(r, client)


def test_tick_applies_misfire_policy_to_late_timers(client: Client, ops: Ops) -> None:
    skip = client.schedule(time.time() + 0.05, "s", misfire="skip", misfire_grace=0.01)
    late = client.schedule(time.time() + 0.05, "l")
    time.sleep(0.2)
    assert ops.tick_all() == 2
    assert client.get(skip).state is JobState.MISFIRED
    assert client.get(late).state is JobState.READY


def test_idempotency_key_returns_live_job_and_frees_after_done(client: Client, ops: Ops) -> None:
    a = client.schedule(timedelta(0), 1, key="order-1")
    b = client.schedule(time.time() + 100, 2, key="order-1")
    assert a == b
    assert client.get(a).payload == 1
    [job] = ops.claim()
    assert ops.ack(job) == 1
    c = client.schedule(timedelta(0), 3, key="order-1")
    assert c != a
    assert client.get(a).state is JobState.DONE


def test_idempotency_key_inside_one_batch(client: Client) -> None:
    ids = client.schedule_many([(timedelta(0), 1, "k"), (timedelta(0), 2, "k"), (timedelta(0), 3, "other")])
    assert ids[0] == ids[1] != ids[2]


def test_tick_moves_due_jobs_in_bounded_batches_and_reports_next_due(client: Client, ops: Ops, r: redis.Redis) -> None:
    now = time.time()
    client.schedule_many([(now - 1, i) for i in range(30)] + [(now + 3600, "later")], queue="q")
    # the 30 overdue ones went straight to ready; add timers that become due
    due = time.time() + 1.0  # far enough ahead that none is already due when it is written
    ids = client.schedule_many([(due, i) for i in range(2500)], queue="q")
    time.sleep(max(0.0, due - time.time()) + 0.05)
    p = 0
    sizes = []
    while True:
        reply = ops.send(tick_call(ops.calls, p, 0, 200, {}, NO_RETENTION, tomb_ms=0))
        sizes.append(reply[0])
        if reply[0] < 200:
            break
    assert max(sizes) == 200  # never more than the limit per call
    total = ops.tick_all(limit=200)
    st = snapshot(r, client)
    assert all(st[i] == "ready" for i in ids)
    nxt = ops.send(tick_call(ops.calls, 0, 0, 200, {}, NO_RETENTION, tomb_ms=0))[1]
    later = [j for j, s in st.items() if s == "scheduled"]
    assert len(later) == 1
    assert nxt == -1 or nxt > (now + 3000) * 1000
    assert total + sum(sizes) == 2500


def test_claim_leases_job_and_fence_grows_with_every_claim(client: Client, ops: Ops, r: redis.Redis) -> None:
    jid = client.schedule(timedelta(0), "x", lease=0.1)
    [first] = ops.claim()
    assert first.record.attempt == 1
    info = client.get(jid)
    assert info.state is JobState.RUNNING and info.fence == first.token
    time.sleep(0.15)
    assert ops.reap_all() == 1
    [second] = ops.claim()
    assert second.token > first.token and second.record.attempt == 2
    assert ops.ack(first) == 0, "stale token must be refused"
    assert ops.fail(first) == 0 and ops.extend(first) == 0
    assert ops.ack(second) == 1
    assert ops.ack(second) == 0, "double ack must be refused"
    assert client.get(jid).state is JobState.DONE
    assert snapshot(r, client) == {}


def test_fail_retries_with_delay_then_dead_when_attempts_spent(client: Client, ops: Ops, r: redis.Redis) -> None:
    jid = client.schedule(timedelta(0), "x", max_attempts=2)
    [j1] = ops.claim()
    assert ops.fail(j1, delay_ms=60_000, msg="first") == 1
    info = client.get(jid)
    assert info.state is JobState.SCHEDULED and info.last_error.message == "first"
    assert info.run_at > datetime.now(UTC) + timedelta(seconds=50)
    assert snapshot(r, client)[jid] == "scheduled"  # moved timer is still findable
    assert client.reschedule(jid, timedelta(0))  # make it due now
    [j2] = ops.claim()
    assert j2.record.attempt == 2
    assert ops.fail(j2, msg="second") == 2
    info = client.get(jid)
    assert info.state is JobState.DEAD and info.last_error.type == "RuntimeError"
    assert info.last_error.message == "second" and info.died_at is not None
    assert [d.id for d in client.dead()] == [jid]


def test_fail_with_zero_delay_goes_back_to_ready(client: Client, ops: Ops) -> None:
    jid = client.schedule(timedelta(0), "x")
    [j] = ops.claim()
    assert ops.fail(j, delay_ms=0) == 1
    assert client.get(jid).state is JobState.READY


def test_permanent_failure_is_dead_at_once(client: Client, ops: Ops) -> None:
    jid = client.schedule(timedelta(0), "x", max_attempts=5)
    [j] = ops.claim()
    assert ops.fail(j, kind="p") == 2
    assert client.get(jid).state is JobState.DEAD


def test_extend_moves_deadline_and_refuses_stale_token(client: Client, ops: Ops) -> None:
    jid = client.schedule(timedelta(0), "x", lease=5)
    [j] = ops.claim()
    new_deadline = ops.extend(j, lease_ms=60_000)
    assert new_deadline > j.deadline_ms
    assert ops.extend(j, token=j.token + 1000) == 0
    assert client.get(jid).lease_deadline.timestamp() * 1000 == pytest.approx(new_deadline, abs=1)


def test_reap_dead_letters_when_attempts_spent(client: Client, ops: Ops) -> None:
    jid = client.schedule(timedelta(0), "x", max_attempts=1, lease=0.1)
    ops.claim()
    time.sleep(0.15)
    assert ops.reap_all() == 1
    info = client.get(jid)
    assert info.state is JobState.DEAD and info.last_error.type == "LeaseExpired"


def test_release_hands_back_without_spending_an_attempt(client: Client, ops: Ops) -> None:
    client.schedule(timedelta(0), "a")
    jid = client.schedule(timedelta(0), "b")
    jobs = ops.claim()
    target = next(j for j in jobs if j.raw_id == decode_id(jid))
    assert ops.release(target) == 1
    info = client.get(jid)
    assert info.state is JobState.READY and info.attempts == 0
    assert ops.release(target) == 0


def test_cancel_by_state(client: Client, ops: Ops, r: redis.Redis) -> None:
    sched = client.schedule(time.time() + 60, "s")
    ready = client.schedule(timedelta(0), "r")
    assert client.cancel(sched) and client.cancel(ready)
    assert client.get(sched).state is JobState.CANCELLED
    assert client.get(ready).state is JobState.CANCELLED
    assert not client.cancel(sched), "second cancel finds nothing live"
    running = client.schedule(timedelta(0), "run")
    [j] = ops.claim()
    assert not client.cancel(running)
    assert ops.fail(j, kind="p") == 2
    assert not client.cancel(running), "dead jobs are purged, not cancelled"
    assert client.get(running).state is JobState.DEAD
    assert snapshot(r, client) == {running: "dead"}


def test_reschedule_scheduled_and_ready_jobs_refuses_running(client: Client, ops: Ops, r: redis.Redis) -> None:
    a = client.schedule(time.time() + 60, "a")
    assert client.reschedule(a, time.time() + 120)
    assert client.get(a).run_at.timestamp() == pytest.approx(time.time() + 120, abs=1)
    b = client.schedule(timedelta(0), "b")
    assert client.reschedule(b, timedelta(minutes=5))
    assert client.get(b).state is JobState.SCHEDULED
    assert client.reschedule(b, timedelta(0))
    assert client.get(b).state is JobState.READY
    [j] = ops.claim()
    assert not client.reschedule(b, time.time() + 10)
    st = snapshot(r, client)
    assert st == {a: "scheduled", b: "running"}


def test_requeue_is_idempotent_and_resets_attempts(client: Client, ops: Ops) -> None:
    jid = client.schedule(timedelta(0), "x", max_attempts=1)
    [j] = ops.claim()
    ops.fail(j)
    assert client.requeue(jid)
    assert not client.requeue(jid), "requeuing twice must run the job once"
    info = client.get(jid)
    assert info.state is JobState.READY and info.attempts == 0 and info.last_error is not None
    live = client.schedule(timedelta(0), "live")
    assert not client.requeue(live)
    [j2, j3] = ops.claim()
    assert sorted(x.record.attempt for x in (j2, j3)) == [1, 1]


def test_requeue_at_a_later_time_schedules(client: Client, ops: Ops) -> None:
    jid = client.schedule(timedelta(0), "x", max_attempts=1)
    [j] = ops.claim()
    ops.fail(j)
    assert client.requeue(jid, at=time.time() + 30)
    assert client.get(jid).state is JobState.SCHEDULED


def test_purge_removes_only_dead_jobs(client: Client, ops: Ops, r: redis.Redis) -> None:
    jid = client.schedule(timedelta(0), "x", max_attempts=1, key="kk")
    live = client.schedule(time.time() + 60, "y")
    [j] = ops.claim()
    ops.fail(j)
    assert not client.purge(live)
    assert client.purge(jid)
    assert client.get(jid) is None
    assert snapshot(r, client) == {live: "scheduled"}
    assert client.schedule(timedelta(0), "again", key="kk") != jid  # the key was freed


def test_stats_counts_per_queue_and_state(client: Client, ops: Ops) -> None:
    client.schedule_many([(time.time() + 60, i) for i in range(5)], queue="a")
    client.schedule_many([(timedelta(0), i) for i in range(3)], queue="b")
    ops.claim("b", 1)
    st = client.stats()
    assert st["a"] == {"scheduled": 5, "ready": 0, "running": 0, "dead": 0}
    assert st["b"] == {"scheduled": 0, "ready": 2, "running": 1, "dead": 0}


def test_dead_listing_filters_by_queue(client: Client, ops: Ops) -> None:
    x = client.schedule(timedelta(0), 1, queue="x", max_attempts=1)
    y = client.schedule(timedelta(0), 2, queue="y", max_attempts=1)
    for q in ("x", "y"):
        [j] = ops.claim(q)
        ops.fail(j)
    assert [d.id for d in client.dead(queue="x")] == [x]
    assert {d.id for d in client.dead()} == {x, y}


def test_many_jobs_at_the_same_millisecond_are_each_findable(client: Client, r: redis.Redis) -> None:
    at = time.time() + 600
    ids = client.schedule_many([(at, i) for i in range(300)])
    for n in (0, 17, 150, 299):
        assert client.get(ids[n]).payload == n
    assert client.cancel(ids[150])
    assert client.get(ids[151]).state is JobState.SCHEDULED
    assert len(snapshot(r, client)) == 299


def test_scripts_reload_after_script_flush_also_in_pipelines(client: Client, r: redis.Redis) -> None:
    client.schedule(time.time() + 60, 1)
    r.script_flush()
    assert client.schedule(time.time() + 60, 2)
    r.script_flush()
    assert len(client.schedule_many([(time.time() + 60, i) for i in range(50)])) == 50
    r.script_flush()
    assert "default" in client.stats()


def test_tombstone_ttl_zero_keeps_nothing(redis_url: str) -> None:
    c = Client.from_url(redis_url, namespace="t0", partitions=2, tombstone_ttl=0)
    jid = c.schedule(time.time() + 60, 1)
    assert c.cancel(jid)
    assert c.get(jid) is None


BAD_AT = [
    (datetime(2030, 1, 1), ValueError, "naive"),
    (math.nan, ValueError, "finite"),
    (math.inf, ValueError, "finite"),
    (True, TypeError, "must be"),
    ("tomorrow", TypeError, "must be"),
    (-1, ValueError, "1970"),
    (253402300800 + 10, ValueError, "9999"),
]


@pytest.mark.parametrize("at,exc,words", BAD_AT)
def test_bad_times_are_refused_and_write_nothing(client: Client, r: redis.Redis, at, exc, words) -> None:
    before = r.dbsize()
    with pytest.raises(exc, match=words):
        client.schedule(at, 1)
    assert r.dbsize() == before


@pytest.mark.parametrize("kwargs,exc,words", [
    (dict(misfire="later"), ValueError, "misfire"),
    (dict(max_attempts=0), ValueError, "max_attempts"),
    (dict(max_attempts=1.5), TypeError, "max_attempts"),
    (dict(queue=""), ValueError, "queue"),
    (dict(queue="a" * 65), ValueError, "queue"),
    (dict(queue="a{b}"), ValueError, "queue"),
    (dict(queue="a:b"), ValueError, "queue"),
    (dict(queue=None), TypeError, "queue"),
    (dict(misfire_grace=5), ValueError, "misfire_grace"),
    (dict(lease=0), ValueError, "lease"),
    (dict(lease=math.nan), ValueError, "lease"),
    (dict(backoff=(5, 1)), ValueError, "backoff"),
    (dict(key=""), ValueError, "key"),
    (dict(key=7), TypeError, "key"),
])
def test_bad_options_are_refused_and_write_nothing(client: Client, r: redis.Redis, kwargs, exc, words) -> None:
    before = r.dbsize()
    with pytest.raises(exc, match=words):
        client.schedule(time.time() + 60, 1, **kwargs)
    assert r.dbsize() == before


def test_bad_payloads_are_refused_and_a_bad_job_in_a_batch_writes_nothing(redis_url: str, r: redis.Redis) -> None:
    c = Client.from_url(redis_url, namespace="pl", partitions=2, max_payload_bytes=1000).connect()
    before = r.dbsize()
    with pytest.raises(PayloadError, match="msgpack"):
        c.schedule(timedelta(0), object())
    with pytest.raises(PayloadError, match="over the limit"):
        c.schedule(timedelta(0), "x" * 2000)
    with pytest.raises(PayloadError):
        c.schedule_many([(timedelta(0), 1), (timedelta(0), 2), (timedelta(0), {1, 2})])
    assert r.dbsize() == before


def test_partition_count_is_fixed_per_namespace(redis_url: str) -> None:
    Client.from_url(redis_url, namespace="fixed", partitions=8).connect()
    with pytest.raises(ConfigError, match="has 8 partitions"):
        Client.from_url(redis_url, namespace="fixed", partitions=16).connect()
    assert Client.from_url(redis_url, namespace="fixed").keyspace.partitions == 8


def test_env_configuration(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZSCHED_REDIS_URL", redis_url)
    monkeypatch.setenv("ZSCHED_NAMESPACE", "envns")
    monkeypatch.setenv("ZSCHED_PARTITIONS", "5")
    c = Client.from_url()
    assert c.keyspace.namespace == "envns" and c.keyspace.partitions == 5
    monkeypatch.setenv("ZSCHED_PARTITIONS", "6")
    with pytest.raises(ConfigError, match="has 5 partitions"):
        Client.from_url().connect()


def test_acl_user_and_password_in_url(redis_url: str, r: redis.Redis) -> None:
    r.execute_command("ACL", "SETUSER", "producer", "on", ">s3cret", "~*", "&*", "+@all")
    try:
        url = redis_url.replace("redis://", "redis://producer:s3cret@")
        c = Client.from_url(url, namespace="acl", partitions=2)
        assert c.get(c.schedule(timedelta(0), 1)).state is JobState.READY
        with pytest.raises(redis.AuthenticationError):
            Client.from_url(redis_url.replace("redis://", "redis://producer:wrong@"), namespace="acl").connect()
    finally:
        r.execute_command("ACL", "DELUSER", "producer")


def test_unknown_and_malformed_ids(client: Client) -> None:
    with pytest.raises(ValueError, match="30-character"):
        client.get("nope")
    assert client.get("0" * 30) is None
    assert client.cancel("0" * 30) is Outcome.NOT_FOUND


def test_malformed_bodies_are_dead_lettered_not_lost(client: Client, ops: Ops, r: redis.Redis) -> None:
    ready = client.schedule(timedelta(0), "ok")
    short = client.schedule(timedelta(0), "short")
    raw = decode_id(short)
    k = client.keyspace.key(partition_of(raw, client.keyspace.partitions), "j")
    r.hset(k, raw, r.hget(k, raw)[:6] + b"\x00")  # 1-byte record
    claimed = ops.claim("default", 10)
    assert [c.raw_id for c in claimed] == [decode_id(ready)]
    info = client.get(short)
    assert info.state is JobState.DEAD and info.last_error.type == "CorruptRecord"
    assert "_undecodable" in info.payload
    assert [d.id for d in client.dead()] == [short]


def test_client_survives_a_redis_restart(fresh_redis) -> None:
    c = Client.from_url(fresh_redis.url, namespace="rs", partitions=2)
    first = c.schedule(time.time() + 60, 1)
    assert c.get(first).state is JobState.SCHEDULED
    fresh_redis.kill()
    fresh_redis.restart()  # no persistence: the job is gone, the connection is stale
    c2 = Client.from_url(fresh_redis.url, namespace="rs", partitions=2)  # re-creates the namespace
    second = c.schedule(time.time() + 60, 2)  # the stale thread-owned connection is replaced
    assert c2.get(second).payload == 2
    c.close()
    c2.close()


def test_claim_takes_due_jobs_only_up_to_its_due_limit_and_leaves_the_rest_in_order(redis_url: str) -> None:
    """A worker claims jobs handed off ahead of their time into its prefetch allowance and due jobs
    only into free handler slots (claim's ARGV 9): the first due job over the limit and all after
    it stay in the ready list, in their order; ahead-of-time jobs are not limited."""
    from scheduler.protocol.replies import parse_claim
    from scheduler.protocol.tick import Retention, tick_call

    c = Client.from_url(redis_url, namespace="due-limit", partitions=1).connect()
    try:
        ops = Ops(c)
        now = time.time()
        ahead = [c.schedule(now + 30 + i * 0.01, f"ahead{i}") for i in range(3)]
        reply = c.transport.call(*tick_call(c.calls, 0, 0, 100, {}, Retention(), 60_000))  # hand them off
        assert [c.get(j).state for j in ahead] == [JobState.READY] * 3, reply
        due = [c.schedule(now - 5 + i * 0.01, f"due{i}") for i in range(3)]
        # consuming end first: ahead0, ahead1, ahead2, due0, due1, due2

        def claim(n: int, max_due: int) -> list[str]:
            _, jobs = parse_claim(ops.send(claim_call(ops.calls, 0, "default", n, max_due=max_due)))
            return [encode_id(j.raw_id) for j in jobs]

        assert claim(10, 1) == ahead + due[:1]
        assert claim(10, 0) == []  # due1 is next and due now: nothing passes it
        assert [c.get(j).state for j in due[1:]] == [JobState.READY] * 2
        assert claim(10, 5) == due[1:]  # still in their order
        assert claim(10, 5) == []
    finally:
        c.close()


def test_a_firing_tick_sweeps_expired_tombstones_at_most_once_a_second_and_an_idle_tick_every_time(
        redis_url: str, r: redis.Redis) -> None:
    # The writers sweep as they write; a busy partition's ticks (about one per job with the hand-off
    # lead) add one sweep per second, an idle partition's every tick drains.
    c = Client.from_url(redis_url, namespace="sw", partitions=1, tombstone_ttl=0.001).connect()
    ops = Ops(c)

    def expired_tombstones(n: int) -> None:
        for i in range(n):
            c.cancel(c.schedule(time.time() + 3600, i))
        time.sleep(0.01)  # their 1 ms ttl has passed

    def firing_tick() -> None:
        c.schedule(time.time() - 1, "due", misfire="run_late")  # already due: lands in ready
        c.schedule(time.time() + 0.02, "soon")
        time.sleep(0.03)
        assert ops.send(tick_call(ops.calls, 0, 0, 100, {}, NO_RETENTION, tomb_ms=1))[0] == 1  # fired one job

    expired_tombstones(5)
    firing_tick()
    assert r.hlen("{sw:0}:f") == 0, "the first firing tick sweeps"
    expired_tombstones(5)
    time.sleep(0.3)
    firing_tick()
    assert r.hlen("{sw:0}:f") == 5, "a second firing tick within the second leaves them"
    idle = ops.send(tick_call(ops.calls, 0, 0, 100, {}, NO_RETENTION, tomb_ms=1))
    assert idle[0] == 0 and r.hlen("{sw:0}:f") == 0, "an idle tick sweeps"
    expired_tombstones(5)
    r.hset("{sw:0}:meta", "tsw", str(int(time.time() * 1000) - 1001))  # a second after the last firing sweep
    firing_tick()
    assert r.hlen("{sw:0}:f") == 0
    c.close()
