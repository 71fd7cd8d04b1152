"""A replica fires by the namespace's settings in ``{ns}:cfg`` (tier/namespace_config.py): it reads
the changes clients make, tells its runners when the rate limits change, and keeps the last known
settings while Redis is down (killed with SIGKILL here), so an outage never lifts a limit."""
from __future__ import annotations

import logging

import pytest

from scheduler.client import AsyncClient
from scheduler.redisio.connection import async_redis
from scheduler.tier.namespace_config import NamespaceConfig
from scheduler.tier.process import TIER_RETRY
from tests.support.servers import RedisServer


async def test_a_replica_follows_the_namespace_settings_and_keeps_them_while_redis_is_down(
        fresh_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    users = AsyncClient.from_url(fresh_redis.url, namespace="cfgns", partitions=4)
    tier_redis = async_redis(fresh_redis.url, socket_timeout=2)
    tier = AsyncClient(tier_redis, namespace="cfgns", partitions=4)
    changed: list[dict[str, tuple[float, float]]] = []
    settings = NamespaceConfig(tier_redis, tier, lambda: changed.append(dict(settings.rate_limits)), TIER_RETRY)
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
        await users.set_rate_limit("sms", 2, burst=4)  # sent again past the connection that died
        await settings.load()
        assert settings.rate_limits == {"sms": (2.0, 4.0)} and settings.dead_retention == (None, None)
        assert changed[-1] == {"sms": (2.0, 4.0)}
    finally:
        await users.close()
        await tier.close()


async def test_the_first_read_after_a_redis_restart_gets_the_settings_without_a_warning(
        fresh_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    tier_redis = async_redis(fresh_redis.url, socket_timeout=2)
    tier = AsyncClient(tier_redis, namespace="cfgns", partitions=4)
    settings = NamespaceConfig(tier_redis, tier, lambda: None, TIER_RETRY)
    users = AsyncClient.from_url(fresh_redis.url, namespace="cfgns", partitions=4)
    try:
        await tier.connect()
        await settings.load()  # leaves an idle connection in the tier's pool
        assert settings.rate_limits == {}

        fresh_redis.kill()  # the pooled connection dies with the server, unnoticed by the pool
        fresh_redis.start()
        await users.set_rate_limit("mail", 5)
        with caplog.at_level(logging.WARNING, logger="zsched.scheduler"):
            await settings.load()
        # before: "cannot read the namespace config (Connection closed by server.)", the last known
        # settings kept until the next read (FOLLOW_S later)
        assert [r.getMessage() for r in caplog.records] == []
        assert settings.rate_limits == {"mail": (5.0, 1.25)}
    finally:
        await users.close()
        await tier.close()
