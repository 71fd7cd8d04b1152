"""``durable=``: schedule returns only once a replica has the job (WAIT), or raises an error that
says the job may exist; ``fsync`` is refused clearly, before writing, where WAITAOF is missing."""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from scheduler import AsyncClient, Client
from scheduler.protocol.errors import DurabilityTimeout, DurabilityUnsupported
from tests.support.servers import RedisServer
from tests.support.waits import wait_until

LATER = timedelta(minutes=5)


def _role_ready(master: RedisServer) -> bool:
    info = master.command("INFO", "replication")
    text = info.decode() if isinstance(info, bytes) else str(info)
    return "connected_slaves:1" in text and "state=online" in text


# A master starts a replica's full sync at once, not after waiting repl-diskless-sync-delay (5 s by
# default) for more replicas: each test here would otherwise spend 5 s on setup.
MASTER_ARGS = ["--repl-diskless-sync-delay", "0"]


@pytest.fixture
def pair() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master and one replica (asynchronous replication, as Redis does by default)."""
    with RedisServer(extra_args=MASTER_ARGS) as master:
        with RedisServer(extra_args=["--replicaof", "127.0.0.1", str(master.port)]) as replica:
            deadline = time.monotonic() + 15
            # online, and acknowledging steadily: for about a second after its first sync a replica
            # can leave a WAIT unanswered (seen here), which would fail the tests for setup reasons
            ok = 0
            while ok < 10:
                assert time.monotonic() < deadline, "replica never came online"
                master.command("SET", "probe", str(ok))
                ok = ok + 1 if _role_ready(master) and int(master.command("WAIT", 1, 200)) == 1 else 0
                time.sleep(0.05)
            yield master, replica


def _timers_on(srv: RedisServer, ns: str) -> int:
    return int(srv.command("ZCARD", "{%s:0}:t" % ns))


def test_durable_replica_returns_once_the_replica_has_the_job(pair: tuple[RedisServer, RedisServer]) -> None:
    master, replica = pair
    c = Client.from_url(master.url, namespace="dur", partitions=1)
    c.schedule(LATER, "plain")  # no durability: returns as soon as the master has it
    c.schedule(LATER, "durable", durable="replica")
    # WAIT returned 1: the replica has both (replication is ordered), read it there directly
    assert _timers_on(replica, "dur") == 2
    ids = c.schedule_many([(LATER, i) for i in range(50)], durable="replica")
    assert len(ids) == 50 and _timers_on(replica, "dur") == 52
    c.close()


def test_durable_timeout_names_the_jobs_that_may_exist(pair: tuple[RedisServer, RedisServer]) -> None:
    master, replica = pair
    c = Client.from_url(master.url, namespace="durt", partitions=1, durable="replica", durable_timeout=0.3)
    replica.pause()  # the replica stops acknowledging: WAIT times out
    try:
        t0 = time.monotonic()
        with pytest.raises(DurabilityTimeout) as err:
            c.schedule(LATER, "unconfirmed")
        assert 0.25 < time.monotonic() - t0 < 3
        job_id = err.value.job_id
        assert job_id is not None and "may exist" in str(err.value) and "0 of 1 replica" in str(err.value)
        info = c.get(job_id)
        assert info is not None and info.state.value == "scheduled"  # it is on the master
        with pytest.raises(DurabilityTimeout) as many:
            c.schedule_many([(LATER, i) for i in range(10)])
        assert len(many.value.ids) == 10 and many.value.job_id is None
        # a per-call override of the client default
        assert c.schedule(LATER, "fire and forget", durable=None)
    finally:
        replica.resume()
    c.close()


def test_durable_fsync_is_refused_before_writing_where_waitaof_is_missing() -> None:
    with RedisServer() as srv:
        c = Client.from_url(srv.url, namespace="durf", partitions=1)
        version = srv.command("INFO", "server")
        text = version.decode() if isinstance(version, bytes) else str(version)
        major, minor = (int(x) for x in text.split("redis_version:", 1)[1].split(".")[:2])
        if (major, minor) >= (7, 2):  # pragma: no cover - Debian 12 ships 7.0
            pytest.fail("this test expects a Redis without WAITAOF; extend it for 7.2+")
        with pytest.raises(DurabilityUnsupported, match="WAITAOF.*7.2"):
            c.schedule(LATER, "x", durable="fsync")
        with pytest.raises(DurabilityUnsupported):
            c.schedule_many([(LATER, 1)], durable="fsync")
        assert c.stats() == {}, "nothing may be written when the durability cannot be given"
        c.close()


def test_durable_fsync_on_a_cluster_asks_every_master(redis_cluster_url: str) -> None:
    """On a cluster a batch's WAITAOF goes to each master it touched, so every master must have it:
    on Redis 7.0 masters the client refuses before writing, as on one node."""
    c = Client.from_url(redis_cluster_url, namespace="durfc", partitions=6)
    with pytest.raises(DurabilityUnsupported, match="WAITAOF.*7.2"):
        c.schedule_many([(LATER, i) for i in range(30)], durable="fsync")
    assert c.stats() == {}, "nothing may be written when the durability cannot be given"
    c.close()


def test_bad_durability_settings_are_refused_with_a_clear_error(redis_url: str) -> None:
    with pytest.raises(ValueError, match="durable must be None, 'replica' or 'fsync'"):
        Client.from_url(redis_url, namespace="durb", durable="always")
    with pytest.raises(ValueError, match="durable_timeout"):
        Client.from_url(redis_url, namespace="durb", durable="replica", durable_timeout=0)
    with pytest.raises(ValueError, match="shorter than the Redis socket timeout"):
        Client.from_url(redis_url, namespace="durb", redis_options={"socket_timeout": 1.0}, durable="replica",
                        durable_timeout=2.0)
    quick = Client.from_url(redis_url, namespace="durb", redis_options={"socket_timeout": 1.0}, durable_timeout=2.0)
    with pytest.raises(ValueError, match="shorter than the Redis socket timeout"):
        quick.schedule(LATER, 1, durable="replica")
    quick.close()
    c = Client.from_url(redis_url, namespace="durb")
    with pytest.raises(ValueError, match="durable must be"):
        c.schedule(LATER, 1, durable="disk")
    assert c.stats() == {}
    c.close()


def test_async_client_durable_replica(pair: tuple[RedisServer, RedisServer]) -> None:
    master, replica = pair

    async def main() -> None:
        c = await AsyncClient.from_url(master.url, namespace="adur", partitions=1, durable_timeout=0.3).connect()
        await c.schedule(LATER, "a", durable="replica")
        await c.schedule_many([(LATER, i) for i in range(5)], durable="replica")
        assert _timers_on(replica, "adur") == 6
        replica.pause()
        try:
            with pytest.raises(DurabilityTimeout) as err:
                await c.schedule(LATER, "b", durable="replica")
            assert err.value.job_id and await c.get(err.value.job_id) is not None
        finally:
            replica.resume()
        await c.close()

    asyncio.run(main())


def test_cli_schedule_durable(pair: tuple[RedisServer, RedisServer], capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.shell.cli import main

    master, replica = pair
    base = ["schedule", "--at", "+5m", "--queue", "q", "--payload", "1", "--redis", master.url,
            "--namespace", "durcli"]
    assert main([*base, "--durable", "replica"]) == 0
    job_id = capsys.readouterr().out.strip()
    assert len(job_id) == 30
    replica.pause()
    try:
        rc = main([*base, "--durable", "replica", "--durable-timeout", "0.2"])
    finally:
        replica.resume()
    out, err = capsys.readouterr()
    assert rc == 3
    assert len(out.strip()) == 30 and "may exist" in err and "zsched" in err
    rc = main([*base, "--durable", "fsync"])
    out, err = capsys.readouterr()
    assert rc == 2 and "WAITAOF" in err and out == ""


def test_a_master_refusing_writes_for_want_of_replicas_is_waited_for_not_failed() -> None:
    """``min-replicas-to-write 1`` (the guard against writing to an isolated master): NOREPLICAS
    means the script wrote nothing, so the call is retried and succeeds once a replica is back."""
    import threading

    with RedisServer(extra_args=MASTER_ARGS) as master:
        c = Client.from_url(master.url, namespace="norep", partitions=1).connect()  # creates the namespace
        master.command("CONFIG", "SET", "min-replicas-to-write", "1")
        result: dict[str, object] = {}

        def produce() -> None:
            try:
                result["id"] = c.schedule(LATER, "waits for a replica")
            except Exception as exc:  # noqa: BLE001 - asserted below
                result["error"] = exc

        def refusals() -> int:
            stat = master.command("INFO", "errorstats")
            m = re.search(rb"errorstat_NOREPLICAS:count=(\d+)", stat if isinstance(stat, bytes) else str(stat).encode())
            return int(m.group(1)) if m else 0

        t = threading.Thread(target=produce)
        t.start()
        wait_until(lambda: refusals() >= 2, 5, what="the master to refuse the call twice (NOREPLICAS)")
        assert t.is_alive(), f"the call did not wait: {result}"
        with RedisServer(extra_args=["--replicaof", "127.0.0.1", str(master.port)]):
            t.join(15)
        assert "error" not in result, result
        assert c.get(str(result["id"])) is not None
        assert c.transport.resends == 0  # refused before writing: not a re-send of a call that may have run
        c.close()
