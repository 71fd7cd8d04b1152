"""The producer clients: :class:`Client` (blocking, redis-py) and :class:`AsyncClient` (asyncio).

Both build their script calls and read the replies with the protocol layer's
:class:`~scheduler.protocol.calls.Calls`, so the two differ only in how they talk to Redis.

- :mod:`.sync`: :class:`Client`;
- :mod:`.aio`: :class:`AsyncClient`;
- :mod:`.options`: the constructor settings both share (retries, durability, limits);
- :mod:`.settings`: namespace-wide settings in the config hash (rate limits, dead-letter
  retention, queue retirement), also read by the scheduler tier.
"""
from ..protocol.codes import Outcome
from ..protocol.options import JobOptions
from .aio import AsyncClient
from .settings import (
    config_commands,
    parse_dead_retention,
    parse_queue_idle,
    parse_rate_limits,
    parse_tombstone_ttl,
    queue_idle_field,
    retention_fields,
    validate_rate,
)
from .sync import Client

__all__ = [
    "AsyncClient", "Client", "JobOptions", "Outcome", "config_commands", "parse_dead_retention",
    "parse_queue_idle", "parse_rate_limits", "parse_tombstone_ttl", "queue_idle_field", "retention_fields",
    "validate_rate",
]
