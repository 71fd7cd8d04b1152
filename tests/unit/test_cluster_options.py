"""Settings that must mean the same on a Redis Cluster as on one server (no server needed)."""
from __future__ import annotations

import pytest

from scheduler import AsyncClient
from scheduler.protocol.durability import require_waitaof
from scheduler.protocol.errors import DurabilityUnsupported
from scheduler.redisio.connection import async_redis
from workers import Worker
from workers.options import WorkerOptions


def test_waitaof_check_reads_every_master_of_a_cluster() -> None:
    # INFO server from every master (node name -> reply): one old master is enough to refuse,
    # since a batch's WAITAOF goes to each node it touched
    with pytest.raises(DurabilityUnsupported, match="Redis 7.0.15"):
        require_waitaof({"127.0.0.1:7000": {"redis_version": "7.2.4"}, "127.0.0.1:7001": {"redis_version": "7.0.15"}})
    require_waitaof({"127.0.0.1:7000": {"redis_version": "7.2.4"}, "127.0.0.1:7001": {"redis_version": "7.4.0"}})
    require_waitaof({"redis_version": "7.2.0"})  # one server's reply, parsed
    with pytest.raises(DurabilityUnsupported):
        require_waitaof(b"# Server\r\nredis_version:6.2.14\r\n")


def test_durable_timeout_is_checked_against_a_cluster_clients_socket_timeout() -> None:
    # a WAIT longer than the socket timeout would look like a lost connection; the cluster client
    # keeps its connection settings in its nodes manager, not in a pool of its own
    r = async_redis("redis+cluster://127.0.0.1:1", socket_timeout=1.0)  # asyncio: connects lazily
    with pytest.raises(ValueError, match="shorter than the Redis socket timeout"):
        AsyncClient(r, durable="replica", durable_timeout=2.0)
    assert AsyncClient(r, durable="replica", durable_timeout=0.5)


def test_worker_sharded_pubsub_switch_is_checked_and_kept() -> None:
    assert Worker(queues=["q"]).sharded_pubsub is None  # automatic: sharded exactly on a cluster
    assert Worker(queues=["q"], sharded_pubsub=True).options.sharded_pubsub is True
    assert WorkerOptions(sharded_pubsub=False).updated(concurrency=4).sharded_pubsub is False
    with pytest.raises(TypeError, match="sharded_pubsub must be True, False or None"):
        Worker(queues=["q"], sharded_pubsub="yes")  # type: ignore[arg-type]
