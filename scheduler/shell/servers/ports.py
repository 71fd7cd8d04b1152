"""Free loopback ports for the servers and processes we start. Only 127.0.0.1 is ever bound."""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

from .process import ServerError

HOST = "127.0.0.1"
ADDRESS_IN_USE = "Address already in use"  # what redis-server logs when it lost a port race
# "LOW-HIGH": the ports free_port draws from, for this process and the processes it starts. Runs
# that share the machine (the test suite's parallel workers) give each its own range, so a server
# restarted on its port cannot find it taken by another run's new server.
PORT_RANGE_ENV = "ZSCHED_PORT_RANGE"
PORTS_FLOOR = 15000  # below: the well-known and registered services people run

_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_range() -> tuple[int, int] | None:
    """The ports :func:`free_port` draws from: ``ZSCHED_PORT_RANGE`` (``LOW-HIGH``, inclusive), else
    from 15000 to just below the kernel's ephemeral range; None when that range is too narrow (the
    kernel's choice is used then). ServerError for a malformed or out-of-range variable."""
    spec = os.environ.get(PORT_RANGE_ENV)
    if not spec:
        low = _ephemeral_low()
        return (PORTS_FLOOR, low - 1) if low > PORTS_FLOOR + 5000 else None
    lo_s, sep, hi_s = spec.partition("-")
    try:
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        lo = hi = 0
    if not sep or not 1024 <= lo <= hi <= 65535:
        raise ServerError(f"{PORT_RANGE_ENV}={spec!r} is not a port range: "
                          "write LOW-HIGH within 1024-65535, e.g. 20000-24999")
    return lo, hi


def port_free(port: int, reuse_addr: bool = False) -> bool:
    """True if ``port`` can be bound on the loopback address right now.

    ``reuse_addr``: as a server binds it (SO_REUSEADDR), so connections of an earlier run still in
    TIME_WAIT do not count as taking the port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse_addr:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """Return a loopback TCP port that is free now and not handed out before by this process.

    Ports are drawn from :func:`port_range`, below the kernel's ephemeral range: a server that is
    killed and restarted on the same port could otherwise find it taken by some client's outgoing
    connection. Falls back to binding port 0 when no range is set and the kernel leaves none.
    Another process can still take the port before our server binds it: servers that picked their
    port here retry on a new one (``RespServer.start``).
    """
    span = port_range()
    with _ports_lock:
        if span is not None:
            for _ in range(200):
                port = random.randint(*span)
                if port not in _handed_out and port_free(port):
                    _handed_out.add(port)
                    return port
            if os.environ.get(PORT_RANGE_ENV):
                raise ServerError(f"no free loopback port in {PORT_RANGE_ENV}={os.environ[PORT_RANGE_ENV]} "
                                  "after 200 tries: widen it")
        for _ in range(50):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((HOST, 0))
                port = int(s.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise ServerError("no free loopback port found")


def free_ports(n: int) -> list[int]:
    """Return ``n`` distinct free ports (etcd needs a client and a peer port)."""
    return [free_port() for _ in range(n)]


def pick_port(preferred: int) -> int:
    """``preferred`` if it is free (a stable port for people to type), else :func:`free_port`.
    With ``ZSCHED_PORT_RANGE`` set, a preferred port outside it is not used: the range is the
    whole set this process may take."""
    if os.environ.get(PORT_RANGE_ENV):
        lo, hi = port_range() or (0, -1)
        if not lo <= preferred <= hi:
            return free_port()
    return preferred if port_free(preferred, reuse_addr=True) else free_port()
