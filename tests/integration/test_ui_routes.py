"""zsched ui, server side: every route against a real redis-server through starlette.testclient
(status codes, escaping, token and CSRF checks, read-only mode, no secret rendered)."""
from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
from starlette.testclient import TestClient

from scheduler import Client, JobState
from scheduler.protocol.replies import parse_stats
from scheduler.shell.ui.security import SESSION_COOKIE, SESSION_SECONDS, ConsoleAuth, RedisSessions
from tests.support.ui import TOKEN, console, csrf, login, namespace_client

NS = "uiroutes"
HOUR = timedelta(hours=1)


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    yield from namespace_client(redis_url, NS, partitions=4)


def app(client: Client, read_only: bool = False) -> TestClient:
    return console(client, read_only=read_only)


def test_every_page_renders_and_the_redis_password_never_shows(client: Client) -> None:
    jid = client.schedule(HOUR, {"a": 1}, queue="q", key="order-7")
    client.add_cron("nightly", "0 3 * * *", None, queue="q")
    tc = app(client)
    for path in ("/", "/fragment/overview", "/jobs", "/jobs?queue=q&state=scheduled", f"/job/{jid}", "/dead",
                 "/crons", "/login", "/static/console.js", "/static/console.css"):
        r = tc.get(path)
        assert r.status_code == 200, path
        assert "s3cret-pass" not in r.text, f"{path} shows the Redis password"
    assert jid in tc.get("/jobs?queue=q&state=scheduled").text
    assert tc.get("/job/" + "0" * 30).status_code == 404
    assert tc.get("/job/not-an-id").status_code == 400, "a malformed id is bad input, not an unknown job"
    r = tc.get("/jobs", params={"find": "order-7"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/job/{jid}"
    assert tc.get("/jobs", params={"find": jid}, follow_redirects=False).headers["location"] == f"/job/{jid}"
    assert tc.get("/jobs", params={"find": "nothing-here"}).status_code == 404
    assert "nightly" in tc.get("/crons").text
    page = tc.get("/")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert 'data-queue="q"' in page.text


def test_a_payload_with_a_script_tag_is_shown_as_text(client: Client) -> None:
    jid = client.schedule(HOUR, {"html": "<script>alert(1)</script>", "raw": b"\x00\xff"}, queue="q")
    text = app(client).get(f"/job/{jid}").text
    assert "<script>alert(1)</script>" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "hex:00ff" in text, "bytes are shown as hex"


def test_actions_need_a_session_a_csrf_token_and_the_same_origin(client: Client,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    jid = client.schedule(HOUR, None, queue="q")
    tc = app(client)
    assert tc.post(f"/action/job/{jid}/cancel", data={}).status_code == 401
    assert tc.post("/login", data={"name": "eve", "token": "wrong-token"}).status_code == 403
    assert tc.post("/login", data={"name": "", "token": TOKEN}).status_code == 400
    login(tc)
    token = csrf(tc, f"/job/{jid}")
    assert tc.post(f"/action/job/{jid}/cancel", data={}).status_code == 403, "no CSRF token"
    assert tc.post(f"/action/job/{jid}/cancel", data={"csrf": "0" * 64}).status_code == 403
    assert tc.post(f"/action/job/{jid}/cancel", data={"csrf": "é" * 64}).status_code == 403  # not a 500
    evil = tc.post(f"/action/job/{jid}/cancel", data={"csrf": token}, headers={"origin": "http://evil.example"})
    assert evil.status_code == 403, "cross-site POST"
    tc.cookies.clear()
    tc.cookies.set(SESSION_COOKIE, "YWxpY2U.forged")
    assert tc.post(f"/action/job/{jid}/cancel", data={"csrf": token}).status_code == 401, "forged session"
    tc.cookies.clear()
    store = RedisSessions(client.redis, client.keyspace)
    ended, _ = ConsoleAuth(TOKEN, store, clock=lambda: time.time() - SESSION_SECONDS - 1).login("alice", "test")
    tc.cookies.set(SESSION_COOKIE, ended)
    assert tc.post(f"/action/job/{jid}/cancel", data={"csrf": token}).status_code == 401, "a session that ended"
    assert "Log in" in tc.get(f"/job/{jid}").text or "login" in tc.get(f"/job/{jid}").text
    tc.cookies.clear()
    login(tc)
    token = csrf(tc, f"/job/{jid}")  # a new session, a new CSRF token
    with caplog.at_level(logging.INFO, logger="zsched.ui.audit"):
        r = tc.post(f"/action/job/{jid}/cancel", data={"csrf": token}, follow_redirects=False)
    assert r.status_code == 303
    assert client.get(jid).state is JobState.CANCELLED
    assert any("alice" in rec.getMessage() and "cancel" in rec.getMessage() for rec in caplog.records)
    assert tc.post(f"/action/job/{jid}/nope", data={"csrf": token}).status_code == 404


def test_job_actions_reschedule_run_now_requeue_purge(client: Client) -> None:
    tc = app(client)
    login(tc)
    jid = client.schedule(HOUR, None, queue="q")
    token = csrf(tc, f"/job/{jid}")
    r = tc.post(f"/action/job/{jid}/reschedule", data={"csrf": token, "at": "2031-01-02T03:04:05",
                                                       "tz": "Europe/Berlin"})
    assert r.status_code == 200 and "rescheduled" in r.text
    info = client.get(jid)
    assert info.run_at is not None and info.run_at.isoformat() == "2031-01-02T02:04:05+00:00"
    assert "refused" in tc.post(f"/action/job/{jid}/reschedule", data={"csrf": token, "at": "nope"}).text
    tc.post(f"/action/job/{jid}/run-now", data={"csrf": token})
    assert client.get(jid).state is JobState.READY
    dead = _dead_job(client, "boom")
    assert "requeued" in tc.post(f"/action/job/{dead}/requeue", data={"csrf": token}).text
    dead2 = _dead_job(client, "bang")
    tc.post(f"/action/job/{dead2}/purge", data={"csrf": token})
    assert client.get(dead2) is None


def _dead_job(client: Client, message: str) -> str:
    from scheduler.testing.transitions import Ops

    queue = "dq-" + os.urandom(3).hex()  # its own queue: the claim below gets only this job
    jid = client.schedule(timedelta(0), {"m": message}, queue=queue, max_attempts=1)
    ops = Ops(client)
    (claimed,) = ops.claim(queue)
    ops.fail(claimed, "p", msg=message)
    assert client.get(jid).state is JobState.DEAD
    return jid


def test_dead_letters_filter_dry_run_then_requeue_and_purge(client: Client) -> None:
    boom = [_dead_job(client, "boom") for _ in range(3)]
    other = _dead_job(client, "disk full")
    tc = app(client)
    assert "disk full" in tc.get("/dead").text
    page = tc.get("/dead", params={"error": "boom"}).text
    assert all(j in page for j in boom) and other not in page
    login(tc)
    token = csrf(tc, "/dead")
    r = tc.post("/action/dead/all/requeue", data={"csrf": token, "error": "boom", "rate": "1000"})
    assert re.search(r'id="dry-run-count">3<', r.text), "a dry-run count comes first"
    assert all(client.get(j).state is JobState.DEAD for j in boom), "nothing done before confirming"
    r = tc.post("/action/dead/all/requeue", data={"csrf": token, "error": "boom", "confirm": "1"})
    assert "requeued 3 of 3" in r.text, "without a rate, one batch is requeued in the request"
    assert all(client.get(j).state is JobState.READY for j in boom)
    r = tc.post("/action/dead/all/purge", data={"csrf": token, "id": [other]})
    assert re.search(r'id="dry-run-count">1<', r.text)
    tc.post("/action/dead/all/purge", data={"csrf": token, "id": [other], "confirm": "1"})
    assert client.get(other) is None


def test_queue_and_cron_pause_buttons(client: Client) -> None:
    client.schedule(timedelta(0), None, queue="q")
    client.add_cron("c1", "* * * * *", None, queue="q")
    tc = app(client)
    login(tc)
    token = csrf(tc, "/")
    tc.post("/action/queue/q/pause", data={"csrf": token})
    assert set(client.paused()) == {"q"}
    assert "since" in tc.get("/").text
    tc.post("/action/queue/q/resume", data={"csrf": token})
    assert client.paused() == {}
    tc.post("/action/cron/c1/pause", data={"csrf": token})
    assert client.crons()[0].paused is not None
    tc.post("/action/cron/c1/resume", data={"csrf": token})
    assert client.crons()[0].paused is None


def test_read_only_shows_no_action_and_refuses_every_post(client: Client) -> None:
    jid = client.schedule(HOUR, None, queue="q")
    client.add_cron("c1", "* * * * *", None, queue="q")
    tc = app(client, read_only=True)
    r = tc.post("/login", data={"name": "alice", "token": TOKEN, "next": "/"}, follow_redirects=False)
    assert r.status_code == 403 and SESSION_COOKIE not in r.cookies, "read-only: nothing to log in for"
    for path in ("/", f"/job/{jid}", "/dead", "/crons"):
        text = tc.get(path).text
        assert 'name="csrf"' not in text and "/action/" not in text, path
        assert 'id="read-only"' in text
    assert tc.post(f"/action/job/{jid}/cancel", data={"csrf": "x"}).status_code == 403
    assert client.get(jid).state is JobState.SCHEDULED


def _poll(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _task_field(tc: TestClient, location: str, name: str) -> str:
    m = re.search(rf'id="task-{name}">([^<]*)<', tc.get(location).text)
    assert m, f"no task-{name} on {location}"
    return m.group(1)


def test_a_rate_limited_requeue_runs_in_the_background_with_a_progress_page(
        client: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from scheduler.shell.ui import tasks
    from scheduler.testing.transitions import Ops

    n = 30
    ids = client.schedule_many([(timedelta(0), i) for i in range(n)], queue="dq", max_attempts=1)
    ops = Ops(client)
    for job in ops.claim("dq", n):
        ops.fail(job, "p", msg="boom")
    assert all(i and i.state is JobState.DEAD for i in client.get_many(ids).values())
    gate, paced = threading.Event(), threading.Event()

    def gated(stop: threading.Event, _seconds: float) -> bool:  # the pacer's wait: held until the test says
        paced.set()
        gate.wait(60)
        return not stop.is_set()

    monkeypatch.setattr(tasks, "pace_wait", gated)
    tc = app(client)
    login(tc, "bob")
    token = csrf(tc, "/dead")
    with caplog.at_level(logging.INFO, logger="zsched.ui.audit"):
        r = tc.post("/action/dead/all/requeue", data={"csrf": token, "queue": "dq", "rate": "10", "confirm": "1"},
                    follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/task/"), "the request returns at once"
        where = r.headers["location"]
        _poll(paced.is_set, "the task to wait for its pace")
        assert _task_field(tc, where, "state") == "running" and _task_field(tc, where, "who") == "bob"
        assert int(_task_field(tc, where, "requeued")) < n and _task_field(tc, where, "total") == str(n)
        again = tc.post("/action/dead/all/requeue", data={"csrf": token, "queue": "dq", "rate": "10", "confirm": "1"})
        assert "a requeue of queue dq is still running" in again.text, "one at a time per queue"
        assert 'data-src="/fragment/task/' in tc.get(where).text, "the progress page refreshes itself"
        gate.set()
        _poll(lambda: _task_field(tc, where, "state").startswith("done"), "the requeue to finish")
    assert _task_field(tc, where, "requeued") == str(n)
    assert all(i and i.state is JobState.READY for i in client.get_many(ids).values())
    assert client.stats()["dq"]["ready"] == n and client.stats()["dq"]["dead"] == 0, "each job requeued once"
    log = [rec.getMessage() for rec in caplog.records]
    assert any("bob" in m and "requeue started" in m for m in log)
    assert any("bob" in m and "requeue done" in m and f"requeued {n} of {n}" in m for m in log)
    assert where.rsplit("/", 1)[1] in tc.get("/dead").text, "the dead-letter page links the task"


def test_the_crons_page_and_cron_list_show_each_crons_missed_occurrences(
        client: Client, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.shell.cli import main
    from scheduler.testing.transitions import Ops

    client.add_cron("late", "* * * * * *", None, queue="late")
    client.add_cron("skip", "* * * * * *", None, queue="skip", misfire="skip", misfire_grace=0.3)
    client.add_cron("fine", "0 3 * * *", None, queue="fine")
    pending = {c.name: c.next_fire for c in client.crons()}
    first = max(pending["late"], pending["skip"])  # type: ignore[type-var]
    sec, usec = client.redis.time()
    deadline = time.monotonic() + 30
    while int(sec) * 1000 + int(usec) // 1000 < first.timestamp() * 1000 + 2500:  # no tier: occurrences pass
        assert time.monotonic() < deadline
        time.sleep(0.02)
        sec, usec = client.redis.time()
    ops = Ops(client)
    ops.tick_all()
    (catch_up,) = ops.claim("late")
    missed = {c.name: c.missed for c in client.crons()}
    assert missed["late"] == catch_up.record.cron_missed >= 2, "run_late: the occurrences its catch-up run covers"
    misfired = sum(parse_stats(client.transport.call(*client.calls.stats_call(p))).counters.get("misfired:skip", 0)
                   for p in range(4))
    assert missed["skip"] == misfired >= 3, "skip: every occurrence dropped, its pending one included"
    assert missed["fine"] == 0
    page = app(client).get("/crons").text
    for name in ("late", "skip", "fine"):
        m = re.search(rf'<tr data-cron="{name}">.*?<td class="n missed">(\d+)</td>', page, re.S)
        assert m and int(m.group(1)) == missed[name], name
    assert main(["cron", "list", "--json", "--redis", redis_url, "--namespace", NS]) == 0
    listed = {c["name"]: c["missed"] for c in json.loads(capsys.readouterr().out)}
    assert listed == missed


def test_the_jobs_page_reads_a_run_at_range_of_scheduled_jobs_in_full_pages(client: Client) -> None:
    base = datetime(2031, 1, 2, 3, 0, tzinfo=UTC)
    ids = client.schedule_many([(base + timedelta(minutes=i), i) for i in range(250)], queue="q")
    client.schedule_many([(base + timedelta(minutes=i, seconds=30), i) for i in range(250)], queue="other")
    want = set(ids[50:170])  # 03:50 .. 05:49 inclusive: 120 jobs
    tc = app(client)
    params = {"queue": "q", "state": "scheduled", "tz": "UTC", "from": "2031-01-02T03:50", "to": "2031-01-02T05:49"}
    url: str | None = "/jobs?" + urlencode(params)
    pages: list[list[str]] = []
    while url:
        text = tc.get(url).text
        assert 'id="per-page-filter"' not in text
        pages.append(re.findall(r'<tr><td><a href="/job/([0-9a-f]{30})">', text))
        m = re.search(r'href="(/jobs\?[^"]+)" id="next-page"', text)
        url = m.group(1).replace("&amp;", "&") if m else None
    got = [j for page in pages for j in page]
    assert len(got) == 120 and set(got) == want, "exactly the 120 matching jobs, each once"
    assert [len(p) for p in pages[:2]] == [50, 50] and len(pages[2]) == 20, [len(p) for p in pages]
    page = tc.get("/jobs?" + urlencode({**params, "state": "ready"})).text
    assert 'id="per-page-filter"' in page, "other states say the filter is applied per page"
