"""What the console takes from a URL: every query and path parameter out of range is a 400 page
naming it and saying what is accepted (not a traceback, not an empty "nothing matches" page); a
flash message is shown only when the console wrote it; and a job page renders any payload the
client accepts, however deep or odd."""
from __future__ import annotations

import html
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import msgpack
import pytest

from scheduler import Client
from scheduler.protocol.listing import encode_cursor
from tests.support.ui import console, csrf, login, namespace_client

NS = "uiinputs"
OTHER_LISTING = encode_cursor("scheduled", "other", 0, b"")


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    yield from namespace_client(redis_url, NS)


@pytest.mark.parametrize(("path", "says"), [
    ("/dead?limit=-5", "limit must be a whole number from 1 to 500, got '-5'"),
    ("/dead?limit=abc", "limit must be a whole number from 1 to 500, got 'abc'"),
    ("/dead?limit=1000000000", "limit must be a whole number from 1 to 500"),
    ("/dead?limit=0", "limit must be a whole number from 1 to 500"),
    ("/dead?tz=Mars/Olympus_Mons", "tz must be an IANA time zone name like Europe/Berlin"),
    ("/dead?tz=../../etc/passwd", "tz must be an IANA time zone name"),
    ("/dead?since=yesterday", "since must be a date and time like 2026-05-01T09:30"),
    ("/dead?until=0001-01-01T00:00", "years 1970 to 9998"),
    ("/dead?since=2026-05-02T00:00&until=2026-05-01T00:00", "since (2026-05-02T00:00) is after until"),
    ("/dead?queue=a:b", "queue 'a:b' is invalid"),
    ("/dead?error=" + "x" * 201, "at most 200 characters"),
    ("/jobs?queue=q&state=done", "state must be one of scheduled, ready, running, dead, got 'done'"),
    ("/jobs?queue=q&state=scheduled&cursor=%25%25%25", "is not a valid jobs() cursor"),
    (f"/jobs?queue=q&state=scheduled&cursor={OTHER_LISTING}", "continues a listing of state 'scheduled' in queue"),
    ("/jobs?cursor=abc", "cursor continues a listing: give its queue and state"),
    ("/jobs?queue=q&from=2026-13-01T00:00", "from must be a date and time"),
    ("/jobs?queue=q&to=2026-05-01T00:00&from=2026-06-01T00:00", "is after to"),
    ("/jobs?tz=Nowhere", "tz must be an IANA time zone name"),
    ("/jobs?queue=" + "q" * 65, "is invalid: expected 1-64 characters"),
    ("/jobs?queue=%7Bns%7D", "is invalid"),
    ("/jobs?find=" + "k" * 201, "find takes a job id (30 characters) or an idempotency key"),
    ("/job/not-an-id", "a job id is 30 hexadecimal characters"),
    ("/job/" + "g" * 30, "a job id is 30 hexadecimal characters"),
    ("/task/nope", "a requeue task id is 12 hexadecimal characters"),
    ("/fragment/task/0123456789AB", "a requeue task id is 12 hexadecimal characters"),
    ("/login?next=//evil.example", "next must be a path on this console"),
    ("/login?next=/%5Cevil.example", "next must be a path on this console"),
    ("/login?next=https://evil.example/", "next must be a path on this console"),
])
def test_a_parameter_out_of_range_is_a_400_saying_what_is_accepted(client: Client, path: str, says: str) -> None:
    r = console(client).get(path)
    text = html.unescape(r.text)
    assert r.status_code == 400 and says in text, (r.status_code, text[-600:])
    assert "Bad request" in text and r.headers["content-type"].startswith("text/html")


def test_parameters_in_range_are_taken(client: Client) -> None:
    tc = console(client)
    for path in ("/dead?limit=1", "/dead?limit=500", "/dead?tz=Europe/Berlin&since=2026-05-01T09:30",
                 "/dead?since=2026-05-01T09:30:15&until=2026-05-01T09:30:15", "/dead?queue=q&error=boom",
                 "/jobs?queue=q&state=dead&tz=America/New_York&from=2026-05-01T00:00",
                 "/jobs?state=running", f"/job/{'A' * 30}".replace("A", "0"), "/login?next=/dead%3Fqueue%3Dq"):
        assert tc.get(path).status_code in (200, 404), path


def test_a_flash_message_is_shown_only_when_the_console_wrote_it(client: Client) -> None:
    jid = client.schedule(timedelta(hours=1), None, queue="q")
    tc = console(client)
    page = tc.get("/", params={"msg": "Your session expired: log in again at https://evil.example"}).text
    assert "evil.example" not in page, "a link made elsewhere cannot put words on the page"
    login(tc)
    r = tc.post(f"/action/job/{jid}/cancel", data={"csrf": csrf(tc, f"/job/{jid}")})
    assert r.status_code == 200 and f"job {jid} cancelled" in r.text, "the console's own message is shown"


def nested(depth: int) -> Any:
    """``depth`` containers, lists and maps in turn, around one string."""
    value: Any = "the bottom"
    for i in range(depth):
        value = [value] if i % 2 else {f"k{i}": value}
    return value


def test_the_deepest_payload_the_client_accepts_renders_on_the_job_page(client: Client) -> None:
    deep = client.schedule(timedelta(hours=1), nested(1024), queue="q")  # msgpack decodes at most 1 024 levels
    info = client.get(deep)
    assert info is not None and isinstance(info.payload, list), "decoded, not _undecodable"
    r = console(client).get(f"/job/{deep}")
    text = html.unescape(r.text)
    assert r.status_code == 200 and text.count("[") >= 512 and text.count("{") >= 512
    assert '{"k2": [{"k0": "the bottom"}]}' in text, "the deep end, compact"


def test_odd_payloads_render_as_json_text(client: Client) -> None:
    odd = {1: "int key", None: "nil key", b"k": "bytes key", 2.5: "float key", "bin": b"\x00\xff",
           "big": 2**64 - 1, "small": -(2**63), "nan": float("nan"), "ext": msgpack.ExtType(7, b"ab"),
           "text": "<b>é</b>"}
    jid = client.schedule(timedelta(hours=1), odd, queue="q")
    r = console(client).get(f"/job/{jid}")
    text = html.unescape(r.text)
    assert r.status_code == 200
    for shown in ('"1": "int key"', '"null": "nil key"', '"hex:6b": "bytes key"', '"2.5": "float key"',
                  '"bin": "hex:00ff"', '"big": 18446744073709551615', '"small": -9223372036854775808',
                  '"nan": NaN', '"ext": "ext(7, hex:6162)"', '"text": "<b>é</b>"'):
        assert shown in text, shown
    assert "<b>é</b>" not in r.text, "escaped in the HTML"


def test_a_request_body_over_the_bound_is_refused_unread(client: Client) -> None:
    tc = console(client)
    big = {"name": "eve", "token": "x" * (1 << 20)}
    r = tc.post("/login", data=big)
    assert r.status_code == 413 and "at most 1048576 bytes" in r.text, "Content-Length over the bound"
    chunks = (b"token=" + b"x" * 65536 for _ in range(20))  # no Content-Length: refused once past the bound
    r = tc.post("/login", content=chunks, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413
    assert tc.post("/login", data={"name": "eve", "token": "wrong-token"}).status_code == 403, "a form in bounds"
