"""zsched ui in a real browser (the system chromium through Playwright), for the pages that show
where work stands: the workers page with a live worker's running jobs, the overview's warning on a
queue nobody serves and its counts as links, job lists in run_at order across partitions, and
dead letters paged newest first. A real redis-server, a worker process and the console; no
replica is needed (jobs due now are ready at once). The workers page's screenshot lands in
tests/artifacts/ (a copy in docs/img/, shown in docs/operations.md)."""
from __future__ import annotations

import textwrap
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page

from scheduler import Client
from scheduler.shell import admin
from scheduler.shell.servers import ZschedProc, ui_proc
from scheduler.shell.servers.ports import free_port
from scheduler.testing.transitions import Ops
from tests.support.browser import http_ok, shot
from tests.support.waits import wait_until

NS = "uilists"
TOKEN = "lists-token-7"

APP = '''
import os, time
from workers import Worker

worker = Worker.from_url(None)


@worker.handler("busy")
def busy(job):
    while not os.path.exists(os.path.join(os.environ["FLAG_DIR"], "release")):
        time.sleep(0.05)
'''


@pytest.fixture
def stack(redis_url: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    (tmp_path / "listsapp.py").write_text(textwrap.dedent(APP))
    client = Client.from_url(redis_url, namespace=NS, partitions=4).connect()
    client.schedule(timedelta(hours=1), None, queue="busy")  # the namespace exists before the console starts
    port = free_port()
    procs = [ZschedProc(["worker", "listsapp:worker", "--redis", redis_url, "--namespace", NS, "--concurrency", "4",
                         "--registry-interval", "0.2"], env={"FLAG_DIR": str(tmp_path)}, cwd=str(tmp_path)).start(),
             ui_proc(redis_url, NS, port=port, token=TOKEN).start()]
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/login"), 20, what="the console")
        yield {"client": client, "url": f"http://127.0.0.1:{port}", "flags": tmp_path}
    finally:
        (tmp_path / "release").write_text("done")
        for proc in reversed(procs):
            proc.stop()
        client.close()


def ids_on(page: Page, table: str) -> list[str]:
    return [a.inner_text() for a in page.locator(f"#{table} td:first-child a, #{table} td:nth-child(1) a").all()]


def test_workers_warnings_links_order_and_dead_pages_in_a_real_browser(stack: dict[str, Any],
                                                                       browser: Browser) -> None:  # noqa: F811
    client: Client = stack["client"]
    url = stack["url"]
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    page.set_default_timeout(20_000)

    # the workers page: the live worker, its busy slots and the jobs its handlers run
    running = client.schedule_many([(timedelta(0), i) for i in range(2)], queue="busy")
    wait_until(lambda: any(sorted(j.id for j in w.record.current) == sorted(running)
                           for w in admin.read_registry(client).workers), 20, what="the worker to name its jobs")
    page.goto(url + "/")
    page.click("header nav a[href='/workers']")
    page.wait_for_url(url + "/workers")
    row = page.locator("#workers tr[data-worker]")
    assert row.count() == 1
    assert row.locator("td.queues").inner_text() == "busy" and row.locator("td.busy").inner_text() == "2"
    assert row.locator("td.free").inner_text() == "2" and row.locator("td.concurrency").inner_text() == "4"
    assert sorted(a.inner_text() for a in row.locator("td.current a").all()) == sorted(running)
    assert "s ago" in row.locator("td.heartbeat").inner_text()
    shot(page, "workers.png")

    # the overview warns of a queue with ready jobs and no live worker; its ready count opens them
    orphans = client.schedule_many([(timedelta(0), i) for i in range(3)], queue="orphan")
    base = time.time() + 3600
    later = client.schedule_many([(base + (i % 6) * 0.25, i) for i in range(12)], queue="later")
    page.goto(url + "/")
    warning = page.locator("#unserved-warning")
    assert "orphan" in warning.inner_text() and "busy" not in warning.inner_text()
    assert page.locator('#queues tr[data-queue="orphan"] .warn.unserved').is_visible()
    assert page.locator('#queues tr[data-queue="busy"] .unserved').count() == 0
    page.click('#queues tr[data-queue="orphan"] td.ready a')
    page.wait_for_url("**/jobs?queue=orphan&state=ready")
    assert sorted(ids_on(page, "jobs")) == sorted(orphans)

    # a queue whose jobs are all scheduled opens its scheduled list, in run_at order across partitions
    page.goto(url + "/")
    page.click('#queues tr[data-queue="later"] a.queue-link')
    page.wait_for_url("**/jobs?queue=later&state=scheduled")
    listed = ids_on(page, "jobs")
    infos = client.get_many(later)
    assert listed == sorted(later, key=lambda j: (infos[j].run_at, bytes.fromhex(j)))  # type: ignore[union-attr]
    assert len({client.calls.locate(j)[1] for j in listed}) > 1, "the jobs come from several partitions"

    # dead letters: newest first, a total, older and newer pages
    ops = Ops(client)
    dead = client.schedule_many([(timedelta(0), i) for i in range(7)], queue="gone")
    for claimed in ops.claim("gone", 7):
        ops.fail(claimed, "p", msg="card declined\nat the issuer")
    dinfo = client.get_many(dead)
    newest = sorted(dead, key=lambda j: (dinfo[j].died_at, bytes.fromhex(j)), reverse=True)  # type: ignore[union-attr]
    page.goto(url + "/dead?queue=gone&limit=3")
    assert page.locator("#dead-total strong").inner_text() == "7"
    seen = ids_on(page, "dead")
    page.click("#older-page")
    seen += ids_on(page, "dead")
    page.click("#older-page")
    seen += ids_on(page, "dead")
    assert seen == newest and page.locator("#older-page").count() == 0
    page.click("#newer-page")
    assert ids_on(page, "dead") == newest[3:6]
    assert page.locator("#dead td.err").first.inner_text().startswith("RuntimeError: card declined")
    assert "at the issuer" not in page.locator("#dead").inner_text()
