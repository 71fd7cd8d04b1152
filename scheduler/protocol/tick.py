"""The scripts a partition's owner runs: ``tick``, ``reap``, ``ratelimit``, ``cron_fill``.

For each one a function that builds its call (the ``(script, keys, args)`` triple a transport
sends) and one that reads its reply into a typed value; the layouts are the ones documented in the
headers of ``lua/tick.lua``, ``lua/reap.lua``, ``lua/ratelimit.lua`` and ``lua/cron_fill.lua``
(status codes in :mod:`.codes`; the ``stats`` reply the owner also reads is in :mod:`.replies`).
Also the part of a cron's hash the owner reads to refill its table of occurrences.

``tick``, ``reap`` and ``cron_fill`` are fenced by the ownership epoch: a reply whose first element
is :data:`~.codes.EPOCH_REFUSED` says Redis has seen a newer epoch, and parses into
:class:`EpochRefused` carrying that epoch. Nothing here does I/O; the tick is the tier's hot path,
so the parsers only slice the reply once and convert what the caller reads.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import msgpack

from .call import Call
from .calls import Calls
from .codes import EPOCH_REFUSED, CronFillCode
from .keys import Keyspace

# Bytes per entry of a cron's packed occurrence tables ('times', 'fires'): big-endian ms (p48/u48
# in lua/_lib.lua).
CRON_TIME_BYTES = 6
# Fields of a cron's hash that the owner reads before refilling its table, in this order.
CRON_FIELDS = ("def", "ver", "pending", "pnom", "times")


@dataclass(frozen=True, slots=True)
class EpochRefused:
    """A fenced call was refused: ``newest_epoch`` is the epoch Redis has seen for the partition."""

    newest_epoch: int


class Retention(NamedTuple):
    """Housekeeping arguments of ``tick``; 0 switches a rule off."""

    dead_ttl_ms: int = 0     # drop dead jobs older than this
    max_dead: int = 0        # keep at most this many dead jobs in the partition
    queue_idle_ms: int = 0   # retire a queue name unused this long


NO_RETENTION = Retention()
"""What a tick that is not a housekeeping tick passes: no rule this time."""


class QueueTokens(NamedTuple):
    """What one tick did with a rate-limited queue's tokens."""

    queue: str
    used: int         # tokens spent on jobs moved to ready
    held: int         # due jobs of the queue held back in the partition now
    newly_held: int   # of those, held back by this tick


@dataclass(frozen=True, slots=True)
class TickReply:
    """An accepted ``tick``."""

    moved: int                       # timers taken (the batch limit when the caller should go again)
    next_due_ms: int | None          # earliest remaining timer (Redis clock), None when there is none
    now_ms: int                      # Redis clock when the tick ran
    queues: list[QueueTokens]        # one per rate-limited queue passed to the call, same order
    crons_to_refill: list[str]       # crons whose table of occurrences runs low: call cron_fill
    dropped_dead: list[tuple[bytes, str]]  # (raw job id, queue) removed by the dead-letter retention
    # Redis Cluster: (queue, burst) whose bells the caller rings, the burst bell when burst ([] elsewhere)
    to_ring: list[tuple[str, bool]]
    # the due time of the BURST_RING-th earliest remaining timer (lua/_lib.lua), None when fewer
    # remain: with next_due_ms it tells the owner whether a burst comes next (tier/coalesce.py)
    burst_due_ms: int | None
    lateness_ms: list[int]           # per fired job: Redis now minus its due time


@dataclass(frozen=True, slots=True)
class ReapReply:
    """An accepted ``reap``."""

    reaped: int                      # expired leases handled (the batch limit: more may be waiting)
    next_deadline_ms: int | None     # earliest remaining lease deadline, None when nothing runs
    now_ms: int


class TokenGrant(NamedTuple):
    """A ``ratelimit`` reply."""

    granted: int
    wait_ms: int  # until the bucket has a token again (0 while tokens remain)


@dataclass(frozen=True, slots=True)
class CronFillReply:
    """An accepted ``cron_fill``."""

    status: CronFillCode        # CHANGED or FILLED
    pending_id: bytes | None      # the cron's pending occurrence (FILLED only)


@dataclass(frozen=True, slots=True)
class CronTable:
    """The part of a cron's hash that decides its refill: the definition, the version the
    occurrences must be computed for, whether an occurrence is pending, and how far the table of
    upcoming occurrences reaches."""

    definition: bytes             # msgpack: expr, tz, jitter (see Calls.set_cron); read with spec()
    version: bytes
    pending: bool                 # an occurrence is scheduled
    upcoming: int                 # occurrences in the table of upcoming ones
    last_planned_ms: int | None   # latest nominal time already planned; None when nothing is pending

    def spec(self) -> dict[str, Any]:
        """The cron's definition (decoded on demand: a refill that is not needed never reads it)."""
        spec: dict[str, Any] = msgpack.unpackb(self.definition, raw=False)
        return spec


# -- tick ----------------------------------------------------------------------------------------
def tick_call(calls: Calls, partition: int, epoch: int, batch: int, tokens: Mapping[str, int],
              retention: Retention, lead_ms: int = 0, housekeeping: bool = True, tomb_ms: int | None = None) -> Call:
    """``tick``: fire up to ``batch`` due timers of ``partition``. ``tokens``: for every queue with
    a rate limit (in the order the reply reports them), the tokens granted for this tick.
    ``lead_ms``: also hand off the timers due within this many ms (the workers hold them until
    their due time). ``housekeeping``: also look for held jobs of queues no longer rate-limited
    (the tier asks on about one tick per second; a tick without it, rate limits or ``retention``
    can take the script's fast path). ``tomb_ms``: how long the tombstones of jobs it misfires stay
    (default the namespace's, ``calls.tomb_ms``)."""
    limited: list[Any] = [len(tokens)]
    for queue, granted in tokens.items():
        limited += [queue, granted]
    return calls.call("tick", partition, epoch, batch, calls.tomb_ms if tomb_ms is None else tomb_ms, *limited,
                      *retention, lead_ms, 1 if housekeeping else 0)


def parse_tick(reply: list[Any]) -> TickReply | EpochRefused:
    """Read a ``tick`` reply (layout in ``lua/tick.lua``)."""
    if reply[0] == EPOCH_REFUSED:
        return EpochRefused(int(reply[1]))
    nlim = int(reply[3])
    at = 4 + 4 * nlim
    queues = [QueueTokens(reply[i].decode(), int(reply[i + 1]), int(reply[i + 2]), int(reply[i + 3]))
              for i in range(4, at, 4)]
    ncron = int(reply[at])
    crons = [c.decode() for c in reply[at + 1: at + 1 + ncron]]
    at += 1 + ncron
    ndropped = int(reply[at])
    dropped = reply[at + 1: at + 1 + 2 * ndropped]
    at += 1 + 2 * ndropped
    nring = int(reply[at])
    flat = reply[at + 1: at + 1 + 2 * nring]
    to_ring = [(flat[i].decode(), int(flat[i + 1]) == 1) for i in range(0, len(flat), 2)]
    at += 1 + 2 * nring
    next_due, burst_due = int(reply[1]), int(reply[at])
    return TickReply(
        moved=int(reply[0]), next_due_ms=next_due if next_due >= 0 else None, now_ms=int(reply[2]),
        queues=queues, crons_to_refill=crons,
        dropped_dead=[(dropped[i], dropped[i + 1].decode()) for i in range(0, len(dropped), 2)],
        to_ring=to_ring, lateness_ms=reply[at + 1:], burst_due_ms=burst_due if burst_due >= 0 else None)


# -- reap ----------------------------------------------------------------------------------------
def reap_call(calls: Calls, partition: int, epoch: int, batch: int, *, past_the_layout_fence: bool = False) -> Call:
    """``reap``: handle up to ``batch`` expired leases of ``partition``. ``past_the_layout_fence``:
    for ``zsched migrate-partitions``, which reaps while the namespace's layout is fenced (epoch 0)."""
    build = calls.call_unfenced if past_the_layout_fence else calls.call
    return build("reap", partition, epoch, batch)


def parse_reap(reply: Sequence[Any]) -> ReapReply | EpochRefused:
    """Read a ``reap`` reply (layout in ``lua/reap.lua``)."""
    if reply[0] == EPOCH_REFUSED:
        return EpochRefused(int(reply[1]))
    deadline = int(reply[1])
    return ReapReply(int(reply[0]), deadline if deadline >= 0 else None, int(reply[2]))


# -- ratelimit -----------------------------------------------------------------------------------
def ratelimit_call(keyspace: Keyspace, queue: str, rate: float, burst: float, partition: int, demand: int,
                   refund: int) -> Call:
    """``ratelimit``: take ``partition``'s share of ``queue``'s tokens for ``demand`` held jobs,
    returning ``refund`` tokens granted earlier but not used."""
    return "ratelimit", [keyspace.bucket(queue)], [rate, burst, partition, demand, refund]


def parse_ratelimit(reply: Sequence[Any]) -> TokenGrant:
    """Read a ``ratelimit`` reply (layout in ``lua/ratelimit.lua``)."""
    return TokenGrant(int(reply[0]), int(reply[1]))


# -- cron_fill -----------------------------------------------------------------------------------
def cron_key(keyspace: Keyspace, partition: int, name: str) -> str:
    """The hash of cron ``name`` (its definition, pending occurrence and occurrence tables)."""
    return keyspace.key(partition, f"cron:{name}")


def crons_key(keyspace: Keyspace, partition: int) -> str:
    """The set of the names of the crons that live in ``partition``."""
    return keyspace.key(partition, "crons")


def parse_cron_table(row: Sequence[bytes | None]) -> CronTable | None:
    """Read the :data:`CRON_FIELDS` of a cron's hash; None when the cron is gone."""
    definition, version, pending, pnom, times = row
    if definition is None or version is None:
        return None
    times = times or b""
    last = int.from_bytes(times[-CRON_TIME_BYTES:], "big") if times else 0
    return CronTable(definition, version, bool(pending), len(times) // CRON_TIME_BYTES,
                     max(int(pnom or 0), last) if pending else None)


def cron_fill_call(calls: Calls, partition: int, epoch: int, name: str, version: bytes,
                   planned: Sequence[tuple[int, int]]) -> Call:
    """``cron_fill``: append ``planned`` ``(nominal ms, fire ms)`` occurrences, ascending, to cron
    ``name``'s table, if the cron is still at ``version``."""
    flat = [ms for pair in planned for ms in pair]
    return calls.call("cron_fill", partition, epoch, name, version, len(planned), *flat)


def parse_cron_fill(reply: Sequence[Any]) -> CronFillReply | EpochRefused:
    """Read a ``cron_fill`` reply (layout in ``lua/cron_fill.lua``)."""
    status = CronFillCode(int(reply[0]))
    if status is CronFillCode.EPOCH_REFUSED:
        return EpochRefused(int(reply[1]))
    return CronFillReply(status, reply[1] if status is CronFillCode.FILLED else None)
