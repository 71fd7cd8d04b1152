"""lua/ack.lua's fast path ends in exactly the state and reply of its general path, on a real
redis-server.

Two namespaces live side by side: ``fa`` runs the shipped script (fast path first), ``ge`` the same
script without the fast path's block (general path only). Both get the same jobs (same ids,
records and times), claimed on each side by the same claim (tokens come from each side's clock, so
each side acks with its own), then every step acks the same jobs on both and compares the replies
and every key of the two namespaces. The steps cover the ways in and out of the fast paths (one job,
and several): a tombstone kept and none kept, per-job options in the record, a stale token
(refused on the one-job path too), Redis Cluster's channel prefix, jobs of two queues in one call,
the tombstone sweep's turn (swept on the fast paths, expired summaries deleted alike), and what
only the general path does: an error kept from an earlier attempt, an idempotency key to free, a
record that is missing, corrupt or names a queue the partition no longer knows, a stale token
among several, one id twice in a call.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any

import redis

from scheduler.protocol.calls import error_arg
from tests.support.fastpath import SIDES, ScriptPair, members_only, pair_fixture, stamped_by_shape
from tests.support.helpers import namespace_state

PARTITIONS = 2
TOMB_MS = 3_600_000


class Pair(ScriptPair):
    """The two namespaces and their ack scripts."""

    def __init__(self, url: str, declared: int) -> None:
        super().__init__(url, "ack", PARTITIONS, ("schedule", "claim", "fail"), declared)
        self.tokens: dict[str, dict[bytes, int]] = {ns: {} for ns in SIDES}
        self.blur: set[bytes] = set()  # jobs whose times each side's own clock set (a retry's)

    def call(self, ns: str, name: str, partition: int, args: list[Any], *, sharded: bool = False) -> Any:
        ks = self.ks[ns]
        sha = self.script(ns, name)
        chan = ks.prefix(partition) if sharded else ks.channel_prefix(partition)
        part = str(partition) if name == "ack" else f"{partition}/{PARTITIONS}"
        try:
            keys = self.keys(ns, name, partition)
            return self.r.evalsha(sha, len(keys), *keys, ks.prefix(partition), chan, part, *args)
        except redis.ResponseError as exc:
            return ("error", str(exc))

    def run_one(self, partition: int, queue: str = "mail", key: str | None = None, **opts: Any) -> bytes:
        """The same job (same id and record) on both sides, due now and claimed; its id."""
        args = self.schedule_args(time.time() - 1, partition, queue, key, **opts)
        raw = bytes(args[4])[:15]
        for ns in SIDES:
            assert self.call(ns, "schedule", partition, args)[2] == raw
            self.claim(ns, partition, queue)
        return raw

    def claim(self, ns: str, partition: int, queue: str = "mail") -> None:
        reply = self.call(ns, "claim", partition, [queue, 100, "", "", "", ""])
        for i in range(1, len(reply), 5):
            self.tokens[ns][reply[i]] = int(reply[i + 2])

    def ack(self, partition: int, ids: list[bytes], *, ttl: int = TOMB_MS, stale: bool = False,
            sharded: bool = False) -> tuple[Any, Any]:
        out, deltas = [], []
        for ns in SIDES:
            args: list[Any] = [ttl]
            for raw in ids:
                args += [raw, self.tokens[ns][raw] - (1 if stale else 0)]
            before = self.counts()
            out.append(self.call(ns, "ack", partition, args, sharded=sharded))
            deltas.append(self.counts() - before)
        # The fast path asks whether an error is kept with HEXISTS (one job) or HLEN and HMGET
        # (several) where the general path reads it with HGET, and reads several jobs' tokens and
        # records with HMGET: a fast side that sent some other command more often than the general
        # side fell through; one that sent fewer did not.
        more = Counter(deltas[0])
        more.subtract(deltas[1])
        if all(v <= 0 for k, v in more.items() if k not in ("hexists", "hlen", "hmget")) and \
                any(v < 0 for v in more.values()):
            self.fast_runs += 1
        return out[0], out[1]

    def state(self, ns: str) -> dict[str, Any]:
        """The namespace's keys (tests/support/helpers.py), with what TIME stamps by shape."""
        def hashes(name: str, h: dict[bytes, bytes]) -> dict[bytes, bytes]:
            if name.endswith(":f"):  # a retried job's due time and error came from each side's clock
                return {k: (v[:5] + v[11:16] + v[16:].split(b"\0", 1)[-1] if k in self.blur else v)
                        for k, v in h.items()}
            return stamped_by_shape(name, h)

        return namespace_state(self.r, ns, hash_fix=hashes, zset_fix=members_only)

    def check(self, step: str, replies: tuple[Any, Any]) -> None:
        assert replies[0] == replies[1], f"{step}: replies differ: {replies[0]!r} vs {replies[1]!r}"
        self.assert_same_state(step)
        for ns in SIDES:  # the last hour's minute hashes expire (namespace_state compares contents)
            ttls = [self.r.ttl(k) for k in self.r.scan_iter(match=f"{{{ns}:*}}:hist:*")]
            assert ttls and all(3600 < t <= 3720 for t in ttls), f"{step}: {ns}'s minute hashes expire in {ttls} s"


pair = pair_fixture(Pair)


class Steps:
    """Acks sent to both sides of ``pair`` in partition ``p``, each compared (``run``)."""

    def __init__(self, pair: Pair, p: int = 0) -> None:
        self.pair, self.p = pair, p

    def run(self, name: str, fast: bool, ids: list[bytes], **kw: Any) -> tuple[Any, Any]:
        pair = self.pair
        runs = pair.fast_runs
        replies = pair.ack(self.p, ids, **kw)
        pair.check(name, replies)
        took = pair.fast_runs - runs
        assert took == int(fast), f"{name}: fast path taken {took} times, expected {int(fast)}"
        return replies

    def each(self, edit: Any) -> None:
        for ns in SIDES:
            edit(self.pair.ks[ns].partition_keys(self.p), ns)

    def retried(self) -> bytes:
        """A job that failed once, its error kept, claimed again."""
        pair, p = self.pair, self.p
        retried = pair.run_one(p)
        for ns in SIDES:
            f = pair.call(ns, "fail", p, [retried, pair.tokens[ns][retried], b"f", 0, error_arg("E", "boom")])
            assert f == [1], f
            pair.claim(ns, p)
        pair.blur.add(retried)
        return retried

    def sweeps_turn(self) -> bytes:
        """A running job whose id's last byte gives its ack the tombstone sweep's turn (a multiple
        of 8); the jobs drawn before it are acked one by one on the way, not on their turn."""
        while True:
            job = self.pair.run_one(self.p)
            if job[-1] % 8 == 0:
                return job
            self.run("not the sweep's turn", True, [job])

    def corrupt(self) -> bytes:
        """A running job whose record was cut short."""
        corrupt = self.pair.run_one(self.p)
        r = self.pair.r
        self.each(lambda keys, ns: r.hset(keys[2], corrupt, (r.hget(keys[2], corrupt) or b"")[:12]))
        return corrupt


def test_one_job_the_fast_path_and_the_general_path_leave_the_same_state_and_replies(pair: Pair) -> None:
    p, steps = 0, Steps(pair)
    run, each = steps.run, steps.each
    job = pair.run_one(p)
    fa, _ = run("one job, its tombstone kept", True, [job])
    assert fa == [1]
    assert pair.r.hexists(pair.ks["fa"].partition_keys(p)[13], job)
    run("the same job again: no longer running", True, [job])
    run("one job, no tombstone", True, [pair.run_one(p)], ttl=0)
    run("one job, its tombstone kept for a millisecond", True, [pair.run_one(p)], ttl=1)
    for opts in ({"lease": 45.0}, {"misfire": "skip", "misfire_grace": 30.0, "lease": 7.0},
                 {"max_attempts": 9}, {"queue": "sms"}):
        run(f"a job with {opts}", True, [pair.run_one(p, **opts)])
    stale = pair.run_one(p)
    fa, _ = run("a stale token (refused)", True, [stale], stale=True)
    assert fa == [0]
    run("then its own", True, [stale])
    run("Redis Cluster's channel prefix", True, [pair.run_one(p)], sharded=True)

    run("an error kept from an earlier attempt", False, [steps.retried()])
    run("an idempotency key to free", False, [pair.run_one(p, key="once")])

    missing = pair.run_one(p)
    each(lambda keys, ns: pair.r.hdel(keys[2], missing))
    run("a missing record", False, [missing])
    run("a corrupt record", False, [steps.corrupt()])
    unknown = pair.run_one(p, queue="gone")
    each(lambda keys, ns: pair.r.hdel(keys[9], "i:" + str(pair.r.hget(keys[9], "n:gone"), "ascii")))
    run("a queue the partition no longer knows", False, [unknown])
    assert pair.fast_runs >= 9


def test_several_jobs_the_fast_path_and_the_general_path_leave_the_same_state_and_replies(pair: Pair) -> None:
    p, steps = 0, Steps(pair)
    run = steps.run
    fa, _ = run("two jobs in one call", True, [pair.run_one(p), pair.run_one(p)])
    assert fa == [1, 1]
    run("five jobs of two queues, their tombstones kept", True,
        [pair.run_one(p, queue="mail" if i % 2 else "sms") for i in range(5)])
    run("three jobs, no tombstone", True, [pair.run_one(p) for _ in range(3)], ttl=0)
    run("several jobs with per-job options", True,
        [pair.run_one(p, **opts) for opts in ({"lease": 45.0}, {"max_attempts": 9}, {"queue": "sms"})])
    jobs = [pair.run_one(p) for _ in range(3)]
    run("three jobs", True, jobs)
    fa, _ = run("the same jobs again: no longer running (refused, on the general path)", False, jobs)
    assert fa == [0, 0, 0]
    jobs = [pair.run_one(p) for _ in range(3)]
    for ns in SIDES:  # the second job's lease was lost: its token is stale
        pair.tokens[ns][jobs[1]] -= 1
    fa, _ = run("a stale token among several", False, jobs)
    assert fa == [1, 0, 1]
    for ns in SIDES:
        pair.tokens[ns][jobs[1]] += 1
    run("then its own", True, [jobs[1]])
    twice = pair.run_one(p)
    fa, _ = run("one id twice in one call", False, [twice, twice])
    assert fa == [1, 0]
    run("an error kept from an earlier attempt of one of several", False, [pair.run_one(p), steps.retried()])
    run("several jobs while another job's error is kept", True, [pair.run_one(p), pair.run_one(p)])
    run("an idempotency key among several", False, [pair.run_one(p), pair.run_one(p, key="again")])
    run("a corrupt record among several", False, [pair.run_one(p), steps.corrupt()])
    assert pair.fast_runs >= 7


def test_the_tombstone_sweeps_turn_is_taken_on_the_fast_paths(pair: Pair) -> None:
    """An id whose last byte is a multiple of 8 (or 8 jobs in a call), 'f' over 512 entries,
    every other one expired: both sides sweep alike."""
    p, steps = 0, Steps(pair)
    run = steps.run
    run("one job, its tombstone kept", True, [pair.run_one(p)])
    f_key = pair.ks["fa"].partition_keys(p)[13]
    some = pair.r.hgetall(f_key)
    stone = next(iter(some.values()))
    expired = stone[:7] + (1000).to_bytes(6, "big") + stone[13:]  # expires (bytes 8-13) in 1970
    for ns in SIDES:
        pair.r.hset(pair.ks[ns].partition_keys(p)[13],
                    mapping={b"%015d" % i: (expired if i % 2 else stone) for i in range(1200)})
    size = pair.r.hlen(f_key)
    run("the tombstone sweep's turn (swept on the fast path)", True, [steps.sweeps_turn()])
    assert pair.r.hlen(f_key) < size, "the sweep deleted no expired tombstone"
    while True:
        first = pair.run_one(p)
        if first[-1] % 8:
            break
    run("not the sweep's turn, several jobs", True, [first, pair.run_one(p)])
    size = pair.r.hlen(f_key)
    run("the sweep's turn by the first of several jobs (swept on the fast path)", True,
        [steps.sweeps_turn(), pair.run_one(p)])
    assert pair.r.hlen(f_key) < size, "the sweep deleted no expired tombstone"
    size = pair.r.hlen(f_key)
    run("eight jobs: always the sweep's turn (swept on the fast path)", True, [pair.run_one(p) for _ in range(8)])
    assert pair.r.hlen(f_key) < size + 8, "the sweep deleted no expired tombstone"
    run("eight jobs, no tombstone", True, [pair.run_one(p) for _ in range(8)], ttl=0)
