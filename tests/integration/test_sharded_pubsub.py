"""Sharded pub/sub (SPUBLISH/SSUBSCRIBE on channels in each partition's slot) and the doorbells on
Redis Cluster: the scripts publish on the tagged channels (wake, epoch reset, and "r MEMBER QUEUE"
for the partition's owner to ring a bell, which is in another slot), the owner rings the bells
(relayed messages, the queues its ticks fired into), and workers waiting on the bells claim.

On a single redis-server 7 with ``sharded_pubsub=True`` (the layout a cluster gets automatically),
and on a real 3-master Redis Cluster through a ``redis+cluster://`` URL.
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import pytest
import redis

from scheduler import Client, JobState
from scheduler.protocol.control import epoch_reset_call
from scheduler.protocol.ids import decode_id, partition_for_key, partition_of
from scheduler.protocol.replies import parse_claim
from scheduler.protocol.tick import NO_RETENTION, TickReply, parse_tick, tick_call
from scheduler.protocol.transitions import claim_call
from scheduler.redisio.connection import async_redis, sync_redis
from scheduler.redisio.pubsub import subscription
from scheduler.shell.servers.cluster import slot_of
from scheduler.testing.transitions import Ops
from scheduler.tier import SchedulerConfig, SchedulerProcess
from tests.support.helpers import key_in
from tests.support.waits import wait_for, wait_until
from tests.support.workers import serving
from workers import Job, Worker
from workers.fetch import DoorbellFetch, FetchContext

NS = "shard"
PARTS = 4
NOTIFIED_WITHIN = 1.0  # seconds: a ring, where the safety-net sweep would take 20 s or more
IDLE_SWEEP = 30.0


def _partition(job_id: str, partitions: int = PARTS) -> int:
    return partition_of(decode_id(job_id), partitions)


class Listener:
    """A redis-py subscriber: SSUBSCRIBE to every channel of the namespace's sharded layout, plus a
    pattern subscription that would see any plain PUBLISH (patterns never see SPUBLISH)."""

    def __init__(self, url: str, client: Client, queue: str) -> None:
        ks = client.keyspace
        assert ks.sharded
        self.channels = [*ks.wake_channels(), *ks.epoch_reset_channels(), ks.config_channel]
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
        # schedule, due now: the ready list of its partition; its owner is asked to ring the bell
        jid = client.schedule(timedelta(0), "now", queue="q")
        p = _partition(jid)
        assert sub.next() == (f"{{{NS}:{p}}}:wake", f"r {p} q".encode())
        # schedule before the partition's earliest timer: its owner's wake channel
        jid = client.schedule(time.time() + 0.2, "soon", queue="q")
        p = _partition(jid)
        assert sub.next() == (f"{{{NS}:{p}}}:wake", str(p).encode())
        # tick fires it onto the ready list and names the queue in its reply (no message: the
        # caller is the owner, it rings the bell itself)
        def tick_each() -> list[Any]:
            ticks = [parse_tick(ops.send(tick_call(ops.calls, q, 0, 100, {}, NO_RETENTION))) for q in range(PARTS)]
            return [t for t in ticks if isinstance(t, TickReply) and t.moved]

        fired = wait_until(tick_each, 3, what="a tick that fires")
        assert [t.to_ring for t in fired] == [[("q", False)]]
        # resume: "P:resume" for the owner to ring, on the burst bell (every idle worker hears it)
        client.pause("q")
        client.resume("q")
        assert {sub.next()[1] for _ in range(PARTS)} == {f"b {q}:resume q".encode() for q in range(PARTS)}
        # epoch reset (operator repair)
        assert ops.send(tick_call(ops.calls, p, 7, 100, {}, NO_RETENTION))[0] == 0
        assert ops.send(epoch_reset_call(ops.calls, p, 7))[0] == 1
        assert sub.next() == (ks.epoch_reset_channels()[p], str(p).encode())
        # namespace config: SPUBLISH in the slot of {ns}:cfg, in the same MULTI as the write
        client.set_rate_limit("q", 10)
        assert sub.next() == (f"{{{NS}}}:config", b"rate")
        sub.no_plain_messages()
        assert not client.redis.exists(ks.bell("q"), ks.burst_bell("q")), "no script rang a bell in another slot"
    finally:
        sub.close()
        client.close()


def test_plain_layout_rings_the_bell_and_publishes_no_ready_message(redis_url: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=PARTS).connect()
    assert not client.keyspace.sharded  # a single redis-server: automatic means plain
    r = redis.Redis.from_url(redis_url)
    ps = r.pubsub()
    ps.psubscribe("*")
    msg = ps.get_message(timeout=5)
    assert msg is not None and msg["type"] == "psubscribe"
    jid = client.schedule(timedelta(0), "now", queue="q")
    assert [m for m, _ in r.zrange(client.keyspace.bell("q"), 0, -1, withscores=True)] == \
        [str(_partition(jid)).encode()]
    assert ps.get_message(timeout=0.3) is None, "a ready message was published"
    ps.close()
    r.close()
    client.close()


def test_a_claim_without_a_handler_slot_that_stops_at_due_jobs_relays_their_ring(redis_url: str) -> None:
    """A worker claims due jobs only into free handler slots (claim's due limit); a claim with
    none (limit 0) that meets a due job comes back empty, as on an empty list. On a cluster the
    worker rings only after claims whose reply shows jobs left, so the script relays this one:
    else those jobs waited for a claim with a handler slot in their partition, which a sweep of
    more partitions than the worker has handler slots may never send (found by bench fanout on a
    3-master cluster: 19 due jobs unclaimed for over a minute). The fast path (a request id, as
    workers send claims) and the general path; the burst bell's message for 4 jobs or more."""
    ns = "shard-due"
    client = Client.from_url(redis_url, namespace=ns, partitions=1, sharded_pubsub=True).connect()
    ops = Ops(client)
    sub = Listener(redis_url, client, "q")
    wake = f"{{{ns}:0}}:wake"
    try:
        client.schedule(timedelta(0), "a", queue="q")
        assert sub.next() == (wake, b"r 0 q")
        for rid in ("w1-1", ""):
            reply = ops.send(claim_call(ops.calls, 0, "q", 2, request_id=rid, receipt_ms=60_000 if rid else 0,
                                        max_due=0))
            assert parse_claim(reply)[1] == []
            assert sub.next() == (wake, b"r 0 q"), rid
        client.schedule_many([(timedelta(0), i) for i in range(4)], queue="q")
        assert sub.next() == (wake, b"b 0 q")
        reply = ops.send(claim_call(ops.calls, 0, "q", 2, request_id="w1-2", receipt_ms=60_000, max_due=0))
        assert parse_claim(reply)[1] == []
        assert sub.next() == (wake, b"b 0 q")
        # with a handler slot the reply shows what is left (the worker rings): nothing relayed
        reply = ops.send(claim_call(ops.calls, 0, "q", 2, request_id="w1-3", receipt_ms=60_000, max_due=1))
        assert len(parse_claim(reply)[1]) == 1
        assert sub.sharded.get_message(timeout=0.3) is None
        assert client.stats()["q"]["ready"] == 4
        assert not client.redis.exists(client.keyspace.bell("q"), client.keyspace.burst_bell("q"))
    finally:
        sub.close()
        client.close()




# --------------------------------------------------------------------------- worker


class CountingFetch(DoorbellFetch):
    """The default fetch strategy, counting its sweeps: the one at start (and after an outage),
    and the safety net, IDLE_SWEEP * 0.8 or more away."""

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
    candidate left, every handler slot free. Until its safety net, only a ring can make it claim
    again."""
    await wait_for(lambda: fetch.sweeps > after and not fetch.planner.has_candidates()
                   and fetch.ctx.slots.free == worker.concurrency, 10, what=f"sweep {after + 1}")


async def _picked_up_by_ring(worker: Worker, fetch: CountingFetch, client: Client,
                             keys: Sequence[str | None] = (None,) * 3) -> None:
    """Once the sweep is over, due-now jobs (with ``keys``) are claimed within NOTIFIED_WITHIN: by
    a ring of the bell."""
    for n, key in enumerate(keys):
        t0 = time.monotonic()
        jid = client.schedule(timedelta(0), n, queue="q", key=key)
        await wait_for(lambda n=n: worker.stats.acked > n, 5, what=f"job {n}")
        assert time.monotonic() - t0 < NOTIFIED_WITHIN, f"job {n} waited for a sweep"
        assert client.get(jid).state is JobState.DONE


def _replica(url: str, etcd: str, sharded: bool | None) -> SchedulerProcess:
    return SchedulerProcess(SchedulerConfig(redis_url=url, etcd_endpoints=etcd, namespace=NS, replica_id="solo",
                                            lease_ttl=2.0, sharded_pubsub=sharded))


async def _owning(proc: SchedulerProcess, partitions: int) -> asyncio.Task[None]:
    task = asyncio.create_task(proc.run())
    await wait_for(lambda: len(proc.runners) == partitions, 10, what="the replica to own every partition")
    return task


async def test_worker_claims_on_a_ring_the_owner_relays(redis_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=PARTS, sharded_pubsub=True).connect()
    proc = _replica(redis_url, etcd_endpoint, True)
    task = await _owning(proc, PARTS)
    made: list[CountingFetch] = []
    w = _worker(redis_url, made, sharded=True)
    try:
        async with serving(w):
            await _sweep_done(w, made[0])
            await _picked_up_by_ring(w, made[0], client)
        assert made[0].sweeps == 1
    finally:
        proc.stop()
        await asyncio.wait_for(task, 10)
        client.close()


async def test_without_an_owner_a_relayed_ring_waits_for_the_sweep(redis_url: str) -> None:
    """The control for the test above: with no replica nobody rings a sharded layout's bell, so the
    bound there is met only through the owner's relay."""
    client = Client.from_url(redis_url, namespace=NS, partitions=PARTS, sharded_pubsub=True).connect()
    made: list[CountingFetch] = []
    w = _worker(redis_url, made, sharded=True)
    async with serving(w):
        await _sweep_done(w, made[0])
        client.schedule(timedelta(0), "x", queue="q")
        await asyncio.sleep(NOTIFIED_WITHIN)
        assert w.stats.claimed == 0
    client.close()


async def test_due_jobs_behind_a_sweeps_handler_slots_are_claimed_through_the_owner(
        redis_url: str, etcd_endpoint: str) -> None:
    """End to end on the cluster's layout: ready jobs whose rings were lost (deleted here, as when
    a worker took them and died) are found by a sweep, the one a worker makes when it starts. A
    worker with one handler slot sweeps 4 partitions: its plan gives the slot to partition 0 and
    claims partitions 2 and 3 without one, which stop at their due jobs and come back empty. The
    claims' relayed rings (lua/claim.lua) get those jobs claimed at once, not a later sweep
    (IDLE_SWEEP: 30 s). Before the relay, and before sweeps took turns at which partition comes
    first (workers/planner.py), such jobs waited for other traffic (bench fanout on a 3-master
    cluster: over a minute)."""
    client = Client.from_url(redis_url, namespace=NS, partitions=PARTS, sharded_pubsub=True).connect()
    ks = client.keyspace
    proc = _replica(redis_url, etcd_endpoint, True)
    task = await _owning(proc, PARTS)
    w = Worker.from_url(redis_url, namespace=NS, queues=["q"], concurrency=1, idle_sweep=IDLE_SWEEP,
                        sharded_pubsub=True)
    done: list[str] = []

    @w.handler("q")
    async def handle(job: Job) -> None:
        done.append(job.id)

    try:
        ids = [client.schedule(timedelta(0), i, queue="q", key=key_in(p, PARTS, f"behind-{i}"))
               for i, p in enumerate((2, 2, 3, 3))]
        # relayed, or (while the owner's subscription was still coming up) rung on its burst bell once it is up
        await wait_for(lambda: rung(client, "q") == {"2", "3"}, 5, what="the owner's rings")
        client.redis.delete(ks.bell("q"), ks.burst_bell("q"))  # the rings are lost
        async with serving(w):
            await wait_for(lambda: set(ids) <= set(done), 5, what="the jobs behind the sweep's handler slot")
    finally:
        proc.stop()
        await asyncio.wait_for(task, 10)
        client.close()


def rung(client: Client, queue: str) -> set[str]:
    """The partitions rung in ``queue``'s bell and burst bell."""
    ks = client.keyspace
    return {m.decode() for key in (ks.bell(queue), ks.burst_bell(queue)) for m in client.redis.zrange(key, 0, -1)}


async def test_an_owner_rings_for_jobs_made_ready_while_its_subscription_was_down(
        redis_url: str, etcd_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The replica owns the partitions before its wake-up subscription is up (at start, after a
    # lost subscription): a job scheduled due now then is relayed to nobody. Once subscribed, the
    # owner rings every queue whose ready list holds jobs, so the job does not wait for a sweep.
    from scheduler.tier import process as process_mod

    gate = asyncio.Event()

    class Gated:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def subscribe(self, channels: Any) -> None:
            await gate.wait()
            await self.inner.subscribe(channels)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    real = process_mod.subscription
    monkeypatch.setattr(process_mod, "subscription", lambda *a, **kw: Gated(real(*a, **kw)))
    client = Client.from_url(redis_url, namespace=NS, partitions=PARTS, sharded_pubsub=True).connect()
    for p in range(PARTS):  # a job ready in every partition: its owner rings it when it takes the partition
        client.schedule(timedelta(0), p, queue="marker", key=key_in(p, PARTS, f"marker-{p}"))
    proc = _replica(redis_url, etcd_endpoint, True)
    task = await _owning(proc, PARTS)
    try:
        # every partition's first look at its ready lists is over: what it rings from here is new
        await wait_for(lambda: rung(client, "marker") == {str(p) for p in range(PARTS)}, 5,
                       what="the new owner's rings")
        jid = client.schedule(timedelta(0), "missed", queue="unheard")  # relayed to nobody: not subscribed yet
        await asyncio.sleep(0.3)  # the replica's loop runs meanwhile (its ticks ring nothing: nothing to move)
        assert rung(client, "unheard") == set()
        gate.set()
        await wait_for(lambda: rung(client, "unheard") == {str(_partition(jid))}, 5, what="the ring once subscribed")
    finally:
        proc.stop()
        await asyncio.wait_for(task, 10)
        client.close()


async def test_a_new_owner_rings_for_jobs_that_became_ready_while_nobody_owned_the_partition(
        redis_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=PARTS, sharded_pubsub=True).connect()
    jid = client.schedule(timedelta(0), "orphan", queue="q")  # relayed to nobody
    assert not client.redis.exists(client.keyspace.bell("q"), client.keyspace.burst_bell("q"))
    proc = _replica(redis_url, etcd_endpoint, True)
    task = await _owning(proc, PARTS)
    try:
        # on the burst bell: a list that waited for an owner may hold many jobs
        await wait_for(lambda: client.redis.zscore(client.keyspace.burst_bell("q"), str(_partition(jid))) is not None,
                       5, what="the new owner's ring")
    finally:
        proc.stop()
        await asyncio.wait_for(task, 10)
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
        load = proc.settings.load

        async def recording_load() -> None:
            task = asyncio.current_task()
            loaded_by.append(task.get_name() if task else "")
            await load()

        proc.settings.load = recording_load  # type: ignore[method-assign]
        client.set_rate_limit("q", 5)
        await wait_for(lambda: "wake-listener" in loaded_by, 2, what="the config notice")
        assert proc.settings.rate_limits == {"q": (5.0, 1.25)}

        # epoch reset: the owner is told to retry at once
        retried = asyncio.Event()
        runner = proc.runners[0]
        runner.retry_now = retried.set  # type: ignore[method-assign]
        epoch = int(redis_meta_epoch(client))
        assert Ops(client).send(epoch_reset_call(Ops(client).calls, 0, epoch))[0] == 1
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
    for ch in ks.wake_channels():
        ps.ssubscribe(ch)
    confirmed = 0
    deadline = time.monotonic() + 5
    while confirmed < PARTS:
        assert time.monotonic() < deadline, "sharded subscriptions not confirmed"
        msg = ps.get_sharded_message(timeout=0.1)
        confirmed += msg is not None and msg["type"] == "ssubscribe"
    jids = client.schedule_many([(timedelta(0), n) for n in range(20)], queue="q")
    per = Counter(_partition(j) for j in jids)  # 4 or more ready at once in a partition: its burst bell
    expected = {(ks.wake_channels()[p], f"{'b' if n >= 4 else 'r'} {p} q".encode()) for p, n in per.items()}
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


async def test_cluster_worker_claims_on_a_ring(redis_cluster_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(redis_cluster_url, namespace=NS, partitions=PARTS * 4).connect()
    proc = _replica(redis_cluster_url, etcd_endpoint, None)
    task = await _owning(proc, PARTS * 4)
    made: list[CountingFetch] = []
    w = _worker(redis_cluster_url, made)
    try:
        async with serving(w):
            assert made[0].ctx.calls.ks.sharded, "a cluster worker uses sharded pub/sub by itself"
            await _sweep_done(w, made[0])
            await _picked_up_by_ring(w, made[0], client)  # due now: relayed by the owner
            t0 = time.monotonic()
            jid = client.schedule(time.time() + 0.3, "timer", queue="q")  # fired by a tick: rung by the owner
            await wait_for(lambda: client.get(jid).state is JobState.DONE, 5, what="the timer's job")
            assert time.monotonic() - t0 < 0.3 + NOTIFIED_WITHIN
    finally:
        proc.stop()
        await asyncio.wait_for(task, 10)
        client.close()


async def test_cluster_tier_wakes_on_sharded_messages(redis_cluster_url: str, etcd_endpoint: str) -> None:
    client = Client.from_url(redis_cluster_url, namespace=NS, partitions=1).connect()
    await _tier_wakes(redis_cluster_url, etcd_endpoint, client, None)
    client.close()


async def test_cluster_worker_follows_the_bells_slot_move(redis_cluster_factory: Callable[..., Any],
                                                          etcd_endpoint: str) -> None:
    """Reshard the slot of the namespace's bells, and of one partition, to other masters while a
    worker waits and a replica relays: jobs landing in that partition are still claimed by ring."""
    cluster = redis_cluster_factory(masters=3)
    client = Client.from_url(cluster.url, namespace=NS, partitions=PARTS * 4).connect()
    ks = client.keyspace
    p = 5
    keys = [k for k in (f"k{n}" for n in range(1000)) if partition_for_key(k, ks.partitions) == p][:3]
    proc = _replica(cluster.url, etcd_endpoint, None)
    task = await _owning(proc, ks.partitions)
    made: list[CountingFetch] = []
    w = _worker(cluster.url, made)
    try:
        async with serving(w):
            fetch = made[0]
            await _sweep_done(w, fetch)
            moved = {}
            for slot in (slot_of(ks.bell("q")), slot_of(ks.prefix(p))):
                src = cluster.node_for_slot(slot)
                dst = next(m for m in cluster.masters() if m is not src)
                await asyncio.to_thread(cluster.move_slots, [slot], src, dst)
                moved[slot] = dst
            bell_node, wake_node = moved[slot_of(ks.bell("q"))], moved[slot_of(ks.prefix(p))]
            # the worker waits on the bell's new node; the replica subscribes again (maybe more
            # than once: a relay sent between two subscriptions is lost, and the sweep finds its
            # jobs): a ring relayed through the partition's new node reaches the worker
            wake = ks.wake_channels()[p]
            await wait_for(lambda: any(b"cmd=bzpopmin" in line and b"flags=b" in line
                                       for line in bell_node.command("CLIENT", "LIST").splitlines()), 10,
                           what="the worker to wait on the bell's new node")

            async def relayed() -> bool:
                before = w.stats.notified
                wake_node.command("SPUBLISH", wake, f"r {p} q")
                await asyncio.sleep(0.2)
                return w.stats.notified > before

            await wait_for(relayed, 10, what="the replica to relay from the partition's new node")
            await _picked_up_by_ring(w, fetch, client, keys)  # jobs in partition p
    finally:
        proc.stop()
        await asyncio.wait_for(task, 10)
        client.close()
