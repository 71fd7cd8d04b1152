"""The /metrics server's thread (scheduler.metrics.serve): asleep until a request or a stop, and
stopped at once whether or not the platform shuts a listening socket down."""
from __future__ import annotations

import socket
import threading
import time
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from scheduler.metrics import serve, stop_serving
from scheduler.shell.servers import free_port


def serving_thread(host: str = "127.0.0.1") -> tuple[Any, threading.Thread, int]:
    port = free_port()
    before = set(threading.enumerate())
    server = serve(CollectorRegistry(), port, host)
    [thread] = set(threading.enumerate()) - before
    return server, thread, port


def timeslices(thread: threading.Thread) -> int:
    """How many times the kernel has run ``thread`` (/proc schedstat, third field)."""
    with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
        return int(f.read().split()[2])


def test_an_idle_metrics_server_thread_does_not_wake_until_a_request_comes() -> None:
    server, thread, port = serving_thread()
    try:
        time.sleep(0.2)  # started and asleep in its selector
        before = timeslices(thread)
        time.sleep(1.6)  # socketserver's default poll would have woken it 3 times
        assert timeslices(thread) == before, "the serving thread woke with no request"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.status == 200
        assert timeslices(thread) > before
    finally:
        stop_serving(server)
    thread.join(5)
    assert not thread.is_alive()


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_server_whose_socket_refuses_shutdown_is_woken_by_connections_and_stops(host: str) -> None:
    server, thread, port = serving_thread(host)

    class Refusing:
        """The listening socket, except that shutdown() fails as on platforms that refuse it."""

        def __init__(self, sock: socket.socket) -> None:
            self.sock = sock

        def shutdown(self, how: int) -> None:
            raise OSError("shutdown refused for a listening socket")

        def __getattr__(self, name: str) -> Any:
            return getattr(self.sock, name)

    time.sleep(0.2)
    server.socket = Refusing(server.socket)
    t0 = time.monotonic()
    stop_serving(server)
    assert time.monotonic() - t0 < 2.0
    thread.join(5)
    assert not thread.is_alive()
    with socket.socket() as s:  # closed: the port is free again
        s.bind((host, port))
