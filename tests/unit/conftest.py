"""The fast tier (``./scripts/test --fast``): unit tests start no server. The fixtures that start
redis-server, Sentinel, a Redis Cluster, etcd or PostgreSQL (tests/conftest.py) are replaced here by ones that
fail, so a unit test that needs a server is moved to tests/integration instead of slowing the tier."""
from __future__ import annotations

from typing import NoReturn

import pytest

SERVER_FIXTURES = ("redis_server", "redis_url", "fresh_redis", "aof_redis", "sentinel_set",
                   "sentinel_set_launched", "redis_cluster",
                   "redis_cluster_url", "redis_cluster_replicas", "redis_cluster_factory", "backend_url",
                   "etcd_server", "etcd_endpoint", "fresh_etcd", "etcd_cluster", "pg_server", "pg_dsn")


def _no_server(request: pytest.FixtureRequest) -> NoReturn:
    pytest.fail(f"{request.fixturename}: tests/unit starts no server (the fast tier); "
                "a test that needs one belongs in tests/integration", pytrace=False)


for _name in SERVER_FIXTURES:
    globals()[_name] = pytest.fixture(name=_name)(_no_server)
