"""lua/claim.lua's fast path ends in exactly the state and reply of its general path, on a real
redis-server.

Two namespaces live side by side: ``fa`` runs the shipped script (fast path first), ``ge`` the same
script without the fast path's block (general path only). Both get the same jobs (same ids,
records and times), then every step sends both the same claim and compares the replies and every
key of the two namespaces, doorbells included. What two calls microseconds apart stamp differently
is compared by shape: lease deadlines and tokens relative to the reply's clock and to the first
token, the token fence and receipts' tokens by length. The steps cover the ways in and out of the
fast path: one and several jobs, fewer left than asked for and more (the re-ring), the due-job
limit (jobs put back, the ring), jobs handed off ahead of their due time, per-job leases, an
earlier receipt to drop, an empty list, Redis Cluster's layout (no ring), and what only the general
path does: a re-sent claim (its receipt), a paused queue, a changed layout (refused), no request
id, more than a thousand jobs, and popped jobs the general path must look at (one already running,
a corrupt record, a missing body: put back first).
"""
from __future__ import annotations

import time
from typing import Any

import redis

from tests.support.fastpath import ScriptPair, pair_fixture
from tests.support.helpers import namespace_state

PARTITIONS = 2
RECEIPT_MS = 30_000


class Pair(ScriptPair):
    """The two namespaces and their claim scripts."""

    def __init__(self, url: str, declared: int) -> None:
        super().__init__(url, "claim", PARTITIONS, ("schedule", "tick", "pause", "ack"), declared)
        self.answered: dict[str, tuple[Any, Any]] = {}  # each request id's first replies (fa, ge)
        self.rids = 0

    def both(self, name: str, partition: int, args: list[Any], *, sharded: bool = False,
             layout: bool = True) -> tuple[Any, Any]:
        """Script ``name`` (claim: fast on ``fa``, general on ``ge``) on both namespaces with
        ``args`` after the common ones."""
        out, deltas = [], []
        for ns in ("fa", "ge"):
            ks = self.ks[ns]
            sha = self.script(ns, name)
            chan = ks.prefix(partition) if sharded else ks.channel_prefix(partition)
            part = f"{partition}/{PARTITIONS}" if layout else str(partition)
            before = self.counts()
            try:
                keys = self.keys(ns, name, partition)
                out.append(self.r.evalsha(sha, len(keys), *keys, ks.prefix(partition), chan, part,
                                          *args))
            except redis.ResponseError as exc:
                out.append(("error", str(exc)))
            after = self.counts()
            deltas.append(after - before)
        if name == "claim":
            # The fast path reads meta with one HMGET where the general path HGETs its layout (and
            # its fence); a fast side that sent GET or TIME more often than the general side (its
            # own, then the general path's) fell through, and one that HGETs as often as it ran the
            # general path after its HMGET (a changed layout).
            more = deltas[0].copy()
            more.subtract(deltas[1])
            if more["hmget"] == 1 and more["hget"] < 0 and more["get"] <= 0 and more["time"] <= 0:
                self.fast_runs += 1
        return out[0], out[1]

    def schedule(self, at: float, partition: int, queue: str = "mail", **opts: Any) -> bytes:
        """The same job (same id and record) on both sides, due at ``at`` (epoch s); its id."""
        args = self.schedule_args(at, partition, queue, **opts)
        fa, ge = self.both("schedule", partition, args)
        assert fa[1:] == ge[1:], (fa, ge)
        return bytes(args[4])[:15]

    def claim(self, partition: int, n: int, *, queue: str = "mail", rid: str | None = None, prev: str = "",
              max_due: int | str = 1000, receipt_ms: int | str = RECEIPT_MS, **kw: Any) -> tuple[Any, Any]:
        if rid is None:
            self.rids += 1
            rid = f"w1-{self.rids}"
        replies = self.both("claim", partition, [queue, n, rid, receipt_ms if rid else "", prev, max_due], **kw)
        first = self.answered.get(rid)
        if first is None:
            if rid:
                self.answered[rid] = replies
            return replies
        # a re-send: each side answers with the jobs, tokens and deadlines its first call gave
        for side, again, was in zip(("fa", "ge"), replies, first):
            assert again[1:] == was[1:], f"{side}: the re-sent claim {rid} got {again!r}, first {was!r}"
        return replies

    def state(self, ns: str) -> dict[str, Any]:
        """The namespace's keys and doorbells (tests/support/helpers.py), with what TIME stamps by shape."""
        def hashes(name: str, h: dict[bytes, bytes]) -> dict[bytes, bytes]:
            if name.endswith(":meta"):  # the token fence and tick's last sweep: when, not whether
                return {k: (b"<us>" if k in (b"fence", b"tsw") else v) for k, v in h.items()}
            if name.endswith(":e"):  # errors: when, then what
                return {k: v[v.index(b"\0"):] for k, v in h.items()}
            if name.endswith(":l"):  # tokens: their order
                firsts = sorted(int(v) for v in h.values())
                return {k: str(firsts.index(int(v))).encode() for k, v in h.items()}
            return h

        def zsets(name: str, z: list[Any]) -> list[Any]:
            return sorted(m for m, _ in z) if name.endswith((":i", ":d")) else z  # lease deadlines, deaths: when
        out = namespace_state(self.r, ns, hash_fix=hashes, zset_fix=zsets)
        for raw in self.r.scan_iter(match=f"{{{ns}:*}}:cr:*"):  # receipts: the ids, tokens by length
            v = self.r.get(raw) or b""
            entries = [(v[i:i + 15], len(v[i + 15:i + 31])) for i in range(0, len(v), 31)]
            out[raw.decode().replace(ns, "NS", 1)] = entries
        return out

    def check(self, step: str, replies: tuple[Any, Any], resent: bool = False) -> None:
        fast, general = replies
        if isinstance(fast, tuple) or isinstance(general, tuple) or len(fast) <= 2:
            assert (fast if isinstance(fast, tuple) else fast[1:]) == \
                (general if isinstance(general, tuple) else general[1:]), f"{step}: {fast!r} vs {general!r}"
        else:
            def shape(reply: list[Any]) -> list[Any]:
                jobs = [reply[i:i + 5] for i in range(1, len(reply), 5)]
                return [(j[0], j[1], j[2] - jobs[0][2], j[4]) for j in jobs]

            def leases(reply: list[Any]) -> list[int]:
                return [d - int(reply[0]) // 1000 for d in reply[4::5]]
            assert shape(fast) == shape(general), f"{step}: {fast!r} vs {general!r}"
            # deadlines: the claim's clock (the reply's first element) + the job's lease, exactly;
            # a re-sent claim answers with its first call's (compared side by side in claim())
            if not resent:
                assert leases(fast) == leases(general), f"{step}: {fast!r} vs {general!r}"
        self.assert_same_state(step)


pair = pair_fixture(Pair)


def test_the_fast_path_and_the_general_path_leave_the_same_state_and_replies(pair: Pair) -> None:
    past = time.time() - 5
    p = 0

    def run(name: str, fast: bool, **claim: Any) -> tuple[Any, Any]:
        n = claim.pop("n", 1)
        runs = pair.fast_runs
        resent = claim.get("rid") in pair.answered
        replies = pair.claim(claim.pop("partition", p), n, **claim)
        pair.check(name, replies, resent)
        took = pair.fast_runs - runs
        assert took == int(fast), f"{name}: fast path taken {took} times, expected {int(fast)}"
        return replies

    for _ in range(3):
        pair.schedule(past, p)
    fa, _ = run("one job", True)
    assert len(fa) == 6
    pair.r.delete("{fa}:bell:mail", "{ge}:bell:mail")  # rung by the schedule calls and that claim
    run("two jobs, one left behind: no ring (none left)", True, n=2)
    assert not pair.r.exists("{fa}:bell:mail")
    for _ in range(3):
        pair.schedule(past, p)
    pair.r.delete("{fa}:bell:mail", "{ge}:bell:mail")
    run("two of three: the rest re-rung", True, n=2)
    assert pair.r.zrange("{fa}:bell:mail", 0, -1) == [str(p).encode()]
    pair.r.delete("{fa}:bell:mail", "{ge}:bell:mail")
    run("the last one, an earlier receipt dropped", True, n=5, prev="w1-1")
    assert not pair.r.exists("{fa:0}:cr:w1-1")
    run("an empty list", True)

    for _ in range(4):
        pair.schedule(past, p)
    pair.r.delete("{fa}:bell:mail", "{ge}:bell:mail")
    run("the due-job limit: one of three due, the rest put back and rung", True, n=3, max_due=1)
    assert pair.r.zrange("{fa}:bell:mail", 0, -1) == [str(p).encode()]
    run("the due-job limit at 0: nothing due taken", True, n=3, max_due=0)
    run("the rest", True, n=3, max_due=3)

    soon = time.time() + 3600
    for _ in range(2):
        pair.schedule(soon, p)
    pair.both("tick", p, [0, 100, 5000, 0, 0, 0, 0, 3_700_000, 0])  # handed off ahead of their due time
    for _ in range(2):
        pair.schedule(past, p)
    run("jobs ahead of their due time pass the due-job limit, due ones stop at it", True, n=4, max_due=1)
    run("the rest", True, n=4)

    for opts in ({"lease": 45.0}, {"misfire": "skip", "misfire_grace": 30.0, "lease": 7.0},
                 {"misfire": "skip", "misfire_grace": 30.0}, {"lease": 3600.0, "max_attempts": 7}):
        pair.schedule(past, p, **opts)
        run(f"a job with {opts}", True)

    fence = 8_000_000_000_000_000  # a token fence ahead of the clock (Redis's clock went back)
    for ns in ("fa", "ge"):
        pair.r.hset(pair.ks[ns].partition_keys(p)[12], "fence", fence)
    pair.schedule(past, p)
    pair.schedule(past, p)
    fa, ge = run("two jobs, the token fence ahead of the clock", True, n=2)
    assert [fa[3], fa[8]] == [ge[3], ge[8]] == [fence + 1, fence + 2]
    assert pair.r.hget(pair.ks["fa"].partition_keys(p)[12], "fence") == str(fence + 2).encode()

    pair.schedule(past, p)
    pair.schedule(past, p)
    run("a claim (its receipt kept)", True, rid="again")
    run("the same claim re-sent: answered from its receipt", False, rid="again")
    run("no request id", False, rid="")
    run("more than a thousand jobs", False, n=1001)
    pair.schedule(past, p)
    pair.r.hset("{fa:0}:meta", "layout", "7")
    pair.r.hset("{ge:0}:meta", "layout", "7")
    run("a changed layout (refused)", False)
    pair.r.hset("{fa:0}:meta", "layout", str(PARTITIONS))
    pair.r.hset("{ge:0}:meta", "layout", str(PARTITIONS))
    pair.both("pause", p, ["mail", int(time.time() * 1000)])
    run("a paused queue", False)
    pair.r.hdel("{fa:0}:paused", "mail")
    pair.r.hdel("{ge:0}:paused", "mail")
    for _ in range(2):
        pair.schedule(past, p)
    pair.r.delete("{fa}:bell:mail", "{ge}:bell:mail")
    run("Redis Cluster's layout: no ring", True, n=1, sharded=True)
    assert not pair.r.exists("{fa}:bell:mail")
    run("the rest", True, n=3)

    # jobs the general path must look at: put back, then claimed by the general path
    running = pair.schedule(past, p)
    run("a job to run twice", True)
    for ns in ("fa", "ge"):
        pair.r.rpush(pair.ks[ns].ready(p, "mail"), running)
    pair.schedule(past, p)
    run("one already running (dropped, not handed out twice)", False, n=2)
    corrupt = pair.schedule(past, p)
    for ns in ("fa", "ge"):
        j = pair.ks[ns].partition_keys(p)[2]
        v = pair.r.hget(j, corrupt)
        assert v is not None
        pair.r.hset(j, corrupt, v[:6] + v[6:9])
    run("a corrupt record (dead-lettered)", False)
    missing = pair.schedule(past, p)
    pair.schedule(past, p)
    for ns in ("fa", "ge"):
        pair.r.hdel(pair.ks[ns].partition_keys(p)[2], missing)
    run("a missing body", False, n=2)
    assert pair.fast_runs >= 16
