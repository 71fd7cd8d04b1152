"""A connection closed under a redis-py call in flight (uvloop's RuntimeError "... the handler is
closed", met by a worker's doorbell during a Sentinel failover; redis-py's AttributeError on a
missing stream, met by the tier's bell ringer during a Redis Cluster failover) reaches the callers
as the ConnectionError their outage handling knows, not as a crash of their loop."""
from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError

from scheduler.protocol.keys import Keyspace
from scheduler.redisio.transport_async import lost_connection, lost_in_transit
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
