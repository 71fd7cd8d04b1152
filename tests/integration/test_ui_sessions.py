"""Console sessions against a real Redis (single server and Cluster): a logout revokes the session
for every console of the namespace (the old cookie, replayed, acts no more); a logout from another
site or without its CSRF token is refused; wrong tokens are throttled per client address (429 with
Retry-After, audited); over https the cookie is Secure; proxy headers count only from a trusted
proxy."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx2 as httpx
import pytest
from starlette.testclient import TestClient

from scheduler import Client, JobState
from scheduler.shell.ui.hosts import LOOPBACK_PROXIES, parse_networks
from scheduler.shell.ui.security import SECURE_SESSION_COOKIE, SESSION_COOKIE, SESSION_SECONDS
from tests.support.helpers import on_both_backends
from tests.support.ui import BASE, TOKEN, console, csrf, login, namespace_client
from tests.support.waits import wait_until

NS = "uisessions"


@pytest.fixture
def client(backend_url: str) -> Iterator[Client]:
    yield from namespace_client(backend_url, NS, partitions=4)


def session_keys(client: Client) -> list[bytes]:
    return sorted(client.redis.scan_iter(match="{%s}:ui:session:*" % NS))


def signed_in(tc: TestClient, cookie: str, name: str = SESSION_COOKIE) -> bool:
    tc.cookies.clear()
    tc.cookies.set(name, cookie)
    return "signed in as" in tc.get("/crons").text


@on_both_backends
def test_a_logout_ends_the_session_on_every_console_of_the_namespace(client: Client) -> None:
    jid = client.schedule(timedelta(hours=1), None, queue="q")
    a, b = console(client), console(client)  # two console processes' worth of state, one Redis
    cookie = login(a)
    (key,) = session_keys(client)
    assert 0 < client.redis.pttl(key) <= SESSION_SECONDS * 1000, "the record expires when the session ends"
    assert cookie.split(".")[0].encode() not in key + (client.redis.get(key) or b""), "no cookie in Redis"
    assert signed_in(b, cookie), "a login on one console holds on the other"
    r = a.post("/logout", data={"csrf": csrf(a, "/")}, follow_redirects=False)
    assert r.status_code == 303 and f'{SESSION_COOKIE}=""' in r.headers["set-cookie"]
    assert session_keys(client) == []
    for tc in (a, b):
        assert not signed_in(tc, cookie), "the old cookie, replayed"
        assert tc.post(f"/action/job/{jid}/cancel", data={"csrf": "x"}).status_code == 401
    assert client.get(jid).state is JobState.SCHEDULED


def test_a_logout_from_another_site_or_without_its_csrf_token_is_refused(client: Client) -> None:
    jid = client.schedule(timedelta(hours=1), None, queue="q")
    tc = console(client)
    cookie = login(tc)
    token = csrf(tc, f"/job/{jid}")  # one token per session, on every form (the logout button's too)
    other = console(client)
    login(other, "bob")
    for form, headers in (({"csrf": token}, {"origin": "http://evil.example"}),
                          ({"csrf": token}, {"referer": "http://evil.example/page"}),
                          ({"csrf": token}, {"origin": "null"}),
                          ({}, {}), ({"csrf": "0" * 64}, {}), ({"csrf": csrf(other, f"/job/{jid}")}, {})):
        r = tc.post("/logout", data=form, headers=headers, follow_redirects=False)
        assert r.status_code == 403 and "set-cookie" not in r.headers, (form, headers)
        assert signed_in(tc, cookie), (form, headers)
    assert tc.post("/logout", data={"csrf": token}, follow_redirects=False).status_code == 303
    assert not signed_in(tc, cookie)


def test_a_new_login_revokes_the_session_the_browser_had(client: Client) -> None:
    tc = console(client)
    first = login(tc)
    second = login(tc, "alice-again")
    assert first != second and len(session_keys(client)) == 1
    assert not signed_in(tc, first) and signed_in(tc, second)


def test_wrong_tokens_are_throttled_per_client_address_with_retry_after_and_audited(
        client: Client, caplog: pytest.LogCaptureFixture) -> None:
    guesser = console(client, peer=("127.0.0.2", 40000))
    neighbour = TestClient(guesser.app, base_url=BASE, client=("127.0.0.3", 40000))  # the same console
    wrong = {"name": "eve", "token": "guess-1234", "next": "/"}
    with caplog.at_level(logging.INFO, logger="zsched.ui.audit"):
        for _ in range(6):  # five free, the sixth locks the address for 1 s
            assert guesser.post("/login", data=wrong).status_code == 403
        for _ in range(2):
            r = guesser.post("/login", data={**wrong, "token": TOKEN}, follow_redirects=False)
            assert r.status_code == 429 and r.headers["retry-after"] == "1", "even the right token waits"
            assert SESSION_COOKIE not in r.cookies and "try again in 1 s" in r.text
        login(neighbour, "bob")  # another address is not held up
        wait_until(lambda: guesser.post("/login", data={**wrong, "token": TOKEN}, follow_redirects=False)
                   .status_code == 303, 10, interval=0.1, what="the lock to pass")
    lines = [rec.getMessage() for rec in caplog.records]
    assert sum("wrong token (name 'eve', from 127.0.0.2:40000" in m for m in lines) == 6
    assert "6 in a row; its logins are refused for 1 s" in lines[5]
    assert sum("too many wrong tokens from 127.0.0.2" in m for m in lines) == 1, "one audit line per lock"


def test_concurrent_wrong_tokens_cannot_outrun_the_throttle(client: Client) -> None:
    app = console(client).app
    wrong = {"name": "eve", "token": "guess-1234"}

    async def from_the_network(scope: Any, receive: Any, send: Any) -> None:
        async def arriving() -> Any:  # a body arrives later than its headers, as over a socket
            await asyncio.sleep(0.01)
            return await receive()
        await app(scope, arriving, send)

    async def burst() -> list[int]:
        transport = httpx.ASGITransport(app=from_the_network, client=("127.0.0.4", 40000))
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as ac:
            replies = await asyncio.gather(*(ac.post("/login", data=wrong) for _ in range(30)))
        return [r.status_code for r in replies]

    codes = asyncio.run(burst())
    assert codes.count(403) == 6 and codes.count(429) == 24, "five free guesses and the one that locks, no more"


def test_over_https_the_session_cookie_is_secure_and_host_only(client: Client) -> None:
    tc = console(client, base_url="https://127.0.0.1:8089")
    r = tc.post("/login", data={"name": "alice", "token": TOKEN, "next": "/"}, follow_redirects=False,
                headers={"origin": "https://127.0.0.1:8089"})
    cookie = r.headers["set-cookie"]
    assert r.status_code == 303 and cookie.startswith(f"{SECURE_SESSION_COOKIE}=")
    assert all(flag in cookie for flag in ("Secure", "HttpOnly", "SameSite=strict", "Path=/"))
    assert "Domain" not in cookie
    assert "signed in as alice" in tc.get("/crons").text
    plain = console(client).post("/login", data={"name": "a", "token": TOKEN}, follow_redirects=False)
    assert plain.headers["set-cookie"].startswith(f"{SESSION_COOKIE}=") and "Secure" not in plain.headers["set-cookie"]


def test_proxy_headers_count_only_from_a_trusted_proxy(client: Client, caplog: pytest.LogCaptureFixture) -> None:
    forwarded = {"host": "console.example.com", "x-forwarded-proto": "https", "origin": "https://console.example.com",
                 "x-forwarded-for": "127.0.0.66, 127.0.0.77"}
    hosts = ("console.example.com",)
    trusted = console(client, allowed_hosts=hosts, trusted_proxies=LOOPBACK_PROXIES)
    elsewhere = console(client, allowed_hosts=hosts, trusted_proxies=parse_networks("10.0.0.0/8"))
    untrusting = console(client, allowed_hosts=hosts)
    with caplog.at_level(logging.INFO, logger="zsched.ui.audit"):
        assert login(trusted, cookie=SECURE_SESSION_COOKIE, **forwarded)
        for tc in (elsewhere, untrusting):  # the headers ignored: http, so an https origin is another site
            r = tc.post("/login", data={"name": "x", "token": TOKEN}, headers=forwarded, follow_redirects=False)
            assert r.status_code == 403, "X-Forwarded-Proto believed from an untrusted peer"
            assert login(tc, "carol", **{**forwarded, "origin": "http://console.example.com"})
    lines = [rec.getMessage() for rec in caplog.records]
    assert "login: alice from 127.0.0.77:0" in lines, "the client the proxy appended"
    assert lines.count("login: carol from 127.0.0.1:50000") == 2, "the peer itself when the proxy is not trusted"
