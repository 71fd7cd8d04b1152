"""Who of the workers serving the same queues waits on the bells: the listener role, and the watch.

:mod:`.doorbell` explains one listener. This module holds the role's state and its Redis side: the
check (``SET NX GET`` of :meth:`Keyspace.listener`, renewed along while held), the hand-off (delete
it, wake a sleeper), and the *watch*.

**The sleepers' checks.** A sleeper checks at the end of its waits (at each timeout; after
wake-ups by rings, once its last check is older than ``BELL_WAIT``, or its longest wait when it
does not hold the watch), reading the oldest ring of each bell along: one older than
:data:`STALE_RING_MS` means the listener stopped taking rings (killed, stalled), and the sleeper
helps at once; and a role that expired is taken. On one server the check rides on the wait
(``Doorbell``'s wait sends it behind the wait, and Redis runs it when the wait ends), so it costs
the sleeper no round trip of its own.

**The watch**. Finding a dead listener's rings needs one sleeper to check every
``BELL_WAIT``, not all of them: each wake-up of an idle process costs it a few tenths of a
millisecond of CPU, and that upkeep is what every added worker costs the fleet. So one sleeper at a
time holds the *watch* (:meth:`Keyspace.listen_watch`: ``SET NX`` with :data:`WATCH_TTL_MS`,
renewed along with each of its checks, in the same commands that ride on its wait) and keeps the
``BELL_WAIT`` timeouts; the other sleepers' waits last until their next periodic chore is due
(``Doorbell``, at most ``SLEEP_WAIT_MAX``), and the chores ride on that one timeout. A watcher that
dies or stalls loses the watch :data:`WATCH_TTL_MS` after its last check, and the next sleeper to
check takes it. A watcher that takes the listener role gives the watch up at once. On a cluster
a sleeper's check is a round trip of its own after its wait (a pipeline the cluster client sends
to the node of the ``{NS}`` slot), with the watch's commands in it, and the chores go on the same
wake-up, each with its own round trip: the other sleepers then wake once per chore interval there
too, not every ``BELL_WAIT``.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

from scheduler.protocol.keys import Keyspace
from scheduler.protocol.masking import mask_secrets

from .kept import KeptConnection

log = logging.getLogger("zsched.worker")

LISTEN_TTL_MS = 4_000  # a listener's role outlives its last check by this much (> BELL_WAIT + a check)
LISTEN_CHECK_S = 1.0  # how often a listener renews its role (at most, and only when it waits again)
WAKE_TTL_MS = 2_000  # wake-ups nobody took expire (no sleeper then: each would cost a wasted turn)
# A ring this old (ms) in a bell means the listener is not taking rings (killed, stopped, its loop
# blocked): a sleeper that sees one at its role check helps at once instead of waiting for the
# role to expire. Far above HAND_OFF_S and a claim; rings are scored by the ringing host's clock.
STALE_RING_MS = 500
WATCH_TTL_MS = 4_000  # the watch outlives its holder's last check by this much (> BELL_WAIT + a check)
# How long a helper (a sleeper that found a stale ring) keeps waiting on the bells after its last
# ring: longer than a claim round trip, short enough that spread traffic returns to the listener.
HELP_S = 0.050


class ListenerRole:
    """The role of one worker among those serving ``queues`` (``bells``: their bells' keys): the
    listener, a helper, or a sleeper. ``kept``: the connection of the bell waits (one server), on
    which the checks go too; None on a cluster."""

    def __init__(self, redis: Any, ks: Keyspace, queues: Sequence[str], bells: Sequence[str],
                 one_listener: bool, kept: KeptConnection | None, wait_s: float,
                 sleep_check_s: float | None = None) -> None:
        self.redis = redis
        self.ks = ks
        self.bells = list(bells)
        self.kept = kept
        self.wait_s = wait_s
        # how long a sleeper without the watch keeps its check when rings wake it before its wait
        # times out (a timeout makes it check at once): about its longest wait (Doorbell.sleep_s)
        self.sleep_check_s = wait_s if sleep_check_s is None else max(wait_s, sleep_check_s)
        self.listener_key = ks.listener(queues)
        self.wake_key = ks.listen_wake(queues)
        self.watch_key = ks.listen_watch(queues)
        # One sleeper watches the listener (the module docstring), the others sleep until their
        # chores are due; with one listener off there are no sleepers. (A cluster's sleepers all
        # checked at every BELL_WAIT until 2026-12-05: an idle worker there cost 0.6 ms/s.)
        self.watches = one_listener
        self.watching = False  # this worker held the watch at its last check
        self.id = os.urandom(8).hex().encode()
        # Off (Worker(one_listener=False)), every idle worker waits on the bells: each is a
        # listener, with no role to take or hand on.
        self.one_listener = one_listener
        self.allowed = one_listener  # the option; Doorbell.follow_pace turns one listener off while handlers are slow
        self.listening = not one_listener
        self.checked_until = 0.0  # monotonic: the last check holds until then
        self.helping_until = 0.0  # monotonic: a helper (not the listener) waits on the bells until then

    @property
    def helping(self) -> bool:
        """Whether this worker is a helper now: not the listener, it found a ring nobody took (the
        listener stalls) and waits on the bells until no ring came for :data:`HELP_S`."""
        return time.monotonic() < self.helping_until

    @property
    def sleeping(self) -> bool:
        """A sleeper: one listener on, neither the listener nor helping."""
        return self.one_listener and not self.listening and not self.helping

    async def check(self) -> bool:
        """Whether this worker is its queues' listener: it takes the role when nobody holds it
        (``SET NX``) and keeps it alive while it holds it (checked at most every
        :data:`LISTEN_CHECK_S`, so a listener taking one ring after another pays no round trip
        for it). A listener that died loses the role :data:`LISTEN_TTL_MS` after its last check;
        until then its rings wait in the bells (the sweeps still find their jobs)."""
        now = time.monotonic()
        if not self.one_listener or now < self.checked_until:
            return self.listening
        # One round trip (SET NX GET, Redis 7): None means the role was free and is ours now; our own
        # id means we hold it. A worker that held it at its last check renews it in the same round
        # trip (PEXPIRE): an idle listener checks every BELL_WAIT, so a second round trip was a third
        # of its Redis calls. Should the role have passed to another worker meanwhile (ours expired
        # while this one stalled), that PEXPIRE lengthens the other's role once, which it renews
        # anyway while it lives. A sleeper reads the oldest ring of each bell along (every key here
        # carries the hash tag {NS}: one slot on a cluster); the listener renewing its role and a
        # helper taking rings have no use for it.
        renew = self.listening
        # A sleeper's check is kept for a whole wait (a timeout or a wake-up ends it early), so one
        # woken by burst rings (every second, say) checks every other burst, not at each: those
        # round trips were a cost per burst of every sleeper, growing with the fleet. It still
        # checks at least once per wait, as an idle sleeper does at each timeout, so a dead
        # listener's rings wait no longer. A listener or helper keeps its check LISTEN_CHECK_S.
        # On one server a sleeper's check rides on each of its waits instead (Doorbell's wait):
        # this round trip is then only its first, and after a failed wait.
        sleeper = not (self.listening or self.helping)
        try:
            replies = await self.trip(renew, sleeper)
        except NoPermissionError as exc:
            return self.refused(exc)
        await self.took(replies, renew, sleeper, now)
        return self.listening

    def refused(self, exc: NoPermissionError) -> bool:
        """Redis refused the listener key: wait on the bells as every worker did before one
        listener (returns True: this worker listens)."""
        # An ACL written before one listener was the default (no ~{NS}:listen:*): wait on the
        # bells as every worker did then, rather than retry a refused command forever.
        log.error("doorbell: Redis refused the listener key %s (%s); this worker waits on the bells as with "
                  "--no-one-listener. Grant its ACL user ~{%s}:listen:* (docs/operations.md, 'ACL users') "
                  "for one listener", self.listener_key, mask_secrets(str(exc)), self.ks.namespace)
        self.one_listener, self.allowed, self.listening, self.helping_until = False, False, True, 0.0
        return True

    def commands(self, renew: bool, sleeper: bool) -> list[tuple[Any, ...]]:
        """A check's commands: ``SET NX GET`` of the role, with ``renew`` its ``PEXPIRE``; for a
        ``sleeper`` the oldest ring of each bell (``ZRANGE 0 0 WITHSCORES``)."""
        key = self.listener_key
        cmds: list[tuple[Any, ...]] = [("SET", key, self.id, "PX", LISTEN_TTL_MS, "NX", "GET")]
        if renew:
            cmds.append(("PEXPIRE", key, LISTEN_TTL_MS))
        cmds += [("ZRANGE", bell, 0, 0, "WITHSCORES") for bell in (self.bells if sleeper else ())]
        if sleeper and self.watches:
            # the watch: taken if free, renewed if held (a PEXPIRE of another's watch, should ours
            # have expired and been taken meanwhile, lengthens it once: harmless)
            cmds.append(("SET", self.watch_key, self.id, "PX", WATCH_TTL_MS, "NX", "GET"))
            if self.watching:
                cmds.append(("PEXPIRE", self.watch_key, WATCH_TTL_MS))
        return cmds

    def replies(self, renew: bool, sleeper: bool) -> int:
        """How many replies a check's :meth:`commands` get."""
        return 1 + renew + (len(self.bells) + self._watch_replies() if sleeper else 0)

    def _watch_replies(self) -> int:
        return (1 + self.watching) if self.watches else 0

    def shape(self, renew: bool, sleeper: bool) -> str:
        """The name of a check's shape (what :meth:`commands` depends on), to pack it once."""
        return f"role{int(renew)}{int(sleeper)}{self._watch_replies() if sleeper else 0}"

    async def trip(self, renew: bool, sleeper: bool) -> list[Any]:
        """A check's one round trip (:meth:`commands`): its replies, the rings as (member, score)
        pairs. One server: on the kept connection of the bell waits, packed once per shape (a
        redis-py pipeline cost the client about twice the round trip: 135 against 70 us
        measured); a cluster client routes a pipeline. Raises the first error reply (after
        reading them all) and the client's errors."""
        if self.kept is None:
            replies = await self._pipelined(renew, sleeper)
        else:
            replies = await self.kept.exchange(self.shape(renew, sleeper), lambda: self.commands(renew, sleeper),
                                               self.replies(renew, sleeper))
            for r in replies:
                if isinstance(r, ResponseError):
                    raise r
        return self._parsed(replies, renew, sleeper)

    async def _pipelined(self, renew: bool, sleeper: bool) -> list[Any]:
        """:meth:`commands` as a redis-py pipeline (a cluster client routes it: every key carries
        the hash tag ``{NS}``, so it goes to one node)."""
        return await pipelined(self.redis, self.commands(renew, sleeper))

    def _parsed(self, replies: list[Any], renew: bool, sleeper: bool) -> list[Any]:
        """The role's replies and the rings as pairs, then the watch's replies as they are."""
        n = 1 + renew
        k = n + (len(self.bells) if sleeper else 0)
        return replies[:n] + [_pairs(r) for r in replies[n:k]] + replies[k:]

    async def took(self, replies: Sequence[Any], renew: bool, sleeper: bool, now: float) -> None:
        """Take a check's parsed replies (:meth:`trip`'s, or those that rode on a sleeper's wait):
        whether this worker holds the role, until when that holds, whether it helps."""
        before, *rest = replies
        watch = rest[len(rest) - (self._watch_replies() if sleeper else 0):]
        rest = rest[:len(rest) - len(watch)]
        oldest = rest[1:] if renew else rest
        held = before is None
        if before == self.id:
            # renewed along; or, not the listener at its last check (a hand-off whose DEL did not go
            # through), renewed now: False if it expired between the two
            held = rest[0] if renew else await self.redis.pexpire(self.listener_key, LISTEN_TTL_MS)
        self.listening = bool(held)
        if watch:
            # free (taken now) or ours (renewed along, or within its expiry: renewed next time)
            self.watching = watch[0] is None or as_bytes(watch[0]) == self.id
        if held and self.watching:
            await self.give_watch_up()
        if sleeper and not held:
            # Kept for a whole wait. A sleeper without the watch keeps it as long as its waits
            # last: only the watcher needs to look every BELL_WAIT, and on a cluster each check is
            # a round trip of its own, which bursts a second apart made every other second.
            keep = self.wait_s if self.watching or not self.watches else self.sleep_check_s
            self.checked_until = now + max(keep, LISTEN_CHECK_S)
        else:
            self.checked_until = now + LISTEN_CHECK_S
        if not held and _stale(oldest, time.time() * 1000 - STALE_RING_MS):
            # Rings wait that nobody takes: the listener died or stalls, and its role would keep
            # them waiting until it expires (LISTEN_TTL_MS). Help: wait on the bells now.
            self.helping_until = now + HELP_S

    async def ridden(self, replies: list[Any]) -> None:
        """Take the replies of the sleeper's check that rode on its wait (:meth:`commands` with
        ``sleeper``, checked when the wait ended). An error reply leaves the role to a check of
        its own before the next wait, which raises it (a refused key: :meth:`refused`)."""
        error = next((r for r in replies if isinstance(r, ResponseError)), None)
        if isinstance(error, NoPermissionError):
            self.refused(error)
        elif error is not None:
            log.debug("doorbell: the role check behind the wait failed: %s", error)
            self.checked_until = 0.0
        else:
            await self.took(self._parsed(replies, False, True), False, True, time.monotonic())

    async def give_watch_up(self) -> None:
        """Give the watch up (this worker became the listener): another sleeper takes it at its
        next check, instead of after the watch's expiry. Raises the client's errors."""
        self.watching = False
        if await self.redis.get(self.watch_key) == self.id:
            await self.redis.delete(self.watch_key)  # one that takes it between the two loses it till its next check

    async def hand_off(self) -> None:
        """Give the listener role up and wake one of the workers waiting for it. Raises the
        client's errors."""
        if not (self.one_listener and self.listening):
            return
        self.listening, self.checked_until = False, 0.0
        r = self.redis
        if await r.get(self.listener_key) == self.id:
            await r.delete(self.listener_key)  # a worker that takes it between the two loses it: harmless
        now = time.time() * 1000
        pipe = r.pipeline(transaction=False)
        pipe.zadd(self.wake_key, {"w": now})  # wakes one sleeper, to take the role
        pipe.pexpire(self.wake_key, WAKE_TTL_MS)  # gone if nobody sleeps to take it
        await pipe.execute()


async def pipelined(redis: Any, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """``commands`` in one redis-py pipeline (a cluster client routes it), for a client the kept
    connection does not serve: their replies as redis-py parses them, ``SET ... GET`` as the old
    value (as ``set(get=True)``), ``PEXPIRE`` a bool, ``ZRANGE ... WITHSCORES`` as the server sent
    it (flat in RESP2, pairs in RESP3: :func:`_pairs` reads both). Raises the first error reply."""
    pipe = redis.pipeline(transaction=False)
    for cmd in commands:
        pipe.execute_command(*cmd, **({"get": True} if cmd[0] == "SET" else {}))
    return list(await pipe.execute())


def as_bytes(v: Any) -> bytes:
    """A reply's member as bytes (RESP3 or a decoding client may hand back str or numbers)."""
    return v if isinstance(v, bytes) else str(v).encode()


def _pairs(reply: Any) -> list[tuple[bytes, float]]:
    """A ``ZRANGE ... WITHSCORES`` reply as (member, score) pairs: raw, flat in RESP2 and pairs in
    RESP3; or pairs already (redis-py's parsed reply)."""
    if reply and isinstance(reply[0], list | tuple):
        return [(as_bytes(m), float(sc)) for m, sc in reply]
    return [(as_bytes(reply[i]), float(reply[i + 1])) for i in range(0, len(reply), 2)]


def _stale(oldest: Sequence[Any], before_ms: float) -> bool:
    """Whether any bell's oldest ring ((member, score) pairs) was rung before ``before_ms``."""
    return any(reply and float(reply[0][1]) < before_ms for reply in oldest)
