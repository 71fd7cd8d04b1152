"""lua/tick.lua's fast path ends in exactly the state and reply of its general path, on a real
redis-server.

Two namespaces live side by side: ``fa`` runs the shipped script (fast path first), ``ge`` the same
script without the fast path's block (general path only). Both get the same jobs (same ids,
records and times), then every step sends both the same tick and compares the replies and every
key of the two namespaces, doorbells included. The steps cover the ways in and out of the fast
path: one and several queues, jobs that moved, an epoch newer than Redis's, the same, an older one
(refused), unfenced, a hand-off lead, a paused queue (not rung), Redis Cluster's layout (the
queues to ring in the reply), and what only the general path does: the first firing tick of a
partition (its tombstone sweep), an idle tick, housekeeping, a rate-limited queue, a misfire.
"""
from __future__ import annotations

import time
from typing import Any

import redis

from scheduler.protocol.bells import BURST_SPAN_MS
from scheduler.protocol.tick import TickReply, parse_tick
from tests.support.fastpath import ScriptPair, pair_fixture
from tests.support.helpers import namespace_state

PARTITIONS = 2
HOUR_MS = 3_600_000


class Pair(ScriptPair):
    """The two namespaces and their tick scripts."""

    def __init__(self, url: str, declared: int) -> None:
        super().__init__(url, "tick", PARTITIONS, ("schedule", "reschedule", "pause"), declared)

    def both(self, name: str, partition: int, args: list[Any], *, sharded: bool = False) -> tuple[Any, Any]:
        """Script ``name`` (tick: fast on ``fa``, general on ``ge``) on both namespaces with ``args``
        after the common ones."""
        out = []
        for ns in ("fa", "ge"):
            ks = self.ks[ns]
            sha = self.script(ns, name)
            chan = ks.prefix(partition) if sharded else ks.channel_prefix(partition)
            before = self.counts()
            try:
                keys = self.keys(ns, name, partition)
                out.append(self.r.evalsha(sha, len(keys), *keys, ks.prefix(partition), chan,
                                          f"{partition}/{PARTITIONS}", *args))
            except redis.ResponseError as exc:
                out.append(("error", str(exc)))
            if name == "tick":
                # Only the fast path reads meta with HMGET; when it falls through after that, the
                # general path asks for TIME again (or refuses the epoch before it does): one HMGET,
                # one TIME and a reply that is not a refusal is the fast path taken.
                sent = self.counts() - before
                hmget, times = sent["hmget"], sent["time"]
                if ns == "fa":
                    refused = isinstance(out[-1], tuple) or out[-1][0] == -1
                    self.fast_runs += hmget == 1 and times == 1 and not refused
                else:
                    assert hmget == 0, "the general path ran the fast path's code"
        return out[0], out[1]

    def schedule(self, at: float, queue: str, partition: int, **opts: Any) -> None:
        """The same job (same id and record) on both sides, due at ``at`` (epoch s)."""
        fa, ge = self.both("schedule", partition, self.schedule_args(at, partition, queue, **opts))
        assert fa[1:] == ge[1:], (fa, ge)

    def tick(self, partition: int, *, epoch: int = 0, lead_ms: int = 0, housekeeping: int = 0,
             limited: tuple[Any, ...] = (), sharded: bool = False) -> tuple[Any, Any]:
        return self.both("tick", partition, [epoch, 100, 5000, len(limited) // 2, *limited, 0, 0, 0, lead_ms,
                                             housekeeping], sharded=sharded)

    def swept_now(self, partition: int) -> None:
        """Both sides' partition swept its tombstones just now (meta 'tsw' at Redis's clock): the
        fast path stays eligible however long the steps take (a firing tick sweeps when the last
        sweep is a second old; on a loaded machine the steps before took longer than that)."""
        secs, micros = self.r.time()
        for ns in ("fa", "ge"):
            self.r.hset(self.ks[ns].partition_keys(partition)[12], "tsw", secs * 1000 + micros // 1000)

    def state(self, ns: str) -> dict[str, Any]:
        """The namespace's keys and doorbells (tests/support/helpers.py), the tombstone sweep's time too."""
        def meta(name: str, h: dict[bytes, bytes]) -> dict[bytes, bytes]:
            return {**h, b"tsw": b"<ms>"} if name.endswith(":meta") and b"tsw" in h else h
        return namespace_state(self.r, ns, hash_fix=meta)

    def check_rings(self, step: str, p: int, spread: tuple[int, ...], tick: TickReply, sharded: bool) -> None:
        """The tick of jobs of queue 'mail' due at ``spread`` (ms apart) rang its burst bell when
        four of them are due within BURST_SPAN_MS, else its bell (on a cluster: its reply says so)."""
        burst = any(b - a <= BURST_SPAN_MS for a, b in zip(spread, spread[3:]))
        if sharded:
            assert tick.to_ring == [("mail", burst)], step
            return
        member = str(p).encode()
        assert member in self.r.zrange("{fa}:bell:mail" + (":b" if burst else ""), 0, -1), step
        assert member not in self.r.zrange("{fa}:bell:mail" + ("" if burst else ":b"), 0, -1), step

    def check(self, step: str, replies: tuple[Any, Any]) -> None:
        fast, general = replies
        if isinstance(fast, tuple) or isinstance(general, tuple) or fast[0] == -1:
            assert fast == general, f"{step}: replies differ: {fast!r} vs {general!r}"
        else:
            # moved, next, now, limited (4 each), crons, dropped, rings (pairs: see the header), burst
            late = 8 + 2 * int(fast[6])
            assert fast[:2] + fast[3:late] == general[:2] + general[3:late], f"{step}: {fast!r} vs {general!r}"
            assert abs(fast[2] - general[2]) < 1000 and len(fast) == len(general), f"{step}: {fast!r} vs {general!r}"
            assert all(abs(a - b) < 1000 for a, b in zip(fast[late:], general[late:])), f"{step}: lateness differs"
        self.assert_same_state(step)


pair = pair_fixture(Pair)


def schedule_step(pair: Pair, p: int, now: float, queues: tuple[str, ...], spread: tuple[int, ...], later: int,
                  later_ms: list[int]) -> None:
    """A step's jobs in partition ``p``: one per queue due a minute from ``now`` (within the lead),
    the others of ``spread`` that many ms after it, ``later`` two hours ahead (beyond the lead)."""
    soon = now + 60
    for q in queues:
        pair.schedule(soon, q, p)
    for ms in spread[1:]:  # the first is the step's own job, at soon
        pair.schedule((round(soon * 1000) + ms) / 1000, "mail", p)
    for _ in range(later):  # a second apart
        at_ms = (int(now) + 7200 + 10 * p + len(later_ms)) * 1000  # whole seconds: exact as ms
        pair.schedule(at_ms / 1000, "mail", p)
        later_ms.append(at_ms)


def test_the_fast_path_and_the_general_path_leave_the_same_state_and_replies(pair: Pair) -> None:
    now = time.time()
    soon = now + 60  # due within the hand-off lead of an hour
    # (step, preparation, tick arguments, whether the fast path takes it)
    for p in range(PARTITIONS):
        pair.schedule(soon, "mail", p)
    for p in range(PARTITIONS):
        pair.check(f"partition {p}'s first firing tick (its tombstone sweep)", pair.tick(p, lead_ms=HOUR_MS))
        pair.check(f"an idle tick of partition {p}", pair.tick(p, lead_ms=HOUR_MS))
    assert pair.fast_runs == 0

    steps: list[tuple[str, dict[str, Any], bool]] = [
        ("one queue, unfenced", {}, True),
        ("two queues, an epoch newer than Redis's", {"epoch": 5, "_queues": ("mail", "sms")}, True),
        ("the same epoch", {"epoch": 5}, True),
        ("an older epoch (refused)", {"epoch": 4}, False),
        ("a job that moved", {"epoch": 6, "_moved": True}, True),
        ("housekeeping", {"housekeeping": 1}, False),
        ("a rate-limited queue", {"limited": ("mail", 10)}, False),
        ("a paused queue (no ring)", {"_pause": "sms", "_queues": ("mail", "sms")}, True),
        ("Redis Cluster's layout (the queues to ring in the reply)", {"sharded": True, "_queues": ("mail", "sms")},
         True),
        ("three timers left beyond the lead (no burst ahead)", {"_later": 3}, True),
        ("five timers left beyond the lead (the fourth one's due time: a burst ahead?)", {"_later": 2}, True),
        ("four jobs 30 ms apart (spread, not a burst: the bell)", {"_spread": (0, 30, 60, 90)}, True),
        ("four jobs within 10 ms (a burst: the burst bell)", {"_spread": (0, 4, 7, 10)}, True),
        ("five jobs, four of them within 10 ms (a burst)", {"_spread": (0, 20, 24, 27, 30)}, True),
        ("four jobs 30 ms apart on Redis Cluster's layout (not a burst in the reply)",
         {"_spread": (0, 30, 60, 90), "sharded": True}, True),
        ("four jobs within 10 ms on Redis Cluster's layout (a burst in the reply)",
         {"_spread": (0, 4, 7, 10), "sharded": True}, True),
        ("past a skip-policy job's grace (misfire, in the last partition)", {"_misfire": True}, True),
    ]
    later_ms: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}  # timers left beyond the lead
    for step, opts, eligible in steps:
        queues = opts.pop("_queues", ("mail",))
        later = opts.pop("_later", 0)
        spread = opts.pop("_spread", ())
        for p in range(PARTITIONS):
            schedule_step(pair, p, now, queues, spread, later, later_ms[p])
            if opts.pop("_moved", False) and p == PARTITIONS - 1:
                raw = pair.r.zrange(pair.ks["fa"].partition_keys(p)[0], -1, -1)[0][:15]
                moved = int((soon + 30) * 1000)
                fa, ge = pair.both("reschedule", p, [raw, moved])
                assert fa == ge, (fa, ge)
            if "_pause" in opts and p == PARTITIONS - 1:
                fa, ge = pair.both("pause", p, [opts["_pause"], int(now * 1000)])
                assert fa == ge
            misfire = opts.get("_misfire") and p == PARTITIONS - 1
            if misfire:
                pair.schedule(time.time() + 0.05, "mail", p, misfire="skip", misfire_grace=0.001)
        paused = opts.pop("_pause", None)
        if paused:  # rung by earlier steps (nobody takes the rings here): start from empty bells
            pair.r.delete("{fa}:bell:" + paused, "{ge}:bell:" + paused)
        if spread:
            pair.r.delete(*(f"{{{ns}}}:bell:mail{b}" for ns in ("fa", "ge") for b in ("", ":b")))
        misfiring = opts.pop("_misfire", False)
        if misfiring:
            time.sleep(0.1)
        for p in range(PARTITIONS):
            pair.swept_now(p)
            runs = pair.fast_runs
            replies = pair.tick(p, lead_ms=HOUR_MS, **opts)
            pair.check(f"{step}, partition {p}", replies)
            tick = parse_tick(replies[0])
            if isinstance(tick, TickReply):  # the fourth earliest timer left, the owner's sign of a burst
                left = sorted(later_ms[p])
                assert tick.next_due_ms == (left[0] if left else None), step
                assert tick.burst_due_ms == (left[3] if len(left) >= 4 else None), step
                if spread:
                    pair.check_rings(step, p, spread, tick, bool(opts.get("sharded")))
            took = pair.fast_runs - runs
            expected = int(eligible and not (misfiring and p == PARTITIONS - 1))
            assert took == expected, f"{step}, partition {p}: fast path taken {took}, expected {expected}"
        if paused:
            assert [m for m, _ in pair.r.zrange("{fa}:bell:" + paused, 0, -1, withscores=True)] == [b"0"], \
                "only the partition where the queue is not paused was rung"
    assert pair.fast_runs >= 10
