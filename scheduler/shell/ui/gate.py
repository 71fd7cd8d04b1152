"""What reaches the console: the Host allow-list (against DNS rebinding) and, with
``--trust-proxy``, the scheme and client address a reverse proxy forwards. One ASGI middleware in
front of every page, fragment, static file and action.

DNS rebinding: a page on a site the operator visits (``http://attacker.example:8089``) re-points
its own name at 127.0.0.1; the browser then sends that page's requests to the console, and as
they are same-origin for the browser, the page reads the answers (payloads, keys, errors) and its
POSTs pass an Origin check. What gives it away is the Host header: the browser sends the name the
page was loaded from. So a request is served only when Host names the console:

- an IP literal (``127.0.0.1:8089``, ``[::1]:8089``, any address: rebinding needs a NAME the
  attacker controls, an address cannot be re-pointed), or ``localhost`` (browsers resolve it to
  loopback themselves), with the port the console listens on (none: 80 for http, 443 for https);
- a name given with ``--allowed-host NAME`` (any port) or ``--allowed-host NAME:PORT`` (that port),
  e.g. the name a reverse proxy serves the console under.

Names compare without case and without one trailing dot (``LocalHost.`` is ``localhost``). A
missing or repeated Host, or one that is not ``name[:port]`` / ``[v6][:port]``, is a 400; a
well-formed Host naming anything else a 421 (Misdirected Request); neither carries any data.

Proxy headers are ignored unless ``--trust-proxy`` names the peer (default there: loopback): then
the last ``X-Forwarded-Proto`` (http or https) is the request's scheme (Secure cookie, the origin
POSTs must come from) and the last address of ``X-Forwarded-For`` (the one the proxy appended;
those before it are what the client claimed) is the client, for the login throttle and the audit
log.

A request body (a form) is at most MAX_BODY bytes: a larger Content-Length is a 413 before the
app runs, and a body without one stops being read past the bound (413), so nobody who can reach
the port fills the console's memory with one POST /login.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .hosts import HostPolicy, IPNetwork
from .security import DEFAULT_PORTS, SECURITY_HEADERS

MAX_BODY = 1 << 20  # bytes of a request body: the largest form (500 dead letters selected) is ~20 KB


def _last(values: Iterable[str]) -> str:
    """The last entry of comma-separated header values (what the nearest proxy added)."""
    entries = [e.strip() for v in values for e in v.split(",") if e.strip()]
    return entries[-1] if entries else ""


class Gate:
    """The ASGI middleware: proxy headers from trusted peers applied, then the Host check."""

    def __init__(self, app: ASGIApp, hosts: HostPolicy, trusted_proxies: Sequence[IPNetwork] = ()) -> None:
        self.app = app
        self.hosts = hosts
        self.trusted = tuple(trusted_proxies)

    def _trusts(self, client: Any) -> bool:
        if not self.trusted or not client:
            return False
        try:
            peer = ipaddress.ip_address(client[0])
        except ValueError:
            return False
        peer = getattr(peer, "ipv4_mapped", None) or peer
        return any(peer in net for net in self.trusted)

    def forwarded(self, scope: Scope) -> Scope:
        """``scope`` with the scheme and client a trusted proxy forwarded (unchanged otherwise)."""
        if not self._trusts(scope.get("client")):
            return scope
        headers: list[tuple[bytes, bytes]] = scope["headers"]
        proto = _last(v.decode("latin-1") for k, v in headers if k == b"x-forwarded-proto").lower()
        client = _last(v.decode("latin-1") for k, v in headers if k == b"x-forwarded-for")
        scope = dict(scope)
        if proto in DEFAULT_PORTS:
            scope["scheme"] = proto if scope["type"] == "http" else {"http": "ws", "https": "wss"}[proto]
        if client:
            try:
                scope["client"] = (str(ipaddress.ip_address(client)), 0)
            except ValueError:
                pass  # not an address (a proxy that writes names or ports): keep the peer's
        return scope

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        scope = self.forwarded(scope)
        hosts = [v.decode("latin-1") for k, v in scope["headers"] if k == b"host"]
        scheme = str(scope.get("scheme") or "http")
        scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
        server = scope.get("server")
        refused = self.hosts.refusal(hosts, scheme, int(server[1]) if server and server[1] else None)
        if refused is None and scope["type"] == "http":
            refused = _too_large(scope["headers"])
            receive = _bounded(receive)
        if refused is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
        else:
            status, why = refused
            await PlainTextResponse(why + "\n", status_code=status, headers=SECURITY_HEADERS)(scope, receive, send)


def _too_large(headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
    lengths = [v for k, v in headers if k == b"content-length"]
    if lengths and (not lengths[-1].isdigit() or int(lengths[-1]) > MAX_BODY):
        return 413, f"a request body is at most {MAX_BODY} bytes"
    return None


def _bounded(receive: Receive) -> Receive:
    """``receive`` that stops a body (sent without a Content-Length, or longer than it said) past MAX_BODY."""
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > MAX_BODY:
                raise HTTPException(413, f"a request body is at most {MAX_BODY} bytes")
        return message

    return bounded
