"""Fetch strategies: how a worker gets jobs (``Worker(fetch=...)``, like Sidekiq's ``fetch_class``).

A strategy is made once per ``serve()`` from a :class:`FetchContext` and runs two loops: one that
learns which partitions have ready jobs (:meth:`Fetch.listen_loop`) and one that claims them into
free slots (:meth:`Fetch.claim_loop`). The default, :class:`DoorbellFetch`:

* **waits on doorbells** (:mod:`workers.doorbell`): while the worker has a free handler slot and
  nothing to claim, it waits in ``BZPOPMIN`` on its queues' bells; Redis hands each ring to one
  waiting worker, which marks that (queue, partition) as a claim candidate. A worker that is busy
  does not wait, so the rings go to the idle ones, one each: a job costs one wake-up and one
  claim however many workers serve its queue;
* a claim that leaves jobs behind rings the bell again (the script does it; on Redis Cluster,
  where the bell is in another slot, the worker), so a burst spreads over the idle workers;
* a claim on a **paused** queue (lua/pause.lua) comes back refused; the planner then ignores that
  (queue, partition)'s rings until ``resume`` rings ``P:resume`` (or the next safety-net sweep),
  so a paused queue costs no claims;
* **claims** whenever there are free slots and candidates, in one pipelined round trip of
  ``claim`` calls planned by the :class:`~workers.planner.ClaimPlanner`, never asking for more
  jobs than free slots (so concurrency is exact); outcomes waiting in the outbox ride along.
  A safety-net sweep marks every partition of a queue as a candidate when nothing else happened
  for ``idle_sweep`` s (a ring taken by a worker that died before its claim costs that much); the
  workers of a queue take turns (:meth:`~workers.doorbell.Doorbell.sweep_turns`), so a queue is
  swept about once per period however many workers serve it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from scheduler.protocol.call import Call
from scheduler.protocol.calls import Calls
from scheduler.protocol.replies import Claimed, claim_paused, parse_claim
from scheduler.protocol.transitions import claim_call
from scheduler.redisio.connection import is_cluster
from scheduler.redisio.errors import REDIS_ERRORS
from scheduler.redisio.transport import NodeFailed

from .clock import RedisClock
from .doorbell import Doorbell
from .lifecycle import Lifecycle
from .outbox import Meta, Outbox
from .pace import held_slots, rings_to_take
from .planner import ClaimPlanner, ready_message
from .slots import Slots
from .sweep import SweepTimer
from .wire import Outage, Send

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .stats import WorkerStats

log = logging.getLogger("zsched.worker")

CLAIM_RECEIPT_MS = 30_000  # how long Redis keeps a claim's receipt for a re-send after a lost reply
# How long a claim whose cluster node failed after it was sent keeps its handler slots while it is
# sent again: a node down longer is failing over (seconds; 15 s with Redis's default node timeout),
# and slots held that long stall the worker's other partitions (a failover test measured 2.7 s of
# it). Given up, the claim's jobs, if it ran, are reaped when their leases expire and run then;
# never twice, since this worker never started them.
ORPHAN_PATIENCE_S = 0.5
# A worker waits on the bells only when it has nothing else to claim. One that always has (a
# partition kept busy, jobs retried there) would leave the rings of the queue's other partitions
# in the bells, and their jobs waiting, for as long as that lasts when no idle worker is there to
# take them: it takes the rings waiting there itself after this long without listening, at most
# as many as it has free slots, and claims there first. Per worker and second, not per job.
BELL_NEGLECT_S = 0.5



class Claim(NamedTuple):
    """One claim of a round trip, with the slots taken for it."""

    queue: str
    p: int
    n: int          # jobs asked for: the slots taken
    gen: int        # the planner's candidate generation
    rid: str        # request id (a re-send gets the same reply)
    handler: int    # how many of the n slots are handler slots
    due: int        # the claim's limit on due jobs: its handler slots, and past them Slots.pace's


@dataclass(frozen=True, slots=True)
class FetchContext:
    """What a fetch strategy gets from the worker.

    ``queues``/``partitions``: what to serve. ``calls``: builds script calls (``calls.call``) and
    knows the key layout (``calls.ks``). ``redis``: the worker's ``redis.asyncio`` client (for
    pub/sub). ``send``: one round trip of script calls on a named lane. ``slots``: the free
    handler slots; take them before a claim round trip, give back what the reply did not fill,
    and wait on ``slots.wake``. ``outbox``: outcomes that may ride along with a claim.
    ``dispatch(queue, partition, jobs, t0, clock, held)``: hand claimed jobs to the runner (each
    holds one slot; ``t0`` is when the claim was sent, monotonic; ``clock`` this host's monotonic
    time minus the claim's Redis time in seconds, read when the reply arrived, so jobs handed off
    ahead of their due time start at it; None: start at once; ``held[i]``: job i is on a
    prefetch slot, not a handler slot). ``life``: stop state and the ``ready``
    event. ``idle_sweep``: seconds between safety-net sweeps. ``roundtrip(op, seconds)``: the
    round-trip histogram, if exported. ``stats``: the worker's counters per queue (a strategy
    counts the notifications it receives and the claims it sends there).
    """

    queues: Sequence[str]
    partitions: int
    calls: Calls
    redis: Any
    send: Send
    slots: Slots
    outbox: Outbox
    dispatch: Callable[[str, int, list[Claimed], float, float | None, list[bool]], None]
    life: Lifecycle
    idle_sweep: float
    roundtrip: Callable[[str, float], None] | None
    stats: Mapping[str, WorkerStats]
    one_listener: bool = False  # Worker(one_listener=): one worker of a set of queues on the bells


class Fetch(ABC):
    """The interface the worker uses to get jobs. The worker runs both loops (each restarted if it
    crashes); at shutdown it sets ``ctx.life.stopping`` and ``ctx.slots.wake``, cancels the
    listen loop and gives the claim loop up to 10 s to return."""

    def __init__(self, ctx: FetchContext) -> None:
        self.ctx = ctx

    @abstractmethod
    async def listen_loop(self) -> None:
        """Learn which queues and partitions have ready jobs; set ``ctx.life.ready`` once jobs are
        being found (``Worker.wait_ready()`` returns then). Runs until cancelled."""

    @abstractmethod
    async def claim_loop(self) -> None:
        """Claim jobs into free slots and ``ctx.dispatch`` them; return once ``ctx.life.stopping``
        is set and no claim is in flight (jobs claimed then are released by the runner)."""


class DoorbellFetch(Fetch):
    """The default strategy: doorbells (the module docstring), claims planned per round trip.

    Claims carry request ids: a claim whose reply was lost is re-sent with the same id and Redis
    answers from its receipt (lua/claim.lua) instead of stranding the jobs until their lease
    expires. The last answered id per (queue, partition) lets the next claim drop its receipt.
    """

    def __init__(self, ctx: FetchContext) -> None:
        super().__init__(ctx)
        self.planner = ClaimPlanner(ctx.queues, ctx.partitions)
        self._rid_prefix = os.urandom(6).hex()
        self._rid_n = 0
        self._last_rid: dict[tuple[str, int], str] = {}
        # The claims whose reply was lost: their slots stay taken until they are re-sent.
        self._lost: list[Claim] | None = None
        # Claims whose Redis Cluster node failed after they were sent (NodeFailed): they may have
        # run, so they go again with their request ids, riding along with new claims once
        # ``_orphans_at`` has passed (the other nodes' claims never wait for them); their slots
        # stay taken meanwhile. ``_orphan_rids``: those ids, until a reply comes back.
        self._orphans: list[Claim] = []
        self._orphan_rids: dict[str, float] = {}  # request id -> when it was first orphaned
        self._orphans_at = 0.0
        # the safety-net sweep: one claim per (queue, partition), under ~16 calls/s per worker whatever their number
        self.sweep_every = ctx.idle_sweep * max(1.0, len(ctx.queues) * ctx.partitions / 32)
        self.sweep_timer = SweepTimer(ctx.life.turns, ctx.slots.wake, ride=lambda: self.bells.sweep_commands(
            ctx.queues, self.sweep_every, self._rid_prefix))  # the first sweep starts the listen loop
        self._bells_heard = time.monotonic()  # when the worker last waited on the bells or took from them
        # Redis's clock on ours (workers/clock.py): one server, or a cluster's nodes (each claim alone)
        self.clock = RedisClock(keep=not is_cluster(ctx.redis))
        self.bells = Doorbell(ctx.redis, ctx.calls.ks, ctx.queues, one_listener=ctx.one_listener,
                              turns=ctx.life.turns)
        # Set while the worker has a free handler slot and nothing to claim: the listen loop waits
        # on the bells only then, so a busy worker takes no rings (they go to idle workers).
        self.hungry = asyncio.Event()
        # On Redis Cluster the claim script cannot ring the bell (another slot): the worker rings
        # it after a claim that may have left jobs behind.
        self._ring_after_claims = ctx.calls.ks.sharded
        self._rings: set[asyncio.Task[None]] = set()

    def mark_all(self) -> None:
        """Full sweep: every (queue, partition) becomes a candidate."""
        self.hungry.clear()  # the claims come first; the bells again when they found nothing
        self.planner.mark_all()
        self.sweep_timer.swept()
        self.ctx.slots.wake.set()

    # -- claims ---------------------------------------------------------------------------------
    async def claim_loop(self) -> None:
        ctx = self.ctx
        outage = Outage("claim")
        every = self.sweep_every
        while not ctx.life.stopping or self._lost is not None:
            plan = self._lost  # the same request ids: Redis answers from the receipts; slots still reserved
            if plan is None:
                orphans = self._due_orphans()
                if ctx.slots.free > 0 and self.planner.has_candidates():
                    await self._while_busy(every)
                    new = self._plan()
                else:
                    new = []
                if not orphans and not new:
                    await self._idle(every)
                    continue
                plan = orphans + new
            # Outcomes waiting for the outcome loop ride along (one round trip instead of two); they
            # go first, so a job failed with no delay is back in ready before the claims run.
            calls, meta = ctx.outbox.take(with_acks=not ctx.outbox.linger)  # lingering acks wait for others
            k = len(calls)
            calls += self._claim_calls(plan)
            t0 = time.monotonic()
            try:
                replies = await ctx.send(calls, "claim")
                ctx.slots.pace.claimed(rtt := time.monotonic() - t0)
                if ctx.roundtrip is not None:
                    ctx.roundtrip("claim", rtt)
            except REDIS_ERRORS as exc:
                self.clock.forget()  # the next answer may come from another server (failover)
                if await self._claims_lost(plan, meta, exc, outage):
                    return
                continue
            self._lost = None
            if k:
                ctx.outbox.apply(meta, replies[:k])
            node_down = self._claimed(plan, replies[k:], t0)
            if node_down is None:
                outage.ok()
                ctx.life.redis_answered = time.monotonic()  # a readiness check needs no PING now
            else:  # one cluster node failed; the others answered
                self._orphans_at = time.monotonic() + outage.failed(node_down)

    async def _while_busy(self, every: float) -> None:
        """A slot is free and there are candidates, so the worker claims without listening: what
        it would miss if that went on (the listen loop and the safety net run only when it has
        nothing to claim). Once it has not listened for :data:`BELL_NEGLECT_S` it takes the rings
        left in the bells, and sweeps if the sweep period is over, as an idle worker would. A
        burst that keeps it busy for less than that costs nothing more."""
        now = time.monotonic()
        if now - self._bells_heard < BELL_NEGLECT_S:  # it listened a moment ago: nothing was missed
            return
        if now - self.sweep_timer.last >= every:
            await self._safety_sweep(every)
        await self._take_waiting_rings()

    async def _take_waiting_rings(self) -> None:
        """Take up to as many waiting rings as there are free slots and claim there first; any
        more go back to the bell for another worker."""
        self._bells_heard = time.monotonic()
        free = self.ctx.slots.free
        try:
            rungs = await self.bells.take_waiting(free)
        except REDIS_ERRORS as exc:  # the claims that follow find out whether Redis is there
            log.debug("could not look at the bells: %s", exc)
            return
        for i, (queue, member, score) in enumerate(rungs):
            if i >= free:
                self._ring(queue, member, score)
                continue
            p = self._ringed_partition(queue, member)
            if p is not None:
                self.planner.notify(queue, p, resumed=True, first=True)

    def _due_orphans(self) -> list[Claim]:
        """The orphaned claims, once their retry time has come (then they leave the list). Those
        orphaned more than :data:`ORPHAN_PATIENCE_S` ago are given up first, their slots freed
        (their jobs, if the claim ran, are reaped when their leases expire)."""
        if not self._orphans:
            return []
        now = time.monotonic()
        keep = now - ORPHAN_PATIENCE_S
        stale = [c for c in self._orphans if self._orphan_rids[c.rid] < keep]
        if stale:
            self._orphans = [c for c in self._orphans if self._orphan_rids[c.rid] >= keep]
            for c in stale:
                del self._orphan_rids[c.rid]
                self.ctx.slots.put_back(c.handler, c.n - c.handler)
                self.planner.failed(c.queue, c.p)
        if not self._orphans or now < self._orphans_at:
            return []
        due, self._orphans = self._orphans, []
        return due

    def _orphans_next(self) -> float:
        """When the orphaned claims next need the loop (monotonic): sent again, or given up."""
        oldest = min(self._orphan_rids[c.rid] for c in self._orphans)
        return min(self._orphans_at, oldest + ORPHAN_PATIENCE_S)

    async def _idle(self, every: float) -> None:
        """Nothing to claim: wait for a wake-up (a ring, a freed slot), or sweep when the
        safety-net period is over. With a free handler slot the listen loop waits on the bells."""
        slots = self.ctx.slots
        slots.wake.clear()
        if slots.free > 0 and not self.planner.has_candidates():
            self.hungry.set()
            self._bells_heard = time.monotonic()
        else:
            self.hungry.clear()
        wait = self.sweep_timer.wait(every, self.bells.sweep_stretch)
        if wait <= 0:
            if slots.free > 0:
                await self._safety_sweep(every)  # a lost ring costs at most about one sweep period
                return
            wait = every
        if self._orphans:  # wake up to send them again, or to give them up
            wait = max(0.0, min(wait, self._orphans_next() - time.monotonic()))
        try:
            async with asyncio.timeout(wait):
                await slots.wake.wait()
        except TimeoutError:
            pass

    async def _safety_sweep(self, every: float) -> None:
        """The periodic safety net, shared by the workers of a queue: a queue is swept by the worker
        that takes its turn for the period (:meth:`Doorbell.sweep_turns`), so it costs one claim per
        partition per period however many workers serve it. When Redis cannot tell, sweep: the
        claims find out whether it is back."""
        ridden = self.sweep_timer.swept(fresh=every / 2)  # the replies of a try that rode on a bell wait
        try:
            mine = await self.bells.sweep_turns(self.ctx.queues, every, self._rid_prefix, ridden)
        except REDIS_ERRORS:
            mine = list(self.ctx.queues)
        if mine:
            self.hungry.clear()
            self.planner.mark(mine)
            self.ctx.slots.wake.set()

    def _plan(self) -> list[Claim]:
        """The next claims, with fresh request ids; their slots are taken before the round trip."""
        plan = []
        slots = self.ctx.slots
        # Due jobs only into handler slots; the prefetch allowance only takes jobs handed off ahead
        # of their time (lua/claim.lua), so it rides along with claims that have a handler slot.
        # Each claim asks for no more than the worker's handlers are expected to start soon after
        # they are due (DuePace.claim_size): a big prefetch allowance must not hoard a burst.
        steps = self.planner.plan(slots.free + slots.hold)
        pace = slots.pace
        sizes, held = [], slots.held
        for (q, _, n, _), h in zip(steps, slots.handler_share([s[2] for s in steps])):
            sizes.append(size := pace.claim_size(q, n, h, held))
            held += size - h
        for (q, p, _, gen), n, h in zip(steps, sizes, slots.reserve_many(sizes)):
            self._rid_n += 1
            due = h + pace.extra(q, n - h) if h else 0  # past the handler slots: on prefetch slots
            plan.append(Claim(q, p, n, gen, f"{self._rid_prefix}{self._rid_n:x}", h, due))
        return plan

    def _claim_calls(self, plan: list[Claim]) -> list[Call]:
        calls = self.ctx.calls
        last = self._last_rid
        return [claim_call(calls, c.p, c.queue, c.n, request_id=c.rid, receipt_ms=CLAIM_RECEIPT_MS,
                           earlier_request_id=last.get((c.queue, c.p), ""), max_due=c.due) for c in plan]

    async def _claims_lost(self, plan: list[Claim], meta: Meta, exc: BaseException,
                           outage: Outage) -> bool:
        """The claim round trip failed: the claims may have run. True if the loop should end."""
        ctx = self.ctx
        ctx.outbox.requeue(meta)
        if ctx.life.stopping:  # give up: those jobs are reaped when their leases expire
            for c in plan:
                ctx.slots.put_back(c.handler, c.n - c.handler)
            self._lost = None
            return True
        self._lost = plan  # ask again with the same ids
        if await ctx.life.wait_stop(outage.failed(exc)):
            return False  # one last re-send so claimed jobs are released now, not reaped later
        self.mark_all()  # anything may have become ready meanwhile
        return False

    def _claimed(self, plan: list[Claim], replies: Sequence[Any], t0: float) -> NodeFailed | None:
        """Take a round trip's claim replies; returns the failure of a cluster node, if any."""
        received = time.monotonic()
        slots, planner, dispatch = self.ctx.slots, self.planner, self.ctx.dispatch
        node_down: NodeFailed | None = None
        for item, reply in zip(plan, replies):
            q, p, n, gen, rid, h, due = item
            if isinstance(reply, NodeFailed):  # its node failed, the other nodes' claims went through
                node_down = reply
                if reply.sent or rid in self._orphan_rids:  # may have run: again with the same id
                    self._orphans.append(item)
                    self._orphan_rids.setdefault(rid, time.monotonic())
                    continue
            self._orphan_rids.pop(rid, None)
            self._last_rid[(q, p)] = rid
            if isinstance(reply, Exception):
                self.clock.forget()
                slots.put_back(h, n - h)
                planner.failed(q, p)  # back with the next notification or sweep
                if reply is not node_down:  # a node failure is logged once per outage by the loop
                    log.error("claim on partition %d queue %r failed: %s", p, q, reply)
                continue
            if claim_paused(reply) is not None:  # the queue is paused: wait for its resume message
                slots.put_back(h, n - h)
                planner.paused_at(q, p)
                continue
            now_us, jobs = parse_claim(reply)
            got = len(jobs)
            self.ctx.stats[q].claims += 1
            self.ctx.stats[q].claims_empty += got == 0
            held = held_slots(jobs, now_us // 1000, h, n - h)
            on_hold = sum(held)
            slots.put_back(h - (got - on_hold), n - h - on_hold)
            if got < n and due and sum(c.due_ms <= now_us // 1000 for c in jobs) >= due:
                # Stopped at its limit on due jobs, not at the end of the ready list: there is
                # more to take, keep it hot.
                planner.claimed(q, p, n, gen, n)
            else:
                # Short: the list ended (or, with no handler slot, the script stopped at a due job,
                # which it rang the bell for: an idle worker takes it, we do once a slot is free).
                planner.claimed(q, p, n, gen, got)
            if self._ring_after_claims and p in planner.hot[q]:
                self._ring(q, p)  # may have left jobs behind: the script could not ring (cluster)
            if got:  # monotonic - Redis's time (an upper bound): maps due times onto our clock
                dispatch(q, p, jobs, t0, self.clock.offset(now_us / 1_000_000, t0, received), held)
        return node_down

    # -- doorbells ------------------------------------------------------------------------------
    async def listen_loop(self) -> None:
        try:
            await self._listen()
        finally:
            await asyncio.shield(self.bells.close())

    async def _listen(self) -> None:
        ctx = self.ctx
        outage = Outage("doorbell")
        swept = False
        while not ctx.life.stopping:
            try:
                if not swept:  # at start and after an outage: anything may have become ready meanwhile
                    self.mark_all()
                    swept = True
                    ctx.life.ready.set()
                pace = ctx.slots.pace
                await self.bells.follow_pace([q for q in ctx.queues if pace.slow(q)])
                await self.bells.wait_hungry(self.hungry, self.ctx.slots)
                rungs = await self.bells.take_many(self._take_count())
                self._bells_heard = ctx.life.redis_answered = time.monotonic()  # it listened until now
                outage.ok()
            except REDIS_ERRORS as exc:
                swept = False
                # The bells cannot be heard (Redis, or on a cluster the node that holds their slot,
                # is down): jobs made ready meanwhile on the nodes still up would wait for the safety
                # sweep. Claim everywhere at each retry instead (at most a second apart); the claims
                # of a node that is down fail on their own.
                self.mark_all()
                if await ctx.life.wait_stop(outage.failed(exc)):
                    return
                continue
            for rung in rungs:
                self._rung(*rung)

    def _take_count(self) -> int:
        """How many rings one bell wait may take (``pace.rings_to_take``)."""
        slots = self.ctx.slots
        return rings_to_take(slots.pace, self.ctx.queues, slots.free, slots.hold, slots.held)

    def _ringed_partition(self, queue: str, member: bytes) -> int | None:
        """The partition a ring taken from ``queue``'s bell names (counted as a notification);
        None, logged, for a malformed one."""
        try:
            p, _resumed = ready_message(member)
        except ValueError:
            log.warning("ignoring a malformed ring %r on queue %r's bell", member, queue)
            return None
        self.ctx.stats[queue].notified += 1
        return p

    def _rung(self, queue: str, member: bytes, score: float) -> None:
        """A ring taken from ``queue``'s bell: claim there, or hand it on when the slots filled meanwhile."""
        p = self._ringed_partition(queue, member)
        if p is None:
            return
        if self.ctx.slots.free <= 0:
            # busy now: another worker takes it, and this one stops waiting on the bells until a
            # slot frees (else it would take its own ring back at once, again and again)
            self.hungry.clear()
            self._ring(queue, member, score)
            return
        # Always claim on a ring, also where this worker last found the queue paused: the scripts
        # do not ring a paused queue, so a ring means it is claimable (a resume, or a pause that
        # ended before this worker heard the resume ring, which went to another worker).
        if self.planner.notify(queue, p, resumed=True):
            self.hungry.clear()
            self.ctx.slots.wake.set()

    def _ring(self, queue: str, member: int | bytes, score: float | None = None) -> None:
        """Ring ``queue``'s bell in the background (a lost ring costs latency, not jobs: the
        safety-net sweep finds them)."""
        task = asyncio.create_task(self._ring_now(queue, member if isinstance(member, bytes) else str(member).encode(),
                                                  score))
        self._rings.add(task)
        task.add_done_callback(self._rings.discard)

    async def _ring_now(self, queue: str, member: bytes, score: float | None) -> None:
        try:
            await self.bells.ring(queue, member, score)
        except REDIS_ERRORS as exc:
            log.debug("could not ring queue %r's bell: %s", queue, exc)
