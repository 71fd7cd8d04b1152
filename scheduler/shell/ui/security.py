"""The console's safety: an operator token, a signed session cookie naming who acts, CSRF tokens
bound to the session, an Origin check on every POST, security headers, and the audit log.

Reading pages needs no token (the console binds loopback by default); every action needs a
session, made by logging in with the token (``ZSCHED_UI_TOKEN``, or one generated at start-up)
and a name that the audit log records with each action.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from urllib.parse import urlsplit

audit = logging.getLogger("zsched.ui.audit")

SESSION_COOKIE = "zsched_ui_session"
SESSION_SECONDS = 12 * 3600  # a session ends after this long: a cookie left in a browser stops acting
NAME_MAX = 64

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


class ConsoleAuth:
    """Sessions and CSRF tokens derived from the operator token by HMAC: nothing to store, and a
    new token (a restart with another one) invalidates every session. A session names its end
    (``session_seconds`` after the login, signed with the name), after which it acts no more and
    the operator logs in again. ``clock``: epoch seconds (tests)."""

    def __init__(self, token: str, session_seconds: float = SESSION_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        if len(token) < 8:
            raise ValueError("the console token must be at least 8 characters (ZSCHED_UI_TOKEN)")
        self.token = token
        self.session_seconds = session_seconds
        self.clock = clock
        self._key = hashlib.sha256(b"zsched-ui:" + token.encode()).digest()

    def _mac(self, purpose: str, value: str) -> str:
        return hmac.new(self._key, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()

    def token_ok(self, given: str) -> bool:
        """Constant-time comparison with the operator token."""
        return hmac.compare_digest(given.encode(), self.token.encode())

    def session_for(self, who: str) -> str:
        """The session cookie value for operator ``who``: name, end (epoch s) and their MAC."""
        name = base64.urlsafe_b64encode(who.encode()).decode()
        signed = f"{name}.{int(self.clock() + self.session_seconds)}"
        return f"{signed}.{self._mac('session', signed)}"

    def who(self, cookie: str | None) -> str | None:
        """The operator a session cookie names, or None when it is missing, forged or over."""
        if not cookie or cookie.count(".") != 2:
            return None
        signed, mac = cookie.rsplit(".", 1)
        if not hmac.compare_digest(mac.encode(), self._mac("session", signed).encode()):  # bytes: any text compares
            return None
        name, ends = signed.split(".")
        if not ends.isdigit() or int(ends) <= self.clock():
            return None
        try:
            return base64.urlsafe_b64decode(name.encode()).decode()
        except ValueError:
            return None

    def csrf_for(self, cookie: str) -> str:
        """The CSRF token every action form of this session carries."""
        return self._mac("csrf", cookie)

    def csrf_ok(self, cookie: str | None, given: str) -> bool:
        return bool(cookie) and hmac.compare_digest(given.encode(), self.csrf_for(cookie or "").encode())


def same_origin(origin: str | None, referer: str | None, host: str | None) -> bool:
    """True when a POST comes from this console's own pages: its Origin (or, without one, its
    Referer) names this host. Browsers send Origin on every cross-site POST, so a page elsewhere
    cannot act even with the session cookie (which is SameSite=Strict as well)."""
    source = origin or referer
    if not source:
        return True  # not a browser (curl with the session cookie and the CSRF token)
    return bool(host) and urlsplit(source).netloc == host


def clean_name(name: str) -> str:
    """An operator name for the audit log: printable, at most NAME_MAX characters."""
    text = "".join(ch for ch in name.strip() if ch.isprintable())[:NAME_MAX]
    if not text:
        raise ValueError("give your name: it is recorded with every action")
    return text
