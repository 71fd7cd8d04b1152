"""Free loopback ports for the servers and processes we start. Only 127.0.0.1 is ever bound."""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

from .process import ServerError

HOST = "127.0.0.1"
ADDRESS_IN_USE = "Address already in use"  # what redis-server logs when it lost a port race

_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


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

    Ports are drawn below the kernel's ephemeral range when possible: a server that is killed and
    restarted on the same port could otherwise find it taken by some client's outgoing connection.
    Falls back to binding port 0.  Another process can still take the port before our server binds
    it: servers that picked their port here retry on a new one (``RespServer.start``).
    """
    with _ports_lock:
        low = _ephemeral_low()
        if low > 20000:
            for _ in range(200):
                port = random.randint(15000, low - 1)
                if port not in _handed_out and port_free(port):
                    _handed_out.add(port)
                    return port
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
    """``preferred`` if it is free (a stable port for people to type), else :func:`free_port`."""
    return preferred if port_free(preferred, reuse_addr=True) else free_port()
