"""Proves the real-server harness in tests/support/servers.py and the conftest fixtures."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import pytest
import redis
from redis.sentinel import Sentinel

from scheduler.shell.servers import ServerError, etcd_get, etcd_put, etcd_request, free_ports
from tests.support.servers import EtcdCluster, EtcdServer, RedisServer, SentinelSet


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


# --------------------------------------------------------------------------- redis faults


def test_redis_stall_blocks_other_clients_then_answers(fresh_redis: RedisServer) -> None:
    ms = 500
    r = redis.Redis(host="127.0.0.1", port=fresh_redis.port, socket_timeout=ms / 1000 + 5)
    try:
        assert r.ping()  # connected before the stall, so only the PING is measured
        stall = fresh_redis.stall(ms)
        t0 = time.monotonic()
        assert r.ping()
        t1 = time.monotonic()
        rtt = t1 - t0
        assert stall.join() >= ms
        assert t1 >= stall.earliest_end  # answered only after the stall
        assert rtt >= 0.8 * ms / 1000, f"PING took {rtt:.3f}s during a {ms} ms stall"
        assert rtt < ms / 1000 + 2.0
        t0 = time.monotonic()
        assert r.ping()
        assert time.monotonic() - t0 < 1.0  # answers at once afterwards
    finally:
        r.close()


def test_redis_stall_context_manager_and_busy_replies(fresh_redis: RedisServer) -> None:
    with fresh_redis.stall(200) as stall:
        assert fresh_redis.command("PING", timeout=5) == "PONG"
        assert time.monotonic() >= stall.earliest_end  # the PING waited for the stall's end
    assert stall.done and stall.elapsed_ms is not None and stall.elapsed_ms >= 200

    # busy_after_ms: once the script has run that long, other clients get -BUSY instead of waiting.
    with fresh_redis.stall(600, busy_after_ms=50) as stall:
        with pytest.raises(ServerError, match="BUSY"):
            while not stall.done:  # a PING is answered BUSY once the script has run for 50 ms
                fresh_redis.command("PING", timeout=5)
    assert fresh_redis.command("CONFIG", "GET", "busy-reply-threshold") == [b"busy-reply-threshold", b"5000"]


@pytest.mark.parametrize("aof", [False, True], ids=["rdb", "aof"])
def test_redis_crash_to_save_point_rolls_back_acknowledged_writes(aof: bool, request: pytest.FixtureRequest) -> None:
    srv: RedisServer = request.getfixturevalue("aof_redis" if aof else "fresh_redis")
    port, d, pid = srv.port, srv.dir, srv.pid
    r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    try:
        r.set("before", "1")
        srv.save_point()
        assert r.set("after", "2")  # acknowledged...
        assert r.get("after") == b"2"
        srv.crash_to_save_point()
        assert (srv.port, srv.dir) == (port, d) and srv.pid != pid
        assert r.get("before") == b"1"
        assert r.get("after") is None  # ...and lost
        if aof:  # AOF is back on, rewritten from the rolled-back data: a kill -9 keeps it
            assert srv.info("persistence")["aof_enabled"] == "1"
            r.set("later", "3")
            srv.kill()
            srv.restart()
            assert (r.get("before"), r.get("after"), r.get("later")) == (b"1", None, b"3")
    finally:
        r.close()


@pytest.mark.parametrize("aof", [False, True], ids=["no-aof", "aof"])
def test_redis_kill9_and_restart_keeps_data_only_with_aof(aof: bool, request: pytest.FixtureRequest) -> None:
    srv: RedisServer = request.getfixturevalue("aof_redis" if aof else "fresh_redis")
    port, d = srv.port, srv.dir
    assert srv.command("CONFIG", "GET", "appendonly")[1] == (b"yes" if aof else b"no")
    r = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    try:
        r.set("k", "v")
        r.zadd("z", {"a": 1.5})
        srv.kill()
        srv.restart()
        assert (srv.port, srv.dir) == (port, d)
        if aof:
            assert r.get("k") == b"v" and r.zscore("z", "a") == 1.5
            srv.restart()  # a graceful restart too
            assert r.get("k") == b"v"
        else:
            assert r.dbsize() == 0
    finally:
        r.close()


# --------------------------------------------------------------------------- redis sentinel


def _retry(fn: Callable[[], object], timeout: float) -> object:
    """Call ``fn`` until it stops raising a failover-time error (for up to ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_sentinel_failover_with_redis_py_and_clean_stop(sentinel_set: SentinelSet) -> None:
    s = sentinel_set
    ports = [p for _, p in s.sentinel_addrs]
    assert s.url == "redis+sentinel://" + ",".join(f"127.0.0.1:{p}" for p in ports) + "/mymaster/0"
    old_master, old_replica = s.master, s.replica
    assert s.master_port() == old_master.port
    assert old_replica.info("replication")["role"] == "slave"

    sentinel = Sentinel(s.sentinel_addrs, socket_timeout=0.5)
    client = sentinel.master_for("mymaster", socket_timeout=0.5)
    try:
        client.set("before", "1")
        assert client.execute_command("WAIT", 1, 2000) == 1  # on the replica before the kill
        t0 = time.monotonic()
        assert s.kill_master() is old_master and not old_master.running
        # every sentinel: master_port() asks the first one that answers, and a lagging one names the
        # dead master until it flags it down (down-after-milliseconds)
        new_port = s.wait_failover(old_master.port, timeout=30, all_sentinels=True)
        failover_s = time.monotonic() - t0
        assert new_port == old_replica.port
        assert s.master is old_replica and s.replica is old_master
        assert s.master_port() == new_port

        _retry(lambda: client.set("after", "2"), 15.0)  # the same client finds the new master
        assert client.get("after") == b"2" and client.get("before") == b"1"
        assert old_replica.command("GET", "after") == b"2"
        assert failover_s < 15.0
    finally:
        client.close()
        for sc in sentinel.sentinels:
            sc.close()

    procs = [*s.servers, *s.sentinels]
    pids = [p.pid for p in procs]
    dirs = [p.dir for p in procs]
    assert len({p.port for p in procs}) == 5
    s.stop()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not any(d.exists() for d in dirs)


def test_sentinel_old_master_rejoins_as_replica(sentinel_set: SentinelSet) -> None:
    s = sentinel_set
    s.master.command("SET", "k", "v")
    old = s.kill_master()
    new_port = s.wait_failover(old.port, all_sentinels=True)
    assert set(s.master_ports().values()) == {new_port}
    s.master.command("SET", "k2", "v2")
    assert s.restart_old_master_as_replica(replicaof_in_config=True) is old
    info = old.info("replication")
    assert info["role"] == "slave" and info["master_port"] == str(new_port)
    assert old.command("GET", "k2") == b"v2"
    # Sentinel's CONFIG REWRITE made the promotion stick in the new master's config file.
    assert "replicaof" not in s.master.conf_path.read_text()


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


def test_a_child_started_without_a_log_leaves_no_temp_log_behind_once_we_exit(tmp_path: object) -> None:
    """ZschedProc's default log is a temp file: readable while we run, gone when we exit."""
    import subprocess
    import sys

    code = (
        "from scheduler.shell.servers.zsched import ZschedProc\n"
        "p = ZschedProc(['--version'], metrics=False).start()\n"
        "p.wait(30)\n"
        "assert p.output().strip(), 'no output while we run'\n"
        "print(p.log)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    log = out.stdout.strip().splitlines()[-1]
    assert "zsched-proc-" in log, out.stdout
    assert not os.path.exists(log), f"{log} was left behind"
