"""Stand-ins for a partition runner's Redis side, for tier tests without servers: a script
transport that answers ``tick`` and ``reap`` like an empty partition (or refuses them) and
records each round trip, and the call builder and pipeline the runner needs around them."""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from scheduler.protocol.keys import Keyspace


class FakeRedis:
    async def smembers(self, key: str) -> set[bytes]:
        return set()  # no crons


class FakeCore:
    tomb_ms = 0
    ks = Keyspace("t", 8)

    def call(self, name: str, partition: int, *args: Any) -> tuple[str, list[str], list[Any]]:
        return name, [], [partition, *args]


class FakeTransport:
    """An empty partition: ticks move nothing and know no next timer, reaps find no lease. Refuses
    tick/reap (Redis has seen epoch 100) until ``accept`` is set. ``trips``: the script names of
    every round trip, with its monotonic time, ``parts`` the partitions of its calls;
    ``fail_next``: that many round trips raise a connection error first."""

    def __init__(self, accept: bool = False) -> None:
        self.redis = FakeRedis()
        self.accept = accept
        self.ticks: list[float] = []
        self.trips: list[tuple[float, list[str]]] = []
        self.parts: list[set[int]] = []
        self.lanes: list[str | None] = []  # the transport lane each round trip named (TickBatcher: TICK_LANE)
        self.atomic: list[bool] = []  # whether each round trip was asked to run as one MULTI/EXEC
        self.fail_next = 0

    async def call_many(self, calls: Sequence[tuple[str, Sequence[Any], Sequence[Any]]],
                        raise_on_error: bool = True, lane: str | None = None, atomic: bool = False) -> list[Any]:
        now = time.monotonic()
        self.trips.append((now, [name for name, _, _ in calls]))
        self.lanes.append(lane)
        self.atomic.append(atomic)
        self.parts.append({int(args[0]) for _, _, args in calls})
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("Connection refused")
        now_ms = int(time.time() * 1000)
        out: list[Any] = []
        for name, _keys, _args in calls:
            if name == "tick":
                self.ticks.append(now)
                # no limits, crons, drops, rings; no burst ahead
                out.append([0, -1, now_ms, 0, 0, 0, 0, -1] if self.accept else [-1, 100])
            elif name == "reap":
                out.append([0, -1, now_ms] if self.accept else [-1, 100])
        return out
