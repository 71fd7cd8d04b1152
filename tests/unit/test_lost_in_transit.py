"""A connection closed under a redis-py call in flight (uvloop's RuntimeError "... the handler is
closed", met by a worker's doorbell during a Sentinel failover; redis-py's AttributeError on a
missing stream, met by the tier's bell ringer during a Redis Cluster failover) reaches the callers
as the ConnectionError their outage handling knows, not as a crash of their loop."""
from __future__ import annotations

import inspect
import logging
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError

from scheduler.client import AsyncClient
from scheduler.protocol.calls import Calls
from scheduler.protocol.keys import Keyspace
from scheduler.redisio.batch import RedisRetry
from scheduler.redisio.transport_async import lost_connection, lost_in_transit
from scheduler.tier.crons import cron_names, fill_calls
from scheduler.tier.namespace_config import NamespaceConfig
from workers.doorbell import Doorbell

CLOSED = RuntimeError("unable to perform operation on <TCPTransport closed=True reading=False 0x5640>; "
                      "the handler is closed")


async def test_a_closed_transport_becomes_a_connection_error_and_other_runtime_errors_stay_bugs() -> None:
    @lost_in_transit
    async def call(exc: BaseException) -> int:
        raise exc

    with pytest.raises(ConnectionError, match="closed while in use") as caught:
        await call(CLOSED)
    assert caught.value.__cause__ is CLOSED
    with pytest.raises(RuntimeError, match="something else"):
        await call(RuntimeError("something else"))


class ClosedPipeline:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: self

    async def execute(self) -> Any:
        raise CLOSED


async def test_the_doorbells_redis_calls_raise_a_connection_error_for_a_transport_closed_under_them() -> None:
    redis = aioredis.Redis(host="127.0.0.1", port=1)  # never connected: every call meets the closed pipeline
    redis.pipeline = lambda *a, **k: ClosedPipeline()  # type: ignore[method-assign]
    bell = Doorbell(redis, Keyspace("closed", 16), ["q"], one_listener=True)
    for call in (bell.take_waiting(4), bell.sweep_turns(["q"], 1.0, "tok"), bell.ring("q", b"3")):
        with pytest.raises(ConnectionError):
            await call
    await redis.aclose()


def _closed_under_redis_py() -> AttributeError:
    """What redis-py 8.1 raises when a connection is closed under a write in flight (the cluster
    client closes every connection of a node during a failover's slot-map refresh): an
    AttributeError on its missing stream, from code of redis.asyncio.connection (made here with
    that module's name, whatever redis-py is installed; 8.2 raises a ConnectionError itself)."""
    scope: dict[str, Any] = {"__name__": "redis.asyncio.connection"}
    exec("def write(writer):\n    writer.writelines([b'PING'])\n", scope)  # noqa: S102 - a frame of that module
    try:
        scope["write"](None)
    except AttributeError as exc:
        return exc
    raise AssertionError("no AttributeError")


async def test_a_missing_stream_inside_redis_py_becomes_a_connection_error_and_other_attribute_errors_stay_bugs(
) -> None:
    # Met by the tier's bell ringer in tests/fault/test_cluster_faults.py (redis-py 8.1).
    lost = lost_connection(_closed_under_redis_py())
    assert isinstance(lost, ConnectionError) and "closed while in use" in str(lost)

    # the pinned redis-py on a connection with no stream: 8.1 fails as above, 8.2 says so itself
    conn = aioredis.Connection(host="127.0.0.1", port=1)  # never connected
    try:
        await conn._send_packed_command([b"PING\r\n"])
    except AttributeError as exc:
        assert isinstance(lost_connection(exc), ConnectionError)
    except ConnectionError:
        pass
    else:
        raise AssertionError("a write with no stream succeeded")

    @lost_in_transit
    async def write() -> None:
        raise _closed_under_redis_py()

    with pytest.raises(ConnectionError, match="closed while in use"):
        await write()

    class Ours:
        stream = None

    @lost_in_transit
    async def bug() -> None:
        Ours.stream.write(b"x")  # type: ignore[attr-defined]  # our own bug: not a lost connection

    with pytest.raises(AttributeError):
        await bug()
    assert lost_connection(RuntimeError("something else")) is None


async def test_the_tiers_bell_ringer_logs_a_connection_closed_under_it_instead_of_a_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    from scheduler.tier.bells import BellRinger

    class Redis:
        async def hkeys(self, key: str) -> list[bytes]:
            raise _closed_under_redis_py()  # as in a cluster failover

    ringer = BellRinger(Redis(), Keyspace("closed", 16))
    ringer.ring_waiting(3)
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    with caplog.at_level("DEBUG", logger="zsched.scheduler"):
        await asyncio.gather(*others)  # the ring's task ends quietly: nothing raised, nothing logged as an error
    assert "ringing a doorbell failed" in caplog.text and "closed while in use" in caplog.text
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "WARNING")]


async def _closed(*a: Any, **k: Any) -> Any:
    raise _closed_under_redis_py()


class PipelineClosedByRedisPy:
    """A redis-py pipeline whose round trip meets a connection closed under it."""

    execute = staticmethod(_closed)

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: self


class ClosedByRedisPy:
    """A redis-py client whose every command and pipeline meets a connection closed under it, as
    redis-py 8.1 reports that (:func:`_closed_under_redis_py`)."""

    def pipeline(self, *a: Any, **k: Any) -> PipelineClosedByRedisPy:
        return PipelineClosedByRedisPy()

    def __getattr__(self, name: str) -> Any:
        return _closed


async def test_the_async_clients_coroutines_raise_a_connection_closed_under_them_as_a_connection_error() -> None:
    client = AsyncClient(ClosedByRedisPy(), namespace="closed", partitions=16)  # type: ignore[arg-type]
    for call in (client.connect(), client.paused(), client.rate_limits(), client.stats()):
        with pytest.raises(ConnectionError, match="closed while in use"):
            await call
    # every coroutine of the client is mapped so (twin() wraps them), the one without Redis aside
    public = [name for name, fn in vars(AsyncClient).items()
              if inspect.iscoroutinefunction(fn) and not name.startswith("_") and name != "close"]
    assert len(public) > 30
    assert [name for name in public if not hasattr(getattr(AsyncClient, name), "__wrapped__")] == []


class _Keyspace:
    config_key = "{closed}:cfg"


class _Client:
    keyspace = _Keyspace()


class CountedClosedByRedisPy(ClosedByRedisPy):
    """:class:`ClosedByRedisPy` counting the reads sent through it."""

    def __init__(self) -> None:
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        self.reads += 1
        return _closed


async def test_the_tiers_config_read_keeps_the_last_known_settings_when_its_connection_is_closed_under_it(
        caplog: pytest.LogCaptureFixture) -> None:
    changed: list[bool] = []
    redis = CountedClosedByRedisPy()
    retry = RedisRetry(budget=5.0, attempts=3, base=0.001, cap=0.002)
    settings = NamespaceConfig(redis, _Client(), lambda: changed.append(True), retry)  # type: ignore[arg-type]
    settings.rate_limits = {"q": (5.0, 1.25)}
    settings.dead_retention = (10, None)
    with caplog.at_level(logging.WARNING, logger="zsched.scheduler"):
        await settings.load()  # before: the AttributeError ended the replica's config poller
    assert settings.rate_limits == {"q": (5.0, 1.25)} and settings.dead_retention == (10, None) and not changed
    assert redis.reads == 3  # sent again under the retry, as a connection error
    assert [r.getMessage() for r in caplog.records] == [
        "cannot read the namespace config (the connection was closed while in use ('NoneType' object has no "
        "attribute 'writelines')); keeping the last known one"]


async def test_a_partitions_cron_reads_raise_a_connection_closed_under_them_as_a_connection_error() -> None:
    class Scripts:
        redis = ClosedByRedisPy()

    core = Calls(Keyspace("closed", 16), max_payload_bytes=1 << 20, tombstone_ttl=60.0)
    with pytest.raises(ConnectionError, match="closed while in use"):
        await cron_names(Scripts(), core, 3)  # type: ignore[arg-type]
    with pytest.raises(ConnectionError, match="closed while in use"):
        await fill_calls(Scripts(), core, 3, 1, ["nightly"])  # type: ignore[arg-type]
