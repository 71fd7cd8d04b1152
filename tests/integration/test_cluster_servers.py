"""Proves the Redis Cluster harness: ``scheduler.shell.servers.ClusterSet`` (formation, slots,
online resharding) and the fault helpers of ``tests/support/servers.py`` (kill -9 of a master), against
redis-py's ``RedisCluster``, which follows MOVED and ASK."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from scheduler.shell.servers import CLUSTER_SLOTS, ServerError, parse_cluster_nodes, slot_of
from tests.support.servers import ClusterServer, ClusterSet
from tests.support.waits import wait_until

MEASURED: dict[str, float] = {}  # printed with -s: the figures the harness is tuned for


@contextmanager
def cluster_client(c: ClusterSet, **kw: Any) -> Iterator[RedisCluster]:
    """redis-py's RedisCluster on the harness's startup nodes."""
    rc = RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in c.startup_nodes],
        socket_timeout=2,
        socket_connect_timeout=1,
        **kw,
    )
    try:
        yield rc
    finally:
        rc.close()


def _retry(fn: Callable[[], object], timeout: float) -> object:
    """Call ``fn`` until it stops raising a failover-time error (for up to ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_parse_cluster_nodes_reads_roles_slots_and_open_slots() -> None:
    text = (
        "a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 [77->-b2]\n"
        "b2 127.0.0.1:7002@17002,host master - 0 10 2 connected 5461 5462-10922\n"
        "c3 127.0.0.1:7003@17003 slave a1 0 10 1 connected\n"
        "d4 :0@0 master,fail,noaddr - 0 10 3 disconnected\n"
    )
    a, b, r, dead = parse_cluster_nodes(text)
    assert (a.node_id, a.port, a.is_master, a.slots, a.open_slots) == ("a1", 7001, True, ((0, 5460),), ("[77->-b2]",))
    assert b.slots == ((5461, 5461), (5462, 10922)) and b.port == 7002
    assert (r.is_master, r.master_id) == (False, "a1")
    assert dead.failing and dead.port == 0 and dead.slots == ()


def test_slot_of_matches_redis_and_hash_tags(redis_cluster: ClusterSet) -> None:
    node = redis_cluster.masters()[0]
    for key in ("foo", "{ns:7}:t", "{ns:7}:r:default", "", "x{}y"):
        assert slot_of(key) == node.command("CLUSTER", "KEYSLOT", key)
    assert slot_of("{ns:7}:t") == slot_of(b"{ns:7}:r:q") == slot_of("ns:7")
    assert slot_of("foo") == 12182


def test_session_cluster_is_formed_with_every_slot_covered_once(redis_cluster: ClusterSet) -> None:
    c = redis_cluster
    ports = [p for _, p in c.startup_nodes]
    assert c.url == "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)
    assert len(set(ports)) == 3 and all(h == "127.0.0.1" for h, _ in c.startup_nodes)
    masters = c.masters()
    assert len(masters) == 3 and c.replicas() == []
    covered: list[int] = []
    for m in masters:
        info = m.cluster_info()
        assert info["cluster_state"] == "ok" and info["cluster_slots_ok"] == str(CLUSTER_SLOTS)
        assert info["cluster_known_nodes"] == "3" and info["cluster_size"] == "3"
        assert m.command("CONFIG", "GET", "bind") == [b"bind", b"127.0.0.1"]
        ranges = c.slots_of(m)
        assert ranges, f"{m!r} owns no slot"
        covered += [s for lo, hi in ranges for s in range(lo, hi + 1)]
    assert sorted(covered) == list(range(CLUSTER_SLOTS))  # every slot, exactly once
    assert c.problems() == []
    for slot in (0, 5460, 5461, 12182, CLUSTER_SLOTS - 1):
        owner = c.node_for_slot(slot)
        assert any(lo <= slot <= hi for lo, hi in c.slots_of(owner))
    with pytest.raises(ServerError, match="out of range"):
        c.node_for_slot(CLUSTER_SLOTS)


def test_key_set_through_redis_py_cluster_is_readable(redis_cluster_url: str, redis_cluster: ClusterSet) -> None:
    c = redis_cluster
    keys = {f"{{ns:{i}}}:t": str(i) for i in range(30)}  # 30 hash tags: spread over the 3 masters
    with cluster_client(c) as rc:
        for k, v in keys.items():
            assert rc.set(k, v)
        for k, v in keys.items():
            assert rc.get(k) == v.encode()
            owner = c.node_for_key(k)
            assert rc.get_node_from_key(k).port == owner.port  # redis-py and the harness agree
            assert owner.command("GET", k) == v.encode()  # the key lives on the owner of its slot
    assert len({c.node_for_key(k).port for k in keys}) == 3
    assert sum(m.command("DBSIZE") for m in c.masters()) == len(keys)


def test_session_cluster_url_fixture_starts_empty(redis_cluster_url: str, redis_cluster: ClusterSet) -> None:
    assert redis_cluster_url == redis_cluster.url
    assert all(m.command("DBSIZE") == 0 for m in redis_cluster.masters())


class Writer(threading.Thread):
    """Keeps writing to one slot through redis-py's RedisCluster: a new key per round (ASK to the
    target while the slot migrates) and an INCR of one existing key; counts acknowledged rounds."""

    def __init__(self, c: ClusterSet, tag: str) -> None:
        super().__init__(daemon=True)
        self.c, self.tag = c, tag
        self.acked = 0
        self.error: BaseException | None = None
        self.stop_flag = threading.Event()
        self.progress = threading.Condition()

    def run(self) -> None:
        with cluster_client(self.c) as rc:
            try:
                while not self.stop_flag.is_set():
                    n = self.acked + 1
                    assert rc.set(f"{self.tag}:w{n}", n)
                    assert rc.incr(f"{self.tag}:counter") == n
                    with self.progress:
                        self.acked = n
                        self.progress.notify_all()
            except BaseException as e:  # noqa: BLE001 - reported by wait_more() and the test
                self.error = e
                with self.progress:
                    self.progress.notify_all()

    def wait_more(self, n: int, timeout: float = 30.0) -> None:
        """Return once ``n`` more rounds were acknowledged (the writer got through the current state)."""
        with self.progress:
            goal = self.acked + n
            ok = self.progress.wait_for(lambda: self.acked >= goal or self.error is not None, timeout)
        assert self.error is None, f"writer failed: {self.error!r}"
        assert ok, f"writer made no progress for {timeout}s (acked {self.acked})"


def test_move_slots_with_keys_under_concurrent_writes_loses_nothing(
    redis_cluster_factory: Callable[..., ClusterSet],
) -> None:
    c = redis_cluster_factory(3)
    tag = "{mv}"
    slot = slot_of(tag)
    src = c.node_for_slot(slot)
    dst = next(m for m in c.masters() if m is not src)
    neighbour = slot + 1 if c.node_for_slot(slot + 1) is src else slot - 1  # an empty slot moves too
    prefill = {f"{tag}:k{i}": f"v{i}" for i in range(1000)}
    with cluster_client(c) as rc:
        for i in range(0, len(prefill), 200):
            rc.mset(dict(list(prefill.items())[i : i + 200]))
        assert src.command("CLUSTER", "COUNTKEYSINSLOT", slot) == 1000

        writer = Writer(c, tag)
        writer.start()
        writer.wait_more(20)  # already writing before the move starts
        batches: list[int] = []
        asked: list[int] = []  # keys on dst that were not migrated: new keys written through -ASK

        def between_batches(s: int, moved: int) -> None:
            batches.append(moved)
            writer.wait_more(5)  # writes land while the slot is half on src, half on dst
            asked.append(dst.command("CLUSTER", "COUNTKEYSINSLOT", s) - moved)

        t0 = time.monotonic()
        moved = c.move_slots([slot, neighbour], src, dst, batch=100, on_batch=between_batches)
        MEASURED["move_slot_1000_keys_s"] = time.monotonic() - t0
        at_move_end = writer.acked
        writer.wait_more(20)  # and after it: MOVED to dst
        writer.stop_flag.set()
        writer.join(10)
        assert not writer.is_alive() and writer.error is None, repr(writer.error)

        assert len(batches) >= 10 and batches[-1] == moved  # 1000+ keys in batches of 100, writes between
        assert moved >= 1000 + 1  # the prefill, the counter and the new keys written before each batch
        assert at_move_end >= 20 + 5 * len(batches)
        # each wait_more(5) saw 5 rounds whose new keys went to dst through -ASK, but for the first
        # callback: the round in flight when the slot began migrating may have set its key on src
        # before MIGRATING (that key moved with a later batch) and be one of its 5 (seen under load)
        assert asked == sorted(asked) and asked[0] >= 4 and asked[-1] >= 5 * len(batches) - 1
        assert c.node_for_slot(slot) is dst and c.node_for_slot(neighbour) is dst
        assert rc.get(f"{tag}:k0") == b"v0"  # this client had the old owner cached: MOVED taught it
        assert rc.get_node_from_key(f"{tag}:k0").port == dst.port
        assert src.command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        n = writer.acked
        assert dst.command("CLUSTER", "COUNTKEYSINSLOT", slot) == 1000 + 1 + n
        assert rc.get(f"{tag}:counter") == str(n).encode()  # every acknowledged INCR, exactly once
        assert [rc.get(f"{tag}:w{i}") for i in range(1, n + 1)] == [str(i).encode() for i in range(1, n + 1)]
        assert all(rc.get(k) == v.encode() for k, v in prefill.items())
    for node in c.running():  # every node, replicas of the future included, agrees
        owners = {n.node_id for n in node.cluster_nodes() if any(lo <= slot <= hi for lo, hi in n.slots)}
        assert owners == {dst.node_id}
    with pytest.raises(ServerError, match="does not own"):
        c.move_slots([slot], src, dst)


def test_kill9_of_a_master_promotes_its_replica_and_it_rejoins_as_replica(
    redis_cluster_replicas: ClusterSet,
) -> None:
    c = redis_cluster_replicas
    assert len(c.masters()) == 3 and len(c.replicas()) == 3
    assert len(c.startup_nodes) == 6
    MEASURED["formation_3x2_s"] = c.formation_s or 0.0
    key = "{fo}:before"
    master = c.node_for_key(key)
    (replica,) = c.replicas_of(master)
    slots = c.slots_of(master)
    with cluster_client(c) as rc:
        assert rc.set(key, "1")
        c.wait_replicated()
        old_pid = master.pid
        t0 = time.monotonic()
        promoted = c.kill_master(master, timeout=60)
        failover_s = time.monotonic() - t0
        assert old_pid is not None and not master.running
        with pytest.raises(ProcessLookupError):
            os.kill(old_pid, 0)
        assert promoted is replica
        assert master not in c.masters() and promoted in c.masters()
        assert c.slots_of(promoted) == slots and c.node_for_key(key) is promoted
        assert all(n.cluster_info()["cluster_state"] == "ok" for n in c.running())

        _retry(lambda: rc.set("{fo}:after", "2"), 30.0)  # the same client finds the new master
        client_s = time.monotonic() - t0
        assert rc.get(key) == b"1" and rc.get("{fo}:after") == b"2"
        MEASURED["failover_kill_to_ok_s"] = failover_s
        MEASURED["failover_kill_to_client_write_s"] = client_s
        assert failover_s < 20.0, f"failover took {failover_s:.1f}s (node timeout 1 s: expected about 2-3 s)"

        t0 = time.monotonic()
        assert c.restart_node(master) is master
        MEASURED["old_master_rejoin_s"] = time.monotonic() - t0
        assert master in c.replicas_of(promoted) and master not in c.masters()
        info = master.info("replication")
        assert info["role"] == "slave" and info["master_port"] == str(promoted.port)
        assert rc.set("{fo}:later", "3")
        c.wait_replicated()
        assert master.command("DBSIZE") == promoted.command("DBSIZE") == 3
    print(f"\ncluster harness figures: { {k: round(v, 2) for k, v in MEASURED.items()} }")


def test_kill_master_refuses_a_master_without_replica(redis_cluster_factory: Callable[..., ClusterSet]) -> None:
    c = redis_cluster_factory(3)
    with pytest.raises(ServerError, match="replicas=1"):
        c.kill_master()
    assert all(n.running for n in c.nodes)


def test_killed_master_without_replica_fails_the_cluster_until_it_rejoins(
    redis_cluster_factory: Callable[..., ClusterSet],
) -> None:
    c = redis_cluster_factory(3)
    victim = c.node_for_key("{dead}")
    slots, other = c.slots_of(victim), next(m for m in c.masters() if m is not victim)
    victim.kill()  # no replica: its slots are served by nobody, so the whole cluster refuses
    wait_until(lambda: other.cluster_info(0.5)["cluster_state"] == "fail", 30, what="the cluster to notice")
    with pytest.raises(ServerError, match="to be ok"):
        c.wait_ok(timeout=0.2)
    assert c.restart_node(victim) is victim  # same ports and nodes.conf: its slots again, no data
    assert c.slots_of(victim) == slots and victim in c.masters()
    assert all(n.cluster_info()["cluster_state"] == "ok" for n in c.nodes)
    victim.stop()  # its dir is gone: it could not rejoin, and restart_node says why
    with pytest.raises(ServerError, match="keep=True"):
        c.restart_node(victim)


def test_cluster_node_moves_to_new_ports_after_losing_a_bus_port_race() -> None:
    node = ClusterServer()
    taken = node.bus_port
    with socket.socket() as s:
        s.bind(("127.0.0.1", taken))
        s.listen()
        try:
            node.start()  # the bus port is taken: redis-server exits, start() retries on new ports
            assert node.bus_port != taken
            assert node.command("CONFIG", "GET", "cluster-port") == [b"cluster-port", str(node.bus_port).encode()]
            assert node.cluster_info()["cluster_state"] == "fail"  # alone, no slots: not formed
            assert "Address already in use" in node.log.read_text()
        finally:
            node.stop()


def test_fresh_cluster_forms_and_stop_leaves_no_process_nor_dir() -> None:
    c = ClusterSet(3)
    try:
        c.start()
        assert c.formation_s is not None
        MEASURED["formation_3x1_s"] = c.formation_s
        nodes = list(c.nodes)
        pids, dirs = [n.pid for n in nodes], [n.dir for n in nodes]
        assert all(d.exists() and (d / "nodes.conf").exists() for d in dirs)
        assert len({n.port for n in nodes} | {n.bus_port for n in nodes}) == 6
    finally:
        c.stop()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not any(d.exists() for d in dirs)
