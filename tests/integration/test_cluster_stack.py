"""The client, transport, worker and CLI on a Redis Cluster: ``durable=`` means the same as on one
server, a master that is down does not hold back the others, an unreachable cluster is "cannot
reach Redis".

The cluster tests of the whole stack under faults are in tests/fault/test_cluster_faults.py; the
end-to-end tests run on both backends (``tests.support.helpers.on_both_backends``)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import redis
import redis.asyncio.cluster as acluster
from redis.exceptions import ClusterDownError, SlotNotCoveredError
from redis.exceptions import ConnectionError as RedisConnectionError

from scheduler import AsyncClient, Client, JobState
from scheduler.protocol.errors import DurabilityUnsupported
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.replies import StatsReply, parse_stats
from scheduler.redisio.routing import slot_of
from scheduler.redisio.transport import NodeFailed, RedisRetry
from scheduler.redisio.transport_async import AsyncScriptTransport
from scheduler.shell.cli import main
from scheduler.shell.servers import HOST, free_port
from tests.support.helpers import key_in
from tests.support.servers import ClusterServer, ClusterSet
from tests.support.waits import wait_for, wait_until
from tests.support.workers import serving
from workers import Job, Worker

REDIS_PY = tuple(int(x) for x in redis.__version__.split(".")[:2])  # the CLUSTERDOWN control's expectation

LATER = 3600.0  # seconds ahead: nothing fires during the test


MF_TIMEOUT = 5.0  # seconds: Redis 7.0 abandons a manual failover not done by then (CLUSTER_MF_TIMEOUT)


def manual_failover(cluster: ClusterSet, master: ClusterServer) -> ClusterServer:
    """``CLUSTER FAILOVER`` on ``master``'s replica (coordinated: nothing is lost); returns it once
    it is the master and every node agrees. Clients that read the slot map before still send
    that slot's calls to the old master, which now answers ``MOVED``.

    Redis abandons a manual failover after 5 s, silently, and its election can lose a round (a
    vote refused, an election timeout of 2 node timeouts), which on a loaded machine used every
    one of those 5 s in a full-suite run (2026-12-04, a loaded machine); the command is given again then, as an
    operator would, up to 3 times. The replica has everything first (a manual failover waits for
    that inside its 5 s) and every node agrees on the epoch (a stale one is refused its votes)."""
    replica = cluster.replicas_of(master)[0]
    cluster.wait_replicated()
    wait_until(lambda: len({n.cluster_info()["cluster_current_epoch"] for n in cluster.running()}) == 1, 10,
               what="the nodes to agree on the cluster's current epoch")

    def promoted() -> bool:
        return replica.myself().is_master and not master.myself().is_master

    for attempt in range(1, 4):
        if not replica.myself().is_master:  # else the last one was won just after the wait gave up
            replica.command("CLUSTER", "FAILOVER")
        try:
            wait_until(promoted, MF_TIMEOUT + 1, what=f"the manual failover (attempt {attempt})")
            break
        except AssertionError:
            if attempt == 3:
                raise AssertionError(f"3 manual failovers of {master!r} to {replica!r} abandoned; the replica's "
                                     f"log:\n{replica.log_tail()}") from None
    cluster.wait_ok()
    return replica


async def test_durable_schedule_through_a_stale_slot_map_follows_moved_and_is_confirmed(
        redis_cluster_replicas: ClusterSet) -> None:
    """The clients still route a partition to its old master, now a replica: the script is
    answered MOVED and the WAIT sent after it "WAIT cannot be used with replica instances". That
    WAIT confirmed nothing (nothing ran there); the call goes to the new master, whose WAIT
    answers for it. (It used to raise DurabilityError: the weakest reply was the replica's error.)"""
    cluster = redis_cluster_replicas
    parts = 4
    sync = Client.from_url(cluster.url, namespace="stale", partitions=parts, durable="replica",
                           durable_timeout=2.0).connect()
    aio = AsyncClient.from_url(cluster.url, namespace="stale", partitions=parts, durable="replica", durable_timeout=2.0)
    try:
        # on a cluster a schedule call declares every partition key (a migrating slot is judged by them)
        assert sync.calls.declare_all_keys and (await aio.connect()).calls.declare_all_keys
        old = cluster.node_for_key(sync.keyspace.prefix(0))
        # both clients read the slot map now
        first = [sync.schedule(time.time() + LATER, "s", key=key_in(0, parts, "s0")),
                 await aio.schedule(time.time() + LATER, "a", key=key_in(0, parts, "a0"))]
        new = await asyncio.to_thread(manual_failover, cluster, old)
        ids = [sync.schedule(time.time() + LATER, "s", key=key_in(0, parts, "s1")),
               await aio.schedule(time.time() + LATER, "a", key=key_in(0, parts, "a1")),
               *sync.schedule_many([(time.time() + LATER, "m", key_in(p, parts, "m")) for p in range(parts)])]
        assert cluster.node_for_key(sync.keyspace.prefix(0)) is new
        for jid in first + ids:
            info = sync.get(jid)
            assert info is not None and info.state is JobState.SCHEDULED, jid
    finally:
        sync.close()
        await aio.close()


def test_durable_fsync_is_refused_before_writing_on_a_cluster_without_waitaof(redis_cluster_url: str) -> None:
    """Every master is asked for its version (a batch's WAITAOF goes to each node it touched)."""
    c = Client.from_url(redis_cluster_url, namespace="durf", partitions=4)
    try:
        with pytest.raises(DurabilityUnsupported, match="WAITAOF.*7.2"):
            c.schedule_many([(time.time() + LATER, p, key_in(p, 4, "f")) for p in range(4)], durable="fsync")
        assert c.stats() == {}, "nothing may be written when the durability cannot be given"
    finally:
        c.close()


# --------------------------------------------------------------------------- a master down for good


@pytest.fixture
def degraded_cluster(redis_cluster_factory: Callable[..., ClusterSet]) -> ClusterSet:
    """3 masters without replicas that keep serving their slots when one of them is down
    (``cluster-require-full-coverage no``)."""
    return redis_cluster_factory(3, redis_args=["--cluster-require-full-coverage", "no"])


def split(cluster: ClusterSet, ks: Keyspace) -> tuple[ClusterServer, list[int], list[int]]:
    """The master of partition 0, the partitions it owns and the others'."""
    victim = cluster.node_for_key(ks.prefix(0))
    parts = range(ks.partitions)
    down = [p for p in parts if cluster.node_for_key(ks.prefix(p)) is victim]
    up = [p for p in parts if p not in down]
    assert up, "every partition on one master: pick another namespace"
    return victim, down, up


async def test_a_batch_with_one_node_down_returns_the_others_replies_at_once(degraded_cluster: ClusterSet) -> None:
    """``raise_on_error=False`` (the workers' round trips): the down node's calls come back as
    NodeFailed without waiting out the retry budget, the other nodes' calls are answered;
    ``raise_on_error=True`` raises the node's error as before."""
    client = AsyncClient.from_url(degraded_cluster.url, namespace="iso", partitions=8)
    await client.connect()
    ks = client.keyspace
    victim, down, up = split(degraded_cluster, ks)
    victim.kill()  # by pid; the cluster stays ok for the others (no full coverage required)
    calls = client.calls.stats_calls()
    slow = RedisRetry(budget=5.0, attempts=100)
    try:
        t0 = time.monotonic()
        replies = await client.transport.call_many(calls, raise_on_error=False, retry=slow)
        took = time.monotonic() - t0
        assert all(isinstance(replies[p], NodeFailed) for p in down), replies
        assert not any(isinstance(replies[p], Exception) for p in up), replies
        assert took < 2.0, f"waited {took:.2f}s for a node that is down (retry budget 5 s)"
        with pytest.raises(RedisConnectionError):
            await client.transport.call_many(calls, retry=RedisRetry(budget=0.2, attempts=3))
    finally:
        await client.close()


async def in_flight_while_redis_py_resets(cluster: ClusterSet, client: AsyncClient, transport: Any,
                                         reset_by: Any) -> Any:
    """A worker's round trip (``stats`` on a partition of one master, held there by a stall)
    while ``reset_by`` (a redis-py cluster client) gets CLUSTERDOWN from another master for a
    slot it no longer serves; returns the round trip's reply."""
    ks = client.keyspace
    bell = ks.bell("q")
    refusing = cluster.node_for_key(bell)
    p = next(p for p in range(ks.partitions) if cluster.node_for_key(ks.prefix(p)) is not refusing)
    held = cluster.node_for_key(ks.prefix(p))
    calls = [client.calls.stats_call(p)]
    await transport.call_many(calls)  # connected and routed before the stall
    slot = slot_of(bell)
    refusing.command("CLUSTER", "DELSLOTS", slot)
    try:
        with held.stall(900):
            trip = asyncio.create_task(transport.call_many(calls, raise_on_error=False, resend=False))
            await asyncio.sleep(0.3)  # written, waiting for the reply (the stall lasts 0.9 s)
            assert not trip.done()
            with pytest.raises((ClusterDownError, SlotNotCoveredError)):
                await reset_by.get(bell)  # redis-py closes every node's connections here
            return (await trip)[0]
    finally:
        refusing.command("CLUSTER", "ADDSLOTS", slot)


async def test_a_command_refused_with_clusterdown_does_not_drop_script_calls_in_flight_elsewhere(
        degraded_cluster: ClusterSet) -> None:
    """redis-py 8.1's cluster client answers CLUSTERDOWN (a failover under way, a slot not served)
    by closing every connection to every node, also those a round trip is reading replies from on
    a healthy master. A worker's bell wait and a replica's rings, pings and pipelines go through its
    Redis client while its claims are in flight; a claim that ran and lost its reply left its jobs
    waiting for their leases to expire (seen as a 4 s stall in the cluster failover test). The
    transport's calls go through a client of their own, so they are answered. The control, a
    transport given a plain redis-py client (shared as given), pins what each redis-py version the
    project allows does: 8.1 drops the call in flight; 8.2 lets it finish (it reconnects a
    connection in use after its reply; the transport keeps its own client all the same). A
    version that changes it again fails the control."""
    client = AsyncClient.from_url(degraded_cluster.url, namespace="reset", partitions=8)
    await client.connect()
    plain = acluster.RedisCluster(host=HOST, port=degraded_cluster.startup_nodes[0][1])
    shared = AsyncScriptTransport(plain, RedisRetry(budget=0.5, attempts=4))
    try:
        reply = await in_flight_while_redis_py_resets(degraded_cluster, client, client.transport, client.redis)
        assert not isinstance(reply, Exception), reply
        assert isinstance(parse_stats(reply), StatsReply)
        control = await in_flight_while_redis_py_resets(degraded_cluster, client, shared, plain)
        if REDIS_PY < (8, 2):
            assert isinstance(control, NodeFailed) and control.sent, control
        else:
            assert not isinstance(control, Exception), control
            assert isinstance(parse_stats(control), StatsReply)
    finally:
        await shared.close()
        await plain.aclose()
        await client.close()


async def test_a_round_trip_to_one_node_makes_no_task_and_several_nodes_are_asked_at_once(
        redis_cluster_url: str) -> None:
    """Most of a worker's round trips go to one node (a claim, the acks of a partition, the
    registry): the transport awaits that round trip itself. Gathering it made a task and an
    event-loop turn per round trip, about a quarter of the client's CPU for one (80 against 106
    µs, docs/scaling.md). Calls on several nodes still go out concurrently, a task per node."""
    client = AsyncClient.from_url(redis_cluster_url, namespace="tasks", partitions=8)
    await client.connect()
    node_of = {p: client.redis.get_node_from_key(client.calls.ks.key(p, "q")).name for p in range(8)}
    one = [client.calls.stats_call(0), *(client.calls.stats_call(p) for p in range(1, 8) if node_of[p] == node_of[0])]
    other = next(p for p in range(8) if node_of[p] != node_of[0])
    loop = asyncio.get_running_loop()
    made: list[Any] = []

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append(coro)
        return asyncio.Task(coro, loop=loop, **kwargs)

    try:
        await client.transport.call_many([*one, client.calls.stats_call(other)])  # connected to both nodes
        loop.set_task_factory(counting)
        replies = await client.transport.call_many(one)
        assert made == [] and all(isinstance(parse_stats(r), StatsReply) for r in replies)
        replies = await client.transport.call_many([one[0], client.calls.stats_call(other)])
        assert len(made) == 2 and all(isinstance(parse_stats(r), StatsReply) for r in replies)
    finally:
        loop.set_task_factory(None)
        await client.close()


async def test_worker_keeps_running_jobs_on_the_other_masters_while_one_is_down(
        degraded_cluster: ClusterSet, caplog: pytest.LogCaptureFixture) -> None:
    """A worker serving partitions on three masters, one of which dies for good: jobs on the
    other two are still claimed, run and acked (claims and acks of the dead node come back as
    NodeFailed per call; its wake-up channels are left out of the subscription and retried)."""
    url, ns = degraded_cluster.url, "iso-w"
    client = Client.from_url(url, namespace=ns, partitions=8).connect()
    ran: list[str] = []
    # frequent sweeps: every one also claims on the dead master's partitions
    w = Worker.from_url(url, namespace=ns, queues=["q"], idle_sweep=0.2)

    @w.handler("q")
    async def handle(job: Job) -> None:
        ran.append(job.id)

    try:
        victim, down, up = split(degraded_cluster, client.keyspace)
        async with serving(w):
            before = client.schedule(timedelta(0), "warm-up", queue="q", key=key_in(up[0], 8, "warm"))
            await wait_for(lambda: w.stats.acked == 1, 5, what="a job before the kill")
            caplog.set_level(logging.WARNING, logger="zsched.worker")
            victim.kill()  # by pid; the cluster stays ok for the others (no full coverage required)
            await wait_for(lambda: any(r.getMessage().startswith("claim: Redis unavailable") for r in caplog.records),
                           5, what="a sweep to claim on the dead master")
            ids = [client.schedule(timedelta(0), p, queue="q", key=key_in(p, 8, "after")) for p in up]
            await wait_for(lambda: set(ids) <= set(ran), 10, what="jobs on the masters still up")
            await wait_for(lambda: w.stats.acked == len(ids) + 1, 5, what="their acks")
            assert all(client.get(i).state is JobState.DONE for i in [before, *ids])
    finally:
        client.close()


def test_cli_with_an_unreachable_cluster_says_so_and_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    """The blocking cluster client reads the slot map when it is made: no node answering is
    "cannot reach Redis" (exit 3), as for one server, not a traceback."""
    ports = [free_port(), free_port()]
    url = "redis+cluster://u:secret@" + ",".join(f"127.0.0.1:{p}" for p in ports)
    rc = main(["stats", "--redis", url, "--namespace", "gone"])
    err = capsys.readouterr().err
    assert rc == 3 and "cannot reach Redis" in err and "secret" not in err, err
    with pytest.raises(RedisConnectionError, match="no node of the cluster answered"):
        Client.from_url(url)
