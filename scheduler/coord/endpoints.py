"""etcd endpoint lists: parsing ``[http[s]://][user:password@]host[:port]`` items, the TLS
material that goes with them, and resolving the members to the ``ip:port`` targets gRPC dials."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..protocol.connection import mask_url
from .api import CoordinatorUnavailable

DEFAULT_PORT = 2379
# appended to every "cannot reach etcd" error
ENV_HINT = (
    "Check that etcd is running and reachable, and that ZSCHED_ETCD_ENDPOINTS "
    "lists its client URLs (e.g. 'http://127.0.0.1:2379' or "
    "'127.0.0.1:2379,127.0.0.1:22379')."
)


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


def parse_endpoints(endpoints: str | Sequence[str]) -> ParsedEndpoints:
    """Parse ``"h:p,h:p"``, ``"https://h:p"``, ``"http://user:pw@h:p"`` forms.

    A missing scheme means plain ``http``; a missing port means 2379.  All
    endpoints must use the same scheme and the same credentials.  Raises
    ``ValueError`` with the offending item on malformed input.
    """
    items = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    raw = [part.strip() for item in items for part in item.split(",")]
    raw = [r for r in raw if r]
    if not raw:
        raise ValueError("no etcd endpoints given (set ZSCHED_ETCD_ENDPOINTS, e.g. '127.0.0.1:2379')")
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
        raise ValueError("etcd endpoints mix http:// and https://; use one scheme for all members")
    if len(creds) > 1:
        raise ValueError("etcd endpoints carry different user:password@ credentials")
    user, password = creds.pop() if creds else (None, None)
    return ParsedEndpoints(tuple(out), schemes.pop() == "https", user, password)


def _parse_item(item: str) -> tuple[str, Endpoint, str | None, str | None]:
    """One ``[scheme://][user:password@]host[:port]`` item -> (scheme, endpoint, user, password)."""
    if "://" in item:
        parts = urlsplit(item)
        scheme = parts.scheme.lower()
    else:
        parts = urlsplit("//" + item)
        scheme = "http"
    if scheme not in ("http", "https"):
        raise ValueError(f"etcd endpoint {_masked(item)!r}: scheme must be http or https")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"etcd endpoint {_masked(item)!r}: expected [scheme://][user:password@]host[:port]")
    try:
        port = parts.port or DEFAULT_PORT
    except ValueError as exc:
        raise ValueError(f"etcd endpoint {_masked(item)!r}: bad port") from exc
    host = parts.hostname
    if not host:
        raise ValueError(f"etcd endpoint {_masked(item)!r}: missing host")
    if host == "localhost":
        host = "127.0.0.1"  # etcd3aio dials with the ipv4: scheme
    if _is_ipv6(host):
        raise ValueError(f"etcd endpoint {_masked(item)!r}: IPv6 addresses are not supported by the etcd3aio "
                         "backend")
    user = unquote(parts.username) if parts.username is not None else None
    password = unquote(parts.password) if parts.password is not None else None
    return scheme, Endpoint(host, port), user, password


def _masked(item: str) -> str:
    """``item`` without its password: error messages must not carry it."""
    return mask_url(item) if "://" in item else mask_url("http://" + item).split("://", 1)[1]


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def load_pem(value: bytes | str | os.PathLike[str] | None, what: str) -> bytes | None:
    """Accept PEM bytes, PEM text or a path to a PEM file."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        return value.encode()
    path = Path(value)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read etcd {what} from {path}: {exc}") from exc


def system_ca_bundle() -> bytes:
    """The system's CA certificates, for https endpoints given without a CA."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_bytes()
    raise ValueError("https etcd endpoint given but no ca_cert and no system CA bundle was found")


async def resolve(endpoints: Sequence[Endpoint], budget: float) -> tuple[list[str], str | None]:
    """Turn endpoints into ``ip:port`` targets (etcd3aio dials ``ipv4:``), plus the first DNS
    name among them (TLS verifies the server certificate against it), within ``budget`` seconds."""
    loop = asyncio.get_running_loop()
    targets: list[str] = []
    server_name: str | None = None
    for ep in endpoints:
        try:
            ipaddress.IPv4Address(ep.host)
        except ValueError:
            pass
        else:
            targets.append(f"{ep.host}:{ep.port}")
            continue
        server_name = server_name or ep.host
        try:
            async with asyncio.timeout(budget):
                infos = await loop.getaddrinfo(ep.host, ep.port, family=socket.AF_INET, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as exc:
            raise CoordinatorUnavailable(
                f"cannot resolve etcd endpoint {ep}: {exc or 'timeout'}. {ENV_HINT}"
            ) from exc
        for info in infos:
            target = f"{info[4][0]}:{ep.port}"
            if target not in targets:
                targets.append(target)
    return targets, server_name
