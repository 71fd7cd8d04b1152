"""A replica fires by the namespace's settings in ``{ns}:cfg`` (tier/namespace_config.py): it reads
the changes clients make, tells its runners when the rate limits change, and keeps the last known
settings while Redis is down (killed with SIGKILL here), so an outage never lifts a limit."""
from __future__ import annotations

import logging

import pytest

from scheduler.client import AsyncClient
from scheduler.redisio.connection import async_redis
from scheduler.tier.namespace_config import NamespaceConfig
from tests.support.servers import RedisServer


async def test_a_replica_follows_the_namespace_settings_and_keeps_them_while_redis_is_down(
        fresh_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    users = AsyncClient.from_url(fresh_redis.url, namespace="cfgns", partitions=4)
    tier_redis = async_redis(fresh_redis.url, socket_timeout=2)
    tier = AsyncClient(tier_redis, namespace="cfgns", partitions=4)
    changed: list[dict[str, tuple[float, float]]] = []
    settings = NamespaceConfig(tier_redis, tier, lambda: changed.append(dict(settings.rate_limits)))
    try:
        await tier.connect()
        await settings.load()
        assert (settings.rate_limits, settings.dead_retention, changed) == ({}, (None, None), [])

        await users.set_rate_limit("mail", 5)
        await users.set_dead_retention(max_dead=40, dead_ttl=3600)
        await users.set_tombstone_ttl(120)
        await settings.load()
        assert settings.rate_limits == {"mail": (5.0, 1.25)}
        assert settings.dead_retention == (40, 3600.0)
        assert tier.calls.tomb_ms == 120_000
        assert changed == [{"mail": (5.0, 1.25)}]
        assert settings.retention().max_dead == 10  # split over the 4 partitions
        await settings.load()
        assert len(changed) == 1  # no change, no wake-up of the runners

        fresh_redis.kill()
        with caplog.at_level(logging.WARNING, logger="zsched.scheduler"):
            await settings.load()
        assert [r.getMessage().startswith("cannot read the namespace config (") for r in caplog.records] == [True]
        assert caplog.records[0].getMessage().endswith("; keeping the last known one")
        assert settings.rate_limits == {"mail": (5.0, 1.25)} and settings.dead_retention == (40, 3600.0)
        assert len(changed) == 1

        fresh_redis.start()  # an empty server: the namespace's settings went with the data
        await users.close()  # its idle connection died with the server (a producer's call would fail once)
        users = AsyncClient.from_url(fresh_redis.url, namespace="cfgns", partitions=4)
        await users.set_rate_limit("sms", 2, burst=4)
        await settings.load()
        assert settings.rate_limits == {"sms": (2.0, 4.0)} and settings.dead_retention == (None, None)
        assert changed[-1] == {"sms": (2.0, 4.0)}
    finally:
        await users.close()
        await tier.close()
