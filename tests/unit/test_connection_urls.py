"""Redis URLs: every scheme accepted everywhere, Sentinel URLs parsed (masking: test_masking.py)."""
from __future__ import annotations

import pytest

from scheduler.protocol import config
from scheduler.protocol.errors import ConfigError
from scheduler.protocol.urls import parse_cluster_url, parse_sentinel_url
from scheduler.redisio.connection import async_redis, is_cluster, sync_redis


def test_sentinel_url_with_several_sentinels_master_and_db() -> None:
    t = parse_sentinel_url("redis+sentinel://app:s3cret@127.0.0.1:26379,127.0.0.1:26380/mymaster/2")
    assert t.sentinels == (("127.0.0.1", 26379), ("127.0.0.1", 26380))
    assert (t.master_name, t.db, t.username, t.password, t.ssl) == ("mymaster", 2, "app", "s3cret", False)
    t = parse_sentinel_url("rediss+sentinel://[::1]:26379/m?sentinel_password=x&socket_timeout=1.5")
    assert t.sentinels == (("::1", 26379),) and t.ssl and t.db == 0
    assert t.sentinel_options == {"sentinel_password": "x"} and t.options == {"socket_timeout": "1.5"}


@pytest.mark.parametrize("url, why", [
    ("redis+sentinel://127.0.0.1:26379", "no master name"),
    ("redis+sentinel:///mymaster", "no sentinel address"),
    ("redis+sentinel://127.0.0.1:x/m", "no valid port"),
    ("redis+sentinel://127.0.0.1:26379/m/notadb", "not a number"),
    ("redis+sentinel://127.0.0.1:26379/m/0/extra", "MASTER_NAME/DB"),
    ("redis+cluster://", "no cluster node address"),
    ("redis+cluster://127.0.0.1:x", "no valid port"),
    ("redis+cluster://127.0.0.1:7000/3", "only database 0"),
    ("http://127.0.0.1:6379", "unknown scheme"),
    ("127.0.0.1:6379", "unknown scheme"),
])
def test_bad_urls_say_what_is_wrong_and_what_is_expected(url: str, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.redis_url(url)
    msg = str(err.value)
    assert why in msg and "redis+sentinel://" in msg and "redis+cluster://" in msg and "ZSCHED_REDIS_URL" in msg


def test_every_scheme_is_accepted() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://127.0.0.1:6379/0", "unix:///tmp/redis.sock",
                "redis+sentinel://127.0.0.1:26379/mymaster", "rediss+sentinel://h:1,h:2/m/3",
                "redis+cluster://127.0.0.1:7000,127.0.0.1:7001", "rediss+cluster://u:p@h:7000/0"):
        assert config.redis_url(url) == url


def test_clients_are_built_without_redis_py_retries() -> None:
    """zsched's transport decides what may be re-sent; redis-py must never re-send by itself."""
    for r in (sync_redis("redis://127.0.0.1:1/0"), sync_redis("redis+sentinel://127.0.0.1:1/m")):
        conn = r.connection_pool.make_connection()  # inspect only; never connected
        assert conn.retry.get_retries() == 0
    a = async_redis("redis://127.0.0.1:1/0")
    assert a.connection_pool.connection_kwargs["retry"].get_retries() == 0


def test_cluster_url_with_several_nodes_credentials_and_options() -> None:
    t = parse_cluster_url("rediss+cluster://app:s%40cret@127.0.0.1:7000,[::1]:7001,h?socket_timeout=2")
    assert t.nodes == (("127.0.0.1", 7000), ("::1", 7001), ("h", 6379))
    assert (t.username, t.password, t.ssl, t.options) == ("app", "s@cret", True, {"socket_timeout": "2"})


def test_plain_urls_are_not_clusters() -> None:
    assert not is_cluster(sync_redis("redis://127.0.0.1:1/0")) and not is_cluster(async_redis("redis://127.0.0.1:1/0"))


@pytest.mark.parametrize("url", [
    "redis://app:Pw-x/7f3k@127.0.0.1:6379/0",   # an unencoded / ends the address early
    "redis://app:Pw-x#7f3k@127.0.0.1:6379/0",
    "rediss://app:Pw-x?7f3k@127.0.0.1:6379/0",
    "redis://app:Pw-x 7f3k@127.0.0.1:6379/0",   # whitespace: refused without being shown at all
    "redis://app:Pw-x7f3k@127.0.0.1:6379/0\n",
])
def test_a_url_redis_py_would_misread_is_refused_without_showing_the_password(url: str) -> None:
    with pytest.raises(ConfigError) as err:
        config.redis_url(url)
    msg = str(err.value)
    assert "is invalid" in msg or "contains whitespace" in msg
    assert "7f3k" not in msg and "Pw-x" not in msg, msg
