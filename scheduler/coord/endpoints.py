"""etcd endpoint lists: the TLS material that goes with them, and resolving the members to the
``ip:port`` targets gRPC dials. The lists themselves are parsed in the protocol layer
(:mod:`scheduler.protocol.etcd_endpoints`), so that commands check them before connecting."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
import ssl
from collections.abc import Sequence
from pathlib import Path

from ..protocol.etcd_endpoints import Endpoint
from .api import CoordinatorUnavailable

# appended to every "cannot reach etcd" error
ENV_HINT = (
    "Check that etcd is running and reachable, and that ZSCHED_ETCD_ENDPOINTS "
    "lists its client URLs (e.g. 'http://127.0.0.1:2379' or "
    "'127.0.0.1:2379,127.0.0.1:22379')."
)


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
