"""What the console tests share: a console app on a real Redis behind starlette's TestClient,
logging in, and reading a page's CSRF token."""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from starlette.testclient import TestClient

from scheduler import Client
from scheduler.shell.ui import ConsoleConfig, create_app
from scheduler.shell.ui.security import SESSION_COOKIE

TOKEN = "test-token-1234"
BASE = "http://127.0.0.1:8089"


def namespace_client(url: str, namespace: str, partitions: int = 2) -> Iterator[Client]:
    """A connected client of ``namespace``, closed afterwards (a fixture's body: ``yield from``)."""
    c = Client.from_url(url, namespace=namespace, partitions=partitions).connect()
    try:
        yield c
    finally:
        c.close()


def console(client: Client, *, read_only: bool = False, url: str = "redis://:s3cret-pass@127.0.0.1:1/0",
            base_url: str = BASE, peer: tuple[str, int] = ("127.0.0.1", 50000), **cfg: Any) -> TestClient:
    """A console on ``client`` (``cfg``: more ConsoleConfig fields), requests sent as from ``peer``."""
    app = create_app(ConsoleConfig(client, TOKEN, redis_url=url, read_only=read_only, **cfg))
    return TestClient(app, base_url=base_url, client=peer)


def login(tc: TestClient, name: str = "alice", cookie: str = SESSION_COOKIE, **headers: str) -> str:
    """Log in with the token; the session cookie's value."""
    r = tc.post("/login", data={"name": name, "token": TOKEN, "next": "/"}, headers=headers, follow_redirects=False)
    assert r.status_code == 303 and cookie in r.cookies, (r.status_code, r.text[:300])
    return str(r.cookies[cookie])


def csrf(tc: TestClient, path: str) -> str:
    """The CSRF token in the forms of ``path``."""
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', tc.get(path).text)
    assert m, f"no CSRF token on {path}"
    return m.group(1)
