"""The outbox: outcomes (ack, fail, extend, release) queued per partition and sent in batches.

An outcome waits about a millisecond (:data:`FLUSH_DELAY`) so others can share its round trip,
unless :data:`FLUSH_BIG` are queued, or the worker is quiet (no handler running, no job starting
within that millisecond: nothing would join, and the wait would cost a wake-up of its own per
job); the outcome loop has at most one round trip in flight, and
the claim loop takes whatever is queued along with its claims. A round trip that fails puts its
outcomes back (the jobs keep their leases meanwhile) and marks them uncertain: once re-sent, a
refusal may mean "already applied".

**Lingering acks** (``Worker(ack_linger=S)``, ``zsched worker --ack-linger MS``; off by default).
Under spread traffic each job finishes at its own moment and its ack was a script call of its
own. With a linger, acks wait up to S seconds (never more than a tenth of the job's lease) so that
those of the same partition share one ``ack`` call and the round trip carries several: the claim
loop leaves them queued, and they go when the first of them is due, when any other outcome goes
(they ride along), at :data:`FLUSH_BIG`, or at once while the worker stops. What it costs: a
finished job stays ``running`` up to S longer, and a worker killed meanwhile leaves those jobs to
run again after their leases, as any worker killed before its acks landed does.

Retries during an outage back off, but never past a tenth of the shortest lease among the queued
outcomes (:meth:`Outbox.retry_wait`): the lease of a finished job keeps running while its ack
waits, so an ack that waits out a long backoff after Redis is back loses the lease and the job
runs again. A Redis Cluster failover is the case that showed it: every node refuses commands for
a few seconds, the backoff grew past the 3 s lease of the jobs acked at its start, and they ran
twice.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from scheduler.protocol.call import Call
from scheduler.protocol.codes import AckCode, FailCode, FailKind, ReleaseCode
from scheduler.protocol.errors import ScriptArgumentError
from scheduler.protocol.ids import encode_id
from scheduler.protocol.transitions import Builder, Failure, ack_call, extend_call, fail_call, release_call
from scheduler.redisio.errors import REDIS_ERRORS
from scheduler.redisio.transport import NodeFailed

from .attempt import RUNNING, Attempt
from .lifecycle import Lifecycle
from .wire import Outage, Send

log = logging.getLogger("zsched.worker")

FLUSH_DELAY = 0.001     # outcomes wait this long to share a round trip...
FLUSH_BIG = 200         # ...unless this many are queued
CALL_BATCH = 200        # outcomes per script call (bounded work per EVALSHA)
RETRY_LEASE_SHARE = 0.1  # during an outage, retry outcomes at least this often, in leases...
RETRY_FLOOR = 0.01       # ...but not more often than this (seconds)

# Per-job reply codes of ack, fail and release (extend replies the new deadline, 0 if refused),
# as plain ints: these comparisons run once per job, and an enum member lookup costs more.
_ACKED = int(AckCode.ACKED)
_RETRY_SCHEDULED, _DEAD = int(FailCode.RETRY_SCHEDULED), int(FailCode.DEAD)
_RELEASED = int(ReleaseCode.RELEASED)

# (script, items) of each call of a batch; items are Attempts, or (Attempt, kind, delay_ms, error)
# for "fail".
Meta = list[tuple[str, list[Any]]]
Fail = tuple[Attempt, FailKind, int, bytes]
Refused = Callable[[Attempt, str], None]


class Outbox:
    """Outcomes waiting for a round trip, per partition. ``calls`` (the worker's
    :class:`~scheduler.protocol.calls.Calls`, with its tombstone TTL for the acks) builds the script
    calls through :mod:`scheduler.protocol.transitions`, and ``on_refused(attempt, what)`` is told
    when Redis refused an outcome because the attempt no longer holds the lease."""

    def __init__(self, calls: Builder, on_refused: Refused, linger: float = 0.0) -> None:
        self.calls = calls
        self.on_refused = on_refused
        self.linger = linger    # seconds an ack may wait for others (Worker(ack_linger=)); 0: none
        self.acks: defaultdict[int, list[Attempt]] = defaultdict(list)
        self.fails: defaultdict[int, list[Fail]] = defaultdict(list)
        self.extends: defaultdict[int, list[Attempt]] = defaultdict(list)
        self.releases: defaultdict[int, list[Attempt]] = defaultdict(list)
        self.n = 0              # outcomes queued
        self.n_acks = 0         # acks among them
        self.ack_due = math.inf  # with a linger: when the queued acks must go (monotonic)
        self.flushing = False   # the outcome loop has a round trip in flight
        self.in_flight = 0      # outcomes in that round trip (back in ``n`` if it fails)
        self.wake = asyncio.Event()

    # -- queueing -------------------------------------------------------------------------------
    def ack(self, r: Attempt) -> None:
        self.acks[r.p].append(r)
        self.n += 1
        self.n_acks += 1
        if not self.linger:
            self.wake.set()
            return
        # The job's lease runs on while its ack waits: at most a tenth of it, as for retries.
        due = time.monotonic() + min(self.linger, r.lease_s * RETRY_LEASE_SHARE)
        if due < self.ack_due or self.n >= FLUSH_BIG:  # else the outcome loop's wait already covers it
            self.ack_due = min(self.ack_due, due)
            self.wake.set()

    def fail(self, r: Attempt, kind: FailKind, delay_ms: int, err: bytes) -> None:
        self.fails[r.p].append((r, kind, max(0, int(delay_ms)), err))
        self.n += 1
        self.wake.set()

    def extend(self, r: Attempt) -> None:
        self.extends[r.p].append(r)
        self.n += 1
        self.wake.set()

    def release(self, r: Attempt) -> None:
        self.releases[r.p].append(r)
        self.n += 1
        self.wake.set()

    # -- batching -------------------------------------------------------------------------------
    def take(self, with_acks: bool = True) -> tuple[list[Call], Meta]:
        """Empty the outbox into script calls, and the items each call carries: extends first (a
        job may have finished since its heartbeat was queued: those are dropped), then fails,
        acks and releases; at most :data:`CALL_BATCH` jobs' arguments per call. ``with_acks``
        False leaves the acks queued (they wait for their linger)."""
        if self.n <= (0 if with_acks else self.n_acks):
            return [], []
        ext, fails, rels = self.extends, self.fails, self.releases
        self.extends, self.fails, self.releases = defaultdict(list), defaultdict(list), defaultdict(list)
        acks: defaultdict[int, list[Attempt]] = defaultdict(list)
        if with_acks:
            acks, self.acks = self.acks, acks
            self.n_acks, self.ack_due = 0, math.inf
        self.n = self.n_acks
        wire = self.calls
        calls: list[Call] = []
        meta: Meta = []
        for p, runs in ext.items():
            runs = [r for r in runs if r.state == RUNNING and not r.lost]
            for s in range(0, len(runs), CALL_BATCH):
                chunk = runs[s:s + CALL_BATCH]
                calls.append(extend_call(wire, p, [(r.raw_id, r.token) for r in chunk]))
                meta.append(("extend", chunk))
        for p, items in fails.items():
            for s in range(0, len(items), CALL_BATCH // 2):
                fchunk = items[s:s + CALL_BATCH // 2]
                calls.append(fail_call(wire, p, [Failure(r.raw_id, r.token, kind, delay, err)
                                                 for r, kind, delay, err in fchunk]))
                meta.append(("fail", fchunk))
        for name, src in (("ack", acks), ("release", rels)):
            build = ack_call if name == "ack" else release_call
            for p, runs in src.items():
                for s in range(0, len(runs), CALL_BATCH):
                    chunk = runs[s:s + CALL_BATCH]
                    calls.append(build(wire, p, [(r.raw_id, r.token) for r in chunk]))
                    meta.append((name, chunk))
        return calls, meta

    def requeue(self, meta: Meta) -> None:
        """Put outcomes back after a failed round trip (the job keeps its lease meanwhile)."""
        if meta:
            self.wake.set()
        for kind, items in meta:
            for it in items:
                r: Attempt = it[0] if kind == "fail" else it
                r.uncertain = True
                if kind == "extend":
                    if r.state == RUNNING:
                        self.extends[r.p].append(r)
                        self.n += 1
                elif kind == "fail":
                    self.fails[r.p].append(it)
                    self.n += 1
                elif kind == "ack":
                    self.acks[r.p].append(r)
                    self.n += 1
                    self.n_acks += 1
                    self.ack_due = 0.0  # they waited already: no second linger after the retry wait
                else:
                    self.releases[r.p].append(r)
                    self.n += 1

    def retry_wait(self, backoff: float) -> float:
        """How long to wait before sending the queued outcomes again: ``backoff`` (the outage's),
        but at most :data:`RETRY_LEASE_SHARE` of the shortest lease among them, so that once Redis
        is back they are delivered while their jobs still hold their leases. Runs only after a
        failed round trip, so its walk over the queue costs nothing on the happy path."""
        shortest = min((r.lease_s for q in (self.acks, self.extends, self.releases) for rs in q.values() for r in rs),
                       default=math.inf)
        shortest = min(shortest, min((f[0].lease_s for fs in self.fails.values() for f in fs), default=math.inf))
        return min(backoff, max(RETRY_FLOOR, shortest * RETRY_LEASE_SHARE))

    def apply(self, meta: Meta, results: Sequence[Any]) -> NodeFailed | None:
        """Take the replies of a round trip: count what Redis did, report refusals, and queue
        again the outcomes of a call that failed as a whole (a script error, or its Redis Cluster
        node failed: returned, so the caller backs off before sending them again)."""
        node_down: NodeFailed | None = None
        for (kind, items), res in zip(meta, results):
            if isinstance(res, ScriptArgumentError):
                # Refused before any write: the same call gets the same answer, so sending it
                # again would retry forever. Those jobs keep their leases and run again once the
                # leases expire (at-least-once); the message says which argument and script.
                log.error("%s of %d job(s) refused by Redis and not sent again (%s); they run again when their "
                          "leases expire", kind, len(items), res)
                continue
            if isinstance(res, Exception):
                if isinstance(res, NodeFailed):
                    node_down = res  # logged once per outage by the caller's loop
                else:
                    log.error("%s script failed (will retry): %s", kind, res)
                self.requeue([(kind, items)])
                self.wake.set()
                continue
            if kind == "ack":
                self._acked(items, res)
            elif kind == "fail":
                self._failed(items, res)
            elif kind == "extend":
                self._extended(items, res)
            else:
                self._released(items, res)
        return node_down

    def _acked(self, items: list[Attempt], res: list[Any]) -> None:
        for r, code in zip(items, res):
            if code == _ACKED:
                r.stats.acked += 1
            else:
                self.on_refused(r, "ack")

    def _failed(self, items: list[Fail], res: list[Any]) -> None:
        for (r, kind, _d, _e), code in zip(items, res):
            if code == _RETRY_SCHEDULED:
                r.stats.retried += 1
            elif code == _DEAD:
                r.stats.dead += 1
                if kind is FailKind.RETRY:  # failures and poison were logged when they happened
                    log.warning("job %s (queue %r) asked for a retry but its attempts are spent; dead-lettered",
                                encode_id(r.raw_id), r.queue)
            else:
                self.on_refused(r, "fail")

    def _extended(self, items: list[Attempt], res: list[Any]) -> None:
        for r, deadline in zip(items, res):
            r.hb_pending = False
            if not deadline:
                self.on_refused(r, "lease extension")

    def _released(self, items: list[Attempt], res: list[Any]) -> None:
        for r, code in zip(items, res):
            if code == _RELEASED:
                r.stats.released += 1
            else:
                self.on_refused(r, "release")

    # -- the outcome loop -----------------------------------------------------------------------
    async def run(self, send: Send, life: Lifecycle, roundtrip: Callable[[str, float], None] | None,
                  quiet: Callable[[float], bool] | None = None) -> None:
        """Send queued outcomes, one round trip at a time, until cancelled (or, while stopping,
        until Redis stays unreachable past ``life.drain_deadline``). ``roundtrip(op, seconds)``
        observes each round trip's duration when histograms are exported. ``quiet(seconds)``:
        True when no other outcome is expected that soon (then the outcomes go at once)."""
        outage = Outage("outcomes")
        while True:
            if not self.n:
                self.wake.clear()
                await self.wake.wait()
                continue
            if self.linger and self.n == self.n_acks and self.n < FLUSH_BIG and not life.stopping:
                wait = self.ack_due - time.monotonic()
                if wait > 0:  # acks alone: they wait for others of their partitions, until the first is due
                    self.wake.clear()
                    try:
                        async with asyncio.timeout(wait):
                            await self.wake.wait()  # another outcome, an earlier due time, FLUSH_BIG
                    except TimeoutError:
                        pass
                    continue
            elif self.n < FLUSH_BIG and (quiet is None or not quiet(FLUSH_DELAY)):
                await asyncio.sleep(FLUSH_DELAY)  # let more outcomes join this round trip
            sending = self.n
            calls, meta = self.take()
            if not calls:
                continue  # the claim loop took them along with its claims
            self.flushing, self.in_flight = True, sending
            try:
                t_flush = time.perf_counter()
                results = await send(calls, "flush")
                if roundtrip is not None:
                    roundtrip("ack", time.perf_counter() - t_flush)
            except REDIS_ERRORS as exc:
                self.requeue(meta)
                self.flushing, self.in_flight = False, 0
                if life.stopping and life.drain_deadline < time.monotonic():
                    return
                await asyncio.sleep(self.retry_wait(outage.failed(exc)))
                continue
            self.flushing, self.in_flight = False, 0
            node_down = self.apply(meta, results)
            if node_down is None:
                outage.ok()
            else:  # one cluster node failed, the others' outcomes went through: wait, then again
                await asyncio.sleep(self.retry_wait(outage.failed(node_down)))

    async def drain(self, flusher: asyncio.Task[Any], life: Lifecycle, timeout: float) -> None:
        """At shutdown: keep the outcome loop (``flusher``) busy until everything queued was
        delivered, or for at most ``timeout`` seconds (``life.drain_deadline``)."""
        deadline = time.monotonic() + timeout
        life.drain_deadline = deadline
        while (self.n or self.flushing) and time.monotonic() < deadline and not flusher.done():
            self.wake.set()
            await asyncio.sleep(0.005)
        if self.n or self.flushing:
            # a round trip still in flight (e.g. stuck connecting) holds its outcomes out of ``n``
            log.error("could not deliver %d outcome(s) before exiting; those jobs run again after their leases "
                      "expire", self.n + self.in_flight)
