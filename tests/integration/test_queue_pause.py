"""Queue pause/resume and cron pause/resume: the scripts on a real redis-server, then the real tier
and a real worker process (a paused queue runs nothing; on resume everything runs once)."""
from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from scheduler import Client, JobState, Outcome
from scheduler.protocol.replies import claim_paused, parse_claim, parse_stats
from scheduler.protocol.transitions import claim_call
from scheduler.shell.servers import scheduler_proc
from tests.support.waits import wait_for
from tests.support.workers import read_runs, spawn_worker, wait_worker_ready, write_app
from workers.planner import ClaimPlanner, ready_message

NS = "pausetest"


def _claim(client: Client, queue: str, p: int, n: int = 10) -> list[object]:
    reply = client.transport.call(*claim_call(client.calls, p, queue, n))
    assert isinstance(reply, list)
    return reply


def test_a_paused_queue_hands_out_nothing_keeps_its_ready_jobs_and_resume_releases_them(redis_url: str) -> None:
    client = Client.from_url(redis_url, namespace=NS + "a", partitions=1).connect()
    ids = client.schedule_many([(timedelta(0), {"i": i}) for i in range(3)], queue="q")  # due now: straight to ready
    assert client.pause("q") is Outcome.DONE
    assert client.pause("q") is Outcome.UNCHANGED, "pause is idempotent"
    since = client.paused()["q"]
    reply = _claim(client, "q", 0)
    assert claim_paused(reply) == int(since.timestamp() * 1000)
    assert client.stats()["q"]["ready"] == 3, "the jobs wait in ready"
    more = client.schedule(timedelta(0), {"late": 1}, queue="q")  # lands in ready while paused
    assert client.get(more).state is JobState.READY
    stats = parse_stats(client.transport.call(*client.calls.stats_call(0)))
    assert set(stats.paused) == {"q"}
    other = client.schedule(timedelta(0), None, queue="other")
    _now, jobs = parse_claim(_claim(client, "other", 0))
    assert [j.raw_id for j in jobs] == [client.calls.locate(other)[0]], "other queues are not paused"

    assert client.resume("q") is Outcome.DONE
    assert client.resume("q") is Outcome.UNCHANGED, "resume is idempotent"
    assert client.paused() == {}
    reply = _claim(client, "q", 0)
    assert claim_paused(reply) is None
    _now, jobs = parse_claim(reply)
    assert sorted(j.raw_id for j in jobs) == sorted(client.calls.locate(i)[0] for i in [*ids, more])


def test_pause_reaches_every_partition_and_is_shown_by_stats(redis_url: str) -> None:
    client = Client.from_url(redis_url, namespace=NS + "b", partitions=4).connect()
    client.pause("q")
    for p in range(4):
        assert claim_paused(_claim(client, "q", p)) is not None
        assert "q" in parse_stats(client.transport.call(*client.calls.stats_call(p))).paused
    client.resume("q")
    assert all(claim_paused(_claim(client, "q", p)) is None for p in range(4))


def test_the_worker_planner_ignores_a_paused_partition_until_its_resume_message() -> None:
    planner = ClaimPlanner(["q"], 2)
    planner.notify("q", 0)
    planner.paused_at("q", 0)
    assert not planner.has_candidates()
    assert planner.notify("q", 0) is False, "ready messages of a paused partition cost no claim"
    assert planner.plan(8) == []
    assert ready_message(b"0:resume") == (0, True) and ready_message(b"1") == (1, False)
    with pytest.raises(ValueError):
        ready_message(b"1:what")
    assert planner.notify("q", *ready_message(b"0:resume")) is True
    assert planner.plan(8)[0][:2] == ("q", 0)


def test_a_paused_cron_makes_no_occurrence_and_resumes_from_now(redis_url: str) -> None:
    client = Client.from_url(redis_url, namespace=NS + "c", partitions=2).connect()
    client.add_cron("every-minute", "* * * * *", {"x": 1}, queue="q")
    (info,) = client.crons()
    assert info.paused is None and info.pending_id is not None
    assert client.pause_cron("every-minute") is Outcome.DONE
    assert client.pause_cron("every-minute") is Outcome.UNCHANGED
    (info,) = client.crons()
    assert info.paused is not None and info.pending_id is None and info.next_fire is None
    assert client.stats().get("q", {}).get("scheduled", 0) == 0, "its pending occurrence was cancelled"
    assert client.resume_cron("every-minute") is Outcome.DONE
    assert client.resume_cron("every-minute") is Outcome.UNCHANGED
    (info,) = client.crons()
    assert info.paused is None and info.next_fire is not None
    assert info.next_fire.timestamp() > time.time() - 1, "resumed from now: nothing missed is run"
    assert client.pause_cron("nope") is Outcome.NO_CRON and client.resume_cron("nope") is Outcome.NO_CRON
    assert not client.remove_cron("nope"), "every outcome but DONE is falsy, as before"


async def test_a_paused_queue_runs_nothing_on_the_real_stack_and_everything_once_on_resume(
        redis_url: str, etcd_endpoint: str, tmp_path: Path) -> None:
    ns = NS + "e2e"
    client = Client.from_url(redis_url, namespace=ns, partitions=4).connect()
    write_app(tmp_path)
    client.pause("default")
    replica = scheduler_proc(redis_url, etcd_endpoint, ns, "s0", ttl=2.0).start()
    worker = spawn_worker(tmp_path, redis_url, "--namespace", ns)
    try:
        await wait_worker_ready(worker)
        ids = client.schedule_many([(timedelta(milliseconds=200 + 5 * i), {"i": i}) for i in range(40)],
                                   queue="default")
        # the tier keeps firing: every job reaches ready (none misfires, none is lost) ...
        await wait_for(lambda: client.stats().get("default", {}).get("ready") == 40, 20,
                       what="the paused queue's due jobs to wait in ready")
        # ... while the worker, which runs the other queue, claims none of them
        control = client.schedule(timedelta(0), None, queue="sync")
        await wait_for(lambda: any(r[1] == control for r in read_runs(tmp_path) if r[0] == "END"), 20,
                       what="a job of another queue to run")
        assert not [r for r in read_runs(tmp_path) if r[1] in set(ids)], "a paused queue runs nothing"
        assert all(i.state is JobState.READY for i in client.get_many(ids).values() if i)

        assert client.resume("default") is Outcome.DONE
        await wait_for(lambda: len({r[1] for r in read_runs(tmp_path) if r[0] == "END" and r[1] in set(ids)}) == 40,
                       20, what="every job to run after resume")
        await wait_for(lambda: all(i and i.state is JobState.DONE for i in client.get_many(ids).values()), 10,
                       what="every job acked")
        starts = [r[1] for r in read_runs(tmp_path) if r[0] == "START" and r[1] in set(ids)]
        assert sorted(starts) == sorted(ids), "each job ran exactly once"
    finally:
        worker.stop()
        replica.stop()


def test_a_pause_holds_in_every_partition_after_migrate_partitions(redis_url: str) -> None:
    from scheduler.shell.migrate import Migration

    client = Client.from_url(redis_url, namespace=NS + "m", partitions=2).connect()
    client.pause("q")
    Migration(client, 5).run()
    moved = Client.from_url(redis_url, namespace=NS + "m").connect()
    assert moved.keyspace.partitions == 5
    assert all(claim_paused(_claim(moved, "q", p)) is not None for p in range(5))
    assert set(moved.paused()) == {"q"}
    moved.resume("q")
    assert all(claim_paused(_claim(moved, "q", p)) is None for p in range(5))


def test_the_cli_pauses_lists_and_resumes_queues_and_crons(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.shell.cli import main

    client = Client.from_url(redis_url, namespace=NS + "cli", partitions=2).connect()
    client.schedule(timedelta(0), None, queue="q")
    client.add_cron("c1", "* * * * *", None, queue="q")
    base = ["--redis", redis_url, "--namespace", NS + "cli"]
    assert main(["queue", "pause", "q", *base]) == 0
    assert "queue q paused since" in capsys.readouterr().out
    assert main(["queue", "list", *base]) == 0
    out = capsys.readouterr().out
    assert "PAUSED SINCE" in out and "q " in out
    assert main(["queue", "resume", "q", *base]) == 0
    assert "queue q resumed" in capsys.readouterr().out
    assert main(["cron", "pause", "c1", *base]) == 0 and "cron c1 paused" in capsys.readouterr().out
    assert main(["cron", "resume", "c1", *base, "--json"]) == 0
    assert '"changed": true' in capsys.readouterr().out
    assert main(["cron", "pause", "nope", *base]) == 1, "no such cron: exit 1 like any other unknown name"


def test_the_tier_exports_the_pause_as_gauges() -> None:
    from scheduler.metrics import PartitionStatsCollector
    from scheduler.protocol.replies import StatsReply

    col = PartitionStatsCollector()
    col.update(0, StatsReply({}, {}, {"q": 3, "r": 0}, None, 0, 0, 0, 1, paused={"q": 1_700_000_000_000}), 0)
    samples = {(m.name, s.labels["queue"]): s.value for m in col.collect() for s in m.samples
               if m.name.startswith("zsched_queue_paused")}
    assert samples[("zsched_queue_paused", "q")] == 1 and samples[("zsched_queue_paused", "r")] == 0
    assert samples[("zsched_queue_paused_since_seconds", "q")] == 1_700_000_000
    assert samples[("zsched_queue_paused_since_seconds", "r")] == 0


def _redis_ms(client: Client) -> int:
    sec, usec = client.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


def _until_redis_ms(client: Client, ms: int) -> None:
    """Poll Redis's clock (the one tick and misfire use) until it reaches ``ms``."""
    deadline = time.monotonic() + 30
    while _redis_ms(client) < ms:
        assert time.monotonic() < deadline, "Redis's clock did not advance"
        time.sleep(0.01)


def test_a_skip_job_that_becomes_due_during_a_pause_waits_in_ready_and_runs_on_resume(redis_url: str) -> None:
    from scheduler.testing.transitions import Ops

    client = Client.from_url(redis_url, namespace=NS + "skip", partitions=2).connect()
    ops = Ops(client)
    assert client.pause("q") is Outcome.DONE
    due = _redis_ms(client) + 300
    jid = client.schedule(due / 1000, {"x": 1}, queue="q", misfire="skip", misfire_grace=2.0)
    assert client.get(jid).state is JobState.SCHEDULED
    _until_redis_ms(client, due)
    assert ops.tick_all() == 1, "due during the pause, within its grace: the tick moves it to ready"
    assert client.get(jid).state is JobState.READY
    _until_redis_ms(client, due + 2000 + 200)  # its grace has passed while it waits out the pause
    assert ops.claim("q") == [], "a paused queue hands out nothing"
    ops.tick_all()
    assert client.get(jid).state is JobState.READY, "the pause does not make it misfire"
    assert client.resume("q") is Outcome.DONE
    (job,) = ops.claim("q")
    assert job.raw_id == client.calls.locate(jid)[0]
    ops.ack(job)
    assert client.get(jid).state is JobState.DONE
    counters = [parse_stats(client.transport.call(*client.calls.stats_call(p))).counters for p in range(2)]
    assert sum(c.get("misfired:q", 0) for c in counters) == 0


@pytest.mark.parametrize("backend_url", ["cluster"], indirect=True)
async def test_pause_and_resume_on_a_redis_cluster_with_both_clients(backend_url: str) -> None:
    from scheduler import AsyncClient

    client = Client.from_url(backend_url, namespace=NS + "cl", partitions=6).connect()
    ids = client.schedule_many([(timedelta(0), i) for i in range(12)], queue="q")  # due now: ready, in many partitions
    assert client.pause("q") is Outcome.DONE
    parts = sorted({client.calls.locate(i)[1] for i in ids})
    assert all(claim_paused(_claim(client, "q", p)) is not None for p in parts)
    async with AsyncClient.from_url(backend_url, namespace=NS + "cl") as ac:
        assert set(await ac.paused()) == {"q"} and await ac.pause("q") is Outcome.UNCHANGED
        assert await ac.resume("q") is Outcome.DONE
    assert client.paused() == {}
    claimed = [j.raw_id for p in parts for j in parse_claim(_claim(client, "q", p, 100))[1]]
    assert sorted(claimed) == sorted(client.calls.locate(i)[0] for i in ids)
