"""``zsched migrate-partitions``: move a namespace to a new partition count.

A job's partition is ``h % count`` for the placement hash h in its id (scheduler/protocol/ids.py),
so under a new count every job, idempotency key and cron has one known new home, and ids keep
working. The move, in the order a re-run resumes from:

1. **Fence.** ``{ns}:cfg`` records ``migrate_from``/``migrate_to``; every partition's meta gets
   ``layout = '-'``. From then on Redis refuses every script behind the fence (tick, reap, claim,
   schedule, cron and admin calls): the scheduler tier pauses, workers stop claiming, producers get
   :class:`~scheduler.protocol.errors.LayoutChanged` (``migrating``). Running jobs may still be
   acked, failed or extended: those scripts are outside the fence.
2. **Move.** Rounds of ``migrate_out`` on every partition (bounded work each: jobs that belong
   elsewhere go to the partition's outbox) and ``migrate_in`` on their new partitions, all
   pipelined. The next ``migrate_out`` of a partition forgets what was delivered; an outbox that
   still holds entries (a crash, a lost reply) is delivered again, and ``migrate_in`` skips what
   it already has, so nothing is lost or doubled however often this is interrupted and re-run.
3. **Running jobs.** Jobs running when the fence went up finish where they are; what they leave
   (a retry, a summary) is moved by another pass. Leases that expire (a dead worker) are reaped
   here, since the tier is fenced out. Waits up to ``wait_running`` seconds.
4. **Open.** ``partitions`` becomes the new count, every partition's meta ``layout`` the new count
   (so a process still on the old count is refused instead of looking in the wrong place), and the
   keys of partitions beyond a smaller count are removed.

Only the tier pauses (firing is late by the migration's length; per-job misfire policies apply);
restart the scheduler replicas and workers afterwards so they use the new count. Producers follow
by themselves.
"""
from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import LockError
from redis.lock import Lock

from ..client import Client
from ..protocol import control
from ..protocol.calls import Calls
from ..protocol.control import parse_paused
from ..protocol.keys import PARTITION_KEYS, Keyspace, validate_partitions
from ..protocol.tick import reap_call
from .admin import AdminError, BadInput, NotFound

BATCH = 2000          # entries one migrate_out call moves (bounded time per script: a few ms)
DELIVER_CHUNK = 500   # entries per migrate_in call
REAP_LIMIT = 1000
LOCK_TTL = 60.0       # seconds the run's lock lives without a renewal (renewed every round)


class NotFinished(AdminError):
    """The migration stopped before the end (running jobs did not finish in time); re-run it."""


@dataclass
class Report:
    """What a run did."""

    namespace: str
    old: int
    new: int
    resumed: bool = False
    moved: int = 0
    skipped: int = 0      # entries delivered again after an interruption, already in place
    rounds: int = 0
    reaped: int = 0
    seconds: float = 0.0
    by_target: dict[int, int] = field(default_factory=dict)


def read_state(client: Client) -> tuple[int, int | None, int | None]:
    """(stored partition count, migrate_from, migrate_to) of the client's namespace."""
    cfg = client.keyspace.config_key
    stored, src, dst = client.redis.hmget(cfg, ["partitions", "migrate_from", "migrate_to"])
    if stored is None:
        raise NotFound(f"namespace {client.keyspace.namespace!r} does not exist (no {cfg})")
    return int(stored), (int(src) if src is not None else None), (int(dst) if dst is not None else None)


class Migration:
    """One run of ``zsched migrate-partitions`` (see the module docstring)."""

    def __init__(self, client: Client, to: int, *, batch: int = BATCH, wait_running: float = 600.0,
                 progress: Callable[[str], None] | None = None, takeover: bool = False) -> None:
        """``takeover``: take the namespace's migration lock from a run that died (it expires by
        itself LOCK_TTL seconds after its holder's last round)."""
        try:
            self.to = validate_partitions(to)
        except ValueError as exc:
            raise BadInput(f"--to: {exc}") from None
        self.client = client
        self.batch = batch
        self.wait_running = wait_running
        self.progress = progress or (lambda line: None)
        self._lock: Lock | None = None
        self.takeover = takeover

    # -- phases -------------------------------------------------------------------------------
    def run(self) -> Report:
        """Run (or resume) the migration; see the module docstring. One run at a time per
        namespace: a redis-py lock (``{ns}:migrate-lock``, renewed every round) refuses a second
        one, which would deliver the same outbox twice."""
        lock = self.client.redis.lock("{%s}:migrate-lock" % self.client.keyspace.namespace,
                                      timeout=LOCK_TTL, blocking=False)
        if not lock.acquire():
            if not self.takeover:
                raise BadInput(f"another zsched migrate-partitions is running on namespace "
                               f"{self.client.keyspace.namespace!r}, or one died less than {LOCK_TTL:g} s ago; "
                               "wait for it (then run this again), or pass --takeover if that run is dead "
                               "(killed, its host lost)")
            self.client.redis.delete(lock.name)  # the operator says the holder is dead
            if not lock.acquire():
                raise BadInput("could not take over the migration lock: another run took it just now")
        self._lock = lock
        try:
            return self._run()
        finally:
            try:
                lock.release()
            except LockError:  # expired meanwhile: nothing to release
                pass

    def _renew(self) -> None:
        """Keep the run's lock; raise NotFinished if another run took it over meanwhile."""
        if self._lock is None:
            return
        try:
            self._lock.reacquire()
        except LockError:
            raise NotFinished("this run lost its lock on the namespace (stalled for more than "
                              f"{LOCK_TTL:g} s?) and stopped; run the same command again") from None

    def _run(self) -> Report:
        t0 = time.monotonic()
        client = self.client
        ns = client.keyspace.namespace
        stored, src, dst = read_state(client)
        if dst is not None:
            if dst != self.to:
                raise BadInput(f"namespace {ns!r} is in the middle of a migration from {src} to {dst} partitions; "
                               f"finish that one first: zsched migrate-partitions --namespace {ns} --to {dst}")
            old, resumed = int(src or stored), True
        elif stored == self.to:
            return Report(ns, stored, self.to, seconds=time.monotonic() - t0)
        else:
            old, resumed = stored, False
        report = Report(ns, old, self.to, resumed=resumed)
        top = max(old, self.to)
        ks = Keyspace(ns, top, sharded=client.keyspace.sharded)
        calls = Calls(ks, max_payload_bytes=client.calls.max_payload, tombstone_ttl=client.calls.tomb_ms / 1000,
                      declare_all_keys=client.calls.declare_all_keys)
        self._fence(ks, old)
        self.progress(f"namespace {ns}: {'resuming the ' if resumed else ''}move from {old} to {self.to} partitions; "
                      "the scheduler tier, workers' claims and producers are paused until it finishes")
        if resumed:  # what ran since the interrupted run may have left jobs behind its walk
            self._reset_walks(ks, range(top))
        floor = self._cronseq_floor(ks)
        running = set(self._running(ks))  # no job starts behind the fence: only these can leave jobs behind
        self._move(calls, set(range(top)), floor, report)
        if running:
            self._wait_running(calls, ks, report)
            self._reset_walks(ks, running)
            self._move(calls, running, floor, report)
        self._open(ks, old)
        report.seconds = time.monotonic() - t0
        return report

    def _fence(self, ks: Keyspace, old: int) -> None:
        r = self.client.redis
        cfg = ks.config_key
        if r.hsetnx(cfg, "migrate_to", self.to):
            r.hset(cfg, mapping={"migrate_from": old, "migrate_started": f"{time.time():.3f}"})
        pipe = r.pipeline(transaction=False)
        for p in range(ks.partitions):
            pipe.hset(ks.key(p, "meta"), "layout", "-")
        pipe.execute()

    def _cronseq_floor(self, ks: Keyspace) -> int:
        pipe = self.client.redis.pipeline(transaction=False)
        for p in range(ks.partitions):
            pipe.hget(ks.key(p, "meta"), "cronseq")
        return max((int(v) for v in pipe.execute() if v is not None), default=0)

    def _move(self, calls: Calls, pending: set[int], floor: int, report: Report) -> None:
        """Rounds of migrate_out / migrate_in until every partition in ``pending`` is walked and
        its outbox delivered."""
        transport = self.client.transport
        delivered: dict[int, list[bytes]] = {}
        last_line = time.monotonic()
        while pending:
            self._renew()
            order = sorted(pending)
            replies = transport.call_many([control.migrate_out_call(calls, p, self.to, self.batch, delivered.get(p, ()))
                                           for p in order])
            delivered = {}
            # per target, entries a first time (no lookups needed) and entries delivered before
            inbox: dict[tuple[int, int], list[Any]] = defaultdict(list)
            for p, reply in zip(order, replies):
                done, again, rest = int(reply[0]), int(reply[1]), reply[2:]
                if done and not rest:
                    pending.discard(p)
                for i in range(0, len(rest), 3):
                    f, target, entry = rest[i], int(rest[i + 1]), rest[i + 2]
                    inbox[target, again] += [f, entry]
                    delivered.setdefault(p, []).append(f)
            plan = [(q, control.migrate_in_call(calls, q, floor, again, items[s:s + 2 * DELIVER_CHUNK]))
                    for (q, again), items in inbox.items() for s in range(0, len(items), 2 * DELIVER_CHUNK)]
            replies = transport.call_many([call for _, call in plan]) if plan else []
            for (q, _call), (taken, skipped) in zip(plan, replies):
                report.moved += int(taken)
                report.skipped += int(skipped)
                report.by_target[q] = report.by_target.get(q, 0) + int(taken)
            report.rounds += 1
            if time.monotonic() - last_line >= 2.0:
                last_line = time.monotonic()
                self.progress(f"moved {report.moved} so far; {len(pending)} partition(s) still being walked")

    def _running(self, ks: Keyspace) -> dict[int, int]:
        pipe = self.client.redis.pipeline(transaction=False)
        for p in range(ks.partitions):
            pipe.zcard(ks.key(p, "i"))
        return {p: int(n) for p, n in enumerate(pipe.execute()) if int(n)}

    def _wait_running(self, calls: Calls, ks: Keyspace, report: Report) -> None:
        """Wait until no job runs (reaping expired leases: the tier is fenced out)."""
        busy = self._running(ks)
        if busy:
            self.progress(f"{sum(busy.values())} job(s) still running in partition(s) {sorted(busy)}: waiting for "
                          f"them to finish (up to {self.wait_running:g} s; expired leases are reaped)")
        deadline = time.monotonic() + self.wait_running
        while busy:
            self._renew()
            reaps = [reap_call(calls, p, 0, REAP_LIMIT, past_the_layout_fence=True) for p in busy]
            report.reaped += sum(int(r[0]) for r in self.client.transport.call_many(reaps) if int(r[0]) > 0)
            busy = self._running(ks)
            if not busy:
                break
            if time.monotonic() >= deadline:
                raise NotFinished(
                    f"{sum(busy.values())} job(s) still running in partition(s) {sorted(busy)} after "
                    f"{self.wait_running:g} s; the namespace stays paused. Let the workers finish them (or their "
                    f"leases expire), then run the same command again to finish the migration")
            time.sleep(0.2)

    def _reset_walks(self, ks: Keyspace, parts: Iterable[int]) -> None:
        pipe = self.client.redis.pipeline(transaction=False)
        for p in parts:
            pipe.hdel(ks.key(p, "meta"), "mstage", "mcur")
        pipe.execute()

    def _open(self, ks: Keyspace, old: int) -> None:
        r = self.client.redis
        paused = parse_paused(r.hgetall(ks.config_key))  # queue pauses hold in every new partition too
        pipe = r.pipeline(transaction=False)
        for p in range(ks.partitions):
            meta = ks.key(p, "meta")
            pipe.delete(ks.key(p, "paused"))
            if paused and p < self.to:
                pipe.hset(ks.key(p, "paused"), mapping={q: str(ms) for q, ms in paused.items()})
            pipe.hset(meta, "layout", self.to)
            pipe.hdel(meta, "mstage", "mcur")
            pipe.delete(ks.key(p, "mo"))
            if p >= self.to:  # a partition the new count does not have: only its meta (the fence) stays
                gone = [k for k, s in zip(ks.partition_keys(p), PARTITION_KEYS) if s != "meta"]
                for key in gone + [ks.key(p, "crons"), ks.key(p, "qfree")]:
                    pipe.delete(key)  # one key per DEL: a cluster pipeline routes each command by its key
        pipe.execute()
        cfg = ks.config_key
        r.hset(cfg, "partitions", self.to)
        r.hdel(cfg, "migrate_from", "migrate_to", "migrate_started")
