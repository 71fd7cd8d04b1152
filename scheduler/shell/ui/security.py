"""The console's safety: an operator token, server-side sessions behind a signed cookie, CSRF
tokens bound to the session, an Origin check on every POST, signed flash messages, security
headers, and the audit log.

Reading pages needs no token (the console binds loopback by default); every action needs a
session, made by logging in with the token (``ZSCHED_UI_TOKEN``, or one generated at start-up)
and a name that the audit log records with each action.

A session is a random id in the cookie, signed with a key derived from the token, and a record in
Redis (one key per session, ``Keyspace.ui_session_key``) that expires when the session ends. The
signature refuses a forged cookie without a Redis round trip; the record makes a logout final for
every console process of the namespace; a restart with a new token changes the key, so every
earlier cookie fails its signature (and names records nobody can find).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from ...protocol.keys import Keyspace

audit = logging.getLogger("zsched.ui.audit")

SESSION_COOKIE = "zsched_ui_session"
# Over https the cookie takes the __Host- prefix: browsers then insist on Secure, Path=/ and no
# Domain, so a sibling subdomain cannot plant a cookie of that name for the console.
SECURE_SESSION_COOKIE = "__Host-" + SESSION_COOKIE
SESSION_SECONDS = 12 * 3600  # a session ends after this long: a cookie left in a browser stops acting
NAME_MAX = 64
COOKIE_MAX = 200  # a longer cookie value is not one of ours: refused before any hashing
DEFAULT_PORTS = {"http": 80, "https": 443}

# No inline script can run even if some text escaped its escaping; no framing (clickjacking).
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
                               "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def new_token() -> str:
    """A fresh operator token (printed at start-up when ``ZSCHED_UI_TOKEN`` is not set)."""
    return secrets.token_urlsafe(24)


def session_cookie(secure: bool) -> str:
    """The session cookie's name: with the ``__Host-`` prefix over https."""
    return SECURE_SESSION_COOKIE if secure else SESSION_COOKIE


class SessionStore(Protocol):
    """Where session records live, by name (an HMAC of the session id: the id itself is not stored)."""

    def create(self, name: str, record: bytes, ttl_ms: int) -> None:
        """Store a new session's record, expiring after ``ttl_ms``."""

    def read(self, name: str) -> bytes | None:
        """The record, or None when the session ended or was revoked."""

    def delete(self, name: str) -> None:
        """Revoke the session."""


class RedisSessions:
    """Session records in Redis under the namespace, one key per session (so it works on Redis
    Cluster), each expiring when its session ends: every console process of the namespace sees a
    login and a logout at once."""

    def __init__(self, redis: Any, keyspace: Keyspace) -> None:
        self.redis = redis
        self.keyspace = keyspace

    def create(self, name: str, record: bytes, ttl_ms: int) -> None:
        if not self.redis.set(self.keyspace.ui_session_key(name), record, px=max(1, ttl_ms), nx=True):
            raise RuntimeError("a new console session id collided with an existing one")  # 256 random bits: never

    def read(self, name: str) -> bytes | None:
        value = self.redis.get(self.keyspace.ui_session_key(name))
        return value.encode() if isinstance(value, str) else value

    def delete(self, name: str) -> None:
        self.redis.delete(self.keyspace.ui_session_key(name))


@dataclass(frozen=True)
class Session:
    """A signed-in operator: ``who`` (the name given at login), ``ends`` (epoch s) and ``sid``, the
    cookie's random id, which the session's CSRF tokens derive from."""

    who: str
    ends: float
    sid: str


class ConsoleAuth:
    """Logins, sessions, CSRF tokens and signed messages, keyed by the operator token.

    ``store``: where session records live (:class:`RedisSessions`). ``clock``: epoch seconds (tests).
    The methods that take a cookie check its signature first and touch the store only when it is
    one this console (with this token) made.
    """

    def __init__(self, token: str, store: SessionStore, session_seconds: float = SESSION_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        if len(token) < 8:
            raise ValueError("the console token must be at least 8 characters (ZSCHED_UI_TOKEN)")
        self.store = store
        self.session_seconds = session_seconds
        self.clock = clock
        self._key = hashlib.sha256(b"zsched-ui:" + token.encode()).digest()
        self._token_mac = self._mac("token", token)

    def _mac(self, purpose: str, value: str) -> str:
        return hmac.new(self._key, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    def token_ok(self, given: str) -> bool:
        """Whether ``given`` is the operator token (compared as MACs: constant time, length too)."""
        return hmac.compare_digest(self._mac("token", given), self._token_mac)

    def login(self, who: str, peer: str) -> tuple[str, Session]:
        """Open a session for operator ``who`` (logging in from ``peer``): its cookie value and the session."""
        sid = secrets.token_urlsafe(32)
        ends = self.clock() + self.session_seconds
        record = json.dumps({"who": who, "ends": ends, "from": peer}).encode()
        self.store.create(self._mac("session-key", sid), record, int(self.session_seconds * 1000))
        return f"{sid}.{self._mac('session', sid)}", Session(who, ends, sid)

    def _signed_sid(self, cookie: str | None) -> str | None:
        if not cookie or len(cookie) > COOKIE_MAX:
            return None
        sid, dot, mac = cookie.rpartition(".")
        if not dot or not sid or "." in sid:
            return None
        if not hmac.compare_digest(mac.encode(), self._mac("session", sid).encode()):  # bytes: any text compares
            return None
        return sid

    def session(self, cookie: str | None) -> Session | None:
        """The session a cookie names, or None when it is missing, forged (no store access then),
        revoked or over."""
        sid = self._signed_sid(cookie)
        if sid is None:
            return None
        raw = self.store.read(self._mac("session-key", sid))
        if raw is None:
            return None
        try:
            doc = json.loads(raw)
            who, ends = str(doc["who"]), float(doc["ends"])
        except (ValueError, KeyError, TypeError):
            return None
        return Session(who, ends, sid) if ends > self.clock() else None

    def logout(self, session: Session) -> None:
        """Revoke ``session`` for every console of the namespace."""
        self.store.delete(self._mac("session-key", session.sid))

    def csrf_for(self, session: Session) -> str:
        """The CSRF token every form of this session carries."""
        return self._mac("csrf", session.sid)

    def csrf_ok(self, session: Session, given: str) -> bool:
        """Whether ``given`` is ``session``'s CSRF token."""
        return hmac.compare_digest(given.encode(), self.csrf_for(session).encode())

    def sign(self, text: str) -> str:
        """A signature for a flash message carried in a redirect's URL."""
        return self._mac("flash", text)

    def signed(self, text: str, signature: str) -> bool:
        """Whether ``signature`` is :meth:`sign`'s for ``text``: a link made elsewhere cannot put
        words ("your session expired, log in at ...") on a console page."""
        return hmac.compare_digest(signature.encode(), self.sign(text).encode())


def _origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL or origin, the default port filled in; None otherwise."""
    try:
        parts = urlsplit(url)
        scheme, host, port = parts.scheme.lower(), parts.hostname, parts.port
    except ValueError:
        return None
    if scheme not in DEFAULT_PORTS or not host:
        return None
    return scheme, host, port or DEFAULT_PORTS[scheme]


def same_origin(origin: str | None, referer: str | None, scheme: str, host: str | None) -> bool:
    """True when a POST comes from this console's own pages: its Origin (or, without one, its
    Referer) is ``scheme://host`` (the request's scheme, https behind a trusted proxy that says so,
    and its Host header). Browsers send Origin on every cross-site POST (``null`` from sandboxed
    or privacy-sensitive contexts, refused too), so a page elsewhere cannot act even with the
    session cookie, which is SameSite=Strict as well."""
    source = origin or referer
    if not source:
        return True  # not a browser (curl with the session cookie and the CSRF token)
    mine = _origin(f"{scheme}://{host}") if host else None
    return mine is not None and _origin(source) == mine


def clean_name(name: str) -> str:
    """An operator name for the audit log: printable, at most NAME_MAX characters."""
    text = "".join(ch for ch in name.strip() if ch.isprintable())[:NAME_MAX]
    if not text:
        raise ValueError("give your name: it is recorded with every action")
    return text
