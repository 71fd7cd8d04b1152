"""Every script checks its arguments before its first write (lua/_lib_args.lua "Argument checks").

Each script is called directly (EVALSHA of the shipped script, with the partition's real KEYS)
against a populated namespace: scheduled (one moved), held (rate limit), ready, running, dead, done
and cancelled jobs, jobs with an idempotency key and a last error, a cron and a paused cron, a
paused queue, a rate-limit bucket. Every ARGV position in turn gets a missing, empty, non-numeric,
NaN/inf, negative, huge and overlong value; then a few combinations, an extra argument and wrong
KEYS. Whenever the reply is an error, DEBUG DIGEST must be unchanged and the error must be the
argument check's ``ZSCHED_ARG <script> ...``; a value that is no number where the script takes a
decimal integer must be refused, naming its position. Whenever a call succeeds, the namespace must
still hold every invariant (tests.support.helpers.snapshot; every record decodes and names a queue, every
idempotency key names a live job with that key, every cron is whole), and it is restored (FLUSHALL
+ RESTORE) before the next call. The calls are pipelined, each followed by DEBUG DIGEST; only a call
that changed the data costs a restore. Uses only what the scripts and redis-py offer, so it runs
on older code too (where it fails: scripts wrote, then failed).
"""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any, NamedTuple

import msgpack
import pytest
import redis

from scheduler import Client
from scheduler.protocol.codec import build_record, decode_record
from scheduler.protocol.keys import validate_name
from scheduler.protocol.options import JobOptions
from scheduler.protocol.registry import beat_call, leave_call, read_call
from scheduler.protocol.scripts import load_scripts
from scheduler.protocol.tick import Retention, ratelimit_call, tick_call
from scheduler.testing.transitions import Ops
from tests.support.helpers import PAST, raw_call, snapshot
from tests.support.servers import RedisServer

BAD = ["", "nan", "inf", "-1", "1e309", "1.5", "x" * 10_240, "9" * 400, "\0\xff{}:|", "-9007199254740993"]
NOT_A_NUMBER = ("nan", "inf", "-1", "1e309", "x" * 10_240)  # refused wherever a decimal integer is taken
DECIMAL = re.compile(rb"^\d+$")
PIPELINE = 25  # calls per round trip (a call that changed the data sends the ones after it again)


class Call(NamedTuple):
    label: str
    name: str
    keys: list[Any]
    args: list[Any]
    must_refuse: int = 0  # 1-based ARGV position the reply must name as refused (0: any outcome)
    good: bool = False  # a baseline call: it must succeed


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(extra_args=["--enable-debug-command", "yes"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def world(server: RedisServer) -> Iterator[tuple[Client, redis.Redis, list[Call]]]:
    r = redis.Redis.from_url(server.url)
    r.flushall()
    client = Client.from_url(server.url, namespace="va", partitions=1).connect()
    calls = baseline(client, populate(client))
    yield client, r, calls
    client.close()
    r.close()


def populate(client: Client) -> dict[str, Any]:
    """Jobs in every state in the namespace's one partition; returns what the calls need."""
    ops = Ops(client)
    later = time.time() + 3600
    client.schedule(later, {"n": 1}, queue="q", key="k1")
    client.schedule(later + 1, {"n": 2}, queue="q", misfire="skip", misfire_grace=5, lease=60)
    moved = client.schedule(later + 2, {"n": 3}, queue="q")
    assert client.reschedule(moved, later + 600)  # its score is no longer its id's: an 'm' entry
    client.schedule_many([(timedelta(0), {"n": i}) for i in range(6)], queue="q")  # 4 are claimed below, 2 stay ready
    client.schedule(timedelta(0), "waits", queue="pq")
    assert client.pause("pq")
    client.schedule_many([(time.time() + 30, i) for i in range(3)], queue="rl")
    # a hand-off lead of a minute makes them due now, and with no token they are held
    ops.send(tick_call(ops.calls, 0, 0, 1000, {"rl": 0}, Retention(0, 0, 0), lead_ms=60_000))
    client.transport.call(*ratelimit_call(client.keyspace, "rl", 10, 5, 0, 3, 0))
    running = ops.claim("q", 4)
    assert len(running) == 4
    assert ops.ack(running[0]) == 1  # done
    assert ops.fail(running[1], kind="p") == 2  # dead
    assert ops.fail(running[2], delay_ms=3_600_000) == 1  # scheduled again, with its last error
    cancelled = client.schedule(later, "cancelled", queue="q")
    assert client.cancel(cancelled)
    client.add_cron("yearly", "0 0 1 1 *", {"c": 1}, queue="cq")
    client.add_cron("sleepy", "0 0 1 1 *", None, queue="cq")
    assert client.pause_cron("sleepy")
    r, ks = client.redis, client.keyspace
    assert r.zcard(ks.key(0, "h:rl")) == 3 and r.exists(ks.bucket("rl")) and r.hlen(ks.key(0, "m")) >= 1
    dead = [raw for raw in r.zrange(ks.key(0, "d"), 0, -1)]
    return {"scheduled": bytes.fromhex(moved), "dead": dead[0], "running": running[3],
            "version": r.hget(ks.key(0, "cron:yearly"), "ver"), "sleepy": r.hget(ks.key(0, "cron:sleepy"), "def")}


def baseline(client: Client, st: dict[str, Any]) -> list[Call]:
    """One good call of every script (and a 3-job schedule), with this partition's KEYS."""
    c, ttl = client.calls, client.calls.tomb_ms
    job, sched, dead = st["running"], st["scheduled"], st["dead"]
    later = time.time() + 7200
    later_ms = int(later * 1000)
    now_ms = int(time.time() * 1000)

    def good(label: str, built: tuple[str, Any, Any]) -> Call:
        return Call(label, built[0], list(built[1]), list(built[2]), good=True)

    def on0(name: str, *args: Any) -> Call:
        return good(name, raw_call(c, name, 0, *args))

    entry = msgpack.packb(["t", later_ms, "q", build_record(b"\xc0", max_attempts=1, created_s=0), "", ""],
                          use_bin_type=False)  # as Redis's cmsgpack packs it (migrate_out)
    return [
        good("schedule", c.prepare_one(later, {"p": 1}, None, JobOptions(queue="q"))),
        good("schedule 3 jobs", c.prepare([(later, 1), (timedelta(hours=2), 2, "key-3"), (PAST, 3)],
                                          JobOptions(queue="q", lease=90))[0][0]),
        good("tick", tick_call(c, 0, 0, 1000, {"rl": 0}, Retention(86_400_000, 100, 86_400_000), 20)),
        on0("reap", 0, 100),
        on0("claim", "q", 1, "rid-1", 30_000, "", 1),
        on0("ack", ttl, job.raw_id, job.token),
        on0("fail", job.raw_id, job.token, "f", 1000, b"E\0boom\0tb"),
        on0("extend", job.raw_id, job.token, 0),
        on0("release", job.raw_id, job.token),
        on0("cancel", sched, ttl),
        on0("reschedule", sched, later_ms),
        on0("requeue", 0, dead),
        on0("purge", "ids", 0, dead),
        good("purge older", c.purge_older_call(0, now_ms, 10)),
        on0("inspect", sched, dead),
        on0("stats"),
        on0("dead_list", "", 10, 100),
        on0("list", "scheduled", "q", 10, "", 100, "", ""),
        on0("pause", "q", now_ms),
        on0("resume", "pq"),
        on0("cron_remove", "yearly", ttl),
        on0("cron_pause", "yearly", ttl),
        on0("cron_fill", 0, "yearly", st["version"], 1, later_ms + 86_400_000, later_ms + 86_400_000),
        good("cron_resume", c.cron_resume_call("sleepy", st["sleepy"], now_ms)),
        good("cron_set", c.cron_set_call("fresh", "0 0 1 1 *", {"x": 1}, "UTC", JobOptions(queue="cq"))),
        on0("epoch_reset", 0),
        on0("migrate_out", 1, 100),
        on0("migrate_in", 0, 1, b"j" + bytes(range(1, 16)), entry),
        good("ratelimit", ratelimit_call(client.keyspace, "rl", 10, 5, 0, 3, 0)),
        good("registry_beat", beat_call(client.keyspace, "host-1-abcd", b"\x80", 5.0)),
        good("registry_read", read_call(client.keyspace)),
        good("registry_leave", leave_call(client.keyspace, "host-1-abcd")),
    ]


def text(v: Any) -> bytes:
    return v if isinstance(v, bytes) else str(v).encode()


def mutations(base: Call) -> Iterator[Call]:
    """Every ARGV position with every bad value, then missing from it on; a few combinations, an
    extra argument, wrong KEYS."""
    for i, good in enumerate(base.args):
        for v in BAD:
            args = list(base.args)
            args[i] = v
            strict = v in NOT_A_NUMBER and DECIMAL.match(text(good)) is not None
            yield Call(f"{base.label}: ARGV[{i + 1}]={v[:12]!r}", base.name, base.keys, args, i + 1 if strict else 0)
        yield Call(f"{base.label}: from ARGV[{i + 1}] on missing", base.name, base.keys, base.args[:i])
    n = len(base.args)
    yield Call(f"{base.label}: an extra argument", base.name, base.keys, [*base.args, "extra"])
    if n > 4:
        yield Call(f"{base.label}: ARGV[4] and the last bad", base.name, base.keys,
                   [*base.args[:3], "nan", *base.args[4:-1], "-1"])
        yield Call(f"{base.label}: every ARGV after 3 empty", base.name, base.keys, [*base.args[:3]] + [""] * (n - 3))
    yield Call(f"{base.label}: no KEYS", base.name, [], base.args)
    yield Call(f"{base.label}: one KEY too many", base.name, [*base.keys, base.keys[0]], base.args)
    yield Call(f"{base.label}: another partition's KEYS", base.name,
               [text(k).replace(b"{va:0}", b"{va:1}").replace(b"{va}", b"{vb}") for k in base.keys], base.args)
    if len(base.keys) > 1:
        yield Call(f"{base.label}: one KEY too few", base.name, base.keys[:-1], base.args)


def check_world(r: redis.Redis, client: Client) -> None:
    """Every invariant of the namespace: snapshot's, and well-formed records, keys, queues, crons."""
    states = snapshot(r, client)
    ks = client.keyspace
    k = dict(zip(("t", "m", "j", "i", "l", "d", "e", "kk", "x", "q", "g", "c", "meta", "f"), ks.partition_keys(0)))
    q = r.hgetall(k["q"])
    names = {int(v): f[2:].decode() for f, v in q.items() if f.startswith(b"n:")}
    for idx, name in names.items():
        validate_name("queue", name)
        assert q.get(b"i:%d" % idx) == name.encode(), f"queue {name!r}: 'i:{idx}' does not name it"
    recs = {m[:15]: m[15:] for m in r.zrange(k["t"], 0, -1)}
    recs.update({raw: v[6:] for raw, v in r.hgetall(k["j"]).items()})
    for raw, rec in recs.items():
        got = decode_record(rec)
        assert got.queue_index in names, f"job {raw.hex()}: queue index {got.queue_index} names no queue"
        assert 1 <= got.max_attempts and got.attempt <= got.max_attempts, f"job {raw.hex()}: attempts {got}"
    for key, raw in r.hgetall(k["kk"]).items():
        assert raw.hex() in states and decode_record(recs[raw]).key == key.decode(), f"key {key!r} -> {raw.hex()}"
    for name in r.smembers(ks.key(0, "crons")):
        cron = r.hgetall(ks.key(0, "cron:" + name.decode()))
        assert {b"def", b"head", b"tail", b"queue", b"ver", b"h"} <= set(cron), f"cron {name!r}: {sorted(cron)}"
        assert len(cron[b"times"]) == len(cron[b"fires"]) and len(cron[b"times"]) % 6 == 0, f"cron {name!r} table"
        pending = cron.get(b"pending") or b""
        assert not pending or states.get(pending.hex()) == "scheduled", f"cron {name!r}: pending {pending.hex()}"


def save(r: redis.Redis) -> list[tuple[bytes, int, bytes]]:
    return [(key, int(r.pttl(key)), r.dump(key)) for key in r.scan_iter(count=1000)]


def restore(r: redis.Redis, saved: list[tuple[bytes, int, bytes]]) -> bytes:
    pipe = r.pipeline(transaction=False)
    pipe.flushall()
    for key, ttl, dump in saved:
        pipe.restore(key, max(ttl, 0), dump, replace=True)
    pipe.execute()
    return bytes(r.execute_command("DEBUG", "DIGEST"))


def verdict(call: Call, reply: Any, changed: bool) -> str | None:
    """What is wrong with a reply (None: nothing). A success is judged by the caller."""
    if not isinstance(reply, Exception):
        return f"succeeded, but ARGV[{call.must_refuse}] should have been refused" if call.must_refuse else None
    msg = str(reply)
    if call.good:
        return f"a good call failed: {msg[:160]}"
    if changed:
        return f"wrote, then failed: {msg[:160]}"
    if not msg.startswith(f"ZSCHED_ARG {call.name} "):
        return f"an error that is not the argument check's: {msg[:160]}"
    if call.must_refuse and f"ARGV[{call.must_refuse}] " not in msg:
        return f"refused, but not naming ARGV[{call.must_refuse}]: {msg[:160]}"
    return None


def run(r: redis.Redis, client: Client, calls: list[Call]) -> list[str]:
    """Send the calls pipelined, each followed by DEBUG DIGEST; returns the failures. The first call
    that changed the data is sent again alone (the calls after it ran on its changes) to judge its
    outcome, then the data is restored and the calls after it are sent again."""
    shas = {name: r.script_load(s.source) for name, s in load_scripts().items()}
    saved = save(r)
    digest = restore(r, saved)
    failures: list[str] = []

    def send(batch: list[Call]) -> list[tuple[Any, bytes]]:
        pipe = r.pipeline(transaction=False)
        for call in batch:
            pipe.evalsha(shas[call.name], len(call.keys), *call.keys, *call.args)
            pipe.execute_command("DEBUG", "DIGEST")
        replies = pipe.execute(raise_on_error=False)
        return [(replies[i], bytes(replies[i + 1])) for i in range(0, len(replies), 2)]

    start = 0
    while start < len(calls):
        outcomes = send(calls[start:start + PIPELINE])
        changed = next((j for j, (_, after) in enumerate(outcomes) if after != digest), len(outcomes))
        for call, (reply, _) in zip(calls[start:start + changed], outcomes):
            problem = verdict(call, reply, False)
            if problem:
                failures.append(f"{call.label}: {problem}")
        if changed == len(outcomes):
            start += len(outcomes)
            continue
        call = calls[start + changed]
        digest = restore(r, saved)
        [(reply, after)] = send([call])
        problem = verdict(call, reply, after != digest)
        if problem is None and not isinstance(reply, Exception):
            try:
                check_world(r, client)
            except Exception as exc:  # an invariant broken by a call that succeeded
                problem = f"succeeded and broke an invariant: {type(exc).__name__}: {str(exc)[:160]}"
        if problem:
            failures.append(f"{call.label}: {problem}")
        digest = restore(r, saved)
        start += changed + 1
    return failures


def test_every_bad_argument_is_refused_before_any_write_and_a_success_keeps_every_invariant(
        world: tuple[Client, redis.Redis, list[Call]]) -> None:
    client, r, base = world
    check_world(r, client)
    assert {c.name for c in base} == set(load_scripts()), "a script has no call here"
    calls = [m for b in base for m in mutations(b)]
    failures = run(r, client, base + calls)
    assert not failures, f"{len(failures)} of {len(base) + len(calls)} calls:\n" + "\n".join(failures[:40])


def test_a_batch_whose_fifth_run_at_is_bad_writes_none_of_its_jobs(world: tuple[Client, redis.Redis, list[Call]]
                                                                  ) -> None:
    client, r, _ = world
    _, keys, args = client.calls.prepare([(time.time() + 60 + i, i) for i in range(6)], JobOptions(queue="q"))[0][0]
    args = list(args)
    args[7 + 4 * 3 + 1] = "nan"  # the 5th job's run_at
    assert run(r, client, [Call("schedule, 5th run_at bad", "schedule", list(keys), args, 21)]) == []


def test_a_claim_with_a_bad_receipt_ttl_takes_no_job(world: tuple[Client, redis.Redis, list[Call]]) -> None:
    client, r, _ = world
    _, keys, args = raw_call(client.calls, "claim", 0, "q", 5, "rid-nan", "nan", "", 5)  # a NaN receipt
    assert run(r, client, [Call("claim, receipt ttl nan", "claim", list(keys), list(args), 7)]) == []
    assert r.llen(client.keyspace.ready(0, "q")) > 0, "the ready jobs it would have taken are still there"
