"""The tombstone TTL as a namespace setting (stored in ``{ns}:cfg`` like the partition count):
set once, read by every process at connect, followed by the running tier and workers, shown and
set by ``zsched namespace``; the old per-process argument still works, with a warning."""
from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

from scheduler import AsyncClient, Client, JobState
from scheduler.protocol import config
from scheduler.shell.cli import main
from tests.integration.test_scheduler_tier import NS, settled, start_replica, stop_replica
from tests.support.waits import wait_for
from tests.support.workers import serving
from workers import Job, Worker


def _kept_for(client: Client, job_id: str) -> float:
    """How long the job's tombstone is kept (its expiry minus its finish), seconds."""
    info = client.get(job_id)
    assert info is not None and info.finished_at is not None and info.expires_at is not None, info
    return (info.expires_at - info.finished_at).total_seconds()


def test_the_ttl_is_stored_with_the_namespace_and_read_by_every_client(redis_url: str) -> None:
    a = Client.from_url(redis_url, namespace="ttl", partitions=2).connect()
    assert a.tombstone_ttl() == config.DEFAULT_TOMBSTONE_TTL
    assert a.calls.tomb_ms == config.DEFAULT_TOMBSTONE_TTL * 1000
    a.set_tombstone_ttl(600)
    assert a.tombstone_ttl() == 600 and a.calls.tomb_ms == 600_000, "the setter's own client uses it at once"
    b = Client.from_url(redis_url, namespace="ttl").connect()
    assert b.calls.tomb_ms == 600_000, "a client connecting later reads it"
    job = b.schedule(timedelta(hours=1), "x")
    assert b.cancel(job)
    assert abs(_kept_for(b, job) - 600) < 1
    for bad, error in ((-1, ValueError), (float("nan"), ValueError), (10**12, ValueError), ("1h", TypeError)):
        with pytest.raises(error, match="tombstone_ttl"):
            a.set_tombstone_ttl(bad)  # type: ignore[arg-type]
    assert a.tombstone_ttl() == 600, "a refused value writes nothing"
    a.close()
    b.close()


async def test_the_async_client_reads_sets_and_reloads_it(redis_url: str) -> None:
    sync = Client.from_url(redis_url, namespace="attl", partitions=1).connect()
    async with AsyncClient.from_url(redis_url, namespace="attl") as c:
        assert await c.tombstone_ttl() == config.DEFAULT_TOMBSTONE_TTL
        sync.set_tombstone_ttl(5)
        assert c.calls.tomb_ms == config.DEFAULT_TOMBSTONE_TTL * 1000, "a running producer keeps its value..."
        assert await c.reload_settings() is True and c.calls.tomb_ms == 5000, "...until it reloads"
        assert await c.reload_settings() is False
        assert await c.reload_settings({b"tomb:ttl_ms": b"7000"}) is True and c.calls.tomb_ms == 7000, \
            "a config the caller has just read is applied, not read again"
        await c.set_tombstone_ttl(0)
        assert sync.tombstone_ttl() == 0 and c.calls.tomb_ms == 0
    sync.close()


def test_a_per_process_ttl_still_works_with_a_deprecation_warning(redis_url: str) -> None:
    Client.from_url(redis_url, namespace="own", partitions=1).connect().set_tombstone_ttl(600)
    with pytest.warns(DeprecationWarning, match="set_tombstone_ttl"):
        own = Client.from_url(redis_url, namespace="own", tombstone_ttl=30)
    own.connect()
    assert own.calls.tomb_ms == 30_000, "given, it overrides the namespace's for this process"
    assert own.reload_settings() is False and own.calls.tomb_ms == 30_000
    assert own.tombstone_ttl() == 600, "the namespace's is unchanged"
    with pytest.warns(DeprecationWarning, match="Worker\\(tombstone_ttl=\\)"):
        Worker(tombstone_ttl=30)
    own.close()


async def test_a_running_tier_follows_a_change_at_once(redis_url: str, etcd_endpoint: str) -> None:
    """The tier's ticks write the tombstones of jobs that misfire: they carry the TTL of the
    moment. The replica hears of a change on the config channel (or within 5 s)."""
    client = Client.from_url(redis_url, namespace=NS, partitions=2).connect()
    proc, task = await start_replica(redis_url, etcd_endpoint, "solo")
    try:
        await settled(etcd_endpoint, [proc], 2)
        assert proc.client.calls.tomb_ms == config.DEFAULT_TOMBSTONE_TTL * 1000
        t0 = time.monotonic()
        client.set_tombstone_ttl(120)
        await wait_for(lambda: proc.client.calls.tomb_ms == 120_000, 5, what="the replica to take the new TTL")
        assert time.monotonic() - t0 < 2.0, "heard over pub/sub, not found by the 5 s poll"
    finally:
        await stop_replica(proc, task)
        client.close()


async def test_running_workers_follow_a_change_within_their_settings_interval(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.namespace

    monkeypatch.setattr(workers.namespace, "SETTINGS_INTERVAL", 0.1)
    client = Client.from_url(redis_url, namespace="wttl", partitions=2).connect()
    w = Worker.from_url(redis_url, namespace="wttl", shutdown_grace=5.0)

    @w.handler("default")
    async def handle(job: Job) -> None:
        pass

    async with serving(w):
        first = client.schedule(timedelta(0), "before")
        await wait_for(lambda: w.stats.acked == 1, 10, what="the first ack")
        assert abs(_kept_for(client, first) - config.DEFAULT_TOMBSTONE_TTL) < 1
        client.set_tombstone_ttl(90)
        jobs: list[str] = []

        def acked_with_new_ttl() -> bool:  # a job each look; true once one was acked with the new TTL
            done = [j for j in jobs if (i := client.get(j)) is not None and i.state is JobState.DONE]
            if any(abs(_kept_for(client, j) - 90) < 1 for j in done):
                return True
            jobs.append(client.schedule(timedelta(0), "after"))
            return False

        await wait_for(acked_with_new_ttl, 10, 0.05, what=lambda: f"an ack with the new TTL among {len(jobs)} jobs")
        kept = [round(_kept_for(client, j)) for j in jobs if client.get(j).state is JobState.DONE]
        assert set(kept) <= {3600, 90}, kept
    client.close()


def test_zsched_namespace_shows_and_sets_the_ttl(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    Client.from_url(redis_url, namespace="clittl", partitions=3).connect().close()
    base = ["--redis", redis_url, "--namespace", "clittl"]
    assert main(["namespace", "tombstone-ttl", *base]) == 0
    assert capsys.readouterr().out == "tombstone ttl: 1h (finished jobs stay visible this long)\n"
    assert main(["namespace", "tombstone-ttl", "10m", *base, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"tombstone_ttl_seconds": 600.0}
    assert main(["namespace", "settings", *base, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["namespace"], doc["partitions"], doc["tombstone_ttl_seconds"]) == ("clittl", 3, 600.0)
    assert doc["dead_retention"] == {"max_dead": None, "dead_ttl_seconds": None} and doc["rate_limits"] == {}
    assert main(["namespace", "settings", *base]) == 0
    assert "tombstone ttl:     10m" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["namespace", "tombstone-ttl", "600", *base])  # a unit is required
    assert e.value.code == 2 and "DURATION" in capsys.readouterr().err
    assert main(["namespace", "tombstone-ttl", "--redis", redis_url, "--namespace", "nosuch"]) == 1
    assert "nosuch" in capsys.readouterr().err
