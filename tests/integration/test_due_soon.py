"""zsched_queue_due_soon against a real redis-server: the stats script counts the timers due
within the horizon per queue (a ZCOUNT and a capped scan), the replica adds the ready lists and
exports the sum per queue over the partitions it owns."""
from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from scheduler import Client
from scheduler.protocol.replies import StatsReply, parse_stats
from scheduler.shell.servers import scheduler_proc
from tests.support.waits import wait_until


@pytest.fixture
def client(redis_url: str) -> Client:
    return Client.from_url(redis_url, namespace=f"d{uuid.uuid4().hex[:8]}", partitions=1)


def schedule(client: Client, queue: str, seconds: float, n: int) -> None:
    client.schedule_many([(timedelta(seconds=seconds), i) for i in range(n)], queue=queue)


def test_stats_counts_the_timers_due_within_the_horizon_per_queue(client: Client) -> None:
    schedule(client, "emails", 10, 4)
    schedule(client, "emails", 7200, 2)    # beyond the horizon
    schedule(client, "reports", 5, 3)
    schedule(client, "idle", 7200, 1)      # a queue with nothing due soon

    def stats(*args: int) -> StatsReply:
        return parse_stats(client.transport.call(*client.calls.stats_call(0, *args)))

    s = stats(30_000)
    assert s.due_soon == {"emails": 4, "reports": 3} and s.due_soon_total == 7
    assert s.due_soon_by_queue() == {"emails": 4, "reports": 3, "idle": 0}
    # more due than scan_max: a quarter as many read (here rank 0 alone), the total exact and shared
    # out in their proportions (the spread of the ranks read: the test below)
    cut = stats(30_000, 4)
    assert cut.due_soon == {"reports": 1} and cut.due_soon_total == 7
    assert cut.due_soon_by_queue() == {"emails": 0, "reports": 7, "idle": 0}
    assert stats(0).due_soon_total == 0
    plain = stats()
    assert plain.due_soon == {} and plain.due_soon_total is None and plain.timers == 10


def test_stats_carries_redis_clock_for_the_age_of_the_earliest_due_timer(client: Client) -> None:
    """The replica ages each partition's earliest due timer by the reply's own clock: no TIME round
    trip of its own, and on a cluster each partition by its own server's clock."""
    schedule(client, "emails", 10, 1)
    before = client.redis.time()
    s = parse_stats(client.transport.call(*client.calls.stats_call(0, 30_000)))
    after = client.redis.time()
    ms = [int(t[0]) * 1000 + int(t[1]) // 1000 for t in (before, after)]
    assert s.now_ms is not None and ms[0] <= s.now_ms <= ms[1]
    assert parse_stats(client.transport.call(*client.calls.stats_call(0))).now_ms is not None  # no horizon too


def test_a_herd_of_one_queue_due_first_does_not_stand_for_the_others(client: Client) -> None:
    for queue, seconds in (("a", 10), ("b", 11), ("c", 12)):
        schedule(client, queue, seconds, 30)
    s = parse_stats(client.transport.call(*client.calls.stats_call(0, 30_000, 12)))  # ranks 0, 30, 60 read
    assert s.due_soon == {"a": 1, "b": 1, "c": 1} and s.due_soon_total == 90
    assert s.due_soon_by_queue() == {"a": 30, "b": 30, "c": 30}


def test_a_replica_exports_ready_and_due_soon_jobs_per_queue(client: Client, redis_url: str,
                                                             etcd_endpoint: str) -> None:
    ns = client.calls.ks.namespace
    schedule(client, "emails", 0, 2)       # due now: straight into the ready list (no worker takes them)
    schedule(client, "emails", 20, 3)
    schedule(client, "emails", 3600, 5)    # beyond the 60 s horizon
    schedule(client, "reports", 50, 1)
    proc = scheduler_proc(redis_url, etcd_endpoint, ns, "r1", extra=["--due-soon-horizon", "60"]).start()
    try:
        def exported() -> dict[str, float] | None:
            got = {q: proc.try_metric("zsched_queue_due_soon", namespace=ns, queue=q) for q in ("emails", "reports")}
            return got if got == {"emails": 5, "reports": 1} else None

        wait_until(exported, 20, 0.1, lambda: f"zsched_queue_due_soon emails=5 reports=1\n{proc.tail()}")
        assert client.stats()["emails"]["ready"] == 2
        assert 'Jobs ready now or due within 60s' in proc.scrape()
    finally:
        proc.stop()
