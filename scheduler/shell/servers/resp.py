"""A minimal RESP2 client over a plain socket: enough to probe and drive the redis-server and
Sentinel processes we start, without a client library (and without its reconnects or pools)."""

from __future__ import annotations

import socket
from typing import Any, BinaryIO

from .ports import HOST
from .process import ServerError


def read_reply(f: BinaryIO) -> Any:
    """Parse one RESP2 reply from a binary file object; an error reply raises ServerError."""
    line = f.readline()
    if not line:
        raise ConnectionError("connection closed")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body.decode()
    if kind == b"-":
        raise ServerError(body.decode())
    if kind == b":":
        return int(body)
    if kind == b"$":
        n = int(body)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2]
    if kind == b"*":
        n = int(body)
        return None if n < 0 else [read_reply(f) for _ in range(n)]
    raise ServerError(f"unexpected RESP line {line!r}")


def encode_command(*args: str | bytes | int) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def redis_command(port: int, *args: str | bytes | int, host: str = HOST, timeout: float = 2.0) -> Any:
    """Send one command over a fresh connection and return the parsed reply."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(encode_command(*args))
        with s.makefile("rb") as f:
            return read_reply(f)


def redis_info(port: int, section: str | None = None, host: str = HOST, timeout: float = 2.0) -> dict[str, str]:
    """``INFO [section]`` as a dict (``{"role": "master", "connected_slaves": "1", ...}``)."""
    raw = redis_command(port, "INFO", *([section] if section else []), host=host, timeout=timeout)
    out: dict[str, str] = {}
    for line in (raw or b"").decode(errors="replace").splitlines():
        if line and not line.startswith("#") and ":" in line:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    return out


def reply_pairs(reply: Any) -> dict[str, str]:
    """A flat ``[k1, v1, k2, v2, ...]`` reply (``SENTINEL master``) as a dict of strings."""
    items = [x.decode(errors="replace") if isinstance(x, bytes) else str(x) for x in (reply or [])]
    return dict(zip(items[::2], items[1::2], strict=False))
