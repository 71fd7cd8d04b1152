"""The scheduler tier's work, done in-process by a test stack: :class:`TierPass`.

A scheduler replica owns partitions and, for each, calls ``tick`` (fire due timers, schedule each
fired cron's next occurrence), ``reap`` (expired leases) and, when a tick says a cron's table of
occurrences runs low, ``cron_fill`` with occurrences computed in Python
(:func:`scheduler.tier.crons.plan_occurrences`). Before a tick it takes the rate-limited queues'
tokens from their buckets (``ratelimit``) and passes them, with the namespace's dead-letter
retention and queue retirement settings, as the tier does (:mod:`scheduler.tier.limits`).
:class:`TierPass` sends the same calls, built by the same functions, for every partition at once,
with epoch 0 (unfenced) and no hand-off lead (a job is handed to a worker at its due time, not
before). Where the tier would sleep until a rate-limited queue has a token again, the pass reports
that time as its next event, so ``advance`` stops there.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..client import Client, parse_dead_retention, parse_queue_idle, parse_rate_limits
from ..protocol.call import Call
from ..protocol.tick import (
    CRON_FIELDS,
    EpochRefused,
    Retention,
    cron_fill_call,
    cron_key,
    parse_cron_fill,
    parse_cron_table,
    parse_reap,
    parse_tick,
    reap_call,
    tick_call,
)
from ..tier.crons import plan_occurrences
from ..tier.limits import TokenLedger, retention_args

__all__ = ["Fired", "TierPass"]

BATCH = 1000  # timers per tick call, leases per reap call (the tier's defaults are of this order)


@dataclass(slots=True)
class Fired:
    """What one :meth:`TierPass.fire` did: timers fired (moved to ready, or misfired / held),
    leases reaped, dead jobs dropped by the retention rule, crons refilled, and the earliest next
    event (a timer, a lease deadline or the next token of a rate-limited queue holding jobs, epoch
    ms by the Redis clock), None when nothing is scheduled, held or running."""

    moved: int = 0
    reaped: int = 0
    dropped_dead: int = 0
    refilled: list[str] = field(default_factory=list)
    next_event_ms: int | None = None


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


class TierPass:
    """Ticks, reaps and refills crons of every partition of ``client``'s namespace, as the
    partitions' owners would. ``now_ms()``: the clock cron occurrences are planned from (the
    Redis clock the scripts see)."""

    def __init__(self, client: Client, now_ms: Callable[[], int], fake_clock: bool = False) -> None:
        self.client = client
        self.now_ms = now_ms
        self.fake_clock = fake_clock
        self.reaped_at: int | None = None  # fake clock: the time of the last reap (None: none yet)
        self._next: int | None = None  # the earliest next event seen by the current fire()
        self.ledgers = [TokenLedger(client.calls.ks, p) for p in range(client.calls.ks.partitions)]
        """Each partition's rate-limit bookkeeping (held jobs, unused tokens), as its owner keeps it."""

    def _check(self, reply: object, what: str) -> None:
        if isinstance(reply, EpochRefused):  # only an operator's epoch_reset or a live tier does this
            raise AssertionError(f"{what}: Redis refused epoch 0 (it has seen {reply.newest_epoch}): a scheduler "
                                 "replica owns this namespace; a test stack must have its namespace to itself")

    def _rounds(self, partitions: list[int], call: Callable[[int], Call],
                take: Callable[[int, Any], tuple[int, int | None]]) -> None:
        """Send ``call(p)`` for each of ``partitions`` in one round trip; ``take(p, reply)`` reads a
        reply into (how many it handled, the next event it reports); a partition that handled a
        full :data:`BATCH` is called again, the others' next events are kept."""
        while partitions:
            replies = self.client.transport.call_many([call(p) for p in partitions])
            again = []
            for p, reply in zip(partitions, replies):
                handled, nxt = take(p, reply)
                if handled >= BATCH:
                    again.append(p)
                else:
                    self._next = _earliest(self._next, nxt)
            partitions = again

    def settings(self) -> tuple[dict[str, tuple[float, float]], Retention]:
        """The namespace's rate limits and tick's retention arguments, read from its config as the
        tier reads them (``Client.set_rate_limit``, ``set_dead_retention``, ``set_queue_retirement``)."""
        cfg = self.client.redis.hgetall(self.client.calls.ks.config_key)
        dead = parse_dead_retention(cfg)
        return parse_rate_limits(cfg), retention_args(*dead, parse_queue_idle(cfg), self.client.calls.ks.partitions)

    def _tokens(self, parts: list[int], limits: dict[str, tuple[float, float]]) -> list[tuple[dict[str, int], float]]:
        """Each partition's grants and token wait (:meth:`TokenLedger.grants`), asked in one round trip."""
        asks = [self.ledgers[p].requests(limits) if limits or self.ledgers[p].held else ([], [])
                for p in parts]
        flat = [c for _, cs in asks for c in cs]
        replies = self.client.transport.call_many(flat) if flat else []
        out = []
        for p, (want, cs) in zip(parts, asks):
            out.append(self.ledgers[p].grants(want, replies[:len(cs)]) if want else ({}, float("inf")))
            replies = replies[len(cs):]
        return out

    def _ticks(self, parts: list[int], out: Fired, crons: dict[int, set[str]]) -> None:
        """Tick ``parts`` until nothing more is due now: a partition goes again after a full batch,
        and while a rate-limited queue holds jobs there and the bucket has tokens (or was not asked
        yet); otherwise its next event is its next timer, or the next token of a holding queue."""
        limits, retention = self.settings()
        calls = self.client.calls
        while parts:
            grants = self._tokens(parts, limits)
            replies = self.client.transport.call_many(
                [tick_call(calls, p, 0, BATCH, TokenLedger.tick_tokens(limits, g), retention)
                 for p, (g, _) in zip(parts, grants)])
            again = []
            for p, (g, wait), reply in zip(parts, grants, replies):
                tick = parse_tick(reply)
                self._check(tick, f"tick of partition {p}")
                assert not isinstance(tick, EpochRefused)
                out.moved += tick.moved
                out.dropped_dead += len(tick.dropped_dead)
                if tick.crons_to_refill:
                    crons.setdefault(p, set()).update(tick.crons_to_refill)
                ledger = self.ledgers[p]
                holding = [q for q, n in ledger.held.items() if n > 0] if ledger.account(tick.queues, g) else []
                # again: a full batch, or a holding queue whose bucket was not asked yet or granted tokens
                if tick.moved >= BATCH or any(g.get(q, 1) > 0 for q in holding):
                    again.append(p)
                    continue
                self._next = _earliest(self._next, tick.next_due_ms)
                if holding and wait != float("inf"):
                    self._next = _earliest(self._next, tick.now_ms + round(wait * 1000))
            parts = again

    def fire(self, *, always_reap: bool = True) -> Fired:
        """Tick every partition until nothing more is due now, reap every expired lease, refill
        the crons the ticks asked for; one pipelined round per repetition. ``always_reap=False``:
        on a fake clock, skip the reap when the clock has not moved since the last one (then
        ``next_event_ms`` does not include lease deadlines)."""
        calls = self.client.calls
        out = Fired()
        crons: dict[int, set[str]] = {}
        self._next = None

        def reaped(p: int, reply: Any) -> tuple[int, int | None]:
            reap = parse_reap(reply)
            self._check(reap, f"reap of partition {p}")
            assert not isinstance(reap, EpochRefused)
            out.reaped += reap.reaped
            return reap.reaped, reap.next_deadline_ms

        parts = list(range(calls.ks.partitions))
        self._ticks(parts, out, crons)
        # A lease expires only when the clock passes its deadline, and every lease taken since the last reap
        # ends after it: on a fake clock that has not moved since, there is nothing to reap.
        now = self.now_ms() if self.fake_clock else None
        if always_reap or now is None or now != self.reaped_at:
            self._rounds(parts, lambda p: reap_call(calls, p, 0, BATCH), reaped)
        self.reaped_at = now
        out.next_event_ms = self._next
        for p, names in sorted(crons.items()):
            out.refilled += self.refill_crons(p, sorted(names))
        return out

    def anything_due(self) -> bool:
        """Whether a timer of any partition is due now, or a rate-limited queue holds jobs (a read,
        no script): on a fake clock that has not moved, a tick that would fire nothing can be
        skipped. Always True on a real Redis, whose clock moves by itself."""
        pipe = self.client.redis.pipeline(transaction=False)
        n = self._due_reads(pipe)
        return n < 0 or any(pipe.execute())

    def _due_reads(self, pipe: Any) -> int:
        """Queue :meth:`anything_due`'s reads on ``pipe``; how many (-1: due without reading)."""
        if not self.fake_clock or any(n > 0 for ledger in self.ledgers for n in ledger.held.values()):
            return -1
        ks, now = self.client.calls.ks, self.now_ms()
        for p in range(ks.partitions):
            pipe.zrangebyscore(ks.key(p, "t"), "-inf", now, start=0, num=1)
        return ks.partitions

    def fire_due(self, reads: Callable[[Any], None]) -> list[Any]:
        """What ``run_due`` does before it claims: fire when a timer is due or a rate-limited queue
        holds jobs (reaping only when the clock moved since the last reap), and when nothing is
        due, reap only when the clock moved; then return the results of the commands ``reads``
        queues on a pipeline. When nothing needs firing, that is one round trip: the reads ride
        with the check."""
        pipe = self.client.redis.pipeline(transaction=False)
        n = self._due_reads(pipe)
        reads(pipe)
        results = pipe.execute()
        if n < 0 or any(results[:n]):
            self.fire(always_reap=False)
        elif self.fake_clock and self.now_ms() != self.reaped_at:
            self.fire()
        else:
            return results[max(n, 0):]
        pipe = self.client.redis.pipeline(transaction=False)
        reads(pipe)
        return list(pipe.execute())

    def refill_crons(self, partition: int, names: list[str]) -> list[str]:
        """Append the next occurrences to the tables of crons ``names`` of ``partition`` (what a
        partition's owner does when a tick reports them); returns the names refilled."""
        client = self.client
        calls = client.calls
        pipe = client.redis.pipeline(transaction=False)
        for name in names:
            pipe.hmget(cron_key(calls.ks, partition, name), *CRON_FIELDS)
        fills = []
        for name, row in zip(names, pipe.execute()):
            table = parse_cron_table(row)
            if table is None:
                continue  # removed meanwhile
            planned = plan_occurrences(name, table, self.now_ms())
            if planned:
                fills.append((name, cron_fill_call(calls, partition, 0, name, table.version, planned)))
        done = []
        for (name, _), reply in zip(fills, client.transport.call_many([c for _, c in fills])):
            self._check(parse_cron_fill(reply), f"cron_fill of {name!r}")
            done.append(name)
        return done
