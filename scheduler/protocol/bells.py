"""Ringing a queue's doorbell from Python (workers/doorbell.py has the waiting side; the scripts
ring through lua/_lib.lua ``ring``). On Redis Cluster the bells are in the slot of ``{NS}``, not
in a partition's, so a script cannot ring them: the partition's owner rings the ones its scripts
name (``tick``'s reply, the "r MEMBER QUEUE" message on the partition's wake channel, which
``claim`` also sends when it stopped at a due job with no handler slot), and a worker rings after
a claim whose reply shows it may have left jobs behind. A ring is a hint: a lost one costs the
workers' safety-net sweep period, never a job."""
from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from .keys import Keyspace, validate_name

# Wake-channel messages asking the partition's owner to ring a bell: "r MEMBER QUEUE" its bell,
# "b MEMBER QUEUE" its burst bell (lua/_lib.lua ring).
RELAY_PREFIXES = (b"r ", b"b ")


BURST_SPAN_MS = 10
"""A tick's jobs of one queue ring the burst bell when ``BURST_RING`` (4) of them come due within this
many ms of each other (lua/_lib.lua ``bursty``; the due ones count as due now), and the owner sees
a burst coming when its partition's fourth earliest timer is due this close to the earliest
(scheduler/tier/coalesce.py ``HandoffLead.look_ahead``). Spread jobs handed off together with a
widened lead are not a burst: the listener takes them, warm."""

# One ring: (queue, member, score_ms or None for now, burst)
Ring = tuple[str, bytes | str, float | None, bool]


async def ring(redis: Any, ks: Keyspace, queue: str, member: bytes | str, score_ms: float | None = None,
               burst: bool = False) -> None:
    """Ring ``queue``'s bell (``burst``: its burst bell, which every idle worker waits on) with
    ``member`` ("P" or "P:resume"), keeping an earlier ring of the same member and its time (NX).
    ``score_ms``: when it was rung first (default now, this host's clock)."""
    await ring_many(redis, ks, [(queue, member, score_ms, burst)])


async def ring_many(redis: Any, ks: Keyspace, rings: Iterable[Ring]) -> None:
    """Ring several bells in one round trip (:func:`ring` for each of ``rings``), one ``ZADD NX``
    per bell with all its members: Redis serves the workers blocked on a bell after each command,
    so rung together the members of one bell reach a waiting sleeper together and it takes several
    at once (workers/doorbell.py ``take_many``); rung one by one, each woke a worker of its own.
    A member rung twice keeps its earliest time. Every bell carries the hash tag ``{NS}``, so on
    a cluster this is one round trip to one node."""
    now = time.time() * 1000
    adds: dict[str, dict[bytes, float]] = {}
    moved: dict[str, list[bytes]] = {}
    for queue, member, score_ms, burst in rings:
        m = member.encode() if isinstance(member, str) else member
        at = now if score_ms is None else score_ms
        members = adds.setdefault(ks.burst_bell(queue) if burst else ks.bell(queue), {})
        members[m] = min(at, members.get(m, at))
        if burst:  # moved out of the bell, as the scripts do (lua/_lib.lua bell_ring): one claim per ring
            moved.setdefault(ks.bell(queue), []).append(m)
    if not adds:
        return
    if not moved and len(adds) == 1:
        key, members = next(iter(adds.items()))
        await redis.zadd(key, members, nx=True)
        return
    pipe = redis.pipeline(transaction=False)
    for key, members in adds.items():
        pipe.zadd(key, members, nx=True)
    for key, gone in moved.items():
        pipe.zrem(key, *gone)
    await pipe.execute()


def is_relay(data: bytes) -> bool:
    """Whether a wake-channel message is a relay (:func:`parse_relay` reads it)."""
    return data.startswith(RELAY_PREFIXES)


def parse_relay(data: bytes) -> tuple[int, bytes, str, bool]:
    """A relay message "r MEMBER QUEUE" or "b MEMBER QUEUE" -> (partition, member, queue, burst).
    ValueError when malformed (or the queue is not a queue name: such a message never names a key
    we write)."""
    parts = data.split(b" ")
    if len(parts) != 3 or parts[0] + b" " not in RELAY_PREFIXES:
        raise ValueError(f"not a relay message: {data[:80]!r}")
    member, queue = parts[1], parts[2].decode("ascii", "replace")
    validate_name("queue", queue)
    head, _, tail = member.partition(b":")
    if not head.isdigit() or tail not in (b"", b"resume"):
        raise ValueError(f"bad bell member {member[:40]!r}")
    return int(head), member, queue, parts[0] == b"b"
