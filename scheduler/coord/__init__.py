"""Coordination service (etcd) access for zsched.

Import from here, never from ``etcd3aio`` directly, so the backend can be
swapped; see ``docs/etcd.md``. :mod:`.api` is the interface and its errors,
:mod:`.etcd` the etcd v3 implementation.
"""

from ..protocol.etcd_endpoints import parse_endpoints
from .api import KV, CoordinationError, Coordinator, CoordinatorUnavailable, LeaseLost, WatchCompacted, WatchEvent
from .etcd import EtcdCoordinator

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
