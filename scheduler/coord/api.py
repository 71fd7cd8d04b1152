"""What zsched needs from a coordination service: the :class:`Coordinator` interface, the values
it returns (:class:`KV`, :class:`WatchEvent`) and the errors it raises.

Written against etcd v3 semantics (leases, create revisions, watches from a revision); the etcd
implementation is :class:`~scheduler.coord.etcd.EtcdCoordinator`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from ..protocol.errors import ZschedError

# --------------------------------------------------------------------------- errors


class CoordinationError(ZschedError):
    """Base class of every error raised by a :class:`Coordinator`."""


class LeaseLost(CoordinationError):
    """The lease no longer exists (expired or revoked).

    Everything attached to it is gone; the holder must stop acting as owner.
    """

    def __init__(self, lease_id: int, detail: str = "") -> None:
        self.lease_id = lease_id
        msg = f"etcd lease {lease_id:#x} is gone (expired or revoked)"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class WatchCompacted(CoordinationError):
    """A watch cannot resume because etcd compacted the history it needs.

    Events between ``revision`` and ``compact_revision`` are lost for good.
    Re-read the current state with :meth:`Coordinator.get_prefix` and start a
    new watch from the revision it returns + 1.
    """

    def __init__(self, revision: int, compact_revision: int = 0) -> None:
        self.revision = revision
        self.compact_revision = compact_revision
        super().__init__(
            f"cannot watch from revision {revision}: etcd has compacted its history up to "
            f"revision {compact_revision}; re-read the prefix with get_prefix() and "
            f"restart the watch from the returned revision + 1"
        )


class CoordinatorUnavailable(CoordinationError):
    """etcd could not be reached (or had no quorum) within the call's deadline."""


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class KV:
    """One key as stored in etcd.

    ``create_revision`` is the cluster revision at which this incarnation of
    the key was created.  It never changes while the key exists and a key
    re-created after a delete always gets a larger one, so zsched uses it as
    the *fencing epoch* of a partition claim.  ``lease`` is 0 for keys without
    a lease.
    """

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class WatchEvent:
    """A change under a watched prefix.

    For ``kind == "delete"`` (explicit delete or lease expiry/revoke) etcd only
    reports the key and the revision of the delete: ``value`` is ``b""`` and
    ``create_revision`` is 0; ``mod_revision`` is the revision of the delete.
    """

    kind: Literal["put", "delete"]
    key: str
    value: bytes
    create_revision: int
    mod_revision: int


# --------------------------------------------------------------------------- interface


@runtime_checkable
class Coordinator(Protocol):
    """What zsched needs from a coordination service (etcd v3 semantics).

    Implementations must give every call a deadline and raise
    :class:`CoordinatorUnavailable` when it passes, :class:`LeaseLost` when a
    lease is gone, and :class:`WatchCompacted` from :meth:`watch_prefix` when
    the requested history is no longer available.
    """

    async def connect(self) -> None:
        """Open connections (idempotent)."""
        ...

    async def close(self) -> None:
        """Close connections; the object may be connected again."""
        ...

    async def grant(self, ttl: float, *, timeout: float | None = None) -> int:
        """Create a lease of at least ``ttl`` seconds and return its id."""
        ...

    async def keepalive_once(self, lease_id: int, *, timeout: float | None = None) -> float:
        """Refresh the lease; return the TTL granted, raise LeaseLost if it is gone."""
        ...

    async def revoke(self, lease_id: int, *, timeout: float | None = None) -> None:
        """Revoke the lease and delete its keys; unknown leases are fine."""
        ...

    async def put(
        self, key: str, value: bytes, lease: int | None = None, *, timeout: float | None = None
    ) -> int:
        """Write ``key`` (optionally attached to ``lease``); return the revision."""
        ...

    async def claim_if_absent(
        self, key: str, value: bytes, lease: int, *, timeout: float | None = None
    ) -> KV | None:
        """Create ``key`` with ``lease`` if it does not exist; None if it does."""
        ...

    async def delete_if(self, key: str, create_revision: int, *, timeout: float | None = None) -> bool:
        """Delete ``key`` only if its create_revision still matches."""
        ...

    async def get(self, key: str, *, timeout: float | None = None) -> KV | None:
        """Read one key (linearizable)."""
        ...

    async def get_prefix(self, prefix: str, *, timeout: float | None = None) -> tuple[list[KV], int]:
        """Read all keys under ``prefix`` plus the revision the read was made at."""
        ...

    def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Yield every change under ``prefix`` from ``start_revision`` on."""
        ...
