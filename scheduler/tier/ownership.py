"""Partition ownership through etcd leases.

Each replica holds one etcd lease and registers ``/zsched/NS/members/ID`` bound to it. Partition
``p`` is owned by whoever holds ``/zsched/NS/owners/p`` (created only if absent, bound to the
owner's lease). The key's create revision is the partition's **epoch**: the scheduler scripts carry
it and Redis refuses an older one, so a replica frozen past its lease cannot act on a partition
that moved.

Replicas aim for ceil(P / live members) partitions each: a replica above its share releases the
surplus (stopping its runner first), one below it claims orphans. Every change is seen through an
etcd watch, so a dead replica's partitions are taken as soon as etcd expires its lease.

Safety does not depend on etcd being reachable: each replica keeps a local deadline (last
confirmed keepalive + TTL - margin) and stops ticking at it even if it never hears from etcd again.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import time
import zlib
from collections.abc import Awaitable, Callable

from ..coord import CoordinationError, Coordinator, LeaseLost, WatchCompacted
from ..metrics import SchedulerMetrics

log = logging.getLogger("zsched.ownership")
REVOKE_ON_SHUTDOWN_S = 1.5
"""How long a planned exit waits for etcd to revoke the lease before leaving it to expire."""
RECONCILE_EVERY_S = 5.0
"""The safety net of the ownership reconcile. Every change it acts on arrives as an event: the
prefix's watch (members joining or leaving, owner keys created or deleted, leases expiring), a
lease confirmed again after it lapsed, a runner refused its epoch, a failed reconcile retried.
Until 2026-12-04 it also ran every second, an etcd range read per replica per second for nothing."""


def default_replica_id() -> str:
    """``host-pid-random``: unique per process, and says where to look."""
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(2).hex()}"


class Ownership:
    """Keeps this replica's share of partitions and tells the process when to start/stop them."""

    def __init__(self, coord: Coordinator, *, namespace: str, partitions: int, replica_id: str,
                 ttl: float, metrics: SchedulerMetrics,
                 on_acquire: Callable[[int, int], Awaitable[None]],
                 on_release: Callable[[int], Awaitable[None]],
                 margin: float | None = None, ignore_deadline: bool = False) -> None:
        """``on_acquire(partition, epoch)`` / ``on_release(partition)`` start and stop a partition's
        runner. ``margin``: how long before the lease could expire this replica stops acting (default
        20% of ``ttl``, at least 0.5 s). ``ignore_deadline`` switches that local deadline off, leaving
        the epoch fence as the only protection: a test knob, never for production."""
        if not ttl >= 1:  # nan too
            raise ValueError(f"lease TTL must be >= 1 second (etcd's granularity), got {ttl}")
        self.coord = coord
        self.partitions = partitions
        self.replica_id = replica_id
        self.ttl = ttl
        # the safety margin covers clock drift between here and etcd and one slow keepalive
        self.margin = margin if margin is not None else max(0.5, ttl * 0.2)
        self.m = metrics
        self.on_acquire = on_acquire
        self.on_release = on_release
        self.ignore_deadline = ignore_deadline
        self.prefix = f"/zsched/{namespace}/"
        self.lease_id: int | None = None
        self.valid_until = 0.0
        self.owned: dict[int, int] = {}  # partition -> epoch
        self._reconcile = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False
        self._lock = asyncio.Lock()
        self._etcd_down_since: float | None = None
        self._offset = zlib.crc32(replica_id.encode()) % max(1, partitions)

    # -- public ------------------------------------------------------------------------------
    def member_key(self) -> str:
        """etcd key that says this replica is alive (bound to its lease)."""
        return f"{self.prefix}members/{self.replica_id}"

    def owner_key(self, p: int) -> str:
        """etcd key whose holder owns partition ``p``; its create revision is the epoch."""
        return f"{self.prefix}owners/{p}"

    def is_valid(self) -> bool:
        """Whether the lease is confirmed for long enough that this replica may act now."""
        return self.ignore_deadline or time.monotonic() < self.valid_until

    def valid_for(self) -> float:
        """Seconds until the local ownership deadline."""
        if self.ignore_deadline:
            return 3600.0
        return self.valid_until - time.monotonic()

    def owns(self, p: int, epoch: int) -> bool:
        """Whether this replica may act for ``p`` with ``epoch`` now."""
        return self.owned.get(p) == epoch and self.is_valid()

    async def start(self) -> None:
        """Register with etcd (retrying until it answers), then keep the lease and the share."""
        await self._register()
        self._tasks = [asyncio.create_task(self._keepalive_loop(), name="etcd-keepalive"),
                       asyncio.create_task(self._watch_loop(), name="etcd-watch"),
                       asyncio.create_task(self._reconcile_loop(), name="ownership-reconcile")]
        self._reconcile.set()

    async def still_owner(self, p: int, epoch: int, *, timeout: float = 2.0) -> bool | None:
        """Whether etcd still names this replica as ``p``'s owner with exactly ``epoch`` (the key's
        create revision): asked when Redis refused that epoch, to tell an epoch conflict (True:
        Redis has seen an epoch etcd never handed out since, i.e. etcd's history was restored or
        replaced) from a hand-over (False: the key is gone, another replica's, or re-created).
        None when etcd did not answer in time (the caller treats that like a hand-over: etcd then
        decides through the normal reconcile, which does nothing while etcd is unreachable)."""
        if self.owned.get(p) != epoch:
            return False  # already dropped locally: a hand-over in progress
        try:
            kv = await self.coord.get(self.owner_key(p), timeout=timeout)
        except CoordinationError as exc:
            log.warning("partition %d: cannot ask etcd whether epoch %d is still ours (%s)", p, epoch, exc)
            return None
        return kv is not None and kv.value == self.replica_id.encode() and kv.create_revision == epoch

    async def partition_refused(self, p: int, current_epoch: int) -> None:
        """A runner saw its epoch refused: forget the partition; etcd says who owns it now."""
        if p in self.owned:
            del self.owned[p]
            self.m.ownership_changes.labels(self.replica_id, "lost").inc()
            self.m.partitions_owned.labels(self.replica_id).set(len(self.owned))
        self._reconcile.set()

    async def shutdown(self) -> None:
        """Planned exit: stop every runner, then revoke the lease so etcd deletes our member and
        owner keys at once and the survivors take over within a round trip."""
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
        async with self._lock:
            for p in list(self.owned):
                await self._drop(p, "released")
        if self.lease_id is not None:
            try:
                # bounded: with etcd gone (killed, frozen, partitioned) a SIGTERM must still end the
                # process promptly; the lease then expires by itself
                await self.coord.revoke(self.lease_id, timeout=REVOKE_ON_SHUTDOWN_S)
                log.info("released all partitions (lease revoked)")
            except CoordinationError as exc:
                log.warning("could not revoke the etcd lease on shutdown within %gs (%s); not waiting longer: "
                            "it expires by itself within its TTL (%gs), then other replicas take the partitions",
                            REVOKE_ON_SHUTDOWN_S, exc, self.ttl)

    # -- internals ---------------------------------------------------------------------------
    async def _register(self) -> None:
        while True:
            try:
                t_sent = time.monotonic()
                self.lease_id = await self.coord.grant(self.ttl)
                self.valid_until = t_sent + self.ttl - self.margin
                info = {"id": self.replica_id, "host": socket.gethostname(), "pid": os.getpid(),
                        "started": time.time()}
                await self.coord.put(self.member_key(), json.dumps(info).encode(), lease=self.lease_id)
                log.info("registered as %s (lease %x, ttl %.1fs)", self.replica_id, self.lease_id, self.ttl)
                return
            except CoordinationError as exc:
                log.error("cannot register with etcd (%s); retrying in 1s", exc)
                if self._stopping:
                    raise
                await asyncio.sleep(1.0)

    async def _keepalive_loop(self) -> None:
        interval = self.ttl / 3.0
        while not self._stopping:
            await asyncio.sleep(interval if self._etcd_down_since is None else min(interval, 0.25))
            assert self.lease_id is not None
            t_sent = time.monotonic()
            try:
                granted = await self.coord.keepalive_once(self.lease_id, timeout=max(0.5, interval))
            except LeaseLost:
                self.m.leases_lost.labels(self.replica_id).inc()
                log.error("etcd lease %x expired: dropping all partitions and registering again", self.lease_id)
                async with self._lock:
                    for p in list(self.owned):
                        await self._drop(p, "lost")
                    await self._register()
                self._etcd_down_since = None
                self._reconcile.set()
                continue
            except CoordinationError as exc:
                self.m.lease_refresh_failures.labels(self.replica_id).inc()
                if self._etcd_down_since is None:
                    self._etcd_down_since = t_sent
                    log.error("etcd keepalive failed (%s); owned partitions keep ticking until %.1fs from now, "
                              "then stop until etcd answers", exc, max(0.0, self.valid_until - time.monotonic()))
                continue
            lapsed = not self.is_valid()  # e.g. the process was frozen past its deadline: no failure seen
            self.valid_until = t_sent + granted - self.margin
            if lapsed:
                self._reconcile.set()  # a reconcile while the lease was not valid did nothing
            if self._etcd_down_since is not None:
                log.info("etcd reachable again after %.1fs; lease refreshed", time.monotonic() - self._etcd_down_since)
                self._etcd_down_since = None
                self._reconcile.set()

    async def _watch_loop(self) -> None:
        while not self._stopping:
            try:
                _, rev = await self.coord.get_prefix(self.prefix)
                self._reconcile.set()
                async for _ev in self.coord.watch_prefix(self.prefix, rev + 1):
                    self._reconcile.set()
            except WatchCompacted:
                continue
            except asyncio.CancelledError:
                raise
            except CoordinationError as exc:
                log.warning("etcd watch failed (%s); retrying", exc)
                await asyncio.sleep(0.5)

    async def _reconcile_loop(self) -> None:
        while not self._stopping:
            try:
                async with asyncio.timeout(RECONCILE_EVERY_S):  # no task per wait, unlike wait_for
                    await self._reconcile.wait()
            except TimeoutError:
                pass
            self._reconcile.clear()
            if not self.is_valid():
                continue  # cannot claim anything without a confirmed lease
            try:
                async with self._lock:
                    await self._reconcile_once()
            except CoordinationError as exc:
                log.warning("ownership reconcile failed (%s); retrying", exc)
                await asyncio.sleep(0.2)
                self._reconcile.set()

    async def _reconcile_once(self) -> None:
        kvs, _ = await self.coord.get_prefix(self.prefix)
        members: set[str] = set()
        owners: dict[int, tuple[str, int]] = {}
        for kv in kvs:
            rest = kv.key[len(self.prefix):]
            if rest.startswith("members/"):
                members.add(rest[len("members/"):])
            elif rest.startswith("owners/"):
                try:
                    owners[int(rest[len("owners/"):])] = (kv.value.decode(), kv.create_revision)
                except ValueError:
                    continue
        if self.replica_id not in members:
            # our member key is gone (lease trouble); the keepalive loop re-registers
            return
        # partitions we run but etcd no longer gives us (lease expired and someone else claimed)
        for p, epoch in list(self.owned.items()):
            who = owners.get(p)
            if who is None or who[0] != self.replica_id or who[1] != epoch:
                log.warning("partition %d: no longer ours in etcd (owner %s); stopping it", p, who)
                await self._drop(p, "lost")
        share = math.ceil(self.partitions / len(members))
        mine = sorted(p for p, (r, _) in owners.items() if r == self.replica_id)
        for p in mine:
            if p not in self.owned:  # ours in etcd but not running (e.g. after a restart race)
                await self._adopt(p, owners[p][1])
        if len(mine) > share:
            # hand over the surplus: stop ticking first, then delete the key so another takes it
            for p in mine[share:]:
                epoch = self.owned.get(p, owners[p][1])
                await self._drop(p, "released")
                await self.coord.delete_if(self.owner_key(p), epoch)
                log.info("partition %d: handed over (share is %d of %d with %d replicas)", p, share,
                         self.partitions, len(members))
        elif len(mine) < share and self.lease_id is not None:
            orphans = [p for p in range(self.partitions) if p not in owners]
            orphans.sort(key=lambda p: (p - self._offset) % self.partitions)
            for p in orphans[: share - len(mine)]:
                claim = await self.coord.claim_if_absent(self.owner_key(p), self.replica_id.encode(), self.lease_id)
                if claim is not None:
                    await self._adopt(p, claim.create_revision)

    async def _adopt(self, p: int, epoch: int) -> None:
        self.owned[p] = epoch
        self.m.ownership_changes.labels(self.replica_id, "acquired").inc()
        self.m.partitions_owned.labels(self.replica_id).set(len(self.owned))
        log.info("partition %d: acquired (epoch %d)", p, epoch)
        await self.on_acquire(p, epoch)

    async def _drop(self, p: int, why: str) -> None:
        if self.owned.pop(p, None) is not None:  # count once, even if a refusal dropped it meanwhile
            self.m.ownership_changes.labels(self.replica_id, why).inc()
        self.m.partitions_owned.labels(self.replica_id).set(len(self.owned))
        await self.on_release(p)
