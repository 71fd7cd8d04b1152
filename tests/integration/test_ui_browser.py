"""zsched ui in a real browser: Playwright drives the system chromium (scripts/bootstrap installs
it; no browser download) against a real stack: redis-server, etcd, a scheduler replica, a worker
and the console. Screenshots of the overview, a job and the dead letters land in tests/artifacts/
(copies in docs/img/, shown in docs/operations.md)."""
from __future__ import annotations

import textwrap
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser

from scheduler import Client, JobState
from scheduler.shell.servers import ZschedProc, scheduler_proc, ui_proc
from scheduler.shell.servers.ports import free_port
from tests.support.browser import http_ok, shot
from tests.support.waits import wait_until

NS = "uibrowser"
TOKEN = "browser-token-42"

APP = '''
import os
from workers import Worker
from workers.errors import PermanentError

worker = Worker.from_url(None)


@worker.handler("ui")
async def ui(job):
    if (job.payload or {}).get("fail") and not os.path.exists(os.path.join(os.environ["FLAG_DIR"], "fixed")):
        raise PermanentError("payment gateway timeout after 30s (card declined upstream)")
'''


@pytest.fixture
def stack(redis_url: str, etcd_endpoint: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    (tmp_path / "uiapp.py").write_text(textwrap.dedent(APP))
    client = Client.from_url(redis_url, namespace=NS, partitions=4).connect()
    procs: list[ZschedProc] = [scheduler_proc(redis_url, etcd_endpoint, NS, "r1", ttl=2.0).start()]
    procs.append(ZschedProc(["worker", "uiapp:worker", "--redis", redis_url, "--namespace", NS],
                            env={"FLAG_DIR": str(tmp_path)}, cwd=str(tmp_path)).start())
    port, ro_port = free_port(), free_port()
    procs.append(ui_proc(redis_url, NS, port=port, token=TOKEN, etcd=etcd_endpoint).start())
    procs.append(ui_proc(redis_url, NS, port=ro_port, token=TOKEN, read_only=True).start())
    try:
        for p in (port, ro_port):
            wait_until(lambda p=p: http_ok(f"http://127.0.0.1:{p}/login"), 20, what=f"the console on port {p}")
        yield {"client": client, "url": f"http://127.0.0.1:{port}", "ro": f"http://127.0.0.1:{ro_port}",
               "flags": tmp_path, "procs": procs}
    finally:
        for proc in reversed(procs):
            proc.stop()
        client.close()


def test_the_console_in_a_real_browser(stack: dict[str, Any], browser: Browser) -> None:
    client: Client = stack["client"]
    url = stack["url"]
    ctx = browser.new_context(timezone_id="Europe/Berlin", viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    page.set_default_timeout(20_000)

    # overview: the counts change in place (no reload) as the jobs run
    ids = client.schedule_many([(timedelta(seconds=2), {"n": i}) for i in range(20)], queue="ui")
    page.goto(url + "/")
    row = page.locator('#queues tr[data-queue="ui"]')
    assert row.locator("td.scheduled").inner_text() == "20"
    page.evaluate("window.__same_document = true")
    page.wait_for_function("""() => {
        const r = document.querySelector('#queues tr[data-queue="ui"]');
        const n = (s) => r.querySelector('td.' + s).textContent;
        return r && n('scheduled') === '0' && n('ready') === '0'
            && n('running') === '0';
    }""")
    assert page.evaluate("window.__same_document") is True, "the overview refreshed without reloading"
    wait_until(lambda: all(i and i.state is JobState.DONE for i in client.get_many(ids).values()), 20, what="jobs done")

    # a dead job, found by its error text, requeued and run
    dead = client.schedule(timedelta(0), {"fail": True}, queue="ui", max_attempts=1)
    wait_until(lambda: (i := client.get(dead)) is not None and i.state is JobState.DEAD, 20, what="the job to die")
    page.goto(url + "/login?next=/dead")
    page.fill("#login-name", "browser-test")
    page.fill("#login-token", TOKEN)
    page.click("#login-form button")
    page.wait_for_url(url + "/dead")
    page.fill("#error-filter", "gateway timeout")
    page.click("#filter")
    pick = page.locator(f'input.pick[value="{dead}"]')
    assert pick.count() == 1
    shot(page, "dead-letters.png")
    (stack["flags"] / "fixed").write_text("the gateway is back")
    pick.check()
    page.click("#requeue-selected")
    assert page.locator("#dry-run-count").inner_text() == "1", "a dry-run count before confirming"
    page.click("#confirm-button")
    assert "requeued 1 of 1" in page.locator("#flash").inner_text()
    wait_until(lambda: (i := client.get(dead)) is not None and i.state is JobState.DONE, 20,
               what="the requeued job to run")
    page.goto(f"{url}/job/{dead}")
    assert page.locator("#job-fields .f-state").inner_text() == "done"

    # reschedule with the picker: the browser's zone is shown and used
    later = client.schedule(timedelta(hours=1), {"x": 1}, queue="ui")
    page.goto(f"{url}/job/{later}")
    assert page.locator("#tz-label").inner_text() == "Europe/Berlin"
    page.fill("#reschedule-at", "2031-06-01T12:30:00")
    page.click("#reschedule-form button")
    assert "rescheduled" in page.locator("#flash").inner_text()
    info = client.get(later)
    assert info is not None and info.run_at == datetime(2031, 6, 1, 10, 30, tzinfo=UTC)
    shot(page, "job.png")

    # a payload with a script tag is text, not code
    evil = client.schedule(timedelta(hours=1), {"note": "<script>window.__xss = 1</script>"}, queue="ui")
    page.goto(f"{url}/job/{evil}")
    assert "<script>window.__xss = 1</script>" in page.locator("#payload").inner_text()
    assert page.evaluate("window.__xss") is None, "the payload's script ran"

    page.goto(url + "/")
    shot(page, "overview.png")

    # log out: the session ends in Redis too, so the old cookie, put back, signs nobody in
    old = [c for c in ctx.cookies() if c["name"] == "zsched_ui_session"]
    assert len(old) == 1 and page.locator('form[action^="/action/"]').count() > 0
    page.click("#logout")
    page.wait_for_url(url + "/")
    assert page.locator("#login-link").count() == 1 and page.locator('form[action^="/action/"]').count() == 0
    assert not [c for c in ctx.cookies() if c["name"] == "zsched_ui_session"], "the browser dropped the cookie"
    ctx.add_cookies(old)
    page.reload()
    assert page.locator("#login-link").count() == 1, "the old cookie, replayed, signs nobody in"
    assert page.locator('form[action^="/action/"]').count() == 0

    # read-only: no action anywhere, even when logged in
    ro = ctx.new_page()
    ro.goto(stack["ro"] + f"/job/{evil}")
    assert ro.locator("#read-only").count() == 1
    for path in (f"/job/{evil}", "/", "/dead", "/crons"):
        ro.goto(stack["ro"] + path)
        assert ro.locator('form[action^="/action/"]').count() == 0, path
        assert ro.locator("#actions").count() == 0
    ctx.close()
