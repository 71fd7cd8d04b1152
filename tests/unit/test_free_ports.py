"""Free loopback ports: drawn from ZSCHED_PORT_RANGE when it is set (the parallel test workers
each have their own), refused with a one-line fix when it is malformed."""
from __future__ import annotations

import socket

import pytest

from scheduler.shell.servers import ServerError, free_port, pick_port
from scheduler.shell.servers.ports import PORT_RANGE_ENV, port_range


def test_ports_come_from_the_range_set_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "23000-23099")
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20 and all(23000 <= p <= 23099 for p in ports)


def test_a_preferred_port_outside_the_set_range_is_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "23100-23199")
    assert 23100 <= pick_port(16379) <= 23199
    inside = free_port()
    assert pick_port(inside) == inside  # inside the range and free: the stable port is kept


def test_by_default_ports_come_from_below_the_kernels_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    span = port_range()
    if ephemeral_low > 20000:
        assert span == (15000, ephemeral_low - 1)
        assert 15000 <= free_port() < ephemeral_low
    else:
        assert span is None


def test_a_range_with_no_free_port_left_says_to_widen_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setenv(PORT_RANGE_ENV, f"{port}-{port}")
        with pytest.raises(ServerError, match="widen it"):
            free_port()


@pytest.mark.parametrize("spec", ["20000", "20000-", "x-y", "30000-20000", "80-90", "60000-70000", "2e4-3e4"])
def test_a_malformed_range_is_refused_with_the_form_to_write(monkeypatch: pytest.MonkeyPatch, spec: str) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, spec)
    with pytest.raises(ServerError, match="LOW-HIGH within 1024-65535"):
        port_range()
