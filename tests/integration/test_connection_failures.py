"""Connection failures end quickly and say which addresses failed, in one short line, for the
blocking and the asyncio client alike: TLS pointed at a plain-text port (the handshake counts
against the connect timeout), Sentinel sets that do not answer or name a master that is down,
Redis Cluster nodes that do not answer or are no cluster, and the ``zsched`` line and exit code
of each."""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from scheduler import AsyncClient, Client, ConfigError
from scheduler.redisio.transport import NO_RETRY
from scheduler.shell.cli import main
from scheduler.shell.servers import free_port
from tests.support.servers import RedisServer, SentinelServer
from tests.support.waits import wait_until

CONNECT_TIMEOUT = 1.0
# Long enough that a handshake waiting for the socket timeout (the old behaviour) is plain to see,
# short enough that such a failure costs the suite seconds, not minutes.
SOCKET_TIMEOUT = 8.0
OPTIONS = {"socket_connect_timeout": CONNECT_TIMEOUT, "socket_timeout": SOCKET_TIMEOUT}


def _port(url: str) -> int:
    return int(re.search(r":(\d+)/", url).group(1))  # type: ignore[union-attr]


def _sync_failure(url: str) -> tuple[BaseException, float]:
    t0 = time.monotonic()
    with pytest.raises(Exception) as err:
        Client.from_url(url, redis_options=OPTIONS, retry=NO_RETRY).connect()
    return err.value, time.monotonic() - t0


async def _async_failure(url: str) -> tuple[BaseException, float]:
    t0 = time.monotonic()
    c = AsyncClient.from_url(url, redis_options=OPTIONS, retry=NO_RETRY)
    with pytest.raises(Exception) as err:
        await c.connect()
    await c.close()
    return err.value, time.monotonic() - t0


def _one_cli_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("zsched: error: "), lines
    assert len(lines[0]) < 400, lines[0]
    return code, lines[0]


# ------------------------------------------------------------------------------- TLS


@pytest.mark.parametrize("form", ["rediss://127.0.0.1:{p}/0", "rediss+cluster://127.0.0.1:{p}",
                                  "rediss+sentinel://127.0.0.1:{p}/mymaster"])
async def test_tls_to_a_plain_text_port_fails_within_the_connect_timeout(redis_url: str, form: str) -> None:
    url = form.format(p=_port(redis_url))  # a live redis-server that does not speak TLS
    # the blocking client fails in a thread while the asyncio one does: their waits overlap
    sync, aio = await asyncio.gather(asyncio.to_thread(_sync_failure, url), _async_failure(url))
    for exc, took in (sync, aio):
        assert isinstance(exc, redis.ConnectionError | redis.TimeoutError), repr(exc)
        assert took < CONNECT_TIMEOUT + 2.0, f"{url}: {took:.1f} s, the connect timeout is {CONNECT_TIMEOUT} s"
        assert len(str(exc)) < 300, str(exc)
    if form.startswith("rediss://"):
        assert str(sync[0]) == (f"Timeout connecting to 127.0.0.1:{_port(redis_url)} over TLS: no TLS handshake within "
                             "1 s; a plain-text Redis port never answers one, use redis:// for it")


# ---------------------------------------------------------------------------- Sentinel


@pytest.fixture
def closed() -> list[int]:
    """Two loopback ports nothing listens on."""
    return [free_port(), free_port()]


async def test_unreachable_sentinels_are_named_in_one_short_line(closed: list[int],
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis+sentinel://127.0.0.1:{closed[0]},127.0.0.1:{closed[1]}/mymaster"
    said = (f"no sentinel named a usable master 'mymaster': 127.0.0.1:{closed[0]} connection refused; "
            f"127.0.0.1:{closed[1]} connection refused")
    for exc, took in (_sync_failure(url), await _async_failure(url)):
        assert isinstance(exc, redis.ConnectionError) and str(exc) == said
        assert took < 3.0, "a refused sentinel is not retried by redis-py (that took 7 s)"
    code, line = _one_cli_line(["stats", "--redis", url], capsys)
    assert code == 3 and line == (f"zsched: error: cannot reach Redis at {url}: {said} (are the sentinels running, "
                                  "and do they monitor that master name? check --redis / ZSCHED_REDIS_URL)")


async def test_a_redis_listed_as_a_sentinel_is_named_as_no_sentinel(redis_url: str, closed: list[int]) -> None:
    url = f"redis+sentinel://127.0.0.1:{_port(redis_url)},127.0.0.1:{closed[0]}/mymaster"
    for exc, _took in (_sync_failure(url), await _async_failure(url)):
        assert re.fullmatch(rf"no sentinel named a usable master 'mymaster': 127\.0\.0\.1:{_port(redis_url)} is "
                            rf"not a sentinel \(unknown command 'SENTINEL'.*\); 127\.0\.0\.1:{closed[0]} connection "
                            "refused", str(exc)), str(exc)


@pytest.fixture
def lone_sentinel(request: pytest.FixtureRequest, closed: list[int]) -> Iterator[tuple[SentinelServer, int]]:
    """A sentinel (quorum 1) monitoring a master on a closed port: ``down_after_ms`` (the param)
    decides whether it already reports the master down."""
    with SentinelServer("mymaster", master_port=closed[0], quorum=1, down_after_ms=request.param) as s:
        yield s, closed[0]


@pytest.mark.parametrize("lone_sentinel", [600_000], indirect=True)
async def test_a_master_the_sentinels_name_but_that_is_down_is_named_as_their_master(
        lone_sentinel: tuple[SentinelServer, int], capsys: pytest.CaptureFixture[str]) -> None:
    s, master = lone_sentinel  # not judged down yet: the sentinel still names it
    url = f"redis+sentinel://127.0.0.1:{s.port}/mymaster"
    said = f"127.0.0.1:{master} (master 'mymaster', named by the sentinels)"
    for exc, took in (_sync_failure(url), await _async_failure(url)):
        assert isinstance(exc, redis.ConnectionError) and said in str(exc) and len(str(exc)) < 200, str(exc)
        assert took < 3.0
    code, line = _one_cli_line(["stats", "--redis", url], capsys)
    assert code == 3 and said in line


@pytest.mark.parametrize("lone_sentinel", [100], indirect=True)
async def test_a_master_the_sentinels_report_down_is_named_with_their_verdict(
        lone_sentinel: tuple[SentinelServer, int], capsys: pytest.CaptureFixture[str]) -> None:
    s, master = lone_sentinel
    wait_until(lambda: "s_down" in s.master_info().get("flags", ""), 10, what=lambda: f"{s!r} to judge the master down")
    url = f"redis+sentinel://127.0.0.1:{s.port}/mymaster"
    pattern = (rf"no sentinel named a usable master 'mymaster': 127\.0\.0\.1:{s.port} reports the master down "
               rf"\(127\.0\.0\.1:{master}, flags [a-z_,]*s_down[a-z_,]*\)")
    for exc, _took in (_sync_failure(url), await _async_failure(url)):
        assert isinstance(exc, redis.ConnectionError) and re.fullmatch(pattern, str(exc)), str(exc)
    code, line = _one_cli_line(["stats", "--redis", url], capsys)
    assert code == 3 and re.search(pattern, line), line


# ----------------------------------------------------------------------------- Cluster


async def test_unreachable_cluster_nodes_are_named_and_are_a_connection_error(
        closed: list[int], capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis+cluster://127.0.0.1:{closed[0]},127.0.0.1:{closed[1]}"
    said = (f"no node of the cluster answered (tried 127.0.0.1:{closed[0]}, 127.0.0.1:{closed[1]}; "
            "the last one connection refused)")
    for exc, _took in (_sync_failure(url), await _async_failure(url)):
        assert isinstance(exc, redis.ConnectionError) and type(exc).__name__ == "ClusterUnreachable", repr(exc)
        assert str(exc) == said
    code, line = _one_cli_line(["stats", "--redis", url], capsys)
    assert code == 3 and line.startswith(f"zsched: error: cannot reach Redis at {url}: {said}")


async def test_a_cluster_url_naming_a_plain_server_is_a_config_error(redis_url: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    url = f"redis+cluster://127.0.0.1:{_port(redis_url)}"
    for exc, _took in (_sync_failure(url), await _async_failure(url)):
        assert isinstance(exc, ConfigError) and type(exc).__name__ == "NotACluster", repr(exc)
        assert f"the Redis at 127.0.0.1:{_port(redis_url)} is not in cluster mode" in str(exc)
    code, line = _one_cli_line(["stats", "--redis", url], capsys)
    assert code == 2 and "use redis://host:port for a single server" in line


def test_tls_cluster_nodes_get_the_url_s_tls_settings(tls_certs: tuple[Path, Path, Path]) -> None:
    """The blocking cluster client is built "from a URL" to carry the TLS connection class: the
    TLS options of the URL must still reach every node (checked against a TLS server that is no
    cluster: the handshake succeeds with the URL's CA, then the server says it is no cluster)."""
    ca, cert, key = tls_certs
    port = free_port()
    with RedisServer(extra_args=["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                                 "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]):
        with pytest.raises(ConfigError, match="is not in cluster mode"):
            Client.from_url(f"rediss+cluster://127.0.0.1:{port}?ssl_ca_certs={ca}", retry=NO_RETRY).connect()
        with pytest.raises(redis.ConnectionError, match=r"the last one failed the TLS handshake \(self.signed cert"):
            Client.from_url(f"rediss+cluster://127.0.0.1:{port}", retry=NO_RETRY).connect()
