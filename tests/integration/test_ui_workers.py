"""zsched ui, server side, against a real redis-server: the workers page (from the worker
registry), the overview's warning on queues with jobs waiting and no live worker, and the
overview's counts as links to their lists. Registry entries are written with the registry's own
script (as a worker's refresh writes them), so no worker process is needed."""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from scheduler import Client
from scheduler.protocol.ids import decode_id
from scheduler.protocol.registry import CurrentJob, WorkerRecord, beat_call, encode_record, leave_call
from tests.support.ui import console, namespace_client
from tests.support.waits import wait_until_time

NS = "uiworkers"


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    yield from namespace_client(redis_url, NS, partitions=4)


def register(client: Client, wid: str, rec: WorkerRecord) -> None:
    """Write ``rec`` as worker ``wid``'s refresh (live for 3 x 60 s)."""
    client.transport.call(*beat_call(client.keyspace, wid, encode_record(rec), 60.0))


def row(text: str, queue: str) -> str:
    """The overview's table row of ``queue``."""
    m = re.search(rf'<tr data-queue="{queue}">.*?</tr>', text, re.S)
    assert m, f"no row of queue {queue}"
    return m.group(0)


def leave(client: Client, wid: str) -> None:
    client.transport.call(*leave_call(client.keyspace, wid))


def test_the_workers_page_lists_each_live_worker_with_its_slots_and_current_jobs(client: Client) -> None:
    tc = console(client, read_only=True)
    assert 'id="no-workers"' in tc.get("/workers").text
    jid = client.schedule(timedelta(hours=1), None, queue="emails")
    rec = WorkerRecord("web-7", 4321, ("emails", "sms"), 8, 16, 60.0, busy=12, running=(11, 1), held=3,
                       claimed=40, acked=28, uptime_s=3700.0, version="9.9",
                       current=(CurrentJob(decode_id(jid), "emails", 42.0),), ack_linger_s=0.25)
    register(client, "web-7-4321-aaaa", rec)
    register(client, "db-1-99-bbbb", WorkerRecord("db-1", 99, ("sms",), 2, 4, 60.0, stopping=True))
    page = tc.get("/workers")
    assert page.status_code == 200 and 'href="/workers"' in page.text, "linked from the nav"
    row = re.search(r'<tr data-worker="web-7-4321-aaaa".*?</tr>', page.text, re.S)
    assert row, page.text
    cells = {k: re.search(rf'class="[^"]*\b{k}\b[^"]*">(.*?)</td>', row.group(0), re.S).group(1)  # type: ignore[union-attr]
             for k in ("host", "pid", "queues", "state", "concurrency", "busy", "free", "prefetch")}
    assert cells == {"host": "web-7", "pid": "4321", "queues": "emails, sms", "state": "serving",
                     "concurrency": "8", "busy": "12", "free": "0", "prefetch": "3 / 16"}
    assert f'<a href="/job/{jid}">{jid}</a>' in row.group(0) and "(42." in row.group(0), "job and how long it ran"
    assert "and 11 more" in row.group(0), "busy handlers the record does not name are counted"
    assert re.search(r"[0-9.]+ s ago", row.group(0)), "last heartbeat age"
    assert re.search(r'class="muted linger"[^>]*>acks linger 250 ms<', row.group(0)), "its acks linger"
    stopping = re.search(r'<tr data-worker="db-1-99-bbbb".*?</tr>', page.text, re.S)
    assert stopping and 'class="state">stopping<' in stopping.group(0)
    assert "acks linger" not in stopping.group(0), "a worker whose acks do not linger says nothing of it"
    per_queue = re.search(r'<tr data-queue="sms">(.*?)</tr>', page.text).group(1)  # type: ignore[union-attr]
    assert re.findall(r'class="n">(\d+)<', per_queue) == ["1", "8", "1", "0"], "stopping workers are not counted"
    assert client.redis.hlen(client.keyspace.workers_key) == 2
    # a killed worker's record drops out of the page, and the page does not delete it: a view never writes
    gone = WorkerRecord("gone", 5, ("sms",), 1, 1, 0.001)
    client.transport.call(*beat_call(client.keyspace, "gone-5-eeee", encode_record(gone), 0.001))
    wait_until_time(time.time() + 0.05)
    assert 'data-worker="gone-5-eeee"' not in tc.get("/workers").text
    assert client.redis.hexists(client.keyspace.workers_key, "gone-5-eeee")


def test_the_overview_warns_of_a_queue_with_ready_jobs_and_no_live_worker(client: Client) -> None:
    client.schedule_many([(timedelta(0), {"n": i}) for i in range(3)], queue="orphan")
    client.schedule(timedelta(hours=1), None, queue="later")  # nothing due: no warning
    client.schedule(timedelta(0), None, queue="frozen")
    client.pause("frozen")
    client.schedule(timedelta(0), None, queue="served")
    register(client, "w-1-cccc", WorkerRecord("w", 1, ("served",), 4, 8, 60.0))
    tc = console(client)
    # the timers fire into ready only with a replica: move them as the tier would
    from scheduler.testing.transitions import Ops

    Ops(client).tick_all()
    for path in ("/", "/fragment/overview"):
        text = tc.get(path).text
        warning = re.search(r'<p class="warning" id="unserved-warning">(.*?)</p>', text, re.S)
        assert warning and "1 queue with jobs waiting" in warning.group(1)
        assert '?queue=orphan&amp;state=ready">orphan</a> (3)' in warning.group(1)
        for q in ("later", "served", "frozen"):
            assert f">{q}</a> (" not in warning.group(1), q
        assert 'class="warn unserved"' in row(text, "orphan")
        assert 'class="warn unserved"' not in row(text, "later") and "unserved" not in row(text, "served")
        assert "paused, no worker" in row(text, "frozen") and 'class="warn' not in row(text, "frozen")
    register(client, "w-2-dddd", WorkerRecord("w", 2, ("orphan",), 1, 1, 60.0))
    assert 'id="unserved-warning"' not in tc.get("/").text, "a live worker serves it now"
    register(client, "w-2-dddd", WorkerRecord("w", 2, ("orphan",), 1, 1, 60.0, stopping=True))
    assert 'id="unserved-warning"' in tc.get("/").text, "a stopping worker takes no new jobs"
    leave(client, "w-2-dddd")


def test_every_overview_count_links_to_its_list_and_a_queue_opens_the_list_with_jobs(client: Client) -> None:
    client.schedule_many([(timedelta(hours=1), {"n": i}) for i in range(2)], queue="later")
    client.schedule(timedelta(0), None, queue="now")
    from scheduler.testing.transitions import Ops

    Ops(client).tick_all()
    tc = console(client)
    text = tc.get("/").text
    later = row(text, "later")
    links = dict(re.findall(r'<td class="n (\w+)"><a href="([^"]+)">', later))
    assert links == {"scheduled": "/jobs?queue=later&amp;state=scheduled",
                     "held": "/jobs?queue=later&amp;state=scheduled", "ready": "/jobs?queue=later&amp;state=ready",
                     "running": "/jobs?queue=later&amp;state=running", "dead": "/dead?queue=later"}
    assert 'href="/jobs?queue=later&amp;state=scheduled" class="queue-link"' in later, "its jobs are all scheduled"
    now = row(text, "now")
    assert 'href="/jobs?queue=now&amp;state=ready" class="queue-link"' in now
    for state, href in links.items():
        page = tc.get(href.replace("&amp;", "&"))
        assert page.status_code == 200, (state, href)
    listed = tc.get("/jobs?queue=later&state=scheduled").text
    assert len(re.findall(r'<tr><td><a href="/job/', listed)) == 2
    assert '<a href="/dead">' in text, "the dead total opens the dead letters"
