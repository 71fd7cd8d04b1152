"""Cron under faults: kill -9 of the replica that owns a cron's partition, at the moment it fires."""
from __future__ import annotations

import asyncio
import time

import pytest
import redis

from scheduler import Client
from scheduler.coord import EtcdCoordinator
from scheduler.protocol.ids import encode_id, partition_for_key
from scheduler.shell.servers import scheduler_proc
from scheduler.testing.transitions import Ops
from tests.support.helpers import snapshot
from tests.support.waits import wait_until

pytestmark = pytest.mark.fault
NS = "cronfault"


def owners(etcd: str) -> dict[int, str]:
    async def read() -> dict[int, str]:
        async with EtcdCoordinator.from_endpoints(etcd) as c:
            kvs, _ = await c.get_prefix(f"/zsched/{NS}/owners/")
        return {int(kv.key.rsplit("/", 1)[1]): kv.value.decode() for kv in kvs}
    return asyncio.run(read())


def fired(r: redis.Redis, client: Client, queue: str) -> int:
    """How many jobs of ``queue`` the tier fired so far (the partitions' event counters)."""
    keys = [client.keyspace.key(p, "c") for p in range(client.keyspace.partitions)]
    return sum(int(r.hget(k, f"fired:{queue}") or 0) for k in keys)


def pending_occurrences(r: redis.Redis, client: Client, name: str) -> list[str]:
    return [jid for jid, st in snapshot(r, client).items()
            if st == "scheduled" and (client.get(jid).key or "").startswith(f"cron:{name}:")]


def test_kill_9_of_the_owner_at_fire_time_leaves_exactly_one_next_occurrence(redis_url: str,
                                                                             etcd_endpoint: str) -> None:
    client = Client.from_url(redis_url, namespace=NS, partitions=4).connect()
    r = redis.Redis.from_url(redis_url)
    procs = {rid: scheduler_proc(redis_url, etcd_endpoint, NS, rid, ttl=1.0).start() for rid in ("a", "b")}
    try:
        wait_until(lambda: len(owners(etcd_endpoint)) == 4 and len(set(owners(etcd_endpoint).values())) == 2,
                   10, what="both replicas own partitions")
        client.add_cron("beat", "* * * * * *", None, queue="beat")
        part = partition_for_key("beat", 4)
        victim = owners(etcd_endpoint)[part]
        survivor = "b" if victim == "a" else "a"
        wait_until(lambda: fired(r, client, "beat") >= 2, 5, what="two occurrences before the kill")
        # kill the owner right at a second boundary, when the occurrence fires
        now = time.time()
        time.sleep(1 - (now % 1) + 0.0005)
        procs[victim].kill()
        assert len(pending_occurrences(r, client, "beat")) == 1, "exactly one pending occurrence right after the kill"
        wait_until(lambda: owners(etcd_endpoint).get(part) == survivor, 6, what="survivor takes the partition")
        after = fired(r, client, "beat")
        wait_until(lambda: fired(r, client, "beat") >= after + 2, 5, what="the survivor to fire two occurrences")
        assert len(pending_occurrences(r, client, "beat")) == 1
        runs = Ops(client).claim("beat", 1000)
        nominals = [j.record.cron_nominal_ms for j in runs]
        keys = [client.get(encode_id(j.raw_id)).key for j in runs]
        assert len(set(keys)) == len(keys), "no occurrence created twice"
        assert len(set(nominals)) == len(nominals)
        assert max(nominals) >= (time.time() - 2) * 1000, "the cron kept firing after fail-over"
    finally:
        for p in procs.values():
            p.stop()
