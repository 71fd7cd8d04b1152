"""Coordination service (etcd) access for zsched.

Import from here, never from ``etcd3aio`` directly, so the backend can be
swapped; see ``docs/etcd.md``.
"""

from .etcd import (
    KV,
    CoordinationError,
    Coordinator,
    CoordinatorUnavailable,
    EtcdCoordinator,
    LeaseLost,
    WatchCompacted,
    WatchEvent,
    parse_endpoints,
)

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
