"""The job view against a real redis-server: a complete ``JobInfo`` in every state (tombstones
included), ``get_many`` in one round trip, ``jobs()`` paging, tombstone trimming at any finish
rate, draining of legacy tombstones, and ``zsched job list`` / ``job show``."""
from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from scheduler import AsyncClient, Client, JobState
from scheduler.protocol.codec import build_record, decode_tombstone
from scheduler.protocol.errors import MisfiredAtSchedule
from scheduler.protocol.ids import decode_id, encode_id, partition_of
from scheduler.protocol.tick import NO_RETENTION, tick_call
from scheduler.protocol.transitions import ack_call, claim_call
from scheduler.shell.cli import main
from scheduler.testing.transitions import Ops
from tests.support.helpers import raw_call, snapshot, tombstones
from tests.support.waits import wait_until_time

UTC = UTC
RECORD = build_record(b"\xc0", max_attempts=1, created_s=0)  # a record the re-sent schedule calls below carry


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    c = Client.from_url(redis_url, namespace="jv", partitions=4).connect()
    yield c
    c.close()


@pytest.fixture
def ops(client: Client) -> Ops:
    return Ops(client)


def ms(dt: datetime | None) -> int:
    assert dt is not None
    return int(round(dt.timestamp() * 1000))


def near_now(dt: datetime | None, slack: float = 5.0) -> bool:
    return dt is not None and abs(dt.timestamp() - time.time()) < slack


def claim_one(ops: Ops, jid: str, queue: str = "default"):
    jobs = ops.claim(queue, 100)
    [job] = [j for j in jobs if encode_id(j.raw_id) == jid]
    return job


def evalsha_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


# ------------------------------------------------------------------------------ every state


def test_scheduled_job_has_every_field(client: Client) -> None:
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    t0 = int(time.time())
    jid = client.schedule(at, {"n": 1}, queue="emails", key="order-1", max_attempts=3)
    info = client.get(jid)
    assert info.state is JobState.SCHEDULED and info.id == jid
    assert (info.queue, info.key, info.attempts, info.max_attempts) == ("emails", "order-1", 0, 3)
    assert info.run_at == at
    assert t0 <= info.created.timestamp() <= time.time()
    assert info.payload == {"n": 1}
    assert info.last_error is info.lease_deadline is info.fence is info.finished_at is info.expires_at is None


def test_job_held_by_a_rate_limit_is_scheduled_with_its_due_time(client: Client, ops: Ops) -> None:
    jid = client.schedule(time.time() + 0.05, "h", queue="slow", max_attempts=2)
    time.sleep(0.1)
    p = client.calls.locate(jid)[1]
    reply = ops.send(tick_call(ops.calls, p, 0, 1000, {"slow": 0}, NO_RETENTION))  # no token for 'slow'
    assert reply[4:8] == [b"slow", 0, 1, 1]  # held
    info = client.get(jid)
    assert info.state is JobState.SCHEDULED and info.queue == "slow"
    assert ms(info.run_at) == int.from_bytes(decode_id(jid)[:6], "big")  # when it became due
    assert (info.attempts, info.max_attempts) == (0, 2) and info.payload == "h"
    [listed], cursor = client.jobs(queue="slow", state="scheduled")
    assert listed.id == jid and listed.run_at == info.run_at and cursor is None


def test_ready_job_keeps_its_due_time_even_when_scheduled_in_the_past(client: Client) -> None:
    jid = client.schedule(datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC), "old", queue="q")
    info = client.get(jid)
    assert info.state is JobState.READY
    assert info.run_at == datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    assert (info.queue, info.attempts, info.max_attempts) == ("q", 0, 5)
    recent = client.schedule(time.time() - 5, "recent", queue="q")
    assert abs(client.get(recent).run_at.timestamp() - (time.time() - 5)) < 1


def test_running_job_has_lease_fence_and_due_time(client: Client, ops: Ops) -> None:
    jid = client.schedule(time.time() - 2, "r", queue="q", lease=60)
    due = client.get(jid).run_at
    job = claim_one(ops, jid, "q")
    info = client.get(jid)
    assert info.state is JobState.RUNNING and info.run_at == due
    assert info.fence == job.token and ms(info.lease_deadline) == job.deadline_ms
    assert (info.attempts, info.max_attempts, info.queue) == (1, 5, "q")


def test_done_after_two_attempts_keeps_the_summary(client: Client, ops: Ops, r: redis.Redis) -> None:
    jid = client.schedule(timedelta(0), {"x": 1}, queue="mail", key="k-done", max_attempts=3)
    created = client.get(jid).created
    first = claim_one(ops, jid, "mail")
    assert ops.fail(first, delay_ms=0, msg="first try failed") == 1
    second_due = client.get(jid).run_at
    second = claim_one(ops, jid, "mail")
    assert ops.ack(second) == 1
    info = client.get(jid)
    assert info.state is JobState.DONE
    assert (info.queue, info.key, info.attempts, info.max_attempts) == ("mail", "k-done", 2, 3)
    assert info.created == created and info.run_at == second_due
    assert near_now(info.finished_at)
    assert ms(info.expires_at) - ms(info.finished_at) == client.calls.tomb_ms
    err = info.last_error
    assert err is not None and (err.type, err.message, err.traceback) == ("RuntimeError", "first try failed", "")
    assert near_now(err.at)
    assert info.payload is None and info.lease_deadline is None and info.fence is None
    assert tombstones(r, client) == {jid: "done"}
    assert snapshot(r, client) == {}  # the error left 'e' with the job


def test_done_first_time_has_no_error_and_a_short_tombstone(client: Client, ops: Ops, r: redis.Redis) -> None:
    jid = client.schedule(timedelta(0), "ok")
    assert ops.ack(claim_one(ops, jid)) == 1
    info = client.get(jid)
    assert info.state is JobState.DONE and info.attempts == 1 and info.last_error is None and info.key is None
    raw = decode_id(jid)
    value = r.hget(client.keyspace.key(partition_of(raw, client.keyspace.partitions), "f"), raw)
    assert len(value) == 28  # key-less, error-less summary: the jemalloc 32-byte class
    assert decode_tombstone(value).state == "done"


def test_cancelled_jobs_keep_due_time_attempts_and_error(client: Client, ops: Ops, r: redis.Redis) -> None:
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    sched = client.schedule(at, "s", queue="c", key="cancel-me")
    assert client.cancel(sched)
    info = client.get(sched)
    assert info.state is JobState.CANCELLED
    assert (info.queue, info.key, info.run_at, info.attempts, info.max_attempts) == ("c", "cancel-me", at, 0, 5)
    assert near_now(info.finished_at) and info.expires_at > info.finished_at and info.last_error is None
    again = client.schedule(time.time() + 60, "again", key="cancel-me")
    assert again != sched  # the key was freed
    # a retried job cancelled while waiting: its attempts and last error are kept
    retried = client.schedule(timedelta(0), "r", queue="c", max_attempts=4)
    assert ops.fail(claim_one(ops, retried, "c"), delay_ms=3_600_000, msg="try later") == 1
    assert client.cancel(retried)
    info = client.get(retried)
    assert info.state is JobState.CANCELLED and info.attempts == 1 and info.max_attempts == 4
    assert info.last_error.message == "try later"
    assert info.run_at.timestamp() > time.time() + 3000  # the retry it would have been
    assert snapshot(r, client) == {again: "scheduled"}
    assert tombstones(r, client) == {sched: "cancelled", retried: "cancelled"}


def test_misfired_at_schedule_time(client: Client) -> None:
    at = time.time() - 10
    with pytest.raises(MisfiredAtSchedule) as exc:
        client.schedule(at, "late", queue="m", misfire="skip", misfire_grace=1, key="mk")
    jid = exc.value.job_id
    info = client.get(jid)
    assert info.state is JobState.MISFIRED
    assert (info.queue, info.key, info.attempts, info.max_attempts) == ("m", "mk", 0, 5)
    assert abs(info.run_at.timestamp() - at) < 0.002
    assert near_now(info.finished_at) and info.expires_at > info.finished_at


def test_misfired_at_tick_time_also_after_a_retry(client: Client, ops: Ops, r: redis.Redis) -> None:
    at = time.time() + 0.05
    jid = client.schedule(at, "t", queue="m", misfire="skip", misfire_grace=0.01)
    retried = client.schedule(time.time() - 0.05, "r", queue="m", misfire="skip", misfire_grace=0.3, max_attempts=3)
    assert ops.fail(claim_one(ops, retried, "m"), delay_ms=20, msg="again") == 1
    retry_due = client.get(retried).run_at
    wait_until_time(retry_due.timestamp() + 0.3 + 0.02)  # both past their misfire grace, neither ticked yet
    ops.tick_all()
    info = client.get(jid)
    assert info.state is JobState.MISFIRED and abs(info.run_at.timestamp() - at) < 0.002
    assert (info.queue, info.attempts) == ("m", 0) and near_now(info.finished_at)
    info = client.get(retried)
    assert info.state is JobState.MISFIRED and info.run_at == retry_due and info.attempts == 1
    assert info.last_error.message == "again"
    assert snapshot(r, client) == {}  # its last error did not stay behind in 'e'


def test_dead_job_has_finish_time_due_time_and_full_error(client: Client, ops: Ops) -> None:
    jid = client.schedule(timedelta(0), "d", queue="dq", max_attempts=2)
    assert ops.fail(claim_one(ops, jid, "dq"), delay_ms=0, msg="one") == 1
    due = client.get(jid).run_at
    assert ops.fail(claim_one(ops, jid, "dq"), msg="two") == 2
    info = client.get(jid)
    assert info.state is JobState.DEAD and info.run_at == due
    assert info.finished_at == info.died_at and near_now(info.died_at)
    assert (info.attempts, info.max_attempts, info.queue) == (2, 2, "dq")
    assert (info.last_error.message, info.last_error.traceback) == ("two", "tb")
    [listed] = client.dead()
    assert listed == info
    [page], _ = client.jobs(queue="dq", state="dead")
    assert page == info


def test_tombstone_ttl_zero_still_drops_the_error(redis_url: str, r: redis.Redis) -> None:
    c = Client.from_url(redis_url, namespace="t0", partitions=2, tombstone_ttl=0)
    ops = Ops(c)
    jid = c.schedule(timedelta(0), "x")
    assert ops.fail(claim_one(ops, jid), delay_ms=3_600_000) == 1
    assert c.cancel(jid) and c.get(jid) is None
    assert snapshot(r, c) == {} and tombstones(r, c) == {}
    c.close()


# ---------------------------------------------------------------------------------- get_many


def test_get_many_is_one_round_trip_across_partitions(redis_url: str, r: redis.Redis) -> None:
    c = Client.from_url(redis_url, namespace="gm", partitions=8)
    ops = Ops(c)
    ids = c.schedule_many([(time.time() + 600, i) for i in range(60)], queue="g")
    done = c.schedule(timedelta(0), "done", queue="g")
    assert ops.ack(claim_one(ops, done, "g")) == 1
    unknown = "0" * 30
    parts = {c.calls.locate(j)[1] for j in ids + [done]}
    assert len(parts) >= 4
    assert c.get(unknown) is None  # loads the script: no NOSCRIPT round below
    trips = []
    orig = c.transport.call_many
    c.transport.call_many = lambda calls, **kw: trips.append(len(calls)) or orig(calls, **kw)  # type: ignore
    before = evalsha_calls(r)
    got = c.get_many(ids + [done, unknown, ids[0]])
    assert evalsha_calls(r) - before == len(parts | {0}) == trips[0] and len(trips) == 1
    assert set(got) == set(ids) | {done, unknown}
    assert [got[j].payload for j in ids] == list(range(60))
    assert got[done].state is JobState.DONE and got[done].attempts == 1 and got[unknown] is None
    assert c.get_many([]) == {}
    before = evalsha_calls(r)
    with pytest.raises(ValueError, match="nope"):
        c.get_many([ids[0], "nope"])
    with pytest.raises(TypeError):
        c.get_many(ids[0])
    assert evalsha_calls(r) == before, "nothing is sent when an id is bad"
    assert c.get_many(["f" * 30]) == {"f" * 30: None}  # any well-formed id names a partition
    c.close()


def test_async_get_many_and_jobs(redis_url: str) -> None:
    sync = Client.from_url(redis_url, namespace="ajv", partitions=3)
    ids = sync.schedule_many([(time.time() + 600 + i, i) for i in range(25)], queue="aq")

    async def run() -> tuple[dict[str, Any], list[str]]:
        async with AsyncClient.from_url(redis_url, namespace="ajv") as ac:
            got = await ac.get_many(ids)
            seen: list[str] = []
            cursor = None
            while True:
                page, cursor = await ac.jobs(queue="aq", state=JobState.SCHEDULED, limit=7, cursor=cursor)
                seen += [j.id for j in page]
                if cursor is None:
                    return got, seen

    got, seen = asyncio.run(run())
    assert [got[j].payload for j in ids] == list(range(25))
    assert sorted(seen) == sorted(ids) and len(seen) == 25
    sync.close()


# --------------------------------------------------------------------------------- jobs()


def page_all(client: Client, **kw: Any) -> tuple[list[list[str]], list[Any]]:
    pages, infos, cursor = [], [], None
    for _ in range(10_000):
        page, cursor = client.jobs(cursor=cursor, **kw)
        assert len(page) <= kw.get("limit", 100)
        pages.append([j.id for j in page])
        infos += page
        if cursor is None:
            return pages, infos
    raise AssertionError("paging never ended")


def test_jobs_pages_through_one_queue_among_others(client: Client, r: redis.Redis) -> None:
    now = time.time()
    mine = client.schedule_many([(now + 100 + (i % 700) * 0.5, i) for i in range(2500)], queue="a")
    for q in ("b", "c"):
        client.schedule_many([(now + 50 + (i % 900) * 0.3, i) for i in range(3000)], queue=q)
    before = evalsha_calls(r)
    pages, infos = page_all(client, queue="a", state="scheduled", limit=100)
    ids = [i for p in pages for i in p]
    assert len(ids) == len(set(ids)) == 2500 and set(ids) == set(mine)
    assert all(j.state is JobState.SCHEDULED and j.queue == "a" for j in infos)
    # by run_at across the partitions (ties by id), not partition after partition
    order = [(ms(j.run_at), j.id) for j in infos]
    assert order == sorted(order)
    assert len({client.calls.locate(j.id)[1] for j in infos[:100]}) == 4, "the first page mixes partitions"
    assert sum(1 for p in pages if len(p) == 100) >= 20
    calls = evalsha_calls(r) - before
    assert calls < 60 * 4, calls  # bounded scans, a round of one call per partition: not one call per job
    assert page_all(client, queue="nope", state="scheduled") == ([[]], [])


def test_jobs_lists_ready_running_and_dead(client: Client, ops: Ops) -> None:
    ready = client.schedule_many([(time.time() - 100 + i, i) for i in range(30)], queue="w")
    pages, infos = page_all(client, queue="w", state="ready", limit=4)
    assert sorted(i for p in pages for i in p) == sorted(ready)
    jobs = ops.claim("w", 10)
    running = {encode_id(j.raw_id) for j in jobs}
    _, infos = page_all(client, queue="w", state="running", limit=3)
    assert {j.id for j in infos} == running and all(j.fence and j.lease_deadline for j in infos)
    for j in jobs[:4]:
        assert ops.fail(j, kind="p") == 2
    _, infos = page_all(client, queue="w", state="dead", limit=3)
    assert {j.id for j in infos} == {encode_id(j.raw_id) for j in jobs[:4]}
    _, infos = page_all(client, queue="w", state="ready", limit=7)
    assert len(infos) == 20 and {j.id for j in infos} == set(ready) - running


def test_jobs_ready_paging_survives_claims_between_pages(client: Client, ops: Ops) -> None:
    raw_ids = []
    while len(raw_ids) < 40:  # 40 ready jobs in partition 0, claimed in this order
        jid = client.schedule(timedelta(0), len(raw_ids), queue="fifo")
        if client.calls.locate(jid)[1] == 0:
            raw_ids.append(jid)
    first, cursor = client.jobs(queue="fifo", state="ready", limit=10)
    in_p0 = [j.id for j in first if client.calls.locate(j.id)[1] == 0]
    assert in_p0 == raw_ids[:10], "ready jobs are listed in claim order"
    seen = [j.id for j in first]
    assert len(ops.send(claim_call(ops.calls, 0, "fifo", 5))) == 1 + 5 * 5  # claim 5 of the listed ones
    while cursor is not None:
        page, cursor = client.jobs(queue="fifo", state="ready", limit=10, cursor=cursor)
        seen += [j.id for j in page]
    rest = [j for j in seen if client.calls.locate(j)[1] == 0]
    assert rest == raw_ids, "no job of partition 0 skipped or repeated"


def test_jobs_validates_its_arguments_and_cursor(client: Client, r: redis.Redis) -> None:
    client.schedule_many([(time.time() + 60, i) for i in range(30)], queue="v")
    page, cursor = client.jobs(queue="v", state="scheduled", limit=5)
    assert len(page) == 5 and isinstance(cursor, str)
    before = evalsha_calls(r)
    with pytest.raises(ValueError, match="not base64|not made by this client"):
        client.jobs(queue="v", state="scheduled", cursor="%%%")
    with pytest.raises(ValueError, match="not made by this client"):
        client.jobs(queue="v", state="scheduled", cursor=base64.urlsafe_b64encode(b"hello").decode())
    with pytest.raises(ValueError, match="state 'scheduled' in queue 'v', not 'dead'"):
        client.jobs(queue="v", state="dead", cursor=cursor)
    with pytest.raises(ValueError, match="not 'scheduled' in 'w'"):
        client.jobs(queue="w", state="scheduled", cursor=cursor)
    forged = base64.urlsafe_b64encode(b"zs1\0ready\0v\0" + b"99\0").decode()
    with pytest.raises(ValueError, match="partition '99'"):
        client.jobs(queue="v", state="ready", cursor=forged)
    forged = base64.urlsafe_b64encode(b"zs1\0scheduled\0v\0*\0x12,short").decode()
    with pytest.raises(ValueError, match="position is malformed"):
        client.jobs(queue="v", state="scheduled", cursor=forged)
    with pytest.raises(ValueError, match="state must be one of"):
        client.jobs(queue="v", state="done")
    with pytest.raises(ValueError, match="limit"):
        client.jobs(queue="v", state="ready", limit=0)
    with pytest.raises(ValueError, match="queue"):
        client.jobs(queue="a:b", state="ready")
    assert evalsha_calls(r) == before


# ------------------------------------------------------------------------ trimming tombstones


def test_trimming_keeps_up_with_5000_acks_per_second_and_drains(redis_url: str, r: redis.Redis) -> None:
    c = Client.from_url(redis_url, namespace="trim", partitions=1, tombstone_ttl=1.0)
    ops = Ops(c)
    core = c.calls
    fkey = c.keyspace.key(0, "f")
    rate, ttl = 5000, 1.0
    t0 = time.monotonic()
    acked, sizes = 0, []
    marks: list[tuple[float, int]] = []  # (time, acks so far) after each round
    while time.monotonic() - t0 < 4.0:  # no ticks at all: the acks trim on their own
        c.schedule_many([(timedelta(0), i) for i in range(50)])
        jobs = ops.claim("default", 50)
        if acked % 1000 < 500:  # half the acks one job per call, half batched
            replies = c.transport.call_many([ack_call(core, 0, [(j.raw_id, j.token)]) for j in jobs])
            acked += sum(x[0] for x in replies)
        else:
            acked += sum(c.transport.call(*ack_call(core, 0, [(j.raw_id, j.token) for j in jobs])))
        sizes.append(r.hlen(fkey))
        marks.append((time.monotonic(), acked))
        ahead = acked / rate - (time.monotonic() - t0)
        if ahead > 0:
            time.sleep(ahead)
    elapsed = time.monotonic() - t0
    assert acked / elapsed > 0.6 * rate, f"could only ack {acked / elapsed:.0f}/s"
    steady = max(sizes[len(sizes) // 2:])
    assert steady < rate * ttl * 3, f"tombstones grew to {steady}"
    # Live tombstones are the acks of the last ttl seconds plus the sweep's lag (measured: about
    # 1.25 x that). Bounded by the busiest ttl-long window, not the mean rate: a run slowed down by
    # other processes catches up in bursts above the rate.
    busiest = max(n - next(m for t, m in marks if t >= now - ttl) for now, n in marks)
    assert steady < 2 * busiest, f"{steady} tombstones; at most {busiest} acks in any {ttl} s"
    time.sleep(ttl + 0.1)
    ops.tick_all()
    assert r.hlen(fkey) == 0
    c.close()


def test_one_tick_asks_again_until_expired_tombstones_are_gone(redis_url: str, r: redis.Redis) -> None:
    # 3 s: the 3 000 tombstones must all be alive when the set-up ends (with 0.5 s a full run on 2
    # cores took longer than that, and the acks' own sweep trimmed the first thousand)
    c = Client.from_url(redis_url, namespace="tt", partitions=1, tombstone_ttl=3.0)
    ops = Ops(c)
    core = c.calls
    for _ in range(3):
        c.schedule_many([(timedelta(0), i) for i in range(1000)])
        jobs = ops.claim("default", 1000)
        assert sum(c.transport.call(*ack_call(core, 0, [(j.raw_id, j.token) for j in jobs]))) == 1000
    t_acked = time.time()
    fkey = c.keyspace.key(0, "f")
    assert r.hlen(fkey) == 3000
    wait_until_time(t_acked + 3.0 + 0.02)  # every tombstone past its TTL
    first = ops.send(tick_call(ops.calls, 0, 0, 1000, {}, NO_RETENTION))
    assert first[0] == 1000, "expired tombstones left: the tick asks to be called again"
    assert r.hlen(fkey) < 3000
    ops.tick_all(limit=1000)
    assert r.hlen(fkey) == 0
    assert ops.send(tick_call(ops.calls, 0, 0, 1000, {}, NO_RETENTION))[0] == 0
    c.close()


def test_legacy_tombstones_are_read_and_drained(client: Client, r: redis.Redis, ops: Ops) -> None:
    xkey = client.keyspace.key(0, "x")
    now_ms = int(time.time() * 1000)
    expired = {bytes(8) + i.to_bytes(7, "big") + b"d": now_ms - 1000 for i in range(3000)}
    r.zadd(xkey, expired)
    live_raw = bytes(6) + b"\x00\x00" + (10**9).to_bytes(7, "big")
    r.zadd(xkey, {live_raw + b"c": now_ms + 3_600_000})
    info = client.get(encode_id(live_raw))
    assert info.state is JobState.CANCELLED and ms(info.expires_at) == now_ms + 3_600_000
    assert info.queue is None and info.run_at is None
    old = encode_id(next(iter(expired))[:15])
    assert client.get(old).state is JobState.DONE  # expired but not trimmed yet
    first = ops.send(tick_call(ops.calls, 0, 0, 1000, {}, NO_RETENTION))
    assert first[0] == 1000 and r.zcard(xkey) == 2001
    ops.tick_all()
    assert r.zrange(xkey, 0, -1) == [live_raw + b"c"]
    assert client.get(old) is None
    # a re-sent schedule still recognises a job with a legacy tombstone
    resend = raw_call(client.calls, "schedule", 0, "default", client.calls.tomb_ms, 1, 1, live_raw + RECORD, 0, "")
    reply = client.transport.call(*resend)
    assert reply[-1] == live_raw and client.get(encode_id(live_raw)).state is JobState.CANCELLED


def test_resent_schedule_recognises_a_finished_job_by_its_summary(client: Client, ops: Ops, r: redis.Redis) -> None:
    jid = client.schedule(timedelta(0), "once")
    assert ops.ack(claim_one(ops, jid)) == 1
    raw = decode_id(jid)
    p = partition_of(raw, client.keyspace.partitions)
    call = raw_call(client.calls, "schedule", p, "default", client.calls.tomb_ms, 1, 1, raw + RECORD, 0, "")
    client.transport.call(*call)
    assert client.get(jid).state is JobState.DONE and snapshot(r, client) == {}


# --------------------------------------------------------------------------------------- CLI


def run_cli(url: str, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = main([*args, "--redis", url, "--namespace", "jv"])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_job_list_pages_with_the_printed_cursor(redis_url: str, client: Client,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    ids = client.schedule_many([(time.time() + 600 + i, i) for i in range(23)], queue="cl")
    client.schedule_many([(time.time() + 300, i) for i in range(40)], queue="other")
    seen: list[str] = []
    cursor = None
    for _ in range(50):
        args = ["job", "list", "--queue", "cl", "--state", "scheduled", "--limit", "10"]
        rc, out, err = run_cli(redis_url, capsys, *args, *(["--cursor", cursor] if cursor else []))
        assert rc == 0, err
        lines = out.strip().splitlines()
        if lines[0].startswith("ID"):
            assert lines[0].split() == ["ID", "RUN", "AT", "ATTEMPTS", "KEY", "LAST", "ERROR"]
            seen += [ln.split()[0] for ln in lines[1:] if not ln.startswith("next page:")]
        nxt = [ln for ln in lines if ln.startswith("next page: zsched job list")]
        if not nxt:
            break
        cursor = nxt[0].rsplit("--cursor ", 1)[1]
    assert seen == ids, "in run_at order across the partitions"
    rc, out, _ = run_cli(redis_url, capsys, "job", "list", "--queue", "cl", "--state", "scheduled", "--json",
                         "--limit", "20")
    doc = json.loads(out)
    assert rc == 0 and doc["count"] == len(doc["jobs"]) <= 20
    assert {"run_at", "attempts", "finished_at", "created"} <= set(doc["jobs"][0]) and "payload" not in doc["jobs"][0]
    while doc["next_cursor"]:
        rc, out, _ = run_cli(redis_url, capsys, "job", "list", "--queue", "cl", "--state", "scheduled", "--json",
                             "--limit", "20", "--cursor", doc["next_cursor"])
        doc = json.loads(out)
    rc, out, err = run_cli(redis_url, capsys, "job", "list", "--queue", "cl", "--state", "ready", "--cursor", "zzz")
    assert rc == 2 and "cursor" in err
    rc, _, err = run_cli(redis_url, capsys, "job", "list", "--queue", "cl", "--state", "done")
    assert rc == 2 and "invalid choice" in err
    rc, out, _ = run_cli(redis_url, capsys, "job", "list", "--queue", "cl", "--state", "dead")
    assert rc == 0 and "no dead jobs in queue 'cl'" in out


def test_cli_job_show_of_a_finished_job(redis_url: str, client: Client, ops: Ops,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    jid = client.schedule(timedelta(0), "x", queue="show", key="sk", max_attempts=3)
    assert ops.fail(claim_one(ops, jid, "show"), delay_ms=0, msg="flaky") == 1
    assert ops.ack(claim_one(ops, jid, "show")) == 1
    rc, out, err = run_cli(redis_url, capsys, "job", "show", jid)
    assert rc == 0, err
    rows = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in out.strip().splitlines())
    assert rows["state"] == "done" and rows["queue"] == "show" and rows["key"] == "sk"
    assert rows["attempts"] == "2/3" and "RuntimeError: flaky" in out
    for label in ("due at", "done at", "created", "record expires", "error at", "last error"):
        assert rows[label].strip(), label
    assert "payload" not in rows
    doc = json.loads(run_cli(redis_url, capsys, "job", "show", jid, "--json")[1])
    assert doc["state"] == "done" and doc["attempts"] == 2 and doc["finished_at"] and doc["run_at"]
    assert doc["last_error"]["message"] == "flaky" and doc["payload"] is None
