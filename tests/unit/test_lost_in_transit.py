"""A connection closed under a redis-py call in flight (uvloop's RuntimeError "... the handler is
closed", met by a worker's doorbell during a Sentinel failover) reaches the callers as the
ConnectionError their outage handling knows, not as a crash of their loop."""
from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError

from scheduler.protocol.keys import Keyspace
from scheduler.redisio.transport_async import lost_in_transit
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
