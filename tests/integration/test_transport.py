"""The script transport's retry-safety rules, proved on a real redis-server: every script a
client may send twice leaves the same state as sending it once."""
from __future__ import annotations

import time
from datetime import timedelta

import pytest
import redis

from scheduler import Client, JobOptions
from scheduler.protocol.replies import parse_claim
from scheduler.protocol.scripts import SCRIPT_NAMES
from scheduler.protocol.transitions import claim_call
from scheduler.redisio.transport import RESEND, RedisRetry, mark_resend
from scheduler.testing.transitions import Ops
from tests.support.helpers import PAST

LATER = timedelta(minutes=5)


@pytest.fixture
def client(redis_url: str) -> Client:
    c = Client.from_url(redis_url, namespace="tr", partitions=1).connect()
    yield c
    c.close()


@pytest.fixture
def r(redis_url: str) -> redis.Redis:
    conn = redis.Redis.from_url(redis_url)
    yield conn
    conn.close()


def _opts(c: Client) -> JobOptions:
    return JobOptions(queue="q", max_attempts=3, lease=30.0, misfire="run_late", misfire_grace=None,
                      backoff=None, jitter=0.0)


def test_every_script_has_a_retry_rule() -> None:
    assert set(SCRIPT_NAMES) <= set(RESEND), "a new script must say whether a re-send is safe (transport.RESEND)"


@pytest.mark.parametrize("at", [LATER, PAST], ids=["scheduled", "due-now"])
def test_a_resent_schedule_returns_the_same_id_and_writes_nothing(client: Client, r: redis.Redis, at: object) -> None:
    call = client.calls.prepare_one(at, {"n": 1}, None, _opts(client))
    first = client.transport.call(*call)[2:]
    again = client.transport.call(*mark_resend(call))[2:]
    assert again == first
    assert int(r.hget("{tr:0}:c", "scheduled:q")) == 1
    if at == PAST:
        assert r.lrange("{tr:0}:r:q", 0, -1) == first  # exactly one ready entry
    else:
        assert r.zcard("{tr:0}:t") == 1


def test_a_resent_schedule_of_a_job_that_already_finished_does_not_run_it_again(client: Client, r: redis.Redis) -> None:
    ops = Ops(client)
    call = client.calls.prepare_one(timedelta(0), "once", None, _opts(client))
    client.transport.call(*call)
    (job,) = ops.claim("q", 10)
    assert ops.ack(job) == 1
    client.transport.call(*mark_resend(call))  # the reply of the first send was "lost"
    assert ops.claim("q", 10) == []
    assert int(r.hget("{tr:0}:c", "scheduled:q")) == 1


def test_without_the_flag_a_batch_is_not_checked_so_the_first_send_stays_cheap(client: Client, r: redis.Redis) -> None:
    # documents why the flag exists: the same blob sent twice WITHOUT it creates a duplicate
    call = client.calls.prepare_one(LATER, "x", None, _opts(client))
    client.transport.call(*call)
    client.transport.call(*call)
    assert int(r.hget("{tr:0}:c", "scheduled:q")) == 2


def test_claim_never_hands_out_a_job_that_is_already_running(client: Client, r: redis.Redis) -> None:
    ops = Ops(client)
    job_id = client.schedule(timedelta(0), "x", queue="q")
    (job,) = ops.claim("q", 10)
    r.lpush("{tr:0}:r:q", job.raw_id)  # a duplicate ready entry (a bug or a hand edit)
    assert ops.claim("q", 10) == []
    assert client.get(job_id).fence == job.token


def test_a_resent_claim_is_answered_from_its_receipt(client: Client, r: redis.Redis) -> None:
    core = client.calls
    client.schedule_many([(timedelta(0), i) for i in range(5)], queue="q")
    first = parse_claim(client.transport.call(*claim_call(core, 0, "q", 3, request_id="rid-1", receipt_ms=30_000)))[1]
    again = parse_claim(client.transport.call(*claim_call(core, 0, "q", 3, request_id="rid-1", receipt_ms=30_000)))[1]
    assert [(j.raw_id, j.token) for j in again] == [(j.raw_id, j.token) for j in first]
    assert all(j.record is not None and j.record.attempt == 1 for j in again)
    other = parse_claim(client.transport.call(*claim_call(core, 0, "q", 3, request_id="rid-2", receipt_ms=30_000,
                                                      earlier_request_id="rid-1")))[1]
    assert len(other) == 2 and not {j.raw_id for j in other} & {j.raw_id for j in first}
    assert not r.exists("{tr:0}:cr:rid-1"), "the next claim drops the receipt of an answered one"
    # a job acked since the claim is not returned by a late re-send of that claim
    Ops(client).ack(other[0])
    late = parse_claim(client.transport.call(*claim_call(core, 0, "q", 3, request_id="rid-2", receipt_ms=30_000)))[1]
    assert [j.raw_id for j in late] == [other[1].raw_id]


def test_fences_are_above_the_server_clock_in_microseconds(client: Client, r: redis.Redis) -> None:
    ops = Ops(client)
    client.schedule_many([(timedelta(0), i) for i in range(3)], queue="q")
    secs, usecs = r.time()
    now_us = int(secs) * 1_000_000 + int(usecs)
    jobs = ops.claim("q", 3)
    tokens = [j.token for j in jobs]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    assert tokens[0] > now_us and tokens[-1] < now_us + 10_000_000
    # a counter set far ahead (clock skew of a previous server) is still respected
    r.hset("{tr:0}:meta", "fence", str(now_us + 3_600_000_000))
    client.schedule(timedelta(0), "later", queue="q")
    (j,) = ops.claim("q", 1)
    assert j.token == now_us + 3_600_000_000 + 1


def test_retry_policy_is_bounded_by_attempts_and_time() -> None:
    assert list(RedisRetry(attempts=1).delays()) == []
    d = list(RedisRetry(attempts=5, budget=100, base=0.01, cap=0.02).delays())
    assert len(d) == 4 and all(0 <= x <= 0.02 for x in d)
    t0 = time.monotonic()
    n = 0
    for x in RedisRetry(attempts=1000, budget=0.2, base=0.05, cap=0.05).delays():
        time.sleep(x)
        n += 1
    assert time.monotonic() - t0 < 0.4 and n < 1000
    with pytest.raises(ValueError):
        RedisRetry(attempts=0)


def test_a_read_only_refusal_is_retried_until_the_server_takes_writes_again() -> None:
    """READONLY (a master demoted by a failover) means the call did not run: it is retried within
    the retry budget. redis-py parses the reply into ReadOnlyError and strips the code from its
    text, which once made the transport give up at the first refusal."""
    import threading

    from scheduler.shell.servers import RedisServer

    with RedisServer() as srv:
        c = Client.from_url(srv.url, namespace="ro", partitions=1,
                            retry=RedisRetry(budget=10.0, attempts=200, base=0.02, cap=0.1)).connect()
        try:
            srv.command("REPLICAOF", "127.0.0.1", "1")  # a replica of nothing: every write is refused
            with pytest.raises(redis.exceptions.ReadOnlyError):
                Client.from_url(srv.url, namespace="ro", retry=RedisRetry(attempts=1, budget=0)).schedule(LATER, 1)
            promote = threading.Timer(0.5, srv.command, ("REPLICAOF", "NO", "ONE"))
            promote.start()
            t = time.monotonic()
            jid = c.schedule(LATER, "x")
            assert time.monotonic() - t >= 0.4, "the write went through while the server was read-only"
            promote.join()
            info = c.get(jid)
            assert info is not None and info.payload == "x"
        finally:
            c.close()
