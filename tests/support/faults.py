"""Fault injection for the real servers of ``scheduler.shell.servers``: test code only.

- :class:`Pausable`: ``pause()``/``resume()`` a process with SIGSTOP/SIGCONT (it keeps its sockets
  but answers nothing);
- :class:`RedisStall`: a busy Lua script that holds a redis-server's command loop for a while
  (every other client waits, nothing is lost), started by ``tests.support.servers.RedisServer.stall()``.

The servers the tests use (``tests/support/servers.py``) are the shared classes with these added.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Self

from scheduler.shell.servers import HOST, ChildProcess, ServerError, encode_command, read_reply

PAUSE_WAIT_S = 2.0


class Pausable(ChildProcess):
    """Adds SIGSTOP/SIGCONT to a child process (mix in before the server class)."""

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing. Returns once every thread
        is stopped (signal delivery is asynchronous: a busy server could still answer otherwise)."""
        self.signal(signal.SIGSTOP)
        pid = self.pid
        deadline = time.monotonic() + PAUSE_WAIT_S
        while pid is not None and time.monotonic() < deadline:
            try:
                states = [Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
                          for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                break
            if all(st in ("T", "t", "Z", "X") for st in states):
                break
            time.sleep(0.001)

    def resume(self) -> None:
        """SIGCONT after ``pause()``; returns once the process is no longer stopped."""
        self.signal(signal.SIGCONT)
        deadline = time.monotonic() + PAUSE_WAIT_S
        while self.paused and time.monotonic() < deadline:
            time.sleep(0.001)


# Spins until ARGV[1] microseconds have passed on the server's clock; returns the microseconds.
_STALL_LUA = (
    "local t0 = redis.call('TIME') "
    "while true do "
    "local t = redis.call('TIME') "
    "local us = (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) "
    "if us >= tonumber(ARGV[1]) then return us end "
    "end"
)


def _tcp_unread_diag(local_port: int, remote_port: int) -> int | None:
    """``_tcp_unread`` through netlink sock_diag: one exact-socket lookup, however many sockets exist."""
    netlink_sock_diag, sock_diag_by_family, nlm_f_request, nlmsg_error, tcp_established = 4, 20, 1, 2, 1
    addr = socket.inet_aton(HOST) + bytes(12)
    req = (
        struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 1 << tcp_established)
        + struct.pack("!HH", local_port, remote_port)
        + addr
        + addr
        + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)  # any interface, INET_DIAG_NOCOOKIE
    )
    msg = struct.pack("=IHHII", 16 + len(req), sock_diag_by_family, nlm_f_request, 1, 0) + req
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, netlink_sock_diag) as s:
        s.settimeout(1.0)
        s.sendall(msg)
        data = s.recv(65536)
    if len(data) < 16 + 4 + 48 + 12 or struct.unpack_from("=H", data, 4)[0] == nlmsg_error:
        return None  # ENOENT: no such socket
    # inet_diag_msg: family, state, timer, retrans; sockid (sport, dport, src, dst, if, cookie); expires, rqueue
    state = data[17]
    sport, dport = struct.unpack_from("!HH", data, 20)
    if state != tcp_established or (sport, dport) != (local_port, remote_port):
        return None  # the kernel fell back to the listening socket
    return int(struct.unpack_from("=I", data, 16 + 4 + 48 + 4)[0])


def _tcp_unread(local_port: int, remote_port: int) -> int | None:
    """Bytes not yet read by the owner of the IPv4 loopback socket ``local_port`` <- ``remote_port``;
    None if there is no such socket.  Uses sock_diag, else /proc/net/tcp (``rx_queue``), which can
    take tens of ms to read on a machine with thousands of sockets (TIME_WAIT left by tests)."""
    try:
        return _tcp_unread_diag(local_port, remote_port)
    except (OSError, AttributeError, struct.error):  # no AF_NETLINK / sock_diag here
        pass
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        f = line.split()
        if len(f) < 5:
            continue
        try:
            if int(f[1].rsplit(":", 1)[1], 16) == local_port and int(f[2].rsplit(":", 1)[1], 16) == remote_port:
                return int(f[4].split(":")[1], 16)
        except (ValueError, IndexError):
            continue
    return None


# How much faster than the monotonic clock Redis's wall clock (TIME, which times a stall) may run
# while the VM's time sync corrects it: 0.36 % was seen over half a second
CLOCK_RATE_SLACK = 0.01


class RedisStall:
    """A running ``RedisServer.stall()``: a busy Lua script holding the server's command loop.

    ``join()`` waits for the end and returns how long the script ran (server clock, ms), re-raising
    what went wrong in between (e.g. a ConnectionError if the server was killed meanwhile).  As a
    context manager, leaving the block joins.

    ``sent_at`` (``time.monotonic()`` just before the script was sent) is a lower bound of its start,
    so a client blocked by the stall gets its reply after :attr:`earliest_end`: a bound that holds
    however loaded the machine is. (The script times itself with ``TIME``, Redis's wall clock, which
    the VM's time sync may run faster than the monotonic clock: a CI run saw a 500 ms stall end
    1.8 ms before ``sent_at + 0.5`` and a 200 ms one 0.5 ms before, a second apart; so the bound
    allows :data:`CLOCK_RATE_SLACK`.)  ``started_at`` is when this process saw that the server had read
    the script; on a machine with more busy processes than cores that can lag the real start by tens
    of ms, so timing checks should use stalls of several hundred ms.
    """

    def __init__(self, server: Any, ms: float, busy_after_ms: int | None = None) -> None:
        if ms <= 0:
            raise ValueError("stall needs ms > 0")
        self.server = server
        self.port: int = server.port
        self.ms = float(ms)
        self.busy_after_ms = busy_after_ms
        self.sent_at = 0.0
        self.started_at = 0.0
        self.elapsed_ms: float | None = None
        self._error: BaseException | None = None
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def _call(self, f: BinaryIO, *args: str | bytes | int) -> Any:
        assert self._sock is not None
        self._sock.sendall(encode_command(*args))
        return read_reply(f)

    def begin(self) -> Self:
        """Send the script and return once the server is running it."""
        sock = socket.create_connection((HOST, self.port), timeout=5.0)
        self._sock = sock
        f = sock.makefile("rb")
        try:
            # A reply proves the server accepted and registered this connection.
            self._call(f, "CLIENT", "SETNAME", "zsched-test-stall")
            old = int(self._call(f, "CONFIG", "GET", "lua-time-limit")[1])
            want = self.busy_after_ms
            if want is None and self.ms + 1000 >= old:
                want = int(self.ms) + 5000
            restore = old if want is not None and want != old else None
            if restore is not None:
                self._call(f, "CONFIG", "SET", "lua-time-limit", want)
            sock.settimeout(self.ms / 1000 + 10.0)
        except BaseException as e:
            f.close()
            sock.close()
            if isinstance(e, TimeoutError):
                raise ServerError(f"{self.server!r} did not answer within 5 s (paused?)") from e
            raise
        # The reader thread is running before the script is sent: Thread.start() waits for the new
        # thread to be scheduled, which on a loaded machine would eat into the stall.
        self._thread = threading.Thread(target=self._finish, args=(f, restore), name="redis-stall", daemon=True)
        self._thread.start()
        self.sent_at = time.monotonic()
        sock.sendall(encode_command("EVAL", _STALL_LUA, 0, int(self.ms * 1000)))
        client_port = int(sock.getsockname()[1])
        # Redis reads a query and runs it in the same step (no I/O threads): once the server's
        # socket has no unread bytes left, the script is running.
        deadline = time.monotonic() + 5.0
        while (unread := _tcp_unread(self.port, client_port)) is not None and unread > 0 and not self.done:
            if time.monotonic() > deadline:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread, which closes the socket
                raise ServerError(f"{self.server!r} did not read the stall script within 5 s (paused?)")
            time.sleep(0.0005)
        self.started_at = time.monotonic()
        return self

    def _finish(self, f: BinaryIO, restore: int | None) -> None:
        assert self._sock is not None
        try:
            self.elapsed_ms = int(read_reply(f)) / 1000.0
            if restore is not None:
                self._call(f, "CONFIG", "SET", "lua-time-limit", restore)
        except BaseException as e:  # noqa: BLE001 - handed to join()
            self._error = e
        finally:
            f.close()
            self._sock.close()

    @property
    def earliest_end(self) -> float:
        """``time.monotonic()`` before which the stall cannot have ended (see the class docstring)."""
        return self.sent_at + self.ms / 1000 * (1 - CLOCK_RATE_SLACK)

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> float:
        """Wait for the stall to end (default: up to ``ms`` + 10 s); return its duration in ms."""
        assert self._thread is not None, "stall not started"
        self._thread.join(self.ms / 1000 + 10.0 if timeout is None else timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"stall of {self.ms} ms on port {self.port} still running")
        if self._error is not None:
            raise self._error
        assert self.elapsed_ms is not None
        return self.elapsed_ms

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.join()
        else:  # don't hide the test's own failure behind a join error
            try:
                self.join()
            except BaseException:  # noqa: BLE001, S110
                pass

    def __repr__(self) -> str:
        return f"RedisStall(port={self.port}, ms={self.ms}, done={self.done})"
