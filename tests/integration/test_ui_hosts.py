"""The console answers only to its own names (DNS rebinding): every page, fragment, static file and
action refuses a request whose Host names another site, and the refusal carries no data. The
names it answers to: localhost and IP literals on its port, and those given with --allowed-host."""
from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from scheduler import Client, JobState
from scheduler.testing.transitions import Ops
from tests.support.ui import console, csrf, login, namespace_client

NS = "uihosts"
SECRET = "4111-SECRET"
REBOUND = "attacker.example:8089"


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    yield from namespace_client(redis_url, NS)


def test_a_rebound_name_gets_no_page_fragment_static_file_or_action(client: Client) -> None:
    jid = client.schedule(timedelta(hours=1), {"card": SECRET}, queue="q", key=f"order-{SECRET}")
    dead = client.schedule(timedelta(0), None, queue="dq", max_attempts=1)
    ops = Ops(client)
    (job,) = ops.claim("dq")
    ops.fail(job, "p", msg=f"charge {SECRET} declined")
    client.add_cron("nightly", "0 3 * * *", None, queue="q")
    tc = console(client)
    login(tc)
    token = csrf(tc, f"/job/{jid}")
    assert SECRET in tc.get(f"/job/{jid}").text and SECRET in tc.get("/dead").text, "under its own name: shown"
    pages = ["/", "/fragment/overview", "/jobs", f"/jobs?find={jid}", "/jobs?queue=q&state=scheduled", f"/job/{jid}",
             f"/job/{dead}", "/dead", "/crons", "/login", "/static/console.js", "/static/console.css",
             "/task/0123456789ab", "/fragment/task/0123456789ab", "/no-such-page"]
    for path in pages:
        r = tc.get(path, headers={"host": REBOUND})
        assert r.status_code == 421, path
        assert SECRET not in r.text and jid not in r.text and dead not in r.text and "nightly" not in r.text, path
        assert r.headers["content-type"].startswith("text/plain") and r.headers["x-content-type-options"] == "nosniff"
    origin = {"host": REBOUND, "origin": f"http://{REBOUND}"}  # the rebound page's own origin: same-origin to it
    posts = [(f"/action/job/{jid}/cancel", {"csrf": token}), (f"/action/job/{dead}/purge", {"csrf": token}),
             ("/action/queue/q/pause", {"csrf": token}), ("/logout", {"csrf": token}),
             ("/login", {"name": "eve", "token": "guess-guess"})]
    for path, form in posts:
        r = tc.post(path, data=form, headers=origin, follow_redirects=False)
        assert r.status_code == 421 and "set-cookie" not in r.headers, path
    assert client.get(jid).state is JobState.SCHEDULED and client.get(dead).state is JobState.DEAD
    assert client.paused() == {}
    assert "signed in as alice" in tc.get("/").text, "the session was not logged out either"


@pytest.mark.parametrize(("host", "status"), [
    ("127.0.0.1:8089", 200), ("localhost:8089", 200), ("LocalHost.:8089", 200), ("[::1]:8089", 200),
    ("192.0.2.10:8089", 200), ("console.example.com", 200), ("console.example.com:443", 200),
    ("alt.example.com:8443", 200),
    ("alt.example.com", 421), ("alt.example.com:443", 421), ("localhost:8090", 421), ("localhost", 421),
    ("console.example.com.attacker.example", 421),
    ("::1", 400), ("[::1", 400), ("local host", 400), ("localhost:http", 400), ("", 400),
])
def test_the_names_the_console_answers_to(client: Client, host: str, status: int) -> None:
    tc = console(client, allowed_hosts=("console.example.com", "alt.example.com:8443"))
    assert tc.get("/crons", headers={"host": host}).status_code == status


def test_a_request_with_two_host_headers_is_refused(client: Client) -> None:
    tc = console(client)
    r = tc.get("/crons", headers=[("host", "127.0.0.1:8089"), ("host", REBOUND)])
    assert r.status_code == 400 and "exactly one Host header" in r.text
