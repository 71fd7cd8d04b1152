"""rediss:// (TLS) to a real redis-server with a private CA, for the producer and the worker."""
from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from scheduler import Client, JobState
from scheduler.shell.servers import free_port
from tests.support.servers import RedisServer


@pytest.fixture
def tls_redis(tls_certs: tuple[Path, Path, Path]):
    ca, cert, key = tls_certs
    port = free_port()
    srv = RedisServer(extra_args=["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                                  "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"])
    srv.start()
    yield f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}", srv
    srv.stop()


def test_producer_over_tls(tls_redis) -> None:
    url, _ = tls_redis
    c = Client.from_url(url, namespace="tls", partitions=2)
    jid = c.schedule(time.time() + 60, {"secure": True})
    assert c.get(jid).payload == {"secure": True}
    assert c.cancel(jid)


def test_tls_with_an_untrusted_certificate_is_refused(tls_redis) -> None:
    url, _ = tls_redis
    import redis
    with pytest.raises(redis.ConnectionError):
        Client.from_url(url.split("?")[0], namespace="tls", partitions=2).connect()  # system CAs do not know ours


async def test_worker_over_tls(tls_redis) -> None:
    from tests.support.waits import wait_for
    from tests.support.workers import serving
    from workers import Worker
    url, _ = tls_redis
    c = Client.from_url(url, namespace="tls", partitions=2).connect()
    ran = []
    w = Worker.from_url(url, namespace="tls")

    @w.handler("default")
    async def handle(job):
        ran.append(job.payload)

    async with serving(w):
        jid = c.schedule(timedelta(0), "over tls")
        await wait_for(lambda: ran == ["over tls"], 10, what="job over TLS")
    await wait_for(lambda: c.get(jid).state is JobState.DONE, 5, what="acked")
