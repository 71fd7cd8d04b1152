"""lua/schedule.lua's one-job fast path ends in exactly the state, reply and messages of its general
path, on a real redis-server.

Two namespaces live side by side: ``fa`` runs the shipped script (fast path first), ``ge`` the same
script without the fast path's block (general path only). Every step sends both the same
call (same id, payload, time and options), then compares the replies, every key of the two
namespaces and the pub/sub messages each published. The steps cover each way in and out of the fast
path: a queue the partition does not know yet, later and earlier and equal times (the owner's wake),
relative times near and far from the id's estimate, a job already due, a misfire, an idempotency
key, the layout fence (refused and passed) and sharded pub/sub.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis

from bench.script_cost import general_only
from scheduler import Client
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.options import JobOptions
from scheduler.protocol.scripts import load_scripts
from tests.support.helpers import namespace_state

PARTITIONS = 4


class Pair:
    """The two namespaces, their scripts and a pub/sub listener on both."""

    def __init__(self, url: str) -> None:
        self.r = redis.Redis.from_url(url)
        self.fast = self.r.script_load(load_scripts()["schedule"].source)
        self.general = self.r.script_load(general_only())
        assert self.fast != self.general
        self.client = Client.from_url(url, namespace="fa", partitions=PARTITIONS).connect()
        self.ks = {"fa": Keyspace("fa", PARTITIONS), "ge": Keyspace("ge", PARTITIONS)}
        self.ps = self.r.pubsub(ignore_subscribe_messages=True)
        self.ps.psubscribe("fa:*", "ge:*")
        self.ps.ssubscribe(*[f"{{{ns}:{p}}}:wake" for ns in ("fa", "ge") for p in range(PARTITIONS)])
        self.ps.subscribe("end-of-step")
        self.fast_runs = 0  # fa calls that took the fast path (the only caller of ZCOUNT here)
        self.known = False  # whether the last call's partition knew its queue before it
        self.seen: set[str] = set()  # channels the fast path's namespace published on

    def close(self) -> None:
        self.ps.close()
        self.client.close()
        self.r.close()

    def send(self, at: Any, *, key: str | None = None, sharded: bool = False, **opts: Any) -> tuple[Any, Any]:
        """The same schedule call on both sides; returns (fast reply, general reply)."""
        name, _keys, args = self.client.calls.prepare_one(at, {"n": 1}, key, JobOptions(**opts))
        part = int(str(args[2]).split("/")[0])
        self.known = bool(self.r.hexists(self.ks["fa"].partition_keys(part)[9], f"n:{opts.get('queue', 'default')}"))
        out = []
        for ns, sha in (("fa", self.fast), ("ge", self.general)):
            ks = self.ks[ns]
            chan = ks.prefix(part) if sharded else ks.channel_prefix(part)
            before = self.zcounts()
            try:
                out.append(self.r.evalsha(sha, 1, *ks.partition_keys(part)[:1], ks.prefix(part), chan, *args[2:]))
            except redis.ResponseError as exc:
                out.append(("error", str(exc)))
            if ns == "fa":
                self.fast_runs += self.zcounts() - before
            else:
                assert self.zcounts() == before, "the general path does not count timers"
        return out[0], out[1]

    def zcounts(self) -> int:
        return int(self.r.info("commandstats").get("cmdstat_zcount", {}).get("calls", 0))

    def messages(self) -> dict[str, list[tuple[str, bytes]]]:
        got: dict[str, list[tuple[str, bytes]]] = {"fa": [], "ge": []}
        self.r.publish("end-of-step", b"")  # a subscriber gets messages in the order they were sent
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = self.ps.get_message(timeout=1)
            if m is None:
                continue
            chan = m["channel"].decode()
            if chan == "end-of-step":
                return got
            ns = "fa" if chan.startswith(("fa:", "{fa:")) else "ge"
            got[ns].append((chan.replace(ns, "NS", 1), m["data"]))
        raise AssertionError("the end-of-step message did not come back within 10 s")

    def state(self, ns: str) -> dict[str, Any]:
        """The namespace's keys and doorbells (tests/support/helpers.py), with the times two calls made
        microseconds apart differ in (TIME) normalised: a run_at resolved by the script's own clock
        ("ESTrDELTA" far from the estimate) is noted in 'm' and is the timer's score, so the two
        calls may be a millisecond apart."""
        moved = {k for p in range(PARTITIONS) for k in self.r.hkeys(self.ks[ns].partition_keys(p)[1])}

        def m_hash(name: str, h: dict[bytes, bytes]) -> dict[bytes, bytes]:
            return {k: b"<ms>" for k in h} if name.endswith(":m") else h

        def scores(name: str, z: list[Any]) -> list[Any]:
            return [(m, "<ms>" if m[:15] in moved else score) for m, score in z]
        return namespace_state(self.r, ns, hash_fix=m_hash, zset_fix=scores)

    def check(self, step: str, replies: tuple[Any, Any]) -> None:
        fast, general = replies
        if isinstance(fast, tuple) or isinstance(general, tuple):
            assert fast == general, f"{step}: replies differ: {fast!r} vs {general!r}"
        else:
            assert fast[1:] == general[1:], f"{step}: replies differ: {fast!r} vs {general!r}"
            assert abs(fast[0] - general[0]) < 1000, f"{step}: the replies' clocks differ: {fast!r} vs {general!r}"
        a, b = self.state("fa"), self.state("ge")
        diff = {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
        assert not diff, f"{step}: the namespaces differ (key: fast path's, general path's): {diff}"
        msgs = self.messages()
        assert msgs["fa"] == msgs["ge"], f"{step}: published messages differ: {msgs}"
        self.seen.update(chan for chan, _ in msgs["fa"])
        self.seen.update(k for k in a if ":bell:" in k)


@pytest.fixture
def pair(redis_url: str) -> Iterator[Pair]:
    p = Pair(redis_url)
    yield p
    p.close()


def test_the_fast_path_and_the_general_path_leave_the_same_state_replies_and_messages(pair: Pair) -> None:
    now = time.time()
    hour = now + 3600
    # (step, at, options, whether the fast path takes it once its partition knows the queue)
    steps: list[tuple[str, Any, dict[str, Any], bool]] = [
        ("a queue's first jobs (the general path names it in each partition)", hour, {"queue": "mail"}, True),
        ("a later job (no wake)", hour + 60, {"queue": "mail"}, True),
        ("an earlier job (wakes the owner)", hour - 60, {"queue": "mail"}, True),
        ("a job at the earliest timer's time (no wake)", hour - 60, {"queue": "mail"}, True),
        ("a relative time near the id's estimate", timedelta(minutes=10), {"queue": "mail"}, True),
        ("options in the record", hour + 5, {"queue": "mail", "max_attempts": 3, "misfire": "skip",
                                              "misfire_grace": 30, "lease": 90}, True),
        ("a job already due (ready list)", now - 1, {"queue": "mail"}, False),
        ("a due job past its grace (misfired)", now - 60, {"queue": "mail", "misfire": "skip", "misfire_grace": 1},
         False),
        ("a second queue", hour + 7, {"queue": "sms"}, True),
        ("sharded pub/sub, earliest of its partition", now + 30, {"queue": "sms", "_sharded": True}, True),
    ]
    for step, at, opts, eligible in steps:
        sharded = bool(opts.pop("_sharded", False))
        for _ in range(8):  # eight ids: the calls spread over the partitions
            runs = pair.fast_runs
            pair.check(step, pair.send(at, sharded=sharded, **opts))
            assert pair.fast_runs - runs == int(eligible and pair.known), f"{step}: fast path taken or not"
    assert pair.fast_runs >= 30, f"the fast path ran {pair.fast_runs} times"
    assert {"NS:wake", "{NS}:bell:mail"} <= pair.seen and any(c.endswith("}:wake") for c in pair.seen), pair.seen
    runs = pair.fast_runs
    pair.check("an idempotency key", pair.send(hour, key="k-1", queue="mail"))
    pair.check("the same key again", pair.send(hour + 1, key="k-1", queue="mail"))
    assert pair.fast_runs == runs, "a job with a key takes the general path"

    # a relative time whose estimate is off by more than the slack: the id's time is not the
    # run_at, so 'm' notes it (general path)
    pair.client.calls.clock_offset_ms = 3_600_000
    pair.check("a relative time far from the id's estimate", pair.send(timedelta(minutes=5), queue="mail"))
    assert pair.fast_runs == runs, "a time the id does not carry takes the general path"
    pair.client.calls.clock_offset_ms = 0

    # the layout fence: a count that differs is refused with the same words, the same passes
    for p in range(PARTITIONS):
        for ns in ("fa", "ge"):
            pair.r.hset(pair.ks[ns].partition_keys(p)[12], "layout", "8")
    fast, general = pair.send(hour, queue="mail")
    assert fast[0] == "error" and "ZSCHED_LAYOUT changed" in fast[1]
    pair.check("refused by the layout fence", (fast, general))
    assert pair.fast_runs == runs, "a refusal comes from the general path"
    for p in range(PARTITIONS):
        for ns in ("fa", "ge"):
            pair.r.hset(pair.ks[ns].partition_keys(p)[12], "layout", str(PARTITIONS))
    pair.check("passed by the layout fence", pair.send(hour + 9, queue="mail"))
    assert pair.fast_runs == runs + 1
    scheduled = sum(pair.r.zcard(pair.ks["fa"].partition_keys(p)[0]) for p in range(PARTITIONS))
    assert scheduled == 8 * 8 + 3, "every future job is in the timer sets"
