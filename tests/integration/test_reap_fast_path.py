"""lua/reap.lua's fast path ends in exactly the state and reply of its general path, on a real
redis-server.

Two namespaces live side by side: ``fa`` runs the shipped script (fast path first), ``ge`` the same
script without the fast path's block (general path only). Both get the same jobs (same ids and
records), claimed on each side by the same claim, then every step sends both the same reap and
compares the replies and every key of the two namespaces (what each side's clock stamps compared
by shape). The fast path is a reap that finds no expired lease: an idle partition, jobs running
within their leases, unfenced or with the epoch Redis has; everything else goes the general way: an
expired lease (a retry, and a job whose attempts are spent), an epoch newer than Redis's (stored)
or older (refused), a changed layout, bad arguments.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any

import redis

from tests.support.fastpath import SIDES, ScriptPair, members_only, pair_fixture, stamped_by_shape
from tests.support.helpers import namespace_state

PARTITIONS = 2
FAST = Counter({"evalsha": 1, "hmget": 1, "time": 1, "zrange": 1})
"""What a reap that takes the fast path to its end sends (commandstats)."""


class Pair(ScriptPair):
    """The two namespaces and their reap scripts."""

    def __init__(self, url: str, declared: int) -> None:
        super().__init__(url, "reap", PARTITIONS, ("schedule", "claim"), declared)

    def call(self, ns: str, name: str, partition: int, args: list[Any], part: str | None = None) -> Any:
        ks = self.ks[ns]
        try:
            keys = self.keys(ns, name, partition)
            return self.r.evalsha(self.script(ns, name), len(keys), *keys, ks.prefix(partition),
                                  ks.channel_prefix(partition), part or f"{partition}/{PARTITIONS}", *args)
        except redis.ResponseError as exc:
            return ("error", str(exc))

    def run_one(self, partition: int, **opts: Any) -> bytes:
        """The same job (same id and record) on both sides, due now and claimed; its id."""
        args = self.schedule_args(time.time() - 1, partition, "mail", **opts)
        raw = bytes(args[4])[:15]
        for ns in SIDES:
            assert self.call(ns, "schedule", partition, args)[2] == raw
            reply = self.call(ns, "claim", partition, ["mail", 100, "", "", "", ""])
            assert reply[1] == raw, reply
        return raw

    def reap(self, partition: int, epoch: int = 0, batch: Any = 100, part: str | None = None) -> tuple[Any, Any]:
        out = []
        for ns in SIDES:
            before = self.counts()
            out.append(self.call(ns, "reap", partition, [epoch, batch], part))
            if ns == "fa":
                sent = self.counts() - before
                del sent["info"]  # counts()' own
                self.fast_runs += +sent == FAST
        return out[0], out[1]

    def state(self, ns: str) -> dict[str, Any]:
        """The namespace's keys (tests/support/helpers.py), with what TIME stamps by shape."""
        def hashes(name: str, h: dict[bytes, bytes]) -> dict[bytes, bytes]:
            if name.endswith(":j"):  # a reaped job is due at each side's own now
                return {k: v[6:] for k, v in h.items()}
            return stamped_by_shape(name, h)

        return namespace_state(self.r, ns, hash_fix=hashes, zset_fix=members_only)

    def check(self, step: str, replies: tuple[Any, Any]) -> None:
        fa, ge = replies
        if isinstance(fa, list) and isinstance(ge, list) and fa[0] != -1:
            # {reaped, next deadline or -1, now}: deadlines and now come from each side's clock
            assert fa[0] == ge[0] and (fa[1] < 0) == (ge[1] < 0), f"{step}: replies differ: {fa!r} vs {ge!r}"
            assert abs(fa[1] - ge[1]) < 5000 and abs(fa[2] - ge[2]) < 5000, f"{step}: {fa!r} vs {ge!r}"
        else:
            assert fa == ge, f"{step}: replies differ: {fa!r} vs {ge!r}"
        self.assert_same_state(step)


pair = pair_fixture(Pair)


def test_the_fast_path_and_the_general_path_leave_the_same_state_and_replies(pair: Pair) -> None:
    p = 0

    def run(name: str, fast: bool, **kw: Any) -> tuple[Any, Any]:
        runs = pair.fast_runs
        replies = pair.reap(p, **kw)
        pair.check(name, replies)
        took = pair.fast_runs - runs
        assert took == int(fast), f"{name}: fast path taken {took} times, expected {int(fast)}"
        return replies

    fa, _ = run("an idle partition, unfenced", True)
    assert fa[:2] == [0, -1]
    run("an idle partition, the first epoch (stored)", False, epoch=3)
    run("the same epoch again", True, epoch=3)
    fa, _ = run("an older epoch (refused)", False, epoch=2)
    assert fa == [-1, 3]
    run("unfenced again", True)
    running = pair.run_one(p)
    fa, _ = run("a job running within its lease", True, epoch=3)
    assert fa[0] == 0 and fa[1] > fa[2]
    short = pair.run_one(p, lease=0.1)
    last = pair.run_one(p, lease=0.1, max_attempts=1)
    time.sleep(0.25)
    fa, _ = run("two leases expired: one job retried, one dead-lettered", False, epoch=3)
    assert fa[0] == 2 and fa[1] > fa[2]
    for ns in SIDES:
        ks = pair.ks[ns]
        assert pair.r.zscore(ks.partition_keys(p)[5], last) is not None, f"{ns}: its attempts spent, dead"
        assert pair.r.hexists(ks.partition_keys(p)[6], short), f"{ns}: its LeaseExpired error is kept"
        assert pair.r.zscore(ks.partition_keys(p)[3], running) is not None, f"{ns}: the other one still runs"
    run("then nothing expired", True, epoch=3)
    run("a newer epoch (stored, then fast)", False, epoch=4)
    run("the other partition", True)
    for ns in SIDES:  # zsched migrate-partitions changed the count
        pair.r.hset(pair.ks[ns].partition_keys(p)[12], "layout", "4")
    fa, _ = run("a changed layout (refused)", False, epoch=4)
    assert fa[0] == "error" and "ZSCHED_LAYOUT" in fa[1]
    fa, _ = run("without a count: no layout fence", True, epoch=4, part=str(p))
    for ns in SIDES:
        pair.r.hset(pair.ks[ns].partition_keys(p)[12], "layout", str(PARTITIONS))
    for bad in (0, 5001, "x", ""):
        fa, _ = run(f"batch {bad!r} (refused)", False, batch=bad)
        assert fa[0] == "error" and "ZSCHED_ARG" in fa[1], fa


def test_a_one_key_reap_names_the_partitions_other_keys_from_the_prefix(redis_url: str) -> None:
    """Off a cluster the tier sends reap with the timer set alone; the general path (an expired
    lease) must find the lease hash, the jobs and the dead set from the prefix as the fast path
    does. Checked against a reap that declares all 14 keys, in the pair's namespaces."""
    one, every = Pair(redis_url, 1), Pair(redis_url, 14)
    try:
        jobs = [one.run_one(0, lease=0.1) for _ in range(3)]
        time.sleep(0.25)
        fa, ge = one.reap(0)
        assert fa[0] == ge[0] == 3
        for ns in SIDES:
            ks = one.ks[ns]
            assert not one.r.zcard(ks.partition_keys(0)[3]) and not one.r.hlen(ks.partition_keys(0)[4])
            assert sorted(one.r.lrange(ks.ready(0, "mail"), 0, -1)) == sorted(jobs)
        assert every.reap(0)[0][:2] == [0, -1]
    finally:
        one.close()
        every.close()
