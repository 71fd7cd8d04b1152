"""Shared fixtures: real redis-server and etcd processes (tests/servers.py: the shared
``scheduler.shell.servers`` classes with fault injection)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scheduler.shell.servers import etcd_delete_all, etcd_revoke_all_leases
from tests.servers import EtcdCluster, EtcdServer, RedisServer, SentinelSet


def _revive(server: RedisServer | EtcdServer) -> None:
    """Undo a stray pause/kill of a session server so one bad test can't break the rest."""
    if server.paused:
        server.resume()
    if not server.running:
        server.restart()


# --------------------------------------------------------------------------- redis


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the whole run. Never kill or pause it: use ``fresh_redis``."""
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session redis, emptied (FLUSHALL + SCRIPT FLUSH) before the test."""
    _revive(redis_server)
    redis_server.command("FLUSHALL")
    redis_server.command("SCRIPT", "FLUSH")  # so EVALSHA/NOSCRIPT paths start cold
    return redis_server.url


@pytest.fixture
def fresh_redis() -> Iterator[RedisServer]:
    """A dedicated, started redis-server the test may kill/pause/restart; stopped afterwards."""
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def aof_redis() -> Iterator[RedisServer]:
    """Like ``fresh_redis`` but with AOF (appendonly yes, appendfsync everysec): data survives kill -9 + restart."""
    with RedisServer(aof=True) as srv:
        yield srv


@pytest.fixture
def sentinel_set() -> Iterator[SentinelSet]:
    """A started Sentinel setup (1 master, 1 replica, 3 sentinels, every one knowing the others), for
    failover tests; ``.url`` is ``redis+sentinel://...``.  Stopped afterwards (about 2 s to start)."""
    with SentinelSet() as s:
        yield s


# --------------------------------------------------------------------------- etcd


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One single-member etcd for the whole run. Never kill or pause it: use ``fresh_etcd``."""
    with EtcdServer() as srv:
        yield srv


@pytest.fixture
def etcd_endpoint(etcd_server: EtcdServer) -> str:
    """``"127.0.0.1:PORT"`` of the session etcd, with every key deleted and lease revoked before the test."""
    _revive(etcd_server)
    etcd_revoke_all_leases(etcd_server.endpoint)
    etcd_delete_all(etcd_server.endpoint)
    return etcd_server.endpoint


@pytest.fixture
def fresh_etcd() -> Iterator[EtcdServer]:
    """A dedicated, started single-member etcd for fault tests; stopped afterwards."""
    with EtcdServer() as srv:
        yield srv


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A started, healthy 3-member etcd cluster for fault tests; stopped afterwards."""
    with EtcdCluster(3) as cluster:
        yield cluster
