"""What zsched uses of redis-py (and hiredis) below their command API, checked in one place.

The script transports send pipelined EVALSHAs on connections they check out of the pools
themselves (``send_packed_command``/``read_response``), the worker's bell wait keeps a connection
of its own, cluster routing reads and updates redis-py's slot map (``nodes_manager``), and the
connectors override two connection hooks (``_connect`` for the TLS handshake's timeout,
``_host_error`` for the messages). None of that is redis-py's documented API, so pyproject.toml
pins redis-py to the major version these tests and the suite were run on. An upgrade that moves
any of it fails here, by name, before a round trip misbehaves; upgrading means running the whole
suite on the new version and then widening the pin (CONTRIBUTING.md, "Dependencies").

Each entry says where zsched relies on it; the behaviour behind it (a restart, a failover, a
MOVED slot) is proven by the integration and fault tests of those modules.
"""
from __future__ import annotations

import inspect
import tomllib
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import hiredis
import pytest
import redis.asyncio.cluster as acluster
import redis.asyncio.connection as aconnection
import redis.asyncio.sentinel as asentinel
import redis.cluster as scluster
import redis.connection as sconnection
import redis.sentinel as ssentinel
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def pinned(name: str) -> Requirement:
    """The requirement on ``name`` in pyproject.toml's dependencies."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = [Requirement(d) for d in deps if Requirement(d).name == name]
    assert len(found) == 1, f"pyproject.toml names {name} {len(found)} times"
    return found[0]


def test_redis_py_is_pinned_below_its_next_major_version_and_the_installed_one_fits() -> None:
    req = pinned("redis")
    assert "hiredis" in req.extras, "hiredis parses replies and packs the transports' commands"
    assert any(s.operator == "<" for s in req.specifier), \
        "redis-py needs an upper bound: zsched uses its connection internals (this module's docstring)"
    assert req.specifier.contains(version("redis")), f"redis-py {version('redis')} is outside {req}"


def params(fn: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(fn).parameters)


def takes(fn: Callable[..., Any], *names: str) -> None:
    got = params(fn)
    missing = [n for n in names if n not in got]
    assert not missing, f"{fn.__qualname__} no longer takes {missing}: {inspect.signature(fn)}"


def callable_without_arguments(fn: Callable[..., Any]) -> None:
    required = [p for n, p in params(fn).items()
                if n != "self" and p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    assert not required, f"{fn.__qualname__} now requires {required}"


@pytest.mark.parametrize("conn", [sconnection.AbstractConnection, aconnection.AbstractConnection],
                         ids=["blocking", "asyncio"])
def test_connections_keep_the_raw_round_trip_the_transports_use(conn: type) -> None:
    """redisio/transport.py, transport_async.py, batch.py ``pack``, workers/doorbell.py: pack
    once, send without the per-command health check, read the replies in order, close a
    connection whose reply may be half read."""
    takes(conn.send_packed_command, "command", "check_health")
    assert 'kwargs.get("check_health"' in inspect.getsource(conn.send_command), "send_command(..., check_health=)"
    takes(conn.read_response, "disable_decoding")
    for name in ("pack_command", "pack_commands", "connect", "disconnect", "can_read"):
        assert callable(getattr(conn, name, None)), f"{conn.__qualname__}.{name} is gone"
    assert callable(getattr(hiredis, "pack_command", None)), "hiredis.pack_command (redisio/batch.py) is gone"


def test_a_cluster_node_closes_its_connections_in_use_and_a_closed_one_says_so() -> None:
    """redisio/transport_async.py ``closed_under_us``: ``ClusterNode.disconnect`` (a slot-map
    refresh that drops or replaces a node) closes every connection of the node, those checked out
    too, and the next write on one meets a missing stream (an AttributeError, not a
    ConnectionError); ``is_connected`` is how the transport tells that case from a bug."""
    from redis.asyncio.cluster import ClusterNode

    src = inspect.getsource(ClusterNode.disconnect)
    assert "self._connections" in src, "ClusterNode.disconnect no longer closes every connection"
    assert isinstance(inspect.getattr_static(aconnection.AbstractConnection, "is_connected"), property)
    conn = aconnection.Connection()
    assert conn.is_connected is False, "a connection never connected (or closed) reports so"


def test_the_blocking_pool_probe_and_the_asyncio_close_take_their_arguments() -> None:
    takes(sconnection.AbstractConnection.can_read, "timeout")  # transport.py: a kept connection's probe
    takes(aconnection.AbstractConnection.disconnect, "nowait")  # transport_async.py ``_drop``


@pytest.mark.parametrize("pool", [sconnection.ConnectionPool, aconnection.ConnectionPool], ids=["blocking", "asyncio"])
def test_pools_hand_out_and_take_back_connections(pool: type) -> None:
    """Both transports check connections out and in themselves; the asyncio ones keep a lane's
    connection and probe it with the pool's own ``ensure_connection`` before reuse."""
    callable_without_arguments(pool.get_connection)
    takes(pool.release, "connection")
    if pool is aconnection.ConnectionPool:
        assert inspect.iscoroutinefunction(pool.ensure_connection)
        assert inspect.iscoroutinefunction(pool.get_connection)
    assert "connection_kwargs" in inspect.getsource(pool.__init__), \
        "client/options.py and doorbell.py read a pool's connection_kwargs (socket timeouts)"


@pytest.mark.parametrize("mod", [scluster, acluster], ids=["blocking", "asyncio"])
def test_the_cluster_slot_map_can_be_read_and_updated(mod: Any) -> None:
    """redisio/routing.py: route each call by its slot, follow MOVED/ASK, re-read the map after a
    node failed; redisio/pubsub.py: a channel's node."""
    nm = mod.NodesManager
    takes(nm.get_node_from_slot, "slot")
    takes(nm.get_node, "node_name")
    takes(nm.move_slot, "e")
    callable_without_arguments(nm.initialize)
    assert callable(getattr(mod.RedisCluster, "get_node_from_key", None))
    if mod is acluster:
        assert inspect.iscoroutinefunction(nm.move_slot) and inspect.iscoroutinefunction(nm.initialize)
        assert inspect.iscoroutinefunction(mod.RedisCluster.initialize)
        callable_without_arguments(mod.ClusterNode.acquire_connection)
        takes(mod.ClusterNode.release, "connection")
    else:
        takes(mod.RedisCluster.get_redis_connection, "node")


def test_the_connection_hooks_the_connectors_override_are_still_called() -> None:
    """redisio/connectors.py: ``TLSConnection._connect`` bounds the TLS handshake by the connect
    timeout; ``_host_error`` names a Sentinel master in connection errors. A hook redis-py stops
    calling would be overridden for nothing, silently."""
    assert "self._connect()" in inspect.getsource(sconnection.AbstractConnection.connect_check_health)
    assert callable(getattr(sconnection.SSLConnection, "_connect", None))
    for conn in (sconnection.AbstractConnection, aconnection.AbstractConnection):
        assert callable(getattr(conn, "_host_error", None)), f"{conn.__module__}: _host_error is gone"
        assert "_host_error()" in inspect.getsource(conn), f"{conn.__module__} no longer calls _host_error"


@pytest.mark.parametrize("mod", [ssentinel, asentinel], ids=["blocking", "asyncio"])
def test_a_sentinel_connection_to_a_demoted_master_fails_as_a_connection_error(mod: Any) -> None:
    """The kept connections (transport lanes, the bell wait) count on this after a failover: the old
    master, now a replica, answers READONLY, which the Sentinel connection turns into a
    ConnectionError and a disconnect, so the next checkout finds the new master."""
    src = inspect.getsource(mod.SentinelManagedConnection.read_response)
    assert "ReadOnlyError" in src and "ConnectionError" in src
    takes(mod.Sentinel.__init__, "sentinels", "sentinel_kwargs")
    assert callable(getattr(mod.Sentinel, "discover_master", None))


async def test_send_packed_writes_without_wait_for_and_keeps_redis_pys_timeout_and_errors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """redisio/transport_async.py ``send_packed`` (the transports' and the bell wait's writes):
    a connection whose ``socket_timeout`` is None writes without ``asyncio.wait_for`` (a task per
    write on Python 3.11); bounded by :func:`asyncio.timeout` instead, a write that cannot finish
    still closes the connection and raises redis-py's TimeoutError, and the timeout is put back.
    A loopback listener that never reads stands in for a stalled server."""
    import asyncio
    import socket

    from redis.exceptions import TimeoutError as RedisTimeoutError

    from scheduler.redisio.transport_async import send_packed

    waits: list[object] = []
    wait_for = asyncio.wait_for

    def counted(*args: Any, **kwargs: Any) -> Any:
        waits.append(args)
        return wait_for(*args, **kwargs)

    monkeypatch.setattr(asyncio, "wait_for", counted)
    with socket.create_server(("127.0.0.1", 0)) as server:
        conn = aconnection.Connection(host="127.0.0.1", port=server.getsockname()[1], socket_timeout=0.3,
                                      protocol=2, driver_info=None)  # no HELLO, no CLIENT SETINFO
        await conn.connect()
        peer, _ = server.accept()
        try:
            await send_packed(conn, conn.pack_command("PING"))
            assert waits == [] and conn.socket_timeout == 0.3 and conn.is_connected
            assert peer.recv(64) == b"*1\r\n$4\r\nPING\r\n"
            await conn.send_packed_command(conn.pack_command("PING"), check_health=False)
            assert len(waits) == 1, "redis-py no longer writes through wait_for: send_packed may go"
            big = conn.pack_command("SET", "k", b"x" * (64 << 20))  # more than the socket buffers hold
            with pytest.raises(RedisTimeoutError, match="Timeout writing to socket"):
                await send_packed(conn, big)
            assert conn.socket_timeout == 0.3 and not conn.is_connected and len(waits) == 1
        finally:
            peer.close()
            await conn.disconnect()
