"""Sharded pub/sub (SPUBLISH/SSUBSCRIBE on channels in each partition's slot): the scripts and the
clients publish on the tagged channels, and workers and the scheduler tier wake up from them.

On a single redis-server 7 with ``sharded_pubsub=True`` (the layout a cluster gets automatically),
and on a real 3-master Redis Cluster through a ``redis+cluster://`` URL.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from scheduler import Client, JobState
from scheduler.protocol.connection import async_redis, sync_redis
from scheduler.protocol.ids import decode_id, partition_for_key, partition_of
from scheduler.protocol.pubsub import subscription
from scheduler.shell.servers.cluster import slot_of
from scheduler.testing.transitions import Ops
from scheduler.tier import SchedulerConfig, SchedulerProcess
from tests.integration.test_worker_support import serving, wait_for
from workers import Job, Worker
from workers.fetch import FetchContext, PubSubFetch

NS = "shard"
PARTS = 4
NOTIFIED_WITHIN = 1.0  # seconds: a notification, where the safety-net sweep would take 20 s or more
IDLE_SWEEP = 30.0


def _partition(job_id: str, partitions: int = PARTS) -> int:
    return partition_of(decode_id(job_id), partitions)


class Listener:
    """A redis-py subscriber: SSUBSCRIBE to every channel of the namespace's sharded layout, plus a
    pattern subscription that would see any plain PUBLISH (patterns never see SPUBLISH)."""

    def __init__(self, url: str, client: Client, queue: str) -> None:
        ks = client.keyspace
        assert ks.sharded
        self.channels = [*ks.ready_channels(queue), *ks.wake_channels(), *ks.epoch_reset_channels(),
                         ks.config_channel]
        self.redis = redis.Redis.from_url(url)
        self.sharded = self.redis.pubsub()
        self.sharded.ssubscribe(*self.channels)
        self.plain = self.redis.pubsub()
        self.plain.psubscribe("*")
        # both subscriptions confirmed before anything is published
        for ps, n in ((self.sharded, len(self.channels)), (self.plain, 1)):
            got = 0
            while got < n:
                msg = ps.get_message(timeout=5)
                assert msg is not None, "subscription not confirmed"
                got += msg["type"] in ("ssubscribe", "psubscribe")

    def next(self, timeout: float = 2.0) -> tuple[str, bytes]:
        """The next sharded message: (channel, payload)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.sharded.get_message(timeout=0.1)
            if msg is not None:
                assert msg["type"] == "smessage", msg
                return msg["channel"].decode(), msg["data"]
        raise AssertionError(f"no sharded message within {timeout} s")

    def no_plain_messages(self) -> None:
        msg = self.plain.get_message(timeout=0.2)
        assert msg is None, f"a plain PUBLISH reached the pattern subscriber: {msg}"

    def close(self) -> None:
        self.sharded.close()
        self.plain.close()
        self.redis.close()


def test_scripts_and_clients_spublish_on_the_partitions_channels(redis_url: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=PARTS, sharded_pubsub=True).connect()
    ks = client.keyspace
    ops = Ops(client)
    sub = Listener(redis_url, client, "q")
    try:
        # schedule, due now: the ready list of its partition
        jid = client.schedule(0, "now", queue="q")
        p = _partition(jid)
        assert sub.next() == (f"{{{NS}:{p}}}:ready:q", str(p).encode())
        # schedule before the partition's earliest timer: its owner's wake channel
        jid = client.schedule(time.time() + 0.2, "soon", queue="q")
        p = _partition(jid)
        assert sub.next() == (f"{{{NS}:{p}}}:wake", str(p).encode())
        # tick fires it onto the ready list
        assert wait_sync(lambda: ops.tick_all() == 1, 3)
        assert sub.next() == (ks.ready_channel("q", p), str(p).encode())
        # epoch reset (operator repair)
        assert ops.run("tick", p, 7, 100, client.calls.tomb_ms)[0] == 0
        assert ops.run("epoch_reset", p, 7)[0] == 1
        assert sub.next() == (ks.epoch_reset_channels()[p], str(p).encode())
        # namespace config: SPUBLISH in the slot of {ns}:cfg, in the same MULTI as the write
        client.set_rate_limit("q", 10)
        assert sub.next() == (f"{{{NS}}}:config", b"rate")
        sub.no_plain_messages()
    finally:
        sub.close()
        client.close()


def test_plain_layout_is_unchanged(redis_url: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=PARTS).connect()
    assert not client.keyspace.sharded  # a single redis-server: automatic means plain
    r = redis.Redis.from_url(redis_url)
    ps = r.pubsub()
    ps.subscribe(f"{NS}:ready:q", f"{NS}:wake")
    for _ in range(2):
        msg = ps.get_message(timeout=5)
        assert msg is not None and msg["type"] == "subscribe"
    jid = client.schedule(0, "now", queue="q")
    msg = ps.get_message(timeout=2)
    assert msg is not None, "no plain ready message"
    assert (msg["type"], msg["channel"], msg["data"]) == ("message", f"{NS}:ready:q".encode(),
                                                          str(_partition(jid)).encode())
    ps.close()
    r.close()
    client.close()


def wait_sync(cond: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while not (v := cond()):
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)
    return v


# --------------------------------------------------------------------------- worker


class CountingFetch(PubSubFetch):
    """The default fetch strategy, counting its sweeps: the one after each (re-)subscription, and
    the safety net, IDLE_SWEEP * 0.8 or more away."""

    sweeps = 0

    def mark_all(self) -> None:
        self.sweeps += 1
        super().mark_all()


def _fetch(made: list[CountingFetch]) -> Callable[[FetchContext], CountingFetch]:
    """A ``Worker(fetch=...)`` factory recording the strategy it makes."""

    def make(ctx: FetchContext) -> CountingFetch:
        made.append(CountingFetch(ctx))
        return made[-1]

    return make


def _worker(url: str, made: list[CountingFetch], sharded: bool = False) -> Worker:
    """``sharded``: the worker's own switch (``Worker(sharded_pubsub=True)``, what a worker on a
    cluster gets by itself); otherwise automatic."""
    w = Worker.from_url(url, namespace=NS, queues=["q"], idle_sweep=IDLE_SWEEP, fetch=_fetch(made),
                        sharded_pubsub=True if sharded else None)

    @w.handler("q")
    async def handle(job: Job) -> None:
        pass

    return w


async def _sweep_done(worker: Worker, fetch: CountingFetch, after: int = 0) -> None:
    """Wait until the worker swept more than ``after`` times and claimed what it found: no
    candidate left, every handler slot free. Until its safety net, only a notification can make
    it claim again."""
    await wait_for(lambda: fetch.sweeps > after and not fetch.planner.has_candidates()
                   and fetch.ctx.slots.free == worker.concurrency, 10, what=f"sweep {after + 1}")


async def _picked_up_by_notification(worker: Worker, fetch: CountingFetch, client: Client,
                                     keys: Sequence[str | None] = (None,) * 3) -> None:
    """Once the sweep is over, due-now jobs (with ``keys``) are claimed within NOTIFIED_WITHIN:
    by notification."""
    for n, key in enumerate(keys):
        t0 = time.monotonic()
        jid = client.schedule(0, n, queue="q", key=key)
        await wait_for(lambda n=n: worker.stats.acked > n, 5, what=f"job {n}")
        assert time.monotonic() - t0 < NOTIFIED_WITHIN, f"job {n} waited for a sweep"
        assert client.get(jid).state is JobState.DONE


async def test_worker_claims_on_a_sharded_notification(redis_url: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=PARTS, sharded_pubsub=True).connect()
    made: list[CountingFetch] = []
    w = _worker(redis_url, made, sharded=True)
    async with serving(w):
        await _sweep_done(w, made[0])
        await _picked_up_by_notification(w, made[0], client)
    assert made[0].sweeps == 1
    client.close()


async def test_plain_subscriber_misses_sharded_notifications(redis_url: str) -> None:
    """The control for the test above: a worker listening on the plain layout is not told, so the
    bound there is met only through the sharded notification."""
    client = Client.from_url(redis_url, namespace=NS, partitions=PARTS, sharded_pubsub=True).connect()
    made: list[CountingFetch] = []
    w = _worker(redis_url, made)
    async with serving(w):
        assert not made[0].ctx.calls.ks.sharded
        await _sweep_done(w, made[0])
        client.schedule(0, "x", queue="q")
        await asyncio.sleep(NOTIFIED_WITHIN)
        assert w.stats.claimed == 0
    client.close()


# --------------------------------------------------------------------------- scheduler tier


async def _tier_wakes(url: str, etcd: str, client: Client, sharded: bool | None) -> None:
    """A sleeping owner fires a job scheduled before its earliest timer at once (sharded wake),
    reloads the config from the config channel and retries at once on an epoch reset."""
    proc = SchedulerProcess(SchedulerConfig(redis_url=url, etcd_endpoints=etcd, namespace=NS, replica_id="solo",
                                            lease_ttl=2.0, sharded_pubsub=sharded))
    proc.cfg.runner.idle_check = 30.0  # only a wake-up can make it fire in time
    task = asyncio.create_task(proc.run())
    try:
        await wait_for(lambda: 0 in proc.runners, 5, what="the replica to own the partition")
        assert proc.client.keyspace.sharded
        client.schedule(time.time() + 3600, "far")
        await asyncio.sleep(0.3)  # the owner now sleeps on the 1 h timer
        at = time.time() + 0.05
        jid = client.schedule(at, "soon")
        while client.get(jid).state is not JobState.READY:
            assert time.time() < at + 1, "job 50 ms ahead did not fire"
            await asyncio.sleep(0.002)
        assert time.time() - at < 0.1

        # config: reloaded by the wake listener (the poller would take up to 5 s)
        loaded_by: list[str] = []
        load = proc._load_config

        async def recording_load() -> None:
            task = asyncio.current_task()
            loaded_by.append(task.get_name() if task else "")
            await load()

        proc._load_config = recording_load  # type: ignore[method-assign]
        client.set_rate_limit("q", 5)
        await wait_for(lambda: "wake-listener" in loaded_by, 2, what="the config notice")
        assert proc.rate_limits == {"q": (5.0, 1.25)}

        # epoch reset: the owner is told to retry at once
        retried = asyncio.Event()
        runner = proc.runners[0]
        runner.retry_now = retried.set  # type: ignore[method-assign]
        epoch = int(redis_meta_epoch(client))
        assert Ops(client).run("epoch_reset", 0, epoch)[0] == 1
        await asyncio.wait_for(retried.wait(), 2)
    finally:
        proc.stop()
        await asyncio.wait_for(task, 10)


def redis_meta_epoch(client: Client) -> bytes:
    return client.redis.hget(client.keyspace.key(0, "meta"), "epoch") or b"0"


async def test_tier_wakes_on_sharded_messages(redis_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=1, sharded_pubsub=True).connect()
    await _tier_wakes(redis_url, etcd_endpoint, client, True)
    client.close()


# --------------------------------------------------------------------------- Redis Cluster


def test_cluster_clients_spublish_to_the_owning_node(redis_cluster_url: str) -> None:
    client = Client.from_url(redis_cluster_url, namespace=NS, partitions=PARTS).connect()
    ks = client.keyspace
    assert ks.sharded, "a cluster client uses sharded pub/sub by itself"
    rc = sync_redis(redis_cluster_url)
    ps = rc.pubsub()
    for ch in ks.ready_channels("q"):
        ps.ssubscribe(ch)
    confirmed = 0
    deadline = time.monotonic() + 5
    while confirmed < PARTS:
        assert time.monotonic() < deadline, "sharded subscriptions not confirmed"
        msg = ps.get_sharded_message(timeout=0.1)
        confirmed += msg is not None and msg["type"] == "ssubscribe"
    jids = client.schedule_many([(0, n) for n in range(20)], queue="q")
    expected = {(ks.ready_channel("q", p), str(p).encode()) for p in {_partition(j) for j in jids}}
    got: set[tuple[str, bytes]] = set()
    deadline = time.monotonic() + 5
    while got != expected:
        assert time.monotonic() < deadline, f"got {got}, expected {expected}"
        msg = ps.get_sharded_message(timeout=0.1)
        if msg is not None and msg["type"] == "smessage":
            got.add((msg["channel"].decode(), msg["data"]))
    # the config notice rides in the MULTI of the config write, on the node of {ns}:cfg
    client.set_rate_limit("q", 10)
    assert client.rate_limits() == {"q": (10.0, 2.5)}
    ps.close()
    rc.close()
    client.close()


async def test_cluster_subscription_hears_every_node_at_once(redis_cluster_url: str) -> None:
    """One subscription over partitions on 3 masters: a message published on any node arrives at
    once, without waiting on the other nodes' connections."""
    client = Client.from_url(redis_cluster_url, namespace=NS, partitions=PARTS * 4).connect()
    ks = client.keyspace
    r = async_redis(redis_cluster_url)
    pub = async_redis(redis_cluster_url)
    sub = subscription(r, True)
    try:
        await sub.subscribe(ks.wake_channels())
        confirmed = 0
        while confirmed < ks.partitions:
            msg = await sub.get_message(timeout=5)
            assert msg is not None and msg["type"] == "subscribe", msg
            confirmed += 1
        nodes = {r.get_node_from_key(ks.prefix(p)).name for p in range(ks.partitions)}
        assert len(nodes) == 3, "the partitions span every master"
        for p in range(ks.partitions):
            t0 = time.monotonic()
            await pub.spublish(ks.wake_channels()[p], str(p))
            msg = await sub.get_message(timeout=2)
            assert msg is not None and (msg["type"], msg["channel"], msg["data"]) == (
                "message", ks.wake_channels()[p].encode(), str(p).encode())
            assert time.monotonic() - t0 < 0.5
        await sub.ping()
        msg = await sub.get_message(timeout=2)
        assert msg is not None and msg["type"] == "pong", "every node answers the ping"
    finally:
        await sub.aclose()
        await r.aclose()
        await pub.aclose()
        client.close()


async def test_cluster_worker_claims_on_a_notification(redis_cluster_url: str) -> None:
    client = Client.from_url(redis_cluster_url, namespace=NS, partitions=PARTS * 4).connect()
    made: list[CountingFetch] = []
    w = _worker(redis_cluster_url, made)
    async with serving(w):
        assert made[0].ctx.calls.ks.sharded, "a cluster worker uses sharded pub/sub by itself"
        await _sweep_done(w, made[0])
        await _picked_up_by_notification(w, made[0], client)
    client.close()


async def test_cluster_tier_wakes_on_sharded_messages(redis_cluster_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(redis_cluster_url, namespace=NS, partitions=1).connect()
    await _tier_wakes(redis_cluster_url, etcd_endpoint, client, None)
    client.close()


async def test_cluster_worker_follows_a_partitions_slot_move(redis_cluster_factory: Callable[..., Any]) -> None:
    """Reshard the slot of one partition to another master while a worker listens: the worker
    subscribes again on the new owner and is still told of jobs landing there."""
    cluster = redis_cluster_factory(masters=3)
    client = Client.from_url(cluster.url, namespace=NS, partitions=PARTS * 4).connect()
    ks = client.keyspace
    p = 5
    keys = [k for k in (f"k{n}" for n in range(1000)) if partition_for_key(k, ks.partitions) == p][:3]
    slot = slot_of(ks.prefix(p))
    src = cluster.node_for_slot(slot)
    dst = next(m for m in cluster.masters() if m is not src)
    channel = ks.ready_channel("q", p)
    made: list[CountingFetch] = []
    w = _worker(cluster.url, made)

    def subscribers(node: Any) -> int:
        return int(node.command("PUBSUB", "SHARDNUMSUB", channel)[1])

    async with serving(w):
        fetch = made[0]
        await _sweep_done(w, fetch)
        assert subscribers(src) == 1
        await asyncio.to_thread(cluster.move_slots, [slot], src, dst)
        await wait_for(lambda: subscribers(dst) == 1, 10, what="the subscription to follow the slot")
        assert subscribers(src) == 0
        await _sweep_done(w, fetch, after=1)  # the sweep after subscribing again
        await _picked_up_by_notification(w, fetch, client, keys)  # jobs in partition p
    client.close()
