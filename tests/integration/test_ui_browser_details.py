"""The console's details in a real browser (the system chromium, as test_ui_browser.py): the
last-hour chart, times in the viewer's zone on hover, the reschedule picker pre-filled in that
zone, the action message leaving the address bar, find by key for a finished job, a paused cron,
the favicon.
The jobs are moved with the production scripts directly (scheduler.testing.Ops): no replica or
worker is needed for what these pages show. A screenshot of the chart lands in tests/artifacts/."""
from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from playwright.sync_api import Browser, Response

from scheduler import Client, JobState
from scheduler.protocol.ids import encode_id
from scheduler.shell.servers import ui_proc
from scheduler.shell.servers.ports import free_port
from scheduler.testing import Ops
from tests.support.browser import ARTIFACTS, http_ok
from tests.support.waits import wait_until

NS = "uibrowserdetails"
TOKEN = "browser-details-token-7"
ZONE = "Asia/Tokyo"  # the viewer's zone: nine hours from UTC all year, so the expected text is fixed


@pytest.fixture
def console_url(redis_url: str) -> Iterator[tuple[str, Client]]:
    client = Client.from_url(redis_url, namespace=NS, partitions=4).connect()
    port = free_port()
    proc = ui_proc(redis_url, NS, port=port, token=TOKEN).start()
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/login"), 20, what="the console")
        yield f"http://127.0.0.1:{port}", client
    finally:
        proc.stop()
        client.close()


def test_chart_local_times_prefilled_picker_clean_address_find_by_key_and_favicon(
        console_url: tuple[str, Client], browser: Browser) -> None:
    url, client = console_url
    ops = Ops(client)
    for i in range(5):
        client.schedule(timedelta(0), {"i": i}, queue="mail", key=f"mail-{i}")
    jobs = ops.claim("mail", 5)
    for j in jobs[:4]:
        ops.ack(j)
    ops.fail(jobs[4], "p")
    later = client.schedule(timedelta(hours=3), {}, queue="mail")

    ctx = browser.new_context(timezone_id=ZONE, viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(20_000)
    missing: list[str] = []

    def on_response(r: Response) -> None:
        if r.status == 404:
            missing.append(r.url)
    page.on("response", on_response)

    # the overview's chart: an SVG per queue, a hover text per minute, the hour's totals
    page.goto(url + "/")
    chart = page.locator('figure.chart[data-queue="mail"]')
    assert chart.locator("svg polyline").count() == 4
    assert "fired 5 · acked 4 · failed 1 · dead 1" in chart.locator("figcaption").inner_text()
    titles = chart.locator("rect.hcol title").all_text_contents()
    assert len(titles) == 60 and sum(int(re.search(r"acked (\d+)", t).group(1)) for t in titles) == 4  # type: ignore[union-attr]
    assert chart.locator("svg").bounding_box()["width"] > 500  # type: ignore[index]
    ARTIFACTS.mkdir(exist_ok=True)
    chart.screenshot(path=str(ARTIFACTS / "history-chart.png"))

    # every time: UTC in the text, the viewer's zone on hover, also after the overview refreshed in place
    page.evaluate("document.querySelector('#overview').removeAttribute('data-refreshed')")
    page.wait_for_function("() => document.querySelector('#overview').hasAttribute('data-refreshed')")
    stamp = page.locator("#overview time[datetime]").first
    utc = datetime.fromisoformat(stamp.get_attribute("datetime").replace("Z", "+00:00"))  # type: ignore[union-attr]
    local = utc.astimezone(ZoneInfo(ZONE))
    hover = stamp.get_attribute("title") or ""
    assert hover.endswith(f"({ZONE})") and local.strftime("%H:%M:%S") in hover, hover

    # log in; the job page: run_at relative ("in 2h59m"), the picker holds run_at in the viewer's zone
    page.goto(url + f"/login?next=/job/{later}")
    page.fill("#login-name", "details-test")
    page.fill("#login-token", TOKEN)
    page.click("#login-form button")
    page.wait_for_url(url + f"/job/{later}")
    assert re.search(r"in (2h59m|3h)$", page.locator("#job-fields .f-run_at").inner_text())
    info = client.get(later)
    assert info is not None and info.run_at is not None
    local_run_at = info.run_at.astimezone(ZoneInfo(ZONE))
    # a datetime-local field reads back without ":00" when the seconds are zero (one run in 60)
    shown = f"{local_run_at:%Y-%m-%dT%H:%M}" + (f":{local_run_at:%S}" if local_run_at.second else "")
    assert page.locator("#reschedule-at").input_value() == shown
    assert page.locator("#reschedule-form input.tz").input_value() == ZONE
    page.click("#reschedule-form button")  # submitted untouched: the job keeps its time
    assert "rescheduled" in page.locator("#flash").inner_text()
    after = client.get(later)
    assert after is not None and after.run_at == info.run_at.replace(microsecond=0)
    # the message was shown, and is gone from the address: a reload does not show it again
    page.wait_for_function("() => !location.search.includes('msg=')")
    assert page.url == f"{url}/job/{later}"
    page.reload()
    assert page.locator("#flash").count() == 0

    # find by key: a finished (acked) job's key leads to its page, which says done
    page.goto(url + "/jobs")
    page.fill("#find", "mail-0")
    page.click("#find-form button")
    page.wait_for_url(re.compile(r".*/job/[0-9a-f]{30}$"))
    assert page.locator("#job-fields .f-state").inner_text() == "done"
    assert page.locator("#job-fields .f-key").inner_text() == "mail-0"

    # a cron paused with its button shows since when, in the viewer's zone on hover
    client.add_cron("nightly", "0 3 * * *", None, queue="mail")
    page.goto(url + "/crons")
    page.click('tr[data-cron="nightly"] button')
    assert "cron nightly paused" in page.locator("#flash").inner_text()
    since = page.locator('tr[data-cron="nightly"] td', has_text="since").locator("time")
    assert since.count() == 1 and (since.get_attribute("title") or "").endswith(f"({ZONE})")
    assert page.locator('tr[data-cron="nightly"] button').inner_text() == "resume"

    # the icon: named by every page, served, and nothing the pages asked for was missing
    assert page.locator('link[rel="icon"]').get_attribute("href") == "/static/favicon.svg"
    assert page.request.get(url + "/favicon.ico").status == 200
    assert not missing, missing
    ctx.close()


def test_times_use_utc_digits_when_the_viewer_is_in_utc(console_url: tuple[str, Client], browser: Browser) -> None:
    url, client = console_url
    jid = client.schedule(datetime(2031, 6, 1, 10, 30, 15, tzinfo=UTC), {}, queue="q")
    ctx = browser.new_context(timezone_id="UTC")
    page = ctx.new_page()
    page.goto(url + f"/job/{jid}")
    hover = page.locator("#job-fields .f-run_at time").get_attribute("title") or ""
    assert "10:30:15" in hover and hover.endswith("(UTC)"), hover
    ctx.close()


def test_the_job_queue_and_dead_letter_actions_the_other_browser_tests_leave(
        console_url: tuple[str, Client], browser: Browser) -> None:
    """Run now, cancel and purge on the job page (cancel and purge behind the browser's confirm
    dialog, accepted here), a queue paused and resumed from the overview, and dead letters purged by
    selection after the dry-run count: each leaves Redis as the route says."""
    url, client = console_url
    ops = Ops(client)
    soon, later = (client.schedule(timedelta(hours=3), {}, queue="acts") for _ in range(2))
    for _ in range(2):
        client.schedule(timedelta(0), {}, queue="acts")
    dead_page, dead_picked = ops.claim("acts", 2)
    for j in (dead_page, dead_picked):
        ops.fail(j, "p")
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(20_000)
    dialogs: list[str] = []

    def accept(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.accept()
    page.on("dialog", accept)
    page.goto(url + f"/login?next=/job/{soon}")
    page.fill("#login-name", "actions-test")
    page.fill("#login-token", TOKEN)
    page.click("#login-form button")
    page.wait_for_url(url + f"/job/{soon}")

    page.click("#run-now")
    page.wait_for_selector("#flash")
    assert client.get(soon).state is JobState.READY  # type: ignore[union-attr]

    page.goto(url + f"/job/{later}")
    page.click("#cancel")
    page.wait_for_selector("#flash")
    assert dialogs and later in dialogs[-1]
    assert client.get(later).state is JobState.CANCELLED  # type: ignore[union-attr]

    dead_id = encode_id(dead_page.raw_id)
    page.goto(url + f"/job/{dead_id}")
    page.click("#purge")
    page.wait_for_selector("#flash")
    assert client.get(dead_id) is None, "purged for good"

    page.goto(url + "/")
    row = page.locator('#queues tr[data-queue="acts"]')
    row.locator("button.pause").click()
    page.wait_for_selector('#queues tr[data-queue="acts"] button.resume')
    assert "acts" in client.paused()
    page.locator('#queues tr[data-queue="acts"] button.resume').click()
    page.wait_for_selector('#queues tr[data-queue="acts"] button.pause')
    assert "acts" not in client.paused()

    picked = encode_id(dead_picked.raw_id)
    page.goto(url + "/dead")
    page.locator(f'input.pick[value="{picked}"]').check()
    page.click("#purge-selected")
    assert page.locator("#dry-run-count").inner_text() == "1", "a dry-run count before confirming"
    page.click("#confirm-button")
    assert "purged 1" in page.locator("#flash").inner_text()
    assert client.get(picked) is None
    ctx.close()
