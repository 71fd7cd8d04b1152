"""EtcdCoordinator against real etcd processes (tests/support/servers.py fixtures).

Covers leases (grant/keepalive/expiry/revoke), the claim/fence transactions,
watches (put, delete, lease-expiry delete, resume across an etcd restart,
compaction, cancellation), deadlines against a dead or frozen etcd, auth, and
failover when the leader of a 3-member cluster dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from scheduler.coord import (
    KV,
    CoordinationError,
    Coordinator,
    CoordinatorUnavailable,
    EtcdCoordinator,
    LeaseLost,
    WatchCompacted,
    WatchEvent,
    parse_endpoints,
)
from scheduler.shell.servers import etcd_request, free_port
from tests.support.servers import EtcdCluster, EtcdServer
from tests.support.waits import wait_for

# --------------------------------------------------------------------------- helpers


@contextlib.asynccontextmanager
async def coordinator(endpoints: str, timeout: float = 2.0, **kw: object) -> AsyncIterator[EtcdCoordinator]:
    coord = EtcdCoordinator.from_endpoints(endpoints, timeout=timeout, **kw)  # type: ignore[arg-type]
    await coord.connect()
    try:
        yield coord
    finally:
        await coord.close()


class Watcher:
    """Consumes ``watch_prefix`` in a background task into a queue."""

    def __init__(self, coord: EtcdCoordinator, prefix: str, start_revision: int) -> None:
        self.queue: asyncio.Queue[WatchEvent | BaseException] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(coord.watch_prefix(prefix, start_revision)))

    async def _run(self, it: AsyncIterator[WatchEvent]) -> None:
        try:
            async for ev in it:
                self.queue.put_nowait(ev)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # surfaced to the test via next()
            self.queue.put_nowait(exc)

    async def next(self, timeout: float = 3.0) -> WatchEvent:
        item = await asyncio.wait_for(self.queue.get(), timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    async def nothing_within(self, seconds: float) -> None:
        with pytest.raises(TimeoutError):
            await self.next(seconds)

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def wait_until_gone(coord: EtcdCoordinator, key: str, within: float) -> float:
    start = time.monotonic()
    while await coord.get(key) is not None:
        assert time.monotonic() - start < within, f"{key} still present after {within}s"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def retry_until(fn, within: float):  # type: ignore[no-untyped-def]
    """Call ``fn()`` until it stops raising CoordinatorUnavailable; return (result, seconds)."""
    start = time.monotonic()
    while True:
        try:
            return await fn(), time.monotonic() - start
        except CoordinatorUnavailable:
            if time.monotonic() - start > within:
                raise
            await asyncio.sleep(0.05)


def freeze(server: EtcdServer, within: float = 10.0) -> None:
    """``server.pause()`` and wait until every thread is really stopped.

    SIGSTOP is asynchronous: on a busy machine etcd was seen answering a
    request ~1 ms after ``pause()`` returned, with its state still "R".
    """
    server.pause()
    deadline = time.monotonic() + within
    task_dir = Path(f"/proc/{server.pid}/task")
    while True:
        states = set()
        for stat in task_dir.glob("*/stat"):
            with contextlib.suppress(OSError):
                states.add(stat.read_text().rsplit(")", 1)[1].split()[0])
        if states and states <= {"T", "t"}:
            return
        assert time.monotonic() < deadline, f"{server!r} not stopped after SIGSTOP: thread states {states}"
        time.sleep(0.002)


@pytest.fixture
def dead_endpoint() -> Iterator[str]:
    yield f"127.0.0.1:{free_port()}"  # nothing listens there


# --------------------------------------------------------------------------- endpoints


def test_parse_endpoints_forms() -> None:
    p = parse_endpoints("127.0.0.1:2379, 127.0.0.1:22379")
    assert [str(e) for e in p.endpoints] == ["127.0.0.1:2379", "127.0.0.1:22379"]
    assert (p.tls, p.user, p.password) == (False, None, None)

    p = parse_endpoints(["http://user:p%40ss@localhost:2379", "http://127.0.0.1"])
    assert [str(e) for e in p.endpoints] == ["127.0.0.1:2379"]  # localhost -> ipv4, default port, dedup
    assert (p.user, p.password) == ("user", "p@ss")

    assert parse_endpoints("https://etcd.example:2379").tls is True
    for bad in ("", "unix:///tmp/etcd.sock", "http://a:2379,https://b:2379", "[::1]:2379", "h:notaport"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


def test_credentials_are_not_shown() -> None:
    coord = EtcdCoordinator.from_endpoints("http://root:secret@127.0.0.1:2379")
    assert "secret" not in repr(coord) and coord.endpoints == ("127.0.0.1:2379",)
    assert isinstance(coord, Coordinator)


# --------------------------------------------------------------------------- leases and keys


async def test_grant_and_keepalive_return_ttl(etcd_endpoint: str) -> None:
    async with coordinator(etcd_endpoint) as coord:
        lease = await coord.grant(5)
        assert isinstance(lease, int) and lease > 0
        assert await coord.keepalive_once(lease) == 5.0
        assert await coord.keepalive_once(lease, timeout=1.0) == 5.0

        await coord.revoke(lease)
        await coord.revoke(lease)  # idempotent
        await coord.revoke(0x7EADBEEF)  # never existed
        with pytest.raises(LeaseLost):
            await coord.keepalive_once(lease)
        with pytest.raises(LeaseLost):
            await coord.put("zs/x", b"1", lease=lease)
        with pytest.raises(LeaseLost):
            await coord.claim_if_absent("zs/x", b"1", lease)


async def test_claimed_key_vanishes_after_lease_expiry(etcd_endpoint: str) -> None:
    async with coordinator(etcd_endpoint) as coord:
        lease = await coord.grant(1)
        kv = await coord.claim_if_absent("zs/p/0", b"owner-a", lease)
        assert kv is not None and kv.lease == lease
        assert (await coord.get("zs/p/0")) == kv
        gone_after = await wait_until_gone(coord, "zs/p/0", within=4.0)
        assert gone_after < 4.0
        with pytest.raises(LeaseLost):
            await coord.keepalive_once(lease)


async def test_claimed_key_vanishes_after_revoke(etcd_endpoint: str) -> None:
    async with coordinator(etcd_endpoint) as coord:
        lease = await coord.grant(30)
        assert await coord.claim_if_absent("zs/p/1", b"owner-a", lease) is not None
        await coord.put("zs/other", b"x", lease=lease)
        await coord.revoke(lease)
        assert await coord.get("zs/p/1") is None
        assert await coord.get("zs/other") is None


async def test_claim_if_absent_and_fencing_epoch(etcd_endpoint: str) -> None:
    async with coordinator(etcd_endpoint) as coord:
        la, lb = await coord.grant(30), await coord.grant(30)
        await coord.put("zs/unrelated", b"bump the revision")

        first = await coord.claim_if_absent("zs/p/7", b"a", la)
        assert first is not None
        stored = await coord.get("zs/p/7")
        assert stored == KV("zs/p/7", b"a", first.create_revision, first.create_revision, la)

        assert await coord.claim_if_absent("zs/p/7", b"b", lb) is None  # someone else holds it
        with pytest.raises(ValueError):
            await coord.claim_if_absent("zs/p/8", b"a", 0)  # an unleased claim would never expire
        # Asking again under the owning lease (e.g. retry after a lost reply)
        # returns the existing claim with its original epoch.
        assert await coord.claim_if_absent("zs/p/7", b"a", la) == stored

        # Overwriting keeps the epoch (create_revision), bumps mod_revision.
        await coord.put("zs/p/7", b"a2", lease=la)
        again = await coord.get("zs/p/7")
        assert again is not None
        assert again.create_revision == first.create_revision and again.mod_revision > first.mod_revision

        # Released and re-claimed: the new epoch is strictly larger.
        assert await coord.delete_if("zs/p/7", first.create_revision) is True
        second = await coord.claim_if_absent("zs/p/7", b"b", lb)
        assert second is not None and second.create_revision > first.create_revision
        assert (await coord.get("zs/p/7")).create_revision == second.create_revision  # type: ignore[union-attr]


async def test_delete_if_with_wrong_revision_does_nothing(etcd_endpoint: str) -> None:
    async with coordinator(etcd_endpoint) as coord:
        lease = await coord.grant(30)
        kv = await coord.claim_if_absent("zs/p/3", b"a", lease)
        assert kv is not None
        assert await coord.delete_if("zs/p/3", kv.create_revision - 1) is False
        assert await coord.delete_if("zs/p/3", kv.create_revision + 1000) is False
        assert await coord.get("zs/p/3") == kv
        assert await coord.delete_if("zs/missing", kv.create_revision) is False
        assert await coord.delete_if("zs/p/3", kv.create_revision) is True
        assert await coord.get("zs/p/3") is None


async def test_get_prefix_returns_kvs_and_revision(etcd_endpoint: str) -> None:
    async with coordinator(etcd_endpoint) as coord:
        assert await coord.get_prefix("zs/") == ([], (await coord.get_prefix("zs/"))[1])
        r1 = await coord.put("zs/a", b"1")
        r2 = await coord.put("zs/b", b"2")
        await coord.put("zt/c", b"not under the prefix")
        kvs, rev = await coord.get_prefix("zs/")
        assert [(kv.key, kv.value, kv.create_revision) for kv in kvs] == [("zs/a", b"1", r1), ("zs/b", b"2", r2)]
        assert rev >= r2 + 1


# --------------------------------------------------------------------------- watch


async def test_watch_sees_put_delete_and_lease_expiry(etcd_endpoint: str) -> None:
    async with coordinator(etcd_endpoint) as coord:
        await coord.put("zs/w/before", b"old")
        _, rev = await coord.get_prefix("zs/w/")
        w = Watcher(coord, "zs/w/", rev + 1)
        try:
            r_put = await coord.put("zs/w/a", b"1")
            await coord.put("zs/elsewhere", b"ignored")
            kv = await coord.get("zs/w/before")
            assert kv is not None and await coord.delete_if("zs/w/before", kv.create_revision)
            lease = await coord.grant(1)
            claim = await coord.claim_if_absent("zs/w/owned", b"me", lease)
            assert claim is not None

            ev = await w.next()
            assert ev == WatchEvent("put", "zs/w/a", b"1", r_put, r_put)
            ev = await w.next()
            assert (ev.kind, ev.key, ev.value) == ("delete", "zs/w/before", b"")
            ev = await w.next()
            assert ev == WatchEvent("put", "zs/w/owned", b"me", claim.create_revision, claim.create_revision)
            ev = await w.next(timeout=5.0)  # lease expiry
            assert (ev.kind, ev.key) == ("delete", "zs/w/owned") and ev.mod_revision > claim.mod_revision
        finally:
            await w.stop()


async def test_watch_several_keys_deleted_in_one_revision(etcd_endpoint: str) -> None:
    """A revoke deletes all keys of a lease in one revision: every delete must come through."""
    async with coordinator(etcd_endpoint) as coord:
        lease = await coord.grant(30)
        for i in range(3):
            await coord.put(f"zs/m/{i}", b"x", lease=lease)
        _, rev = await coord.get_prefix("zs/m/")
        w = Watcher(coord, "zs/m/", rev + 1)
        try:
            await coord.revoke(lease)
            evs = [await w.next() for _ in range(3)]
            assert sorted(e.key for e in evs) == ["zs/m/0", "zs/m/1", "zs/m/2"]
            assert {e.kind for e in evs} == {"delete"} and len({e.mod_revision for e in evs}) == 1
        finally:
            await w.stop()


async def test_watch_replays_history_from_start_revision(etcd_endpoint: str) -> None:
    async with coordinator(etcd_endpoint) as coord:
        revs = [await coord.put(f"zs/h/{i}", str(i).encode()) for i in range(3)]
        w = Watcher(coord, "zs/h/", revs[1])
        try:
            assert [(await w.next()).mod_revision for _ in range(2)] == revs[1:]
            await w.nothing_within(0.3)
        finally:
            await w.stop()


async def test_watch_compacted_revision_raises(etcd_endpoint: str) -> None:
    async with coordinator(etcd_endpoint) as coord:
        first = await coord.put("zs/c/a", b"1")
        last = await coord.put("zs/c/a", b"2")
        etcd_request(etcd_endpoint, "/v3/kv/compaction", {"revision": str(last), "physical": True})
        it = coord.watch_prefix("zs/c/", first)
        with pytest.raises(WatchCompacted) as info:
            await asyncio.wait_for(anext(it), 3.0)
        assert info.value.revision == first and info.value.compact_revision == last
        assert "get_prefix" in str(info.value)
        # Re-read + restart from the read's revision works.
        kvs, rev = await coord.get_prefix("zs/c/")
        assert [kv.value for kv in kvs] == [b"2"]
        w = Watcher(coord, "zs/c/", rev + 1)
        try:
            r = await coord.put("zs/c/b", b"3")
            assert (await w.next()).mod_revision == r
        finally:
            await w.stop()


async def test_watch_cancel_does_not_leak(etcd_endpoint: str) -> None:
    async with coordinator(etcd_endpoint) as coord:
        baseline = set(asyncio.all_tasks())
        _, rev = await coord.get_prefix("zs/l/")
        watchers = [Watcher(coord, "zs/l/", rev + 1) for _ in range(3)]
        await coord.put("zs/l/x", b"1")
        for w in watchers:
            assert (await w.next()).key == "zs/l/x"
        for w in watchers:
            await w.stop()
            assert w.task.cancelled()
        await asyncio.sleep(0.1)
        assert set(asyncio.all_tasks()) - baseline == set()

        # aclose() on an iterator closes its stream too.
        it = coord.watch_prefix("zs/l/", rev + 2)
        pending = asyncio.ensure_future(anext(it))
        await coord.put("zs/l/y", b"2")
        assert (await asyncio.wait_for(pending, 3.0)).key == "zs/l/y"
        await it.aclose()
        await asyncio.sleep(0.1)
        assert set(asyncio.all_tasks()) - baseline == set()


async def test_watch_resumes_after_etcd_restart(fresh_etcd: EtcdServer) -> None:
    async with coordinator(fresh_etcd.endpoint, timeout=1.0) as coord:
        _, rev = await coord.get_prefix("zs/r/")
        w = Watcher(coord, "zs/r/", rev + 1)
        try:
            r_a = await coord.put("zs/r/a", b"before")
            assert (await w.next()).mod_revision == r_a

            fresh_etcd.kill()
            await asyncio.sleep(0.3)  # let the stream notice
            await asyncio.to_thread(fresh_etcd.restart)

            r_b, _ = await retry_until(lambda: coord.put("zs/r/b", b"after"), within=5.0)
            r_c = await coord.put("zs/r/c", b"after2")
            ev_b = await w.next(timeout=5.0)
            assert (ev_b.key, ev_b.value, ev_b.mod_revision) == ("zs/r/b", b"after", r_b)
            assert (await w.next()).mod_revision == r_c
            await w.nothing_within(0.3)  # no duplicates of a or b
        finally:
            await w.stop()


# --------------------------------------------------------------------------- deadlines / unavailability


async def _unavailable_within(call: Callable[[], Awaitable[object]], bound: float, what: str) -> CoordinatorUnavailable:
    """Await ``call()``, which must raise CoordinatorUnavailable within ``bound`` s; that error."""
    start = time.monotonic()
    with pytest.raises(CoordinatorUnavailable) as info:
        await call()
    took = time.monotonic() - start
    assert took < bound, f"{what} took {took:.2f}s"
    return info.value


async def test_calls_against_killed_etcd_raise_unavailable_within_timeout(fresh_etcd: EtcdServer) -> None:
    timeout = 0.5
    async with coordinator(fresh_etcd.endpoint, timeout=timeout) as coord:
        lease = await coord.grant(30)
        fresh_etcd.kill()
        calls = {
            "get": lambda: coord.get("zs/k"),
            "get_prefix": lambda: coord.get_prefix("zs/"),
            "put": lambda: coord.put("zs/k", b"v"),
            "grant": lambda: coord.grant(5),
            "keepalive_once": lambda: coord.keepalive_once(lease),
            "revoke": lambda: coord.revoke(lease),
            "claim_if_absent": lambda: coord.claim_if_absent("zs/k", b"v", lease),
            "delete_if": lambda: coord.delete_if("zs/k", 5),
        }
        # all at once, as the tier's loops call it: each within its own deadline
        for err in await asyncio.gather(*(_unavailable_within(call, timeout + 1.0, name)
                                          for name, call in calls.items())):
            msg = str(err)
            assert fresh_etcd.endpoint in msg and "ZSCHED_ETCD_ENDPOINTS" in msg, msg

        # The per-call deadline overrides the default.
        start = time.monotonic()
        with pytest.raises(CoordinatorUnavailable):
            await coord.get("zs/k", timeout=0.2)
        assert time.monotonic() - start < 0.7

        # Back up again: the same coordinator recovers.
        await asyncio.to_thread(fresh_etcd.restart)
        (_, took) = await retry_until(lambda: coord.get("zs/k"), within=3.0)
        assert took < 3.0


async def test_frozen_etcd_does_not_hang_calls(fresh_etcd: EtcdServer) -> None:
    """SIGSTOPped etcd keeps its socket open but never answers: only the deadline saves us."""
    async with coordinator(fresh_etcd.endpoint, timeout=1.0) as coord:
        lease = await coord.grant(30)
        freeze(fresh_etcd)
        try:
            await asyncio.gather(_unavailable_within(lambda: coord.put("zs/k", b"v"), 2.0, "put"),
                                 _unavailable_within(lambda: coord.keepalive_once(lease), 2.0, "keepalive_once"))
        finally:
            fresh_etcd.resume()
        assert await coord.keepalive_once(lease) > 0

        # close() while a call hangs on the frozen server ends that call at once.
        freeze(fresh_etcd)
        try:
            pending = asyncio.create_task(coord.get("zs/k", timeout=5.0))
            await asyncio.sleep(0.2)
            start = time.monotonic()
            await coord.close()
            with pytest.raises(CoordinationError, match="closed"):
                await asyncio.wait_for(pending, 2.0)
            assert time.monotonic() - start < 1.0
        finally:
            fresh_etcd.resume()


async def test_connect_to_unreachable_endpoint_fails_fast(dead_endpoint: str) -> None:
    coord = EtcdCoordinator.from_endpoints(dead_endpoint, timeout=0.5)
    start = time.monotonic()
    with pytest.raises(CoordinatorUnavailable) as info:
        await coord.connect()
    assert time.monotonic() - start < 1.5
    assert dead_endpoint in str(info.value) and "ZSCHED_ETCD_ENDPOINTS" in str(info.value)
    with pytest.raises(CoordinationError, match="not connected"):
        await coord.get("x")
    await coord.close()


async def test_closed_coordinator_ends_watch(etcd_endpoint: str) -> None:
    coord = EtcdCoordinator.from_endpoints(etcd_endpoint)
    await coord.connect()
    w = Watcher(coord, "zs/z/", 0)
    await asyncio.sleep(0.2)
    await coord.close()
    with pytest.raises(CoordinationError):
        await w.next()
    await w.stop()


# --------------------------------------------------------------------------- failover and auth


async def test_claim_succeeds_again_after_leader_is_killed(etcd_cluster: EtcdCluster) -> None:
    async with coordinator(etcd_cluster.endpoints, timeout=1.0) as coord:
        lease = await coord.grant(10)
        assert await coord.claim_if_absent("zs/f/0", b"a", lease) is not None
        _, rev = await coord.get_prefix("zs/f/")
        w = Watcher(coord, "zs/f/", rev + 1)
        try:
            leader = await asyncio.to_thread(etcd_cluster.leader)
            leader.kill()
            kv, took = await retry_until(lambda: coord.claim_if_absent("zs/f/1", b"a", lease), within=5.0)
            assert kv is not None and took < 5.0
            assert await coord.get("zs/f/1") == kv
            assert await coord.keepalive_once(lease) > 0  # the lease survived the leader change
            ev = await w.next(timeout=5.0)  # the watch moved to a live member
            assert (ev.key, ev.create_revision) == ("zs/f/1", kv.create_revision)
        finally:
            await w.stop()


async def test_user_password_in_endpoint(caplog: pytest.LogCaptureFixture) -> None:
    with EtcdServer(extra_args=["--auth-token", "simple", "--auth-token-ttl", "1"]) as srv:
        ep = srv.endpoint
        etcd_request(ep, "/v3/auth/user/add", {"name": "root", "password": "s3cret"})
        etcd_request(ep, "/v3/auth/role/add", {"name": "root"})
        etcd_request(ep, "/v3/auth/user/grant", {"user": "root", "role": "root"})
        etcd_request(ep, "/v3/auth/enable", {})

        async with coordinator(f"http://root:s3cret@{ep}") as coord:
            _, start = await coord.get_prefix("zs/auth/")
            w = Watcher(coord, "zs/auth/", start + 1)
            w2: Watcher | None = None
            try:
                rev = await coord.put("zs/auth/k", b"v")
                assert (await w.next()).mod_revision == rev

                # The simple token expires after 1 s unused.  A watch created
                # now is refused ("invalid auth token"), logs in again and
                # carries on; so does the next unary call.
                await asyncio.sleep(2.5)
                with caplog.at_level("INFO", logger="scheduler.coord.etcd"):
                    w2 = Watcher(coord, "zs/auth/", rev + 1)
                    await wait_for(lambda: "logging in again" in caplog.text, 5, what="the watch to log in again")
                assert (await coord.get("zs/auth/k")).value == b"v"  # type: ignore[union-attr]
                rev2 = await coord.put("zs/auth/k", b"v2")
                for watcher in (w, w2):
                    ev = await watcher.next()
                    assert (ev.value, ev.mod_revision) == (b"v2", rev2)
            finally:
                await w.stop()
                if w2 is not None:
                    await w2.stop()

        with pytest.raises(CoordinationError, match="rejected user") as info:
            async with coordinator(f"http://root:wrong@{ep}"):
                pass
        assert not isinstance(info.value, CoordinatorUnavailable)
        with pytest.raises(CoordinationError):  # no credentials at all
            async with coordinator(ep) as coord:
                await coord.get("zs/auth/k")
