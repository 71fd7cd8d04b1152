"""/livez and /readyz of real ``zsched scheduler`` and ``zsched worker`` processes while their Redis
is frozen (SIGSTOP) and thawed: not ready before connecting or while Redis does not answer, ready
again after, and live all along (their event loops keep turning while they wait)."""
from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from scheduler.shell.servers import ZschedProc, scheduler_proc
from tests.support.helpers import http_get
from tests.support.servers import RedisServer
from tests.support.waits import wait_until

pytestmark = pytest.mark.fault


def probe(proc: ZschedProc, path: str) -> tuple[int, str]:
    assert proc.metrics_port is not None
    return http_get(proc.metrics_port, path)


def wait_probe(proc: ZschedProc, path: str, status: int, contains: str = "", timeout: float = 20.0) -> str:
    def seen() -> str | None:
        code, body = probe(proc, path)
        return body if code == status and contains in body else None

    return str(wait_until(seen, timeout, 0.1, lambda: f"{path} -> {status} {contains!r}, last "
                          f"{probe(proc, path)}\n{proc.tail()}"))


@pytest.fixture
def scheduler(fresh_redis: RedisServer, etcd_endpoint: str) -> Iterator[ZschedProc]:
    fresh_redis.pause()  # frozen before the replica starts: it cannot connect yet
    proc = scheduler_proc(fresh_redis.url, etcd_endpoint, f"p{uuid.uuid4().hex[:8]}", "r1").start()
    try:
        yield proc
    finally:
        fresh_redis.resume()
        proc.stop()


def test_a_replica_is_ready_only_while_connected_and_in_the_ownership_protocol(
        scheduler: ZschedProc, fresh_redis: RedisServer) -> None:
    # the loop turns while it retries Redis: live, and not ready, saying why
    wait_probe(scheduler, "/livez", 200, "ok: the event loop answered in ")
    assert probe(scheduler, "/readyz") == (503, "fail: starting: connecting to Redis and etcd, registering in etcd\n")
    fresh_redis.resume()
    body = wait_probe(scheduler, "/readyz", 200, "ok: Redis answers; etcd lease valid")
    assert "owns" in body and "partitions" in body
    fresh_redis.pause()
    wait_probe(scheduler, "/readyz", 503, "fail: ")
    assert probe(scheduler, "/livez")[0] == 200  # waiting on Redis is not a stuck process
    fresh_redis.resume()
    wait_probe(scheduler, "/readyz", 200, "ok: Redis answers")


def test_a_worker_is_live_while_redis_is_down_and_ready_once_claiming(fresh_redis: RedisServer) -> None:
    fresh_redis.pause()
    ns = f"w{uuid.uuid4().hex[:8]}"
    proc = ZschedProc(["worker", "scheduler.shell.demo:worker", "--namespace", ns],
                      env={"ZSCHED_REDIS_URL": fresh_redis.url}).start()
    try:
        # the probes answer before Redis is reached: Kubernetes must not restart it for an outage
        wait_probe(proc, "/livez", 200, "ok: ")
        assert probe(proc, "/readyz")[1].startswith("fail: starting: connecting to Redis")
        fresh_redis.resume()
        wait_probe(proc, "/readyz", 200, "ok: Redis answers; claiming jobs of ")
        fresh_redis.pause()
        wait_probe(proc, "/readyz", 503, "fail: ")
        assert probe(proc, "/livez")[0] == 200
        fresh_redis.resume()
        wait_probe(proc, "/readyz", 200, "ok: Redis answers")
        assert "zsched_worker_running" in proc.scrape()  # /metrics on the same port as before
    finally:
        fresh_redis.resume()
        proc.stop()
