"""The console's last-hour charts: the per-minute counts the scripts keep in Redis (one hash per
partition and minute, in the partition's slot, with a TTL) and the overview's SVG of them."""
from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest

from scheduler import Client
from scheduler.protocol import history
from scheduler.protocol.codes import FailKind
from scheduler.shell import admin
from scheduler.testing import Ops
from tests.support.ui import console, namespace_client

NS = "uihistory"
NOW = timedelta(0)


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    yield from namespace_client(redis_url, NS, partitions=4)


def minute_hashes(client: Client) -> list[str]:
    return sorted(k.decode() for k in client.redis.scan_iter(match=f"{{{NS}:*}}:hist:*"))


def test_fired_acked_failed_and_dead_are_counted_per_minute_in_expiring_hashes(client: Client) -> None:
    ops = Ops(client)
    for i in range(6):
        client.schedule(NOW, {"i": i}, queue="mail", max_attempts=1)
    client.schedule(NOW, {}, queue="sms")
    jobs = ops.claim("mail", 10)
    assert len(jobs) == 6
    for j in jobs[:3]:
        ops.ack(j)
    ops.fail(jobs[3], FailKind.FAILED)
    ops.fail(jobs[4], FailKind.PERMANENT)
    start = history.minute_of(admin.redis_now_ms(client))
    keys = minute_hashes(client)
    assert keys, "no minute hash was written"
    for k in keys:
        assert re.fullmatch(r"\{uihistory:\d+\}:hist:\d+", k), k  # the partition's hash tag: its cluster slot
        assert 0 < client.redis.ttl(k) <= history.TTL_S, f"{k} has no expiry: the history would grow forever"
    first = start - history.MINUTES + 2
    merged = history.merge(first, history.MINUTES,
                           [(int(k.rsplit(":", 1)[1]), client.redis.hgetall(k)) for k in keys])
    totals = {q: {kind: h.total(kind) for kind in history.KINDS} for q, h in merged.items()}
    # a job due now is made ready at once: a job ready at once: counted as fired by schedule itself
    assert totals["mail"] == {"fired": 6, "acked": 3, "failed": 2, "dead": 2}
    assert totals["sms"] == {"fired": 1, "acked": 0, "failed": 0, "dead": 0}


def test_the_overview_draws_each_queues_hour_with_a_count_per_minute_on_hover(client: Client) -> None:
    ops = Ops(client)
    for _ in range(3):
        client.schedule(NOW, {}, queue="mail")
    for j in ops.claim("mail", 3):
        ops.ack(j)
    client.schedule(timedelta(hours=1), {}, queue="quiet")
    tc = console(client)
    page = tc.get("/").text
    fig = re.search(r'<figure class="chart" data-queue="mail">.*?</figure>', page, re.S)
    assert fig, "no chart for queue mail"
    svg = fig.group(0)
    assert "fired 3" in svg and "acked 3" in svg and "failed 0" in svg
    assert len(re.findall(r"<rect class=\"hcol\"", svg)) == history.MINUTES
    assert len(re.findall(r"<polyline class=\"h-(fired|acked|failed|dead)\"", svg)) == 4
    titles = re.findall(r"<title>([^<]*)</title>", svg)
    assert all(re.fullmatch(r"\d\d:\d\d UTC: fired \d+, acked \d+, failed \d+, dead \d+", t) for t in titles), titles
    # summed over the columns: a test that ran across a minute's end has its counts in two of them
    assert sum(int(n) for t in titles for n in re.findall(r"acked (\d+)", t)) == 3
    assert '<figure class="chart" data-queue="quiet">' in page, "a quiet queue gets its (flat) chart too"
    # the refreshed fragment reads the current minute again: new counts show without a reload
    client.schedule(NOW, {}, queue="mail")
    assert "fired 4" in tc.get("/fragment/overview").text


def test_the_chart_reads_the_minute_hashes_on_redis_cluster(redis_cluster_url: str) -> None:
    """Each minute hash lives in its partition's slot, so partitions on different masters are read
    through one cluster pipeline and summed."""
    client = Client.from_url(redis_cluster_url, namespace="uihistorycl", partitions=8).connect()
    try:
        ops = Ops(client)
        for i in range(8):
            client.schedule(NOW, {"i": i}, queue="mail")
        for j in ops.claim("mail", 8):
            ops.ack(j)
        fig = re.search(r'<figure class="chart" data-queue="mail">.*?</figure>', console(client).get("/").text, re.S)
        assert fig, "no chart for queue mail"
        assert 'total-fired">fired 8<' in fig.group(0) and 'total-acked">acked 8<' in fig.group(0), fig.group(0)[:400]
    finally:
        client.close()
