"""The worker's fan-out counters (workers/stats.py), against a real redis-server: every ring it
takes from a doorbell and every claim Redis answers, empty or not, counted per queue and
exported on /metrics (what ``python -m bench fanout`` reads from each worker process)."""
from __future__ import annotations

import asyncio
import urllib.request
from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from scheduler import Client
from scheduler.shell.servers.ports import free_port
from tests.support.waits import wait_for
from tests.support.workers import serving
from workers import Job, Worker


def scrape(port: int, queue: str) -> dict[str, float]:
    """The worker's ``zsched_worker_*_total`` counters of ``queue`` on its /metrics page."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    return {s.name.removeprefix("zsched_worker_").removesuffix("_total"): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name.startswith("zsched_worker_") and s.name.endswith("_total") and s.labels.get("queue") == queue}


async def test_worker_counts_notifications_and_claims_per_queue_and_exports_them(redis_url: str) -> None:
    client = Client.from_url(redis_url)
    port = free_port()
    # no safety-net sweep during the test: every claim after the first sweep follows a notification
    w = Worker.from_url(redis_url, queues=["default", "other"], metrics_port=port, idle_sweep=600,
                        shutdown_grace=5.0)
    ran: list[str] = []

    @w.handler("default")
    async def handle(job: Job) -> None:
        ran.append(job.id)

    @w.handler("other")
    async def other(job: Job) -> None:
        ran.append(job.id)

    try:
        async with serving(w):
            # the sweep after subscribing: claims on every partition of both queues, all empty
            await wait_for(lambda: w.stats.claims >= 2 * 16, 5, what="the first sweep")
            first = w.stats_by_queue()["default"]
            assert first.claims == first.claims_empty >= 1 and first.notified == 0

            bell = client.keyspace.bell("default")
            for p in (5, 6, 7):  # nothing is ready there: each claim comes back empty
                client.redis.zadd(bell, {str(p): 1}, nx=True)
            await wait_for(lambda: w.stats_by_queue()["default"].notified == 3, 5, what="3 rings taken")
            await wait_for(lambda: w.stats_by_queue()["default"].claims > first.claims, 5, what="a claim")
            await asyncio.sleep(0.2)  # any claim those notifications caused has been answered
            after = w.stats_by_queue()["default"]
            assert after.claims_empty - first.claims_empty == after.claims - first.claims >= 1

            jid = client.schedule(timedelta(0), None)  # due now: ready at once, its bell rung
            await wait_for(lambda: jid in ran, 5, what="the job to run")
            await wait_for(lambda: w.stats.acked == 1, 5, what="its ack")
            by_q = w.stats_by_queue()
            got = by_q["default"]
            assert got.notified == 4
            assert got.claims - got.claims_empty == 1  # the one claim that found the job
            assert by_q["other"].notified == 0 and by_q["other"].claims == by_q["other"].claims_empty
            exported = scrape(port, "default")
            assert {k: exported[k] for k in ("notified", "claims", "claims_empty")} == {
                "notified": got.notified, "claims": got.claims, "claims_empty": got.claims_empty}
    finally:
        client.close()
