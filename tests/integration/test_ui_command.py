"""``zsched ui`` as the operator runs it (``python -m scheduler ui`` processes on loopback, a real
redis-server): start-up problems are one line and a documented exit code; it serves https with
its own certificate (Secure session cookie); it refuses a rebound Host over a real socket; a
logout on one console process ends the session on another; behind a reverse proxy, the proxy's
headers count only with --trust-proxy."""
from __future__ import annotations

import http.client
import os
import re
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode

import pytest

from scheduler import Client
from scheduler.shell.servers import ZschedProc, free_port, ui_proc
from tests.support.ui import TOKEN, namespace_client
from tests.support.waits import wait_until

NS = "uicommand"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    yield from namespace_client(redis_url, NS)


@pytest.fixture
def procs() -> Iterator[list[ZschedProc]]:
    started: list[ZschedProc] = []
    yield started
    for p in started:
        p.stop()


def request(port: int, method: str, path: str, headers: dict[str, str] | None = None, body: str | None = None,
            tls: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], str]:
    """One request to 127.0.0.1:port: (status, headers, body); ``headers`` may set Host."""
    conn = (http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=10) if tls
            else http.client.HTTPConnection("127.0.0.1", port, timeout=10))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode()
    finally:
        conn.close()


def answers(port: int, tls: ssl.SSLContext | None = None) -> bool:
    try:
        return request(port, "GET", "/login", tls=tls)[0] == 200
    except OSError:
        return False


def form_login(port: int, name: str, headers: dict[str, str], tls: ssl.SSLContext | None = None) -> tuple[int, str]:
    """POST /login as a browser on ``headers``' origin would: (status, Set-Cookie)."""
    status, hdrs, _ = request(port, "POST", "/login", {**FORM, **headers},
                              urlencode({"name": name, "token": TOKEN, "next": "/"}), tls)
    return status, hdrs.get("set-cookie", "")


def test_start_up_problems_are_one_line_and_a_documented_exit_code(client: Client, redis_url: str,
                                                                   tmp_path: Path) -> None:
    client.schedule(timedelta(hours=1), None)  # the namespace exists: only the problem under test stops it
    cert = tmp_path / "cert.pem"
    cert.write_text("read before the key is looked for\n")
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    taken = held.getsockname()[1]
    cases = [  # the other argument and TLS checks run in-process: tests/unit/test_ui_cli.py
        (["--port", str(taken)], 4, "the port is in use"),
        (["--host", "999.1.1.1"], 2, "neither an IPv4 address nor a host name"),
        (["--host", "no-such-host.invalid"], 2, "does not resolve"),
        (["--tls-cert", str(cert), "--tls-key", str(tmp_path / "missing.key")], 4, "cannot read --tls-key"),
    ]
    env = {**os.environ, "ZSCHED_REDIS_URL": redis_url, "ZSCHED_NAMESPACE": NS, "ZSCHED_UI_TOKEN": TOKEN}
    try:
        runs = [subprocess.Popen([sys.executable, "-m", "scheduler", "ui", *args], env=env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) for args, _, _ in cases]
        for (args, code, says), run in zip(cases, runs, strict=True):
            out, err = run.communicate(timeout=60)
            assert run.returncode == code, (args, run.returncode, err)
            lines = err.splitlines()
            assert len(lines) == 1 and lines[0].startswith("zsched: error: ") and says in lines[0], (args, err)
            assert out == "", (args, out)
    finally:
        held.close()


def test_the_console_serves_https_with_its_certificate_and_a_secure_session(
        client: Client, redis_url: str, tls_certs: tuple[Path, Path, Path], procs: list[ZschedProc]) -> None:
    jid = client.schedule(timedelta(hours=1), {"card": "4111-SECRET"}, queue="q")
    ca, cert, key = tls_certs
    tls = ssl.create_default_context(cafile=str(ca))
    port = free_port()
    procs.append(ui_proc(redis_url, NS, port=port, token=TOKEN,
                         extra=["--tls-cert", str(cert), "--tls-key", str(key)]).start())
    wait_until(lambda: answers(port, tls), 20, what="the https console")
    wait_until(lambda: f"zsched ui: https://127.0.0.1:{port}/" in procs[0].output(), 10, what="the https URL printed")
    status, cookie = form_login(port, "alice", {"Origin": f"https://127.0.0.1:{port}"}, tls)
    assert status == 303 and cookie.startswith("__Host-zsched_ui_session=")
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    session = cookie.split(";")[0]
    status, _, page = request(port, "GET", f"/job/{jid}", {"Cookie": session}, tls=tls)
    assert status == 200 and "signed in as alice" in page and "4111-SECRET" in page
    status, _, page = request(port, "GET", f"/job/{jid}", {"Cookie": session, "Host": f"attacker.example:{port}"},
                              tls=tls)
    assert status == 421 and "4111-SECRET" not in page, "a rebound name gets nothing, even with the session"
    with socket.create_connection(("127.0.0.1", port)) as raw, tls.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")  # HTTP/1.0 may leave Host out; the console does not serve it
        head = s.recv(4096).decode()
    assert head.startswith("HTTP/1.1 400"), head


def test_a_logout_on_one_console_ends_the_session_on_another_and_proxy_headers_need_trust(
        client: Client, redis_url: str, procs: list[ZschedProc]) -> None:
    jid = client.schedule(timedelta(hours=1), None, queue="q")
    direct, proxied = free_port(), free_port()
    procs.append(ui_proc(redis_url, NS, port=direct, token=TOKEN).start())
    procs.append(ui_proc(redis_url, NS, port=proxied, token=TOKEN,
                         extra=["--allowed-host", "console.example.com", "--trust-proxy"]).start())
    for port in (direct, proxied):
        wait_until(lambda port=port: answers(port), 20, what=f"the console on port {port}")
    # as nginx forwards it (docs/operations.md): the public Host, https, the client it saw appended
    via_proxy = {"Host": "console.example.com", "X-Forwarded-Proto": "https",
                 "X-Forwarded-For": "127.0.0.66, 127.0.0.77", "Origin": "https://console.example.com"}
    status, cookie = form_login(proxied, "alice", via_proxy)
    assert status == 303 and cookie.startswith("__Host-zsched_ui_session=") and "Secure" in cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    wait_until(lambda: "login: alice from 127.0.0.77:0" in procs[1].output(), 10,
               what="the audit line naming the forwarded client (the address the proxy appended)")
    # the other console: not behind the proxy, so the same headers count for nothing there
    assert request(direct, "GET", "/", {"Host": "console.example.com"})[0] == 421, "no --allowed-host there"
    status, _ = form_login(direct, "carol", {"X-Forwarded-Proto": "https", "X-Forwarded-For": "127.0.0.99",
                                             "Origin": f"https://127.0.0.1:{direct}"})
    assert status == 403, "without --trust-proxy the console is http: an https origin is another site"
    status, cookie_b = form_login(direct, "carol", {"X-Forwarded-For": "127.0.0.99",
                                                    "Origin": f"http://127.0.0.1:{direct}"})
    assert status == 303 and "Secure" not in cookie_b
    wait_until(lambda: "login: carol from 127.0.0.1:" in procs[0].output(), 10, what="carol's audit line")
    assert "127.0.0.99" not in procs[0].output(), "X-Forwarded-For ignored without --trust-proxy"
    # alice's session, made on the proxied console, holds on the direct one; her logout there ends it on both
    _, _, page = request(direct, "GET", "/", {"Cookie": f"zsched_ui_session={value}"})
    assert "signed in as alice" in page
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert token
    status, hdrs, _ = request(direct, "POST", "/logout", {**FORM, "Cookie": f"zsched_ui_session={value}",
                                                          "Origin": f"http://127.0.0.1:{direct}"},
                              urlencode({"csrf": token.group(1)}))
    assert status == 303 and "zsched_ui_session=" in hdrs.get("set-cookie", "")
    for port, headers in ((direct, {"Cookie": f"zsched_ui_session={value}"}),
                          (proxied, {**via_proxy, "Cookie": f"__Host-zsched_ui_session={value}"})):
        _, _, page = request(port, "GET", "/", headers)
        assert "signed in as" not in page, f"the old cookie replayed on port {port}"
        status, _, _ = request(port, "POST", f"/action/job/{jid}/cancel", {**FORM, **headers}, "csrf=x")
        assert status == 401, port
