"""What an idle replica sends: to Redis for its readiness probes, nothing of its own while its tick
round trips (sent anyway, at least once per idle check) are answered, and a PING per probed check
when it owns no partition, so has no ticks to go by; to etcd, reads of the ownership keys on
events only."""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from redis import Redis

from scheduler.health import CHECK_REUSE_S
from scheduler.shell.servers import RedisServer, free_port
from scheduler.tier.ownership import RECONCILE_EVERY_S
from scheduler.tier.process import SchedulerConfig, SchedulerProcess
from scheduler.tier.runner import RunnerConfig
from tests.support.helpers import command_calls as calls
from tests.support.helpers import probing, ready
from tests.support.waits import wait_for

FRESH_S = RunnerConfig().idle_check + CHECK_REUSE_S


async def test_an_owners_readiness_rides_on_its_ticks_and_a_replica_without_partitions_pings(
        fresh_redis: RedisServer, etcd_endpoint: str) -> None:
    ns = f"u{uuid.uuid4().hex[:8]}"
    ports = [free_port(), free_port()]

    def replica(i: int) -> SchedulerProcess:
        return SchedulerProcess(SchedulerConfig(
            redis_url=fresh_redis.url, etcd_endpoints=etcd_endpoint, namespace=ns, partitions=1,
            replica_id=f"r{i}-{ns}", lease_ttl=5.0, metrics_port=ports[i]))

    sync = Redis.from_url(fresh_redis.url)
    owner, spare = replica(0), replica(1)
    tasks = [asyncio.create_task(owner.run())]
    try:
        await wait_for(lambda: len(owner.runners) == 1 and ready(ports[0]), 20, 0.05,
                       "the first replica to own the only partition and be ready")
        await wait_for(lambda: owner.batcher.answered_within(FRESH_S), 10, 0.05, "a tick round trip answered")
        sync.config_resetstat()
        # probed more often than a kubelet would, over more than the freshness window: a check per CHECK_REUSE_S
        with probing(ports[0]) as seen:
            await asyncio.sleep(FRESH_S + 2 * CHECK_REUSE_S)
        assert len(seen) >= 8 and all(code == 200 for code, _ in seen), seen
        assert seen[-1][1].startswith("ok: Redis answers; etcd lease valid")
        assert calls(sync, "evalsha") >= 2, "the owner ticked and reaped on its idle grid"
        assert calls(sync, "ping") == 0, "an owner pinged although its ticks were answered"

        # a second replica owns nothing (one partition): its readiness has no ticks to go by
        tasks.append(asyncio.create_task(spare.run()))
        await wait_for(lambda: ready(ports[1]), 20, 0.05, "the second replica to be ready")
        assert not spare.runners
        sync.config_resetstat()
        with probing(ports[1]) as seen:
            await wait_for(lambda: calls(sync, "ping") >= 2, 3 * FRESH_S, 0.05, "PINGs from the replica without ticks")
        assert spare.batcher.round_trips == 0 and seen and all(code == 200 for code, _ in seen), seen
    finally:
        owner.stop()
        spare.stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 20)
        sync.close()


async def test_an_idle_replica_reads_the_ownership_keys_on_etcd_events_only(redis_url: str,
                                                                              etcd_endpoint: str) -> None:
    """The watch delivers every change the reconcile acts on; the reconcile's timer is a slow
    safety net (RECONCILE_EVERY_S), not a read of the whole prefix every second."""
    ns = f"u{uuid.uuid4().hex[:8]}"
    proc = SchedulerProcess(SchedulerConfig(redis_url=redis_url, etcd_endpoints=etcd_endpoint, namespace=ns,
                                            partitions=4, replica_id=f"r-{ns}", lease_ttl=5.0))
    reads: list[float] = []
    get_prefix = proc.coord.get_prefix

    async def counted(prefix: str) -> Any:
        reads.append(time.monotonic())
        return await get_prefix(prefix)

    proc.coord.get_prefix = counted  # type: ignore[method-assign]
    task = asyncio.create_task(proc.run())
    try:
        await wait_for(lambda: len(proc.runners) == 4, 20, 0.05, "the replica to own every partition")
        # its own claims come back through the watch, each an event that reconciles once more
        await wait_for(lambda: time.monotonic() - reads[-1] > 1.0, 10, 0.05, "the echoes of its claims to end")
        settled = len(reads)
        quiet_s = RECONCILE_EVERY_S - 1.5  # from over 1 s after the last read: within the safety net's wait
        await asyncio.sleep(quiet_s)
        assert len(reads) == settled, f"{len(reads) - settled} reads of the prefix in {quiet_s:g} s with no event"
        # an event still reaches it at once: a second member makes this one hand half over
        other = SchedulerProcess(SchedulerConfig(redis_url=redis_url, etcd_endpoints=etcd_endpoint, namespace=ns,
                                                 partitions=4, replica_id=f"s-{ns}", lease_ttl=5.0))
        joined = asyncio.create_task(other.run())
        try:
            await wait_for(lambda: len(proc.runners) == 2 and len(other.runners) == 2, 10, 0.05,
                           "the partitions to split between the two replicas")
        finally:
            other.stop()
            await asyncio.wait_for(joined, 20)
    finally:
        proc.stop()
        await asyncio.wait_for(task, 20)
