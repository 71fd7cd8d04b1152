"""Coordination service (etcd) access for zsched.

Import from here, never from ``etcd3aio`` directly, so the backend can be
swapped; see ``docs/etcd.md``. :mod:`.api` is the interface and its errors,
:mod:`.etcd` the etcd v3 implementation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..protocol.etcd_endpoints import parse_endpoints
from .api import KV, CoordinationError, Coordinator, CoordinatorUnavailable, LeaseLost, WatchCompacted, WatchEvent

if TYPE_CHECKING:
    from .etcd import EtcdCoordinator


def __getattr__(name: str) -> Any:
    # EtcdCoordinator loads etcd3aio, gRPC and protobuf (about 80 ms): only in the processes that
    # talk to etcd, not in every zsched command that merely knows coordination's error types
    if name == "EtcdCoordinator":
        from .etcd import EtcdCoordinator

        return EtcdCoordinator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "KV",
    "CoordinationError",
    "Coordinator",
    "CoordinatorUnavailable",
    "EtcdCoordinator",
    "LeaseLost",
    "WatchCompacted",
    "WatchEvent",
    "parse_endpoints",
]
