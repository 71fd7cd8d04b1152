"""Proves the real-server harness in tests/servers.py and the conftest fixtures."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import pytest
import redis

from tests.servers import (
    EtcdCluster,
    EtcdServer,
    RedisServer,
    ServerError,
    etcd_get,
    etcd_put,
    etcd_request,
    free_ports,
)


def _wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(4)
    assert len(set(ports)) == 4
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


# --------------------------------------------------------------------------- redis


def test_redis_url_answers_ping(redis_url: str, redis_server: RedisServer) -> None:
    assert redis_url == f"redis://127.0.0.1:{redis_server.port}/0"
    r = redis.Redis.from_url(redis_url)
    try:
        assert r.ping()
        r.set("zsched:leftover", "1")  # the next test checks FLUSHALL removed it
    finally:
        r.close()


def test_redis_url_starts_empty(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    try:
        assert r.dbsize() == 0
    finally:
        r.close()


def test_redis_kill_and_restart_same_port(fresh_redis: RedisServer) -> None:
    port, old_pid = fresh_redis.port, fresh_redis.pid
    r = redis.Redis.from_url(fresh_redis.url, socket_timeout=1, socket_connect_timeout=1)
    try:
        assert r.ping()
        fresh_redis.kill()
        assert not fresh_redis.running
        with pytest.raises(redis.ConnectionError):
            r.ping()
        fresh_redis.restart()
        assert fresh_redis.port == port and fresh_redis.pid != old_pid
        assert r.ping()  # redis-py reconnects to the same url
    finally:
        r.close()


def test_redis_pause_and_resume(fresh_redis: RedisServer) -> None:
    fresh_redis.pause()
    assert not fresh_redis.ping(timeout=0.3)
    fresh_redis.resume()
    assert fresh_redis.ping()


def test_redis_stop_removes_dir_and_kill_leaves_no_process() -> None:
    srv = RedisServer(extra_args=["--maxmemory", "10mb"]).start()
    assert srv.command("CONFIG", "GET", "maxmemory") == [b"maxmemory", b"10485760"]
    d, pid = srv.dir, srv.pid
    assert (d / "redis.log").exists()
    srv.stop()
    assert not d.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_redis_bad_args_report_log_tail() -> None:
    srv = RedisServer(extra_args=["--no-such-option", "1"])
    try:
        with pytest.raises(ServerError, match="no-such-option"):
            srv.start()
        assert not srv.running
    finally:
        srv.stop()


# --------------------------------------------------------------------------- etcd


def test_etcd_single_member_health_and_put_get(etcd_endpoint: str, etcd_server: EtcdServer) -> None:
    assert etcd_endpoint == etcd_server.endpoint
    assert etcd_server.healthy()
    etcd_put(etcd_endpoint, "zsched/a", "hello")
    assert etcd_get(etcd_endpoint, "zsched/a") == b"hello"
    etcd_request(etcd_endpoint, "/v3/lease/grant", {"TTL": 60})


def test_etcd_endpoint_starts_empty(etcd_endpoint: str) -> None:
    res = etcd_request(etcd_endpoint, "/v3/kv/range", {"key": "AA==", "range_end": "AA==", "count_only": True})
    assert int(res.get("count", 0)) == 0
    assert not etcd_request(etcd_endpoint, "/v3/lease/leases", {}).get("leases")


def test_etcd_kill_and_restart_keeps_data(fresh_etcd: EtcdServer) -> None:
    etcd_put(fresh_etcd.endpoint, "k", "v")
    fresh_etcd.kill()
    assert not fresh_etcd.healthy(0.3)
    fresh_etcd.restart()
    assert etcd_get(fresh_etcd.endpoint, "k") == b"v"


def test_etcd_cluster_one_leader_and_failover(etcd_cluster: EtcdCluster) -> None:
    assert etcd_cluster.endpoints == ",".join(f"127.0.0.1:{m.client_port}" for m in etcd_cluster.members)
    assert len({m.member_id for m in etcd_cluster.members}) == 3

    leader = etcd_cluster.leader()
    leaders = {m.status()["leader"] for m in etcd_cluster.members}
    assert leaders == {leader.member_id}

    leader.kill()
    survivors = [m for m in etcd_cluster.members if m is not leader]
    t0 = time.monotonic()

    def write_ok() -> bool:
        try:
            etcd_put(survivors[0].endpoint, "after-failover", "1", timeout=0.5)
            return True
        except (OSError, ServerError):
            return False

    _wait_for(write_ok, 5.0, "a write after killing the leader")
    assert time.monotonic() - t0 < 5.0
    new_leader = etcd_cluster.leader()
    assert new_leader is not leader and new_leader in survivors
    assert etcd_get(survivors[1].endpoint, "after-failover") == b"1"

    # The killed member rejoins with its data dir and catches up.
    leader.restart()
    _wait_for(lambda: etcd_get(leader.endpoint, "after-failover") == b"1", 5.0, "rejoined member to catch up")
