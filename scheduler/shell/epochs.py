"""Operator operations on the scheduler tier's fencing epochs (``zsched epochs show | reset``).

Each partition's owner ticks with an epoch, the etcd create revision of its ownership key; Redis
keeps the highest epoch seen per partition (``meta.epoch``) and refuses older ones. If etcd's
history goes back (restored from a snapshot, or replaced by an empty cluster), every epoch etcd
hands out is older than ``meta.epoch``: the owners' ticks are refused and nothing fires. The tier
detects this (an *epoch conflict*: etcd still names the replica as owner with exactly the refused
epoch), backs off and logs the fix, which is :func:`reset_epochs`: set ``meta.epoch`` to 0 with
the ``epoch_reset`` script, one atomic compare-and-set per partition, so that the next owner's
tick re-establishes its epoch.

Resetting is safe even for a healthy partition: ``tick`` pops due timers and pushes them to ready
in one script, so a stale replica whose epoch is accepted for a moment can only contend with the
real owner for due jobs, never fire one twice; the real owner's next tick raises the epoch again.

The script is sent through the client's transport (EVALSHA with NOSCRIPT recovery), its call built
by the client's :class:`~scheduler.protocol.calls.Calls`, its reply read as an
:class:`~scheduler.protocol.codes.EpochResetCode`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..client import Client
from ..protocol import control
from ..protocol.codes import EpochResetCode, code_of
from . import admin
from .admin import BadInput

# ------------------------------------------------------------------------------------ reading


def read_epochs(client: Client, partitions: Sequence[int] | None = None) -> dict[int, int]:
    """Partition -> the highest epoch Redis has seen for it (0: none), one pipelined round trip."""
    ks = client.keyspace
    parts = list(range(ks.partitions)) if partitions is None else list(partitions)
    pipe = client.redis.pipeline(transaction=False)
    for p in parts:
        pipe.hget(ks.key(p, "meta"), "epoch")
    return {p: int(v or 0) for p, v in zip(parts, pipe.execute())}


@dataclass(frozen=True)
class Owner:
    """A partition's owner in etcd: the replica id and the epoch it ticks with."""

    replica: str
    epoch: int


def read_owner_epochs(endpoints: str, namespace: str, *, timeout: float = 1.5) -> dict[int, Owner]:
    """Partition -> owner (replica id, create revision of ``/zsched/NS/owners/P`` = its epoch)
    from etcd. Raises on any failure; bounded by about ``2 * timeout`` seconds in total."""
    return {p: Owner(replica, epoch)
            for p, (replica, epoch) in admin.read_owner_records(endpoints, namespace, timeout=timeout).items()}


@dataclass(frozen=True)
class PartitionEpoch:
    """One row of ``epochs show``. ``conflict``: etcd's owner ticks with an epoch older than the one
    Redis has seen, so all its ticks are refused (None when owners are unknown)."""

    partition: int
    epoch: int
    owner: Owner | None = None
    conflict: bool | None = None


def describe(epochs: dict[int, int], owners: dict[int, Owner] | None) -> list[PartitionEpoch]:
    """Join Redis's epochs with etcd's owners (None: owners not read)."""
    rows = []
    for p, e in sorted(epochs.items()):
        if owners is None:
            rows.append(PartitionEpoch(p, e))
        else:
            o = owners.get(p)
            rows.append(PartitionEpoch(p, e, o, o is not None and o.epoch < e))
    return rows


# ------------------------------------------------------------------------------------ reset


def select_partitions(partitions: Sequence[int] | None, all_: bool, count: int) -> list[int]:
    """Check the selection of ``epochs reset``: ``--partition P`` (repeatable) or ``--all``, one of
    them (so a forgotten flag never resets every partition), each partition in range."""
    if all_ and partitions:
        raise BadInput("give either --partition P (repeatable) or --all, not both")
    if not all_ and not partitions:
        raise BadInput("nothing selected: give --partition P (repeatable; the partitions the replicas' "
                       "'EPOCH CONFLICT' errors name, or 'zsched epochs show --etcd ...' marks) or --all")
    if all_:
        return list(range(count))
    bad = sorted({p for p in partitions or () if not 0 <= p < count})
    if bad:
        raise BadInput(f"partition {', '.join(map(str, bad))} does not exist: this namespace has {count} "
                       f"partition(s), numbered 0 to {count - 1} (see: zsched epochs show)")
    return sorted(set(partitions or ()))


@dataclass(frozen=True)
class ResetOutcome:
    """One partition of a reset. ``status``: ``reset`` (``before`` -> 0), ``unchanged`` (0 was
    stored already: nothing to do) or ``changed`` (the stored epoch was no longer ``before``, the
    value read; it is ``now``: left alone, since a replica raised it meanwhile)."""

    partition: int
    before: int
    status: str
    now: int


def reset_epochs(client: Client, expected: dict[int, int]) -> list[ResetOutcome]:
    """Set ``meta.epoch`` to 0 in each partition of ``expected`` whose stored epoch is still the
    expected one (the value the operator saw). One ``epoch_reset`` script per partition (atomic
    compare-and-set), all in one pipelined round trip."""
    parts = sorted(expected)
    if not parts:
        return []
    calls = client.calls
    replies = client.transport.call_many([control.epoch_reset_call(calls, p, expected[p]) for p in parts])
    out = []
    for p, (code, value) in zip(parts, replies):
        status, now = code_of(EpochResetCode, code, "epoch_reset"), int(value)
        if status is EpochResetCode.RESET:
            out.append(ResetOutcome(p, expected[p], "reset", 0))
        elif status is EpochResetCode.NOTHING_TO_DO or now == 0:
            # 0 already: nothing to do (also when a re-sent call finds its own first run's reset)
            out.append(ResetOutcome(p, expected[p], "unchanged", 0))
        else:
            out.append(ResetOutcome(p, expected[p], "changed", now))
    return out
