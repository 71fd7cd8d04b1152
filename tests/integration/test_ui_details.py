"""The console's details, server side: relative times next to absolute ones, the reschedule picker
pre-filled, finding a finished job by its key while its tombstone lives, paused crons in the
console and in ``zsched cron list``, zsched's own error classes by their short name, the audit
log naming what a dead-letter action acted on, and the favicon."""
from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from datetime import UTC, timedelta

import pytest

from scheduler import Client, JobState
from scheduler.protocol.calls import error_arg
from scheduler.protocol.codes import FailKind
from scheduler.protocol.replies import Claimed
from scheduler.protocol.transitions import Failure, fail_call
from scheduler.shell.admin import jobs as jobs_admin
from scheduler.shell.cli import main as cli_main
from scheduler.testing import Ops
from tests.support.ui import console, csrf, login, namespace_client

NS = "uidetails"
NOW = timedelta(0)


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    yield from namespace_client(redis_url, NS, partitions=4)


def die_permanently(ops: Ops, job: Claimed) -> None:
    """Fail ``job`` as a handler raising workers.errors.PermanentError does (the type a worker records)."""
    raw_id, token = job.raw_id, job.token
    failure = Failure(raw_id, token, FailKind.PERMANENT, 0,
                      error_arg("workers.errors.PermanentError", "card declined", "Traceback ..."))
    ops.send(fail_call(ops.calls, ops.partition(raw_id), [failure]))


def test_times_show_relative_to_now_next_to_utc_in_a_time_element(client: Client) -> None:
    jid = client.schedule(timedelta(hours=3), {}, queue="q")
    page = console(client).get(f"/job/{jid}").text
    cell = re.search(r'<td class="f-run_at">(.*?)</td>', page, re.S)
    assert cell, "no run_at cell"
    m = re.fullmatch(r'<time datetime="(\S+Z)" class="when">\1</time> <span class="rel">in (2h59m|3h)</span>',
                     cell.group(1))
    assert m, cell.group(1)
    created = re.search(r'<td class="f-created">(.*?)</td>', page, re.S)
    assert created and re.search(r'class="rel">(now|\ds ago)<', created.group(1)), created


def test_the_reschedule_picker_holds_the_jobs_run_at(client: Client) -> None:
    jid = client.schedule(timedelta(hours=2), {}, queue="q")
    info = client.get(jid)
    assert info is not None and info.run_at is not None
    tc = console(client)
    login(tc)
    field = re.search(r'<input type="datetime-local" name="at" id="reschedule-at"[^>]*>', tc.get(f"/job/{jid}").text)
    assert field, "no reschedule picker"
    assert f'value="{info.run_at.astimezone(UTC):%Y-%m-%dT%H:%M:%S}"' in field.group(0)
    assert 'data-utc="' in field.group(0), "console.js needs the UTC time to show it in the viewer's zone"
    # submitted as it is (the form's tz field says UTC without the script), the job keeps its time
    r = tc.post(f"/action/job/{jid}/reschedule", data={"csrf": csrf(tc, f"/job/{jid}"), "tz": "UTC",
                                                       "at": f"{info.run_at:%Y-%m-%dT%H:%M:%S}"},
                headers={"origin": "http://127.0.0.1:8089"}, follow_redirects=False)
    assert r.status_code == 303
    after = client.get(jid)
    assert after is not None and after.run_at == info.run_at.replace(microsecond=0)


def test_find_by_key_finds_a_finished_job_while_its_tombstone_lives(client: Client) -> None:
    ops = Ops(client)
    done = client.schedule(NOW, {}, queue="q", key="receipt-9")
    (job,) = ops.claim("q", 1)
    ops.ack(job)
    cancelled = client.schedule(timedelta(hours=1), {}, queue="q", key="invoice-3")
    client.cancel(cancelled)
    tc = console(client)
    for key, jid, state in (("receipt-9", done, "done"), ("invoice-3", cancelled, "cancelled")):
        r = tc.get("/jobs", params={"find": key}, follow_redirects=False)
        assert (r.status_code, r.headers.get("location")) == (303, f"/job/{jid}"), key
        assert re.search(rf'<td class="f-state">{state}</td>', tc.get(f"/job/{jid}").text), key
    # the key is free again: a new live job holding it is the one found
    again = client.schedule(timedelta(hours=1), {}, queue="q", key="receipt-9")
    assert tc.get("/jobs", params={"find": "receipt-9"}, follow_redirects=False).headers["location"] == f"/job/{again}"
    # in a namespace that keeps no tombstones, a finished job's key finds nothing
    bare = Client(client.redis, namespace=NS + "-t0").connect()
    bare.set_tombstone_ttl(0)
    bare.schedule(NOW, {}, queue="q", key="no-trace")
    (job,) = Ops(bare).claim("q", 1)
    Ops(bare).ack(job)
    r = console(bare).get("/jobs", params={"find": "no-trace"})
    assert r.status_code == 404 and "no job with id or idempotency key" in r.text


def test_a_key_search_that_stopped_at_its_limit_says_so(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    ops = Ops(client)
    for i in range(40):  # tombstones in every partition
        client.schedule(NOW, {}, queue="q", key=f"k-{i}")
    for job in ops.claim("q", 40):
        ops.ack(job)
    monkeypatch.setattr(jobs_admin, "FINISHED_SCAN_LIMIT", 1)
    r = console(client).get("/jobs", params={"find": "never-used"})
    assert r.status_code == 404 and "only the first 1 finished jobs of its partition were searched" in r.text


def test_paused_crons_show_in_the_console_and_in_cron_list(client: Client, redis_url: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    client.add_cron("nightly", "0 3 * * *", None, queue="q")
    client.add_cron("hourly", "0 * * * *", None, queue="q")
    client.pause_cron("nightly")
    row = re.search(r'<tr data-cron="nightly">.*?</tr>', console(client).get("/crons").text, re.S)
    assert row and re.search(r'since <time datetime="\S+Z" class="when">', row.group(0))
    assert cli_main(["cron", "list", "--redis", redis_url, "--namespace", NS]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-1] == "PAUSED", lines[0]
    rows = {ln.split()[0]: ln for ln in lines[1:]}
    assert re.search(r"since \d{4}-\d\d-\d\dT\S+Z$", rows["nightly"]), rows["nightly"]
    assert rows["hourly"].rstrip().endswith(" -"), rows["hourly"]


def test_zscheds_own_error_classes_show_by_their_short_name(client: Client) -> None:
    ops = Ops(client)
    jid = client.schedule(NOW, {}, queue="q", max_attempts=1)
    (job,) = ops.claim("q", 1)
    die_permanently(ops, job)
    tc = console(client)
    for path in ("/dead", "/jobs?queue=q&state=dead"):
        text = tc.get(path).text
        assert "PermanentError: card declined" in text and "workers.errors.PermanentError" not in text, path
    page = tc.get(f"/job/{jid}").text
    assert '<strong title="workers.errors.PermanentError" id="error-type">PermanentError</strong>' in page
    info = client.get(jid)
    assert info is not None and info.state is JobState.DEAD and info.last_error is not None
    assert info.last_error.type == "workers.errors.PermanentError", "the stored type keeps its module"
    assert str(info.last_error) == "PermanentError: card declined"


def test_the_audit_log_names_a_selected_requeue_by_its_jobs(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    ops = Ops(client)
    ids = [client.schedule(NOW, {}, queue="q", max_attempts=1) for _ in range(2)]
    for job in ops.claim("q", 2):
        die_permanently(ops, job)
    tc = console(client)
    login(tc)
    token = csrf(tc, "/dead")
    with caplog.at_level(logging.INFO, logger="zsched.ui.audit"):
        r = tc.post("/action/dead/all/requeue", data={"csrf": token, "confirm": "1", "id": ids[0]},
                    headers={"origin": "http://127.0.0.1:8089"}, follow_redirects=False)
        assert r.status_code == 303
        r = tc.post("/action/dead/all/purge", data={"csrf": token, "confirm": "1", "queue": "q"},
                    headers={"origin": "http://127.0.0.1:8089"}, follow_redirects=False)
        assert r.status_code == 303
    lines = [rec.getMessage() for rec in caplog.records]
    assert any(f"dead requeue of 1 selected job: {ids[0]}: requeued 1 of 1" in ln for ln in lines), lines
    assert any("dead purge of the jobs matching queue=q: purged 1 dead jobs" in ln for ln in lines), lines
    assert not any("dead requeue all" in ln for ln in lines), lines


def test_the_favicon_is_served(client: Client) -> None:
    tc = console(client)
    r = tc.get("/favicon.ico")
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml") and b"<svg" in r.content
    assert '<link rel="icon" href="/static/favicon.svg"' in tc.get("/").text
    assert tc.get("/static/favicon.svg").status_code == 200
