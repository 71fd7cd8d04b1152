"""workers.effects.fenced_write on a real redis-server and a real Redis Cluster: a job's writes to
the user's own keys apply once whatever its attempts (repeats, stale attempts, steps, a command
failing part-way), the fence key expires by itself, the asyncio variant does the same, and real
zsched workers running every job twice (a sync handler outliving its timeout) still move every
balance exactly once."""
from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from scheduler import Client, JobState
from scheduler.redisio.connection import async_redis, sync_redis
from scheduler.redisio.routing import slot_of
from tests.support.helpers import on_both_backends
from tests.support.waits import wait_for, wait_until
from tests.support.workers import TierStandIn, serving
from workers import Job, Worker
from workers.effects import (
    AlreadyApplied,
    EffectsError,
    EffectSkipped,
    PartialWrite,
    StaleAttempt,
    fenced_write,
    fenced_write_async,
)
from workers.effects.redis_commands import ALLOWED, ARGS_MAX
from workers.effects.redis_script import SHA

JOB_ID = "0" * 30
OVERWRITE = {"SET", "SETEX", "PSETEX", "SETNX"}  # string commands that take a key of any type
CATEGORY = {"string": "@string", "hash": "@hash", "list": "@list", "set": "@set", "zset": "@sortedset",
            "stream": "@stream"}


def job(fence: int = 100, attempt: int = 1, job_id: str = JOB_ID) -> Any:
    return SimpleNamespace(id=job_id, fence=fence, attempt=attempt, namespace="ns")


def fence_key(tag: str, step: str = "") -> str:
    return f"{{{tag}}}:zsched:fx:ns:{JOB_ID}" + (f":{step}" if step else "")


def snapshot(r: Any) -> dict[bytes, Any]:
    """Every key with its type, value and whether it has a TTL: what a refused call must not change."""
    return {k: (r.type(k), r.dump(k), r.pttl(k) > 0) for k in r.keys("*")}  # a cluster's: every master's


@pytest.fixture
def store(backend_url: str) -> Any:
    r = sync_redis(backend_url)
    yield r
    r.close()


# -- one call's outcomes, on one server and on a cluster ------------------------------------------


@on_both_backends
def test_the_first_write_applies_and_returns_the_replies(store: Any) -> None:
    out = fenced_write(store, job(), [("INCRBY", "{a}:n", 5), ("HSET", "{a}:h", "f", "v"), ("GET", "{a}:none"),
                                      ("RPUSH", "{a}:l", "x", "y"), ("LRANGE", "{a}:l", 0, -1)])
    assert out == [5, 1, None, 2, [b"x", b"y"]]
    fence, attempt, ms = store.get(fence_key("a")).split()
    assert (int(fence), int(attempt)) == (100, 1)
    assert abs(int(ms) - int(store.time()[0]) * 1000) < 5000


@on_both_backends
def test_a_repeat_raises_already_applied_and_changes_nothing(store: Any) -> None:
    cmds = [("INCRBY", "{a}:n", 5), ("SADD", "{a}:s", "m")]
    fenced_write(store, job(100), cmds)
    before = snapshot(store)
    for fence, attempt in ((100, 1), (105, 2)):  # a re-sent call (lost reply), then a later attempt
        with pytest.raises(AlreadyApplied) as e:
            fenced_write(store, job(fence, attempt), cmds)
        assert (e.value.recorded_fence, e.value.recorded_attempt) == (100, 1)
        assert e.value.applied_at is not None
    assert snapshot(store) == before and store.get("{a}:n") == b"5"


@on_both_backends
def test_a_stale_attempt_after_a_newer_one_raises_stale_attempt(store: Any) -> None:
    fenced_write(store, job(200, 2), [("INCRBY", "{a}:n", 5)])
    before = snapshot(store)
    with pytest.raises(StaleAttempt, match="attempt 2 \\(fence 200\\).*this attempt \\(fence 100\\) wrote nothing"):
        fenced_write(store, job(100, 1), [("INCRBY", "{a}:n", 5)])
    assert snapshot(store) == before


@on_both_backends
def test_steps_are_fenced_independently(store: Any) -> None:
    fenced_write(store, job(), [("INCRBY", "{a}:n", 1)], step="debit")
    fenced_write(store, job(), [("INCRBY", "{a}:n", 10)], step="credit")
    for step in ("debit", "credit"):
        with pytest.raises(AlreadyApplied):
            fenced_write(store, job(101, 2), [("INCRBY", "{a}:n", 100)], step=step)
    assert store.get("{a}:n") == b"11"
    assert store.exists(fence_key("a", "debit"), fence_key("a", "credit")) == 2


@on_both_backends
def test_a_wrong_type_mid_call_is_a_partial_write_that_no_later_attempt_applies_again(store: Any) -> None:
    # SET makes '{a}:k' a string; the HSET after it fails at run time, after two commands applied
    cmds = [("INCRBY", "{a}:n", 5), ("SET", "{a}:k", "v"), ("HSET", "{a}:k", "f", "v"), ("INCR", "{a}:m")]
    with pytest.raises(PartialWrite, match=r"commands\[2\] \(HSET '\{a\}:k'\): WRONGTYPE.*the 2 command\(s\) before "
                                           r"it .* stayed applied.*delete the fence key '\{a\}:zsched:fx:ns:0+'") as e:
        fenced_write(store, job(100), cmds)
    assert e.value.applied == 2
    assert store.pttl(fence_key("a")) == -1  # a partial record does not expire: it marks data to repair
    for fence in (100, 101, 99):  # re-sent, later, stale: all told the same, nothing applied again
        with pytest.raises(PartialWrite, match=r"by attempt 1 \(fence 100\) failed at commands\[2\]"):
            fenced_write(store, job(fence, 2), cmds)
    assert (store.get("{a}:n"), store.get("{a}:m")) == (b"5", None)
    # the operator repairs the keys and deletes the fence key: the job's next attempt writes
    store.delete("{a}:k", fence_key("a"))
    assert fenced_write(store, job(102, 3), [("HSET", "{a}:k", "f", "v"), ("INCR", "{a}:m")]) == [1, 1]


@on_both_backends
def test_a_wrong_type_before_the_first_write_writes_nothing_and_the_retry_applies(store: Any) -> None:
    store.lpush("{a}:balance", "oops")
    before = snapshot(store)
    with pytest.raises(EffectsError, match=r"refused, nothing written: commands\[1\] \(INCRBY '\{a\}:balance'\): "
                                           "WRONGTYPE the key holds a list, INCRBY needs a string") as e:
        fenced_write(store, job(), [("RPUSH", "{a}:ledger", "x"), ("INCRBY", "{a}:balance", 5)])
    assert not isinstance(e.value, PartialWrite)
    assert snapshot(store) == before  # no fence key either
    store.delete("{a}:balance")
    assert fenced_write(store, job(101, 2), [("RPUSH", "{a}:ledger", "x"), ("INCRBY", "{a}:balance", 5)]) == [1, 5]


@on_both_backends
def test_a_first_command_redis_refuses_at_run_time_writes_nothing(store: Any) -> None:
    with pytest.raises(EffectsError, match=r"nothing written: commands\[0\] \(SET '\{a\}:k'\): ERR syntax error"):
        fenced_write(store, job(), [("SET", "{a}:k", "v", "NX", "XX"), ("INCR", "{a}:n")])
    assert snapshot(store) == {}


@on_both_backends
def test_the_fence_key_expires_after_the_retention(store: Any) -> None:
    fenced_write(store, job(), [("INCR", "{a}:n")], retention=timedelta(hours=2))
    assert 7_190_000 < store.pttl(fence_key("a")) <= 7_200_000
    fenced_write(store, job(), [("INCR", "{a}:n")], step="short", retention=0.2)
    assert 0 < store.pttl(fence_key("a", "short")) <= 200
    wait_until(lambda: not store.exists(fence_key("a", "short")), 5, 0.02, "the fence key to expire")
    # after its retention a duplicate is no longer recognised: keep it longer than a job's retries
    assert fenced_write(store, job(101, 2), [("INCR", "{a}:n")], step="short") == [3]


@on_both_backends
def test_the_script_is_sent_again_when_the_server_has_forgotten_it(store: Any) -> None:
    node = (store.get_redis_connection(store.get_node_from_key("{a}:n"))
            if isinstance(store, redis.cluster.RedisCluster) else store)  # the server of the keys
    fenced_write(store, job(job_id="A" * 30), [("INCR", "{a}:n")])
    assert node.script_exists(SHA) == [True]
    node.script_flush()  # as after a restart, or a failover to a replica that never ran it
    assert fenced_write(store, job(job_id="B" * 30), [("INCR", "{a}:n")]) == [2]
    assert node.script_exists(SHA) == [True]


def test_keys_of_one_hash_tag_work_on_a_cluster_and_two_slots_are_refused_before_sending(
        redis_cluster_url: str) -> None:
    r = sync_redis(redis_cluster_url)
    try:
        keys = [f"{{acct:{i}}}:balance" for i in range(40)]
        assert len({r.get_node_from_key(k).name for k in keys}) == 3  # the tags spread over the 3 masters
        for i, k in enumerate(keys):
            fenced_write(r, job(job_id=f"{i:030d}"), [("INCRBY", k, i), ("RPUSH", f"{{acct:{i}}}:ledger", "x")])
            fence = f"{{acct:{i}}}:zsched:fx:ns:{i:030d}"
            assert slot_of(fence) == slot_of(k) and r.get(fence) is not None
        assert [int(r.get(k)) for k in keys] == list(range(40))
        before = {k: r.dump(k) for k in keys}
        with pytest.raises(EffectsError, match=r"more than one Redis Cluster slot.*'\{acct:0\}:balance'.*"
                                               r"'\{acct:1\}:balance'"):
            fenced_write(r, job(job_id="Z" * 30), [("INCRBY", keys[0], 1), ("INCRBY", keys[1], 1)])
        assert {k: r.dump(k) for k in keys} == before
        assert r.keys("*ZZZZ*") == []
    finally:
        r.close()


def test_every_allowed_command_takes_one_key_first_as_redis_describes_it(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    try:
        info = r.execute_command("COMMAND", "INFO", *ALLOWED)
    finally:
        r.close()
    wrong = []
    for name, spec in ALLOWED.items():
        c = info[name.lower()]
        if c["first_key_pos"] != 1 or c["step_count"] != 1 or (c["last_key_pos"] != 1 and spec.most != 0):
            wrong.append(f"{name}: keys {c['first_key_pos']}..{c['last_key_pos']} (one key, first, expected)")
        arity = c["arity"]
        if (arity > 0 and not spec.least == spec.most == arity - 2) or (arity < 0 and spec.least != -arity - 2):
            wrong.append(f"{name}: arity {arity}, allowed {spec.least}..{spec.most} arguments after the key")
        if {"noscript", "blocking"} & set(c["flags"]):
            wrong.append(f"{name}: flags {c['flags']}")
        cats = set(c["acl_categories"])
        if spec.type and CATEGORY[spec.type] not in cats:
            wrong.append(f"{name}: a {spec.type} command, categories {sorted(cats)}")
        if not spec.type and "@keyspace" not in cats and name not in OVERWRITE:
            wrong.append(f"{name}: takes any type, categories {sorted(cats)}")
    assert not wrong, "\n".join(wrong)


def test_a_command_with_the_most_arguments_allowed_runs(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    try:
        assert fenced_write(r, job(), [("SADD", "{a}:s", *range(ARGS_MAX))]) == [ARGS_MAX]
    finally:
        r.close()


@pytest.mark.parametrize("commands,message", [
    ([("INCR", "{a}:n"), ("MSET", "{a}:x", 1, "{a}:y", 2)], "one command per key"),
    ([("INCR", "{a}:n"), ("DEL", "{a}:x", "{a}:y")], "a second key is a second command"),
    ([("INCR", "{a}:n"), ("CONFIG", "SET", "x")], "does not send"),
    ([("INCR", "{a}:n"), ("SET", "{a}:x", None)], "NoneType"),
])
def test_bad_input_is_one_clear_error_and_nothing_is_written(redis_url: str, commands: Any, message: str) -> None:
    r = redis.Redis.from_url(redis_url)
    try:
        with pytest.raises(EffectsError, match=message):
            fenced_write(r, job(), commands)
        assert r.dbsize() == 0
    finally:
        r.close()


# -- the asyncio variant ----------------------------------------------------------------------------


@on_both_backends
async def test_the_async_variant_applies_once_and_reports_the_same_outcomes(backend_url: str) -> None:
    r = async_redis(backend_url)
    try:
        assert await fenced_write_async(r, job(100), [("INCRBY", "{a}:n", 5), ("ZADD", "{a}:z", 1, "m")]) == [5, 1]
        with pytest.raises(AlreadyApplied):
            await fenced_write_async(r, job(101, 2), [("INCRBY", "{a}:n", 5)])
        with pytest.raises(StaleAttempt):
            await fenced_write_async(r, job(99), [("INCRBY", "{a}:n", 5)])
        partial = [("INCR", "{a}:m"), ("SET", "{a}:w", "abc"), ("INCR", "{a}:w")]  # not an integer, at run time
        with pytest.raises(PartialWrite, match="by this attempt"):
            await fenced_write_async(r, job(1), partial, step="p")
        with pytest.raises(PartialWrite, match="by attempt 1"):
            await fenced_write_async(r, job(2), partial, step="p")
        assert (await r.get("{a}:n"), await r.get("{a}:m")) == (b"5", b"1")
        with pytest.raises(EffectsError, match="use fenced_write"):
            await fenced_write_async(sync_redis(backend_url), job(), [("INCR", "{a}:n")])  # type: ignore[arg-type]
    finally:
        await r.aclose()


# -- real workers, every job run twice ---------------------------------------------------------------


async def test_workers_running_every_job_twice_move_each_balance_exactly_once(redis_url: str) -> None:
    """16 jobs, each run twice by a zsched worker: its sync handler outlives its 0.3 s timeout on the
    first attempt, so the job is retried while the first attempt's thread still runs. Half the jobs
    write in the first attempt and then hang (a worker that dies after its write, before its ack),
    half write only after the second attempt did (an attempt that lost its lease). Every balance
    and the ledger come out exact, and the runs recorded outside the fenced write show each job
    ran twice and each of its two writes met the other."""
    n, accounts = 16, 4
    store = redis.Redis.from_url(redis_url)  # the application's own Redis (here the same server)
    client = Client.from_url(redis_url)
    first_wrote = {i: threading.Event() for i in range(n)}
    second_done = {i: threading.Event() for i in range(n)}
    lock = threading.Lock()  # handlers run in threads
    runs: list[tuple[str, int]] = []
    outcomes: Counter[tuple[str, int, str]] = Counter()  # (mode, attempt, outcome)
    w = Worker.from_url(redis_url, concurrency=2 * n + 2, shutdown_grace=5.0)

    @w.handler("default", timeout=0.3)
    def pay(job: Job) -> None:
        p = job.payload
        with lock:
            runs.append((job.id, job.attempt))
        cmds = [("INCRBY", f"{{bank}}:balance:{p['acct']}", p["amount"]), ("RPUSH", "{bank}:ledger", job.id)]

        def write() -> None:
            outcome = "error"
            try:
                fenced_write(store, job, cmds)
                outcome = "applied"
            except EffectSkipped as e:
                outcome = type(e).__name__
                raise
            finally:
                with lock:
                    outcomes[(p["mode"], job.attempt, outcome)] += 1

        if job.attempt > 1:
            if p["mode"] == "repeat":
                first_wrote[p["i"]].wait(20)  # (it has, unless the machine is slower than the timeout)
            try:
                write()
            finally:
                second_done[p["i"]].set()
        elif p["mode"] == "stale":
            second_done[p["i"]].wait(20)  # past the timeout: the second attempt runs and writes first
            write()
        else:
            write()
            first_wrote[p["i"]].set()
            second_done[p["i"]].wait(20)  # past the timeout, after the write: as if it died before its ack

    payloads = [{"i": i, "acct": i % accounts, "amount": 10 + i, "mode": ("stale", "repeat")[i % 2]} for i in range(n)]
    try:
        async with TierStandIn(redis_url), serving(w):
            ids = client.schedule_many([(timedelta(0), p) for p in payloads], backoff=(0.05, 0.1))
            await wait_for(lambda: sum(outcomes.values()) == 2 * n and w.stats.acked == n, 20,
                           what=lambda: f"every job's two writes and one ack: {dict(outcomes)}, {w.stats}")
        expected = Counter[int]()
        for p in payloads:
            expected[p["acct"]] += p["amount"]
        assert {a: int(store.get(f"{{bank}}:balance:{a}")) for a in range(accounts)} == dict(expected)
        assert sorted(store.lrange("{bank}:ledger", 0, -1)) == sorted(i.encode() for i in ids)
        # the duplicates happened: every job ran twice, and each second write met the first
        assert Counter(runs) == Counter((i, a) for i in ids for a in (1, 2))
        half = n // 2
        assert outcomes == {("stale", 2, "applied"): half, ("stale", 1, "StaleAttempt"): half,
                            ("repeat", 1, "applied"): half, ("repeat", 2, "AlreadyApplied"): half}
        assert w.stats.skipped == half  # the repeats' second attempts, acked
        assert all(client.get(i).state is JobState.DONE for i in ids)
    finally:
        for e in (*first_wrote.values(), *second_done.values()):
            e.set()
        client.close()
        store.close()
