"""workers.effects.fenced_write without a server: what it refuses before sending (commands,
arguments, limits, keys of two cluster slots, clients), where its fence key goes, and the
script's outcomes on fakeredis (the testing kit's in-memory Redis, which applications' own tests
use). The same outcomes on a real redis-server and a Redis Cluster: tests/integration."""
from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest
import redis
import redis.asyncio
from hypothesis import given
from hypothesis import strategies as st

from scheduler.protocol.timeutil import MAX_MS
from scheduler.redisio.routing import slot_of
from workers.effects import (
    AlreadyApplied,
    EffectsError,
    PartialWrite,
    StaleAttempt,
    fenced_write,
    fenced_write_async,
)
from workers.effects.redis_commands import ALLOWED, ARGS_MAX, BYTES_MAX, COMMANDS_MAX, fence_key_of, plan
from workers.effects.redis_script import SOURCE
from workers.effects.redis_write import retention_ms
from workers.effects.target import Target

JOB_ID = "0" * 30


def job(fence: int = 100, attempt: int = 1, job_id: str = JOB_ID, namespace: str = "ns") -> Any:
    return SimpleNamespace(id=job_id, fence=fence, attempt=attempt, namespace=namespace)


def target(step: str = "") -> Target:
    return Target("ns", JOB_ID, step, 100, 1)


def utf8(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


@pytest.fixture
def r() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


# -- the fence key ---------------------------------------------------------------------------------


def test_the_fence_key_takes_the_first_keys_hash_tag() -> None:
    assert fence_key_of(b"{acct:42}:balance", target()) == b"{acct:42}:zsched:fx:ns:" + JOB_ID.encode()
    assert fence_key_of(b"x{t}y{u}", target("pay")) == b"{t}:zsched:fx:ns:" + JOB_ID.encode() + b":pay"


def test_a_key_without_a_hash_tag_is_the_fence_keys_tag_whole() -> None:
    assert fence_key_of(b"balance:7", target()).startswith(b"{balance:7}:zsched:fx:")
    assert fence_key_of(b"a{b", target()).startswith(b"{a{b}:zsched:fx:")  # Redis: the first '{', the first '}'


@given(st.binary(min_size=1, max_size=40).filter(lambda k: b"}" not in k or _has_tag(k)))
def test_the_fence_key_is_in_the_first_keys_cluster_slot(key: bytes) -> None:
    assert slot_of(fence_key_of(key, target("s"))) == slot_of(key)


def _has_tag(k: bytes) -> bool:
    s = k.find(b"{")
    return s >= 0 and k.find(b"}", s + 1) > s + 1


@pytest.mark.parametrize("key", [b"a}b", b"}", b"{}empty-tag"])
def test_a_first_key_with_a_brace_but_no_hash_tag_is_refused(key: bytes) -> None:
    with pytest.raises(EffectsError, match="no hash tag"):
        fence_key_of(key, target())


def test_fence_keys_of_other_jobs_steps_and_namespaces_differ() -> None:
    keys = {fence_key_of(b"{t}k", Target(ns, jid, step, 1, 1))
            for ns in ("a", "b") for jid in ("J1", "J2") for step in ("", "x", "x:y")}
    assert len(keys) == 12


@pytest.mark.parametrize("field", ["namespace", "job_id"])
def test_a_namespace_or_job_id_with_a_colon_is_refused(field: str) -> None:
    kw = {"namespace": "ns", "job_id": JOB_ID, field: "a:b"}
    with pytest.raises(EffectsError, match="':'"):
        plan([("SET", "k", 1)], Target(kw["namespace"], kw["job_id"], "", 1, 1), 1000, utf8, same_slot=False)


def test_a_command_on_a_fence_key_is_refused() -> None:
    with pytest.raises(EffectsError, match="reserved"):
        plan([("INCR", "{t}n"), ("DEL", "{t}:zsched:fx:ns:other")], target(), 1000, utf8, same_slot=False)


# -- what it refuses before sending ---------------------------------------------------------------


def test_keys_in_two_cluster_slots_are_refused_by_name_on_a_cluster_client() -> None:
    cmds = [("INCRBY", "{a}:balance", 5), ("RPUSH", "{b}:ledger", "x")]
    with pytest.raises(EffectsError, match=r"more than one Redis Cluster slot.*'\{a\}:balance'.*'\{b\}:ledger'"):
        plan(cmds, target(), 1000, utf8, same_slot=True)
    assert plan(cmds, target(), 1000, utf8, same_slot=False).keys[1:] == [b"{a}:balance", b"{b}:ledger"]
    same = plan([("INCRBY", "{a}:balance", 5), ("RPUSH", "{a}:ledger", "x")], target(), 1000, utf8, same_slot=True)
    assert len({slot_of(k) for k in same.keys}) == 1


BAD: list[tuple[Any, str]] = [
    ([("MSET", "a", 1, "b", 2)], "one command per key"),
    ([("rename", "a", "b")], "one command per key"),
    ([("BLPOP", "a", 0)], "one command per key"),
    ([("FLUSHALL", "a")], "FLUSHALL, which it does not send"),
    ([("EVAL", "return 1", 0)], "EVAL, which it does not send"),
    ([("GETSET", "a", 1)], "GETSET, which it does not send"),
    ([("DEL", "a", "b")], "DEL 'a'.* 1 argument.*takes 0 here.*a second key is a second command"),
    ([("HSET", "h", "f")], "takes pairs, 2 or more"),
    ([("HSET", "h", "f", "v", "g")], "takes pairs"),
    ([("INCRBY", "n")], "takes 1 here"),
    ([("SET", "a", 1, "b", 2, "c", 3, "d")], "takes 1 to 5"),
    ([("SET", "a", True)], "bool"),
    ([("SET", "a", None)], "NoneType"),
    ([("SET", "a", float("nan"))], "NaN"),
    ([("SET", None, 1)], "key is a NoneType"),
    ([("SET", "a", [1])], "list"),
    ([(b"SET", "a", 1)], "not a command name"),
    ([("SET",)], "not a \\(NAME, KEY, \\*ARGS\\) tuple"),
    (["SET a 1"], "not a \\(NAME, KEY, \\*ARGS\\) tuple"),
    ("SET a 1", "list of \\(NAME, KEY, \\*ARGS\\) tuples"),
    ([], "no commands"),
    ([("INCR", "n")] * (COMMANDS_MAX + 1), f"more than {COMMANDS_MAX}"),
    ([("SADD", "s", *range(ARGS_MAX + 1))], f"more than {ARGS_MAX}"),
    ([("SET", f"k{i}", b"x" * (1024 * 1024)) for i in range(9)], "8 MiB"),
]


@pytest.mark.parametrize("commands,message", BAD, ids=[m.split(",")[0][:30] for _, m in BAD])
def test_bad_commands_are_refused_before_anything_is_sent(r: fakeredis.FakeRedis, commands: Any,
                                                          message: str) -> None:
    with pytest.raises(EffectsError, match=message):
        fenced_write(r, job(), commands)
    assert r.dbsize() == 0


def test_the_limits_are_inclusive(r: fakeredis.FakeRedis) -> None:
    assert len(fenced_write(r, job(1), [("INCR", "{t}n")] * COMMANDS_MAX)) == COMMANDS_MAX
    assert r.get("{t}n") == str(COMMANDS_MAX).encode()
    p = plan([("SET", "k", b"x" * (BYTES_MAX - 1))], target(), 1000, utf8, same_slot=False)
    assert len(p.args[-1]) == BYTES_MAX - 1


def test_names_are_case_insensitive_and_values_are_encoded_as_redis_py_does(r: fakeredis.FakeRedis) -> None:
    out = fenced_write(r, job(), [("set", "{t}f", 1.5), ("IncrByFloat", "{t}f", 2), ("zadd", "{t}z", 3, b"\xff")])
    assert out == [b"OK", b"3.5", 1]
    assert r.zscore("{t}z", b"\xff") == 3.0


def test_a_bad_job_or_step_is_refused(r: fakeredis.FakeRedis) -> None:
    with pytest.raises(EffectsError, match="the job a handler received"):
        fenced_write(r, object(), [("INCR", "n")])
    with pytest.raises(EffectsError, match="step"):
        fenced_write(r, job(), [("INCR", "n")], step="a b")
    with pytest.raises(EffectsError, match="namespace"):
        fenced_write(r, job(namespace=""), [("INCR", "n")])
    assert r.dbsize() == 0


@pytest.mark.parametrize("retention", [0, -1, timedelta(0), float("nan"), float("inf"), True, "1d",
                                       MAX_MS / 1000 + 1])
def test_a_bad_retention_is_refused(r: fakeredis.FakeRedis, retention: Any) -> None:
    with pytest.raises(EffectsError, match="retention"):
        fenced_write(r, job(), [("INCR", "n")], retention=retention)
    assert r.dbsize() == 0


def test_retention_is_a_timedelta_or_seconds() -> None:
    assert retention_ms(timedelta(days=1)) == 86_400_000
    assert retention_ms(2.5) == 2500 and retention_ms(0.001) == 1


def test_a_client_of_the_other_kind_or_a_pipeline_is_refused_with_the_right_function() -> None:
    with pytest.raises(EffectsError, match="use fenced_write_async"):
        fenced_write(fakeredis.FakeAsyncRedis(), job(), [("INCR", "n")])  # type: ignore[arg-type]
    with pytest.raises(EffectsError, match="not a pipeline"):
        fenced_write(fakeredis.FakeRedis().pipeline(), job(), [("INCR", "n")])
    with pytest.raises(EffectsError, match="needs a redis-py Redis or RedisCluster client, got dict"):
        fenced_write({}, job(), [("INCR", "n")])  # type: ignore[arg-type]


async def test_the_async_variant_refuses_a_blocking_client() -> None:
    with pytest.raises(EffectsError, match="blocking client: use fenced_write"):
        await fenced_write_async(redis.Redis(), job(), [("INCR", "n")])  # type: ignore[arg-type]


def test_every_allowed_command_names_a_redis_type_or_any() -> None:
    assert {s.type for s in ALLOWED.values()} == {"", "string", "hash", "list", "set", "zset", "stream"}
    assert all(s.most is None or s.least <= s.most for s in ALLOWED.values())


def test_the_scripts_header_names_every_outcome() -> None:
    header = "\n".join(line for line in SOURCE.splitlines() if line.startswith("--"))
    for part in ("KEYS:", "ARGV:", "Refuses:", "Returns:", "Invariants:", "Uses:", "{1, reply_1", "{0, record}",
                 "{2, i, error}", "{3, record}"):
        assert part in header


# -- the script's outcomes (fakeredis; a real server: tests/integration) ---------------------------


def test_a_repeat_writes_nothing_and_a_lower_fence_is_stale(r: fakeredis.FakeRedis) -> None:
    assert fenced_write(r, job(100), [("INCRBY", "{t}n", 5), ("GET", "{t}none")]) == [5, None]
    with pytest.raises(AlreadyApplied) as same:
        fenced_write(r, job(100), [("INCRBY", "{t}n", 5)])
    assert (same.value.fence, same.value.recorded_fence, same.value.recorded_attempt) == (100, 100, 1)
    with pytest.raises(AlreadyApplied):
        fenced_write(r, job(101, 2), [("INCRBY", "{t}n", 5)])
    with pytest.raises(StaleAttempt) as stale:
        fenced_write(r, job(99), [("INCRBY", "{t}n", 5)])
    assert stale.value.recorded_fence == 100
    assert r.get("{t}n") == b"5"


def test_a_failure_after_the_first_command_is_a_partial_write_for_every_attempt(r: fakeredis.FakeRedis) -> None:
    r.set("{t}word", "abc")
    cmds = [("INCRBY", "{t}n", 5), ("INCR", "{t}word"), ("INCR", "{t}m")]
    with pytest.raises(PartialWrite, match=r"commands\[1\] \(INCR '\{t\}word'\): ERR value is not an integer") as e:
        fenced_write(r, job(1), cmds)
    assert e.value.applied == 1
    with pytest.raises(PartialWrite, match=r"by attempt 1 \(fence 1\)"):
        fenced_write(r, job(2, 2), cmds)
    assert (r.get("{t}n"), r.get("{t}m")) == (b"5", None)


def test_a_wrong_type_found_before_the_first_write_writes_nothing(r: fakeredis.FakeRedis) -> None:
    r.hset("{t}h", "f", "v")
    with pytest.raises(EffectsError, match=r"refused, nothing written: commands\[1\] \(INCR '\{t\}h'\): "
                                           "WRONGTYPE the key holds a hash, INCR needs a string"):
        fenced_write(r, job(), [("INCR", "{t}n"), ("INCR", "{t}h")])
    assert sorted(r.keys()) == [b"{t}h"]


def test_a_client_that_decodes_replies_gets_text_and_the_same_outcomes() -> None:
    r = fakeredis.FakeRedis(decode_responses=True)
    assert fenced_write(r, job(5), [("SET", "{t}k", "é"), ("GET", "{t}k"), ("HGETALL", "{t}none")]) == ["OK", "é", []]
    with pytest.raises(StaleAttempt) as e:
        fenced_write(r, job(4), [("SET", "{t}k", "x")])
    assert e.value.recorded_fence == 5 and e.value.applied_at is not None
