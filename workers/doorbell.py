"""The worker's side of the doorbells: how it learns that a (queue, partition) has ready jobs.

Each queue has a bell, the sorted set ``{NS}:bell:QUEUE`` (:meth:`Keyspace.bell`): a script that
puts jobs in a partition's ready list rings it with the partition number (lua/_lib.lua ``ring``;
``P:resume`` when a paused queue is resumed there). A worker with a free handler slot and nothing
else to claim waits in ``BZPOPMIN`` on the bells of its queues, and Redis hands each member to
ONE waiting worker, the longest waiting: a ring costs one wake-up however many workers serve the
queue. A pub/sub message per ring reached every worker, and each answered with a claim, so the
work per job grew with the fleet (docs/architecture.md "Waking workers").

A bell holds a member until a worker takes it, so nothing is missed while no worker waits (all
busy, or none running yet); ringing a member that is there already changes nothing (``NX``), so a
bell holds at most two members per partition however many jobs wait. A worker that takes a member
it can no longer use (its slots filled meanwhile) rings it again for another worker.

**One listener** (the default; ``Worker(one_listener=False)``, ``zsched worker
--no-one-listener`` turns it off). Redis hands a member to the client that has waited longest, so
with every idle worker on the bells each spread job would wake a cold process: at 300 jobs/s over
16 workers, 2.4x the CPU per job of one worker. With one listener, of the workers serving the
same queues only one waits on the bells (the *listener*, :meth:`Keyspace.listener`: a key holding
its id, taken with ``SET NX`` and renewed with an expiry while it listens); the others sleep on a
wake-up key (:meth:`Keyspace.listen_wake`). The listener keeps taking rings while it has room,
warm; when its slots are full, when it has been off the bells for 20 ms claiming elsewhere
(:data:`HAND_OFF_S`), or when it stops, it gives the role up and wakes one sleeper, which takes
it. A listener that dies keeps the role until its expiry (``LISTEN_TTL_MS``), but its rings do
not wait that long: the watching sleeper's wait times out every ``BELL_WAIT``, and one that finds a ring
older than :data:`STALE_RING_MS` in the bells helps (waits on the bells beside the listener until
no ring came for :data:`HELP_S`) at once; the sleepers take the role once it has expired. Nothing
is lost either way: the rings stay in the bells, and the busy workers' checks of the bells and the
sweeps find the jobs too. One listener is for quick handlers: a worker whose handlers it measured
as slow (``DuePace.slow``) waits on the bells as without the option (:meth:`Doorbell.follow_pace`).
Workers serving different sets of queues have different listeners (a queue served by both sets
has two). The role's state and checks are :mod:`.listen_role`'s; the waits and the checks go out on
a connection the doorbell keeps (:mod:`.kept`, one server).

**Burst bells.** One listener takes rings one after another, so a burst (many jobs made ready at
once) would reach the fleet only as fast as it fills up and hands on. The scripts tell a burst
apart where it happens: a script that leaves ``BURST_RING`` (4) or more jobs in a ready list at
once (a tick firing a batch due within ``BURST_SPAN_MS`` of each other, not spread jobs handed off
together: scheduler/protocol/bells.py; a claim leaving a batch behind), and ``resume``, ring the queue's
*burst bell* (:meth:`Keyspace.burst_bell`) instead, and every idle worker waits on it, the
sleepers too: a burst reaches them all at once, as it would with every worker on the bells, while
the rings of spread traffic (one or a few jobs each) stay on the warm listener. A sleeper that
takes a burst ring claims there and sleeps again.

**Several rings per wait** (:meth:`Doorbell.take_many`, sleepers only): a sleeper with
room for the jobs of several partitions takes up to that many burst rings at once (``BZMPOP ... MIN
COUNT k``), and the replica lands a burst's tick step's rings together (one ``MULTI``/``EXEC`` on
one server; on a cluster, where the owner rings, one ``ZADD`` per bell: scheduler/tier/bells.py),
so a burst wakes about half as many workers (``workers/pace.py`` ``rings_to_take``; 16 workers,
``bench fanout`` batched: 160 burst rings in 74 wake-ups, 25 of them taking 4).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

from scheduler.protocol import bells
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.masking import mask_secrets
from scheduler.redisio.connection import is_cluster
from scheduler.redisio.errors import REDIS_ERRORS
from scheduler.redisio.transport_async import lost_in_transit

from .kept import KeptConnection
from .listen_role import HELP_S, ListenerRole, as_bytes, pipelined
from .listen_role import LISTEN_TTL_MS as LISTEN_TTL_MS  # the role's constants, where they were before
from .listen_role import STALE_RING_MS as STALE_RING_MS
from .slots import Slots
from .turns import Turns

log = logging.getLogger("zsched.worker")

BELL_WAIT = 2.0  # seconds one BZPOPMIN waits before it is sent again (below any socket timeout we set)
# A sleeper that does not hold the watch (workers/listen_role.py) waits until its next periodic
# chore must go, less RIDE_MARGIN (so the chore rides on the next wait, before its own timer would
# send it), at least BELL_WAIT and at most this long: the chores (registry and settings every 5 s,
# sweep tries every 6.4-8 s) then ride on one timeout every few seconds instead of waking the
# process every BELL_WAIT (on a cluster, where nothing rides, they go on that timeout's wake-up).
SLEEP_WAIT_MAX = 5.0
RIDE_MARGIN = 0.25
# How long a listener with a free slot may stay off the bells (claiming on) before it hands the role
# on: a ring waits at most about this long, plus a wake-up, while another worker has room. The
# default hand-off lead (zsched scheduler --handoff-lead), so such a job still starts on time; and
# far above a claim's round trip (about a millisecond), which a loaded machine can stretch: a
# listener taking one ring after another keeps the role. One with no free slot hands it on at once
# (a burst then spreads one hop per worker, as before).
HAND_OFF_S = 0.020

# A sleeper (one listener on, not the listener, not helping) tries for the queues' safety-net sweep
# turn this many times less often than the sweep period: the listener, awake anyway, takes the
# turn. Each try is a round trip, a third of an idle sleeper's before this; with a listener that
# does not sweep (its fetch loop stuck while its listen loop renews the role) the sleepers still
# sweep, about every SLEEPER_SWEEP_STRETCH periods, and one that takes the role sweeps as usual.
SLEEPER_SWEEP_STRETCH = 4

LISTEN, HELP, SLEEP = "listen", "help", "sleep"


class Doorbell:
    """The bells of ``queues`` on ``redis`` (the worker's asyncio client: one Redis, a Sentinel
    master or a cluster; every bell of a namespace carries the hash tag ``{NS}``, so one command
    waits on them all, on a cluster too)."""

    def __init__(self, redis: Any, ks: Keyspace, queues: Sequence[str], wait: float = BELL_WAIT,
                 one_listener: bool = False, turns: Turns | None = None) -> None:
        self.redis = redis
        self.ks = ks
        self.queues = list(queues)
        self.keys = [ks.bell(q) for q in queues]
        self.burst = [ks.burst_bell(q) for q in queues]
        self.queue_of = {k.encode(): q for k, q in zip(self.keys + self.burst, list(queues) * 2)}
        self.wait_s = _block_seconds(redis, wait)
        self.sleep_max = max(self.wait_s, _block_seconds(redis, SLEEP_WAIT_MAX))
        # One server (or a Sentinel master): the waits and role checks go out on a connection this
        # object keeps (workers/kept.py). A cluster client routes them itself.
        self.kept = None if is_cluster(redis) else KeptConnection(redis.connection_pool)
        # One listener per set of queues (the module docstring; workers/listen_role.py)
        self.role = ListenerRole(redis, ks, queues, self.keys, one_listener, self.kept, self.wait_s,
                                 self.sleep_max - RIDE_MARGIN)
        # Several rings per wait (take_many); False once Redis refused BZMPOP (an ACL listing
        # commands without it). On a cluster too since 2026-12-05: the owners ring a grid step's
        # partitions in one ZADD per bell (scheduler/tier/bells.py), no longer one by one
        self.multi_take = True
        # A wait that timed out gives the worker's periodic chores their turn (workers/turns.py):
        # the process is awake for its role check anyway
        self.turns = turns
        # the queues whose sweep turn this worker held at its last try: renewed at the next
        self._sweep_held: set[str] = set()

    @property
    def listening(self) -> bool:
        """Whether this worker waits on the bells as its queues' listener (always, with one listener off)."""
        return self.role.listening

    @property
    def helping(self) -> bool:
        """Whether this worker helps a listener that stopped taking rings (:attr:`ListenerRole.helping`)."""
        return self.role.helping

    async def take(self) -> tuple[str, bytes, float] | None:
        """:meth:`take_many` of one ring: (queue, member, score), or None."""
        rings = await self.take_many(1)
        return rings[0] if rings else None

    @lost_in_transit
    async def take_many(self, count: int) -> list[tuple[str, bytes, float]]:
        """Wait up to :attr:`wait_s` for rings on any of the bells and take up to ``count`` of them
        from the first bell that has any (``BZMPOP ... MIN COUNT``; ``BZPOPMIN`` for one): (queue,
        member, score) each, oldest first, none when nothing rang. A worker that is neither the
        listener of its queues nor a helper waits to be woken instead (none when it was, or on a
        timeout: call again). Raises the client's errors.

        ``count`` is how many partitions the caller can claim from at once: the burst of one tick
        step rings a bell per partition, and a worker that takes them one by one wakes once per
        partition, or wakes that many workers, each a cold process (docs/architecture.md, "Several
        rings per wake-up"). Only a sleeper takes more than one: a listener that took several
        spread rings made 8 workers' p99 at 1 000 jobs/s 1.5x."""
        role = self.role
        listening = await role.check()
        mode = LISTEN if listening else HELP if role.helping else SLEEP
        count = count if self.multi_take and mode == SLEEP else 1
        # A sleeper's role check rides on its wait (one server): sent behind it, Redis runs it
        # when the wait ends, and both answers come back in one reply
        check = mode == SLEEP and role.one_listener and self.kept is not None
        try:
            reply, ridden = await self._wait(mode, count, check)
        except NoPermissionError as exc:
            if count == 1:
                raise
            # An ACL that lists commands and not BZMPOP: one ring per wait, as before 2026-12-05
            log.error("doorbell: Redis refused BZMPOP (%s); this worker takes one ring per wait. Grant its ACL user "
                      "+bzmpop (docs/operations.md, 'ACL users')", mask_secrets(str(exc)))
            self.multi_take = False
            return []
        if ridden is not None:
            await role.ridden(ridden)
        rings = _rings(reply, count)
        if not reply and self.turns is not None:
            # timed out: idle. The chores that can ride go with the next wait (one server)
            self.turns.pulse(riding=self.kept is not None)
        if mode == SLEEP:
            if not rings:
                if ridden is None:
                    role.checked_until = 0.0  # a timeout: check the role (it may have expired) and the bells
                return []
            if rings[0][0] == role.wake_key.encode():  # woken: take the role if it is free, else help
                if ridden is None:
                    role.checked_until = 0.0
                if rings[0][1].startswith(b"h"):  # from a worker before 2026-12-04 (helpers for bursts)
                    role.helping_until = time.monotonic() + HELP_S
                return []
        if not rings:
            role.helping_until = 0.0  # no ring for HELP_S: back to sleep
            return []
        if mode == HELP:
            role.helping_until = time.monotonic() + HELP_S
        # a sleeper that took burst rings claims there and sleeps again (spread traffic stays
        # on the listener)
        queue = self.queue_of.get(rings[0][0])
        if queue is None:  # not one of ours: cannot happen with the keys we asked for
            return []
        return [(queue, member, score) for _key, member, score in rings]

    @property
    def sweep_stretch(self) -> float:
        """How many sweep periods apart this worker tries for the safety-net sweep turn:
        :data:`SLEEPER_SWEEP_STRETCH` for a sleeper, 1 otherwise."""
        return SLEEPER_SWEEP_STRETCH if self.role.sleeping else 1

    def _command(self, mode: str) -> tuple[list[str], float]:
        """The keys and timeout of the wait in ``mode``: the bells and burst bells (listener,
        helper), or the wake-up key and the burst bells (sleeper)."""
        if mode == SLEEP:
            return [self.role.wake_key, *self.burst], self.sleep_s()
        return self.keys + self.burst, (self.wait_s if mode == LISTEN else HELP_S)

    def sleep_s(self) -> float:
        """How long a sleeper's wait lasts: ``BELL_WAIT`` for the watcher (it finds a dead
        listener's rings); for the others, until the first chore that may ride must go (on a
        cluster none rides: they go when the wait times out), at most :data:`SLEEP_WAIT_MAX`,
        less :data:`RIDE_MARGIN`, at least ``BELL_WAIT``, in tenths of a second (each value's wait
        is packed once)."""
        role = self.role
        if role.watching or not role.watches or self.turns is None:
            return self.wait_s
        # capped below SLEEP_WAIT_MAX too: a chore that takes its ticket while this wait is out
        # (its last turn ended just now) has a whole interval (5 s or more), so it rides next time
        due = min(self.turns.ride_due() - asyncio.get_running_loop().time(), self.sleep_max) - RIDE_MARGIN
        return max(self.wait_s, math.floor(due * 10) / 10)

    async def wait_hungry(self, hungry: asyncio.Event, slots: Slots) -> None:
        """Wait for ``hungry`` (the worker has a free slot and nothing else to claim). A listener
        with no free handler slot hands its role on at once, and one that is not back on the bells
        within :data:`HAND_OFF_S` (it keeps claiming elsewhere) does then: the rings would
        otherwise wait for it while another worker has room. Raises the client's errors."""
        if self.role.one_listener and self.role.listening and not hungry.is_set():
            if slots.free > 0:
                try:
                    async with asyncio.timeout(HAND_OFF_S):
                        await hungry.wait()
                    return
                except TimeoutError:
                    pass
            await self.hand_off()
        await hungry.wait()

    async def follow_pace(self, slow: Sequence[str]) -> None:
        """One listener while this worker's handlers are quick; while the queues in ``slow`` have
        handlers it measured as slow (``DuePace.slow``: about 8 claim round trips or more at
        concurrency 4), it waits on the bells as every worker does without the option, handing the
        role on if it holds it. A listener of slow handlers fills its handler slots in a ring or
        two and hands the role on each time, and its rings waited for the next one: 16 workers at
        300 spread jobs/s with 100 ms handlers started them 65 ms late at the median, 181 ms at
        p99, against 0.5 and 3 ms with every idle worker on the bells. Raises the client's errors."""
        role = self.role
        on = role.allowed and not slow
        if on == role.one_listener:
            return
        if on:
            log.info("doorbell: the handlers are quick again: one listener for queues %s", ", ".join(self.queues))
            role.one_listener, role.listening, role.checked_until = True, False, 0.0
            return
        log.info("doorbell: handlers of queue(s) %s are slower than the claims can feed one listener: every "
                 "idle worker waits on the bells", ", ".join(slow))
        await self.hand_off()
        role.one_listener, role.listening, role.helping_until = False, True, 0.0

    @lost_in_transit
    async def hand_off(self) -> None:
        """Give the listener role up (this worker has no free slot left, or stops) and wake one
        of the workers waiting for it. Raises the client's errors."""
        await self.role.hand_off()

    async def _wait(self, mode: str, count: int, check: bool = False) -> tuple[Any, list[Any] | None]:
        """``BZPOPMIN`` (``count`` 1) or ``BZMPOP ... MIN COUNT count`` on the bells (listener,
        helper) or on the listeners' wake-up key and the burst bells (sleeper): its raw reply,
        and with ``check`` (one server) the raw replies of a sleeper's role check sent behind it
        (error replies as they are). On one server on the kept connection.

        Redis runs the commands a blocked client sent behind its wait once the wait ends (taken or
        timed out), so the check sees the role as it is then, and its replies come back with the
        wait's, in the same read: a sleeper makes no round trip for its checks, and one woken to
        take the role (a hand-off's ``w``) takes it in the same round trip."""
        if self.kept is None:  # a cluster client routes it (every bell carries the hash tag {NS})
            keys, timeout = self._command(mode)
            if count == 1:
                return await self.redis.bzpopmin(keys, timeout=timeout), None
            return await self.redis.execute_command("BZMPOP", timeout, len(keys), *keys, "MIN", "COUNT", count), None
        role = self.role
        # idle chores whose turn has come go ahead of the wait, in the same write (workers/turns.py);
        # taken first, so that a sleeper's timeout is set by the chores still waiting
        ahead = self.turns.rides() if self.turns is not None else ()
        keys, timeout = self._command(mode)

        def commands() -> list[tuple[Any, ...]]:  # built only to pack a shape the first time
            wait = (("BZPOPMIN", *keys, timeout) if count == 1 else
                    ("BZMPOP", timeout, len(keys), *keys, "MIN", "COUNT", count))
            return [wait, *(role.commands(False, True) if check else ())]

        replies = 1 + (role.replies(False, True) if check else 0)
        shape = f"{mode}{count}{role.shape(False, True) if check else ''}{timeout}"
        reply, *ridden = await self.kept.exchange(shape, commands, replies, ahead)
        if isinstance(reply, ResponseError):
            raise reply
        return reply, (ridden if check else None)

    async def close(self) -> None:
        """Hand the listener role on (a stopping worker takes no more rings) and give the kept
        connection back to the pool (the listen loop has ended)."""
        with contextlib.suppress(*REDIS_ERRORS):
            await self.hand_off()
        if self.kept is not None:
            await self.kept.release()

    @lost_in_transit
    async def take_waiting(self, count: int) -> list[tuple[str, bytes, float]]:
        """Take up to ``count`` rings waiting on each of the bells now, without blocking: (queue,
        member, score), oldest first. For a worker that stayed busy: a ring still in a bell is one
        no idle worker was there to take."""
        pipe = self.redis.pipeline(transaction=False)
        keys = self.keys + self.burst
        for k in keys:
            pipe.zpopmin(k, count)
        replies = await pipe.execute()
        out = [(self.queue_of[k.encode()], as_bytes(m), float(score))
               for k, reply in zip(keys, replies) for m, score in reply]
        out.sort(key=lambda r: r[2])
        return out

    @lost_in_transit
    async def sweep_turns(self, queues: Sequence[str], period: float, token: str,
                          ridden: Sequence[Any] | None = None) -> list[str]:
        """Which of ``queues`` this worker sweeps this period: those whose turn it took (``SET NX``
        of :meth:`Keyspace.sweep_turn` for ``period`` s), or still holds (``token``, its own: a
        worker tries every 0.8-1.0 period, so its own last turn is often still there, and the
        listener, which takes most turns, would then sweep every other period). The workers of a
        queue take turns, so a queue is swept about once per period whatever their number. A turn
        held at the last try is renewed along (``PEXPIRE``), so the worker that sweeps keeps the
        turn while it tries each period: the listener, awake anyway, rather than a sleeper woken
        for a sweep of every partition once the listener's turn lapsed between two of its tries
        (with 15 sleepers trying, one took about every other period).

        ``ridden``: the replies of :meth:`sweep_commands` sent ahead of a bell wait (workers/sweep.py),
        read instead of a round trip; one that Redis refused (NOPERM, READONLY, ...) makes the
        round trip, which says how."""
        if ridden is not None and len(ridden) >= len(queues) and not any(isinstance(r, Exception) for r in ridden):
            mine = self.sweep_mine(queues, token, ridden)
        else:
            replies = await pipelined(self.redis, self.sweep_commands(queues, period, token))
            mine = self.sweep_mine(queues, token, replies)
        self._sweep_held = set(mine)
        return mine

    def sweep_commands(self, queues: Sequence[str], period: float, token: str) -> list[tuple[Any, ...]]:
        """:meth:`sweep_turns`'s commands (one ``SET NX PX GET`` per queue; GET: Redis 7, as the
        role check), then a ``PEXPIRE`` of each turn this worker held at its last try (should it
        have lapsed and gone to another meanwhile, that lengthens the other's turn once:
        harmless); also for a try that rides on a bell wait (workers/sweep.py)."""
        ms = max(1, round(period * 1000))
        return ([("SET", self.ks.sweep_turn(q), token, "NX", "PX", ms, "GET") for q in queues]
                + [("PEXPIRE", self.ks.sweep_turn(q), ms) for q in queues if q in self._sweep_held])

    @staticmethod
    def sweep_mine(queues: Sequence[str], token: str, held: Sequence[Any]) -> list[str]:
        """The queues whose turn the replies of :meth:`sweep_commands` gave this worker (none
        held it before, or this worker did: ``token``); the renewals' replies after them are not read."""
        mine = token.encode()
        return [q for q, before in zip(queues, held[:len(queues)]) if before is None or as_bytes(before) == mine]

    @lost_in_transit
    async def ring(self, queue: str, member: bytes | str, score: float | None = None) -> None:
        """Ring ``queue``'s burst bell, which every idle worker waits on, with ``member`` (a
        partition number, or ``P:resume``), keeping an earlier ring of the same member (NX): after a
        claim that may have left jobs behind (on a cluster), or to put back a member this worker
        took and could not use (``score``: when it was first rung, ms; default now)."""
        await bells.ring(self.redis, self.ks, queue, member, score, burst=True)


def _rings(reply: Any, count: int) -> list[tuple[bytes, bytes, float]]:
    """(key, member, score) of a ``BZPOPMIN`` reply (``count`` 1: ``[key, member, score]``) or a
    ``BZMPOP`` one (``[key, [[member, score], ...]]``); none for a timeout (nil)."""
    if not reply:
        return []
    key = as_bytes(reply[0])
    if count == 1:
        return [(key, as_bytes(reply[1]), float(reply[2]))]
    return [(key, as_bytes(m), float(sc)) for m, sc in reply[1]]


def _block_seconds(redis: Any, wait: float) -> float:
    """How long one BZPOPMIN may block: ``wait``, or less when the client's socket timeout (URL
    ``socket_timeout=``) is shorter: a read that outlasts it fails as a timeout instead of
    returning empty. A cluster client gives its nodes' settings (``get_connection_kwargs``)."""
    pool = getattr(redis, "connection_pool", None)
    if pool is not None:
        kwargs = getattr(pool, "connection_kwargs", None) or {}
    else:  # a cluster client (a sleeper's wait lasts up to SLEEP_WAIT_MAX there too)
        get = getattr(redis, "get_connection_kwargs", None)
        kwargs = (get() if callable(get) else None) or {}
    timeout = kwargs.get("socket_timeout")
    if isinstance(timeout, int | float) and timeout > 0:
        return max(0.1, min(wait, timeout / 2))
    return wait
