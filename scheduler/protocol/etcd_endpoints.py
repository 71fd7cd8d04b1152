"""etcd endpoint lists (``--etcd``, ``ZSCHED_ETCD_ENDPOINTS``): ``[http[s]://][user:password@]host[:port]``
items, comma-separated for the members of one cluster.

Parsed here, below the etcd client (:mod:`scheduler.coord`), so that every command checks the
list before it connects to anything: a malformed list is bad input (exit 2), never an etcd that
"did not answer". Error messages show the list masked (:func:`~scheduler.protocol.masking.mask_secrets`).
"""
from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from .errors import ConfigError
from .masking import mask_secrets

DEFAULT_PORT = 2379
_HINT = ("expected [http[s]://][user:password@]host[:port], comma-separated for the members of one cluster "
         "(e.g. 127.0.0.1:2379 or http://user:password@127.0.0.1:2379; percent-encode @ : / , in a password); "
         "set --etcd or ZSCHED_ETCD_ENDPOINTS")


@dataclass(frozen=True)
class Endpoint:
    """One etcd member's client address."""

    host: str  # IPv4 literal or DNS name (resolved at connect time)
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class ParsedEndpoints:
    """What an endpoint list says: the members, whether to use TLS, and the credentials."""

    endpoints: tuple[Endpoint, ...]
    tls: bool
    user: str | None
    password: str | None


def _bad(item: str, why: str) -> ConfigError:
    return ConfigError(f"etcd endpoint {_shown(item)!r} is invalid: {why}; {_HINT}")


def _shown(item: str) -> str:
    """``item`` masked; a scheme-less one is masked as the ``http://`` URL it stands for, so that
    ``PASSWORD@host`` (user info without a ``:``) is hidden too."""
    if "://" in item:
        return mask_secrets(item)
    return mask_secrets("http://" + item)[len("http://"):]


def parse_endpoints(endpoints: str | Sequence[str]) -> ParsedEndpoints:
    """Parse ``"h:p,h:p"``, ``"https://h:p"``, ``"http://user:pw@h:p"`` forms.

    A missing scheme means plain ``http``; a missing port means 2379.  All endpoints must use the
    same scheme and the same credentials, and credentials are a user and a password.  Raises
    :class:`~scheduler.protocol.errors.ConfigError` (a ``ValueError``) naming the offending item,
    masked, on malformed input.
    """
    items = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    raw = [part.strip() for item in items for part in item.split(",")]
    raw = [r for r in raw if r]
    if not raw:
        raise ConfigError(f"no etcd endpoints given; {_HINT}")
    schemes: set[str] = set()
    creds: set[tuple[str | None, str | None]] = set()
    out: list[Endpoint] = []
    for item in raw:
        scheme, ep, user, password = _parse_item(item)
        schemes.add(scheme)
        if user is not None or password is not None:
            creds.add((user, password))
        if ep not in out:
            out.append(ep)
    if len(schemes) > 1:
        raise ConfigError(f"etcd endpoints mix http:// and https://: use one scheme for all members; {_HINT}")
    if len(creds) > 1:
        raise ConfigError(f"etcd endpoints carry different user:password@ credentials: give the same on every "
                          f"member (or on the first only); {_HINT}")
    user, password = creds.pop() if creds else (None, None)
    return ParsedEndpoints(tuple(out), schemes.pop() == "https", user, password)


def _parse_item(item: str) -> tuple[str, Endpoint, str | None, str | None]:
    """One ``[scheme://][user:password@]host[:port]`` item -> (scheme, endpoint, user, password)."""
    if any(c.isspace() for c in item):  # not shown: masking cannot tell where such a password ends
        raise ConfigError(f"an etcd endpoint contains whitespace (percent-encode a space in a password as %20); "
                          f"{_HINT}")
    try:
        parts = urlsplit(item if "://" in item else "//" + item)
    except ValueError:  # e.g. an unbalanced [ of an IPv6 literal
        raise _bad(item, "not host:port") from None
    scheme = parts.scheme.lower() if "://" in item else "http"
    if scheme not in ("http", "https"):
        raise _bad(item, "the scheme must be http:// or https://")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise _bad(item, "a path, query or fragment after the address")
    try:
        port = DEFAULT_PORT if parts.port is None else parts.port
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise _bad(item, "the port is not a number from 1 to 65535")
    host = parts.hostname
    if not host:
        raise _bad(item, "no host")
    if host == "localhost":
        host = "127.0.0.1"  # etcd3aio dials with the ipv4: scheme
    if _is_ipv6(host):
        raise _bad(item, "IPv6 addresses are not supported by the etcd3aio backend")
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    if (user is not None or password is not None) and not (user and password is not None):
        raise _bad(item, "credentials must be user:password@ (both)")
    return scheme, Endpoint(host, port), user, password


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def check_etcd_endpoints(value: str) -> str:
    """Validate an etcd endpoint list (see :func:`parse_endpoints`); returns it unchanged."""
    parse_endpoints(value)
    return value
