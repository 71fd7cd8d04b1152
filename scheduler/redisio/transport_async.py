"""The asyncio script transport (:class:`AsyncScriptTransport`), the twin of
:class:`~.transport.ScriptTransport`: same batches, same retry and re-send rules, same cluster
routing; see :mod:`.transport` for what it guarantees."""
from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, ParamSpec, TypeVar

from redis.exceptions import ConnectionError, NoScriptError, RedisClusterException, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..protocol.call import Call
from ..protocol.scripts import load_scripts
from .batch import (
    DEFAULT_RETRY,
    MAX_REDIRECTS,
    NO_TAIL,
    TRANSIENT,
    Batch,
    RedisRetry,
    any_ran,
    finish,
    is_noscript,
    merge_tails,
    pack,
    send_again,
)
from .connection import is_cluster
from .connectors import AsyncCluster
from .errors import REDIS_ERRORS
from .routing import AsyncRoutes, isolate_failed


class AsyncScriptTransport:
    """The asyncio twin of :class:`ScriptTransport` (a ``redis.asyncio`` client).

    A caller that never has two round trips in flight at once on the same *lane* (e.g. the
    worker's claim loop and its outcome loop) may name it: the lane keeps the pool connection it
    checked out between calls instead of paying the pool's checkout and return (lock, health
    probe, book-keeping) on every round trip. The connection goes back to the pool when a call
    on it fails or :meth:`close` is called."""

    def __init__(self, redis: Any, retry: RedisRetry = DEFAULT_RETRY) -> None:
        self.redis = redis
        self.retry = retry
        self.scripts = load_scripts()
        self.resends = 0
        self._lanes: dict[str, Any] = {}
        # On a cluster the calls go through a client of their own. redis-py's cluster client
        # answers CLUSTERDOWN, an uncovered slot or a failed pipeline by closing every connection
        # to every node (``RedisCluster.aclose``), also those a round trip is reading replies from
        # on a healthy node: a ring or a ping refused while a master fails over dropped the claims
        # in flight elsewhere, and jobs those claims had taken waited for their leases to expire.
        # Nothing else sends commands through this client, and the transport itself never closes
        # a node's connections wholesale. A client not made by ``async_redis`` is shared as given.
        self._own: AsyncCluster | None = redis.another() if isinstance(redis, AsyncCluster) else None
        self._routes = AsyncRoutes(self._own or redis) if is_cluster(redis) else None

    async def close(self) -> None:
        """Return the lanes' connections to the pool; on a cluster, close the transport's own
        client (it is made again on the next call)."""
        lanes, self._lanes = self._lanes, {}
        for conn in lanes.values():
            await self.redis.connection_pool.release(conn)
        if self._own is not None:
            await self._own.aclose()

    async def _checkout(self, lane: str | None) -> Any:
        conn = self._lanes.pop(lane, None) if lane is not None else None
        return await checkout(self.redis.connection_pool, conn)

    async def call(self, name: str, keys: Sequence[Any], args: Sequence[Any], *,
                   retry: RedisRetry | None = None, resend: bool = True) -> Any:
        """Run one script; returns its reply, raises its error reply or the transport error."""
        return (await self.call_many([(name, keys, args)], retry=retry, resend=resend))[0]

    async def call_many(self, calls: Sequence[Call], *, retry: RedisRetry | None = None, resend: bool = True,
                        raise_on_error: bool = True, then: Sequence[Any] | None = None,
                        lane: str | None = None, atomic: bool = False) -> list[Any]:
        """See :meth:`ScriptTransport.call_many`; ``lane``: see the class docstring (ignored on a
        cluster, where every round trip takes a connection from each node's pool). ``atomic``
        (one server only; not with ``then``): the round trip's calls run in one ``MULTI``/``EXEC``,
        so no other client's command runs between them and the clients blocked on the keys they
        write are served once, after the last (the replica's ticks of one grid step: their burst
        rings then reach a waiting worker together, workers/doorbell.py). A call re-sent after a
        refusal or a lost reply goes again the same way; each keeps its own reply."""
        batch = Batch(calls, self.scripts)
        policy = retry or self.retry
        if self._routes is not None:
            tails = await self._cluster(self._routes, batch, policy.delays(), resend, then, not raise_on_error)
        else:
            if atomic and then is not None:
                raise ValueError("call_many: atomic=True cannot carry a command after the batch (then=)")
            tails = [await self._single(batch, policy.delays(), resend, then, lane, atomic)]
        out = finish(batch.results, raise_on_error)
        if then is not None:
            out.append(merge_tails(tails))
        return out

    async def _single(self, batch: Batch, delays: Iterator[float], resend: bool, then: Sequence[Any] | None,
                      lane: str | None, atomic: bool = False) -> Any:
        """The batch on one server."""
        pool = self.redis.connection_pool
        tail: Any = None
        while True:
            try:
                conn = await self._checkout(lane)
            except TRANSIENT:
                if not await self._pause(delays):
                    raise
                continue
            try:
                got = await self._roundtrip(conn, batch, then, batch.pending, atomic)
                if got is not NO_TAIL:  # else nothing ran: keep the reply that covered what did
                    tail = got
            except TRANSIENT:
                await _drop(conn)
                await pool.release(conn)
                if not (resend and batch.resend_safe()) or not await self._pause(delays):
                    raise
                batch.mark_resent()
                self.resends += 1
                continue
            except BaseException:  # cancelled mid-call, or a bug: the reply may be half read
                await asyncio.shield(drop_and_release(pool, conn))
                raise
            if lane is not None and lane not in self._lanes:
                self._lanes[lane] = conn
            else:
                await pool.release(conn)
            if batch.pending:
                if not await self._pause(delays):
                    return tail
                continue
            return tail

    async def _cluster(self, routes: AsyncRoutes, batch: Batch, delays: Iterator[float], resend: bool,
                       then: Sequence[Any] | None, isolate: bool) -> list[Any]:
        """The batch on a cluster: one round trip per node, the nodes concurrently. ``isolate``
        (``raise_on_error=False``): a node that fails is not waited for; see :func:`.routing.isolate_failed`."""
        await routes.start()
        tails: list[Any] = []
        redirects = 0
        while batch.pending:
            try:
                groups = routes.groups(batch)
            except RedisClusterException as exc:  # a slot with no known master (a failover under way)
                groups = [(None, exc)]  # type: ignore[list-item]  # _on_node reports it as a failure
            if len(groups) == 1:  # one node (most of a worker's round trips): no task of gather's to make and wake
                node, idx = groups[0]
                results: list[Any] = [await self._on_node(node, batch, then, idx, resend, isolate)]
            else:
                results = await asyncio.gather(*(self._on_node(node, batch, then, idx, resend, isolate)
                                                 for node, idx in groups), return_exceptions=True)
            failed: BaseException | None = None
            down: set[str] = set()
            for r in results:
                if isinstance(r, _Failed):
                    failed = r.error
                    down.add(r.node)
                elif isinstance(r, BaseException):
                    raise r
                else:
                    tails.append(r)
            if batch.moved and redirects < MAX_REDIRECTS and failed is None:
                redirects += 1
                await routes.moved(batch.moved)
                batch.moved.clear()
                continue
            if batch.moved:
                await routes.moved(batch.moved)
                batch.moved.clear()
            if failed is not None:
                await routes.refresh()
                if isolate:
                    isolate_failed(batch, routes.groups, down, failed)
            if batch.pending and not await self._pause(delays):
                if failed is not None:
                    if not isolate:
                        raise failed
                    batch.give_up(list(batch.pending), failed)
                break
        return tails

    async def _on_node(self, node: Any, batch: Batch, then: Sequence[Any] | None, idx: Any,
                       resend: bool, isolate: bool) -> Any:
        """One round trip to one cluster node; a transport failure that allows a re-send comes
        back as :class:`_Failed` (the calls are marked re-sent), any other error is raised; with
        ``isolate``, calls that may have run and may not be re-sent get :class:`NodeFailed`."""
        if node is None:  # no route: ``idx`` is the routing error
            return _Failed(idx, "")
        try:
            conn = node.acquire_connection()
        except TRANSIENT as exc:  # nothing was sent
            return _Failed(exc, node.name)
        try:
            # connect first (a no-op when connected): a failure here sent nothing, so the calls
            # may go again whatever their script, instead of counting as "may have run"
            await conn.connect()
        except TRANSIENT as exc:
            await _drop(conn)
            node.release(conn)
            return _Failed(exc, node.name)
        except BaseException:
            await asyncio.shield(_drop(conn))
            node.release(conn)
            raise
        try:
            tail = await self._roundtrip(conn, batch, then, idx)
        except (*TRANSIENT, AttributeError, RuntimeError) as caught:
            lost = closed_under_us(conn, caught)
            if lost is None:  # not a lost connection: a bug, raised
                await asyncio.shield(_drop(conn))
                node.release(conn)
                raise
            await _drop(conn)
            node.release(conn)
            if not (resend and batch.resend_safe(idx)):
                if not isolate:
                    if lost is caught:
                        raise
                    raise lost from caught
                batch.give_up(idx, lost, written=True)
                return _Failed(lost, node.name)
            batch.mark_resent(idx)
            self.resends += 1
            return _Failed(lost, node.name)
        except BaseException:
            await asyncio.shield(_drop(conn))
            node.release(conn)
            raise
        node.release(conn)
        return tail

    @staticmethod
    async def _pause(delays: Iterator[float]) -> bool:
        d = next(delays, None)
        if d is None:
            return False
        await asyncio.sleep(d)
        return True

    @staticmethod
    async def _roundtrip(conn: Any, batch: Batch, then: Sequence[Any] | None, idx: Sequence[int],
                         atomic: bool = False) -> Any:
        tail: Any = None
        ran = False  # a call of this connection ran: the last WAIT covers it (WAIT is per connection)
        idx = list(idx)
        for _ in range(3):
            cmds = batch.commands(idx)
            if atomic and len(idx) > 1:  # one server: no ASKING, no tail (call_many checked)
                replies = await _transaction(conn, cmds)
            else:
                if then is not None:
                    cmds.append(tuple(then))
                asking = [i in batch.ask for i in idx]
                await send_packed(conn, pack(conn, cmds))
                replies = []
                for ask in asking:
                    if ask:
                        await conn.read_response()  # ASKING's +OK
                    try:
                        replies.append(await conn.read_response())
                    except ResponseError as exc:
                        replies.append(exc)
            if then is not None:
                try:
                    tail = await conn.read_response()
                except ResponseError as exc:
                    tail = exc
            ran = ran or any_ran(replies)
            refused = [i for i, r in zip(idx, replies) if isinstance(r, Exception) and is_noscript(r)]
            missing, _wait = batch.take(idx, replies)
            if not missing:
                return tail if ran else NO_TAIL
            for name in missing:
                await conn.send_command("SCRIPT", "LOAD", batch.scripts[name].source, check_health=False)
                await conn.read_response()
            idx = refused
        raise NoScriptError("scripts still missing after loading them twice (is SCRIPT FLUSH running in a loop?)")


async def _transaction(conn: Any, cmds: list[tuple[Any, ...]]) -> list[Any]:
    """``cmds`` in one ``MULTI``/``EXEC`` round trip: a reply per command, an error reply as its
    exception. A command refused as it is queued (``LOADING``, ``BUSY``, ``OOM``: Redis checks
    those then; ``BUSY`` refuses ``MULTI`` and ``EXEC`` too) makes ``EXEC`` run nothing: every
    command gets the first refusal, so the batch's rules (:meth:`Batch.take`) treat them all as
    not run, as they were."""
    await send_packed(conn, pack(conn, [("MULTI",), *cmds, ("EXEC",)]))
    refused: ResponseError | None = None
    for _ in range(len(cmds) + 1):  # MULTI's +OK, then +QUEUED each (BUSY refuses all of them)
        try:
            await conn.read_response()  # +QUEUED
        except ResponseError as exc:
            refused = refused or exc
    try:
        replies = await conn.read_response()
    except ResponseError as exc:
        return [refused or exc] * len(cmds)
    if refused is not None or not isinstance(replies, list) or len(replies) != len(cmds):
        # EXEC ran although a command was refused, or answered something else: cannot happen
        raise ResponseError(f"MULTI/EXEC of {len(cmds)} calls answered {replies!r:.200}")
    return replies


class _Failed:
    """A node's round trip failed in transit (connection error or timeout) in a way the batch
    may retry: the cluster loop re-reads the slot map and pauses before sending again. ``node``:
    the node's name ("" when the calls had no route)."""

    __slots__ = ("error", "node")

    def __init__(self, error: BaseException, node: str) -> None:
        self.error = error
        self.node = node


async def checkout(pool: Any, held: Any | None = None) -> Any:
    """A connection of ``pool`` (a non-cluster ``redis.asyncio`` pool) for a caller that keeps it
    between round trips: ``held`` (the one it kept, probed with the pool's own checkout probe,
    which reconnects one the server closed, e.g. after a restart), or a new checkout. Give it
    back with ``pool.release``, or :func:`drop_and_release` after a failed or cancelled round
    trip (its reply may be half read)."""
    if held is None:
        return await pool.get_connection()
    try:
        await pool.ensure_connection(held)
    except BaseException:
        await asyncio.shield(drop_and_release(pool, held))
        raise
    return held


def closed_under_us(conn: Any, exc: BaseException) -> BaseException | None:
    """``exc`` as a connection lost in transit: a transport error as it is; an AttributeError of
    a connection that is no longer connected (redis-py's cluster client closes every connection of
    a node, those in use too, when a slot-map refresh drops or replaces it: the next write or read
    meets a missing stream), or uvloop's RuntimeError for a write to a stream closed that way
    ("unable to perform operation on <TCPTransport closed=True ...>; the handler is closed",
    seen when a master was killed under load), as a :class:`~redis.exceptions.ConnectionError`;
    None for any other AttributeError or RuntimeError, which is a bug to raise."""
    if isinstance(exc, RuntimeError):
        if "handler is closed" not in str(exc) and conn.is_connected:
            return None
    elif not isinstance(exc, AttributeError):
        return exc
    elif conn.is_connected:
        return None
    return ConnectionError("the connection was closed while in use (the cluster client refreshed its slot map)")


_P = ParamSpec("_P")
_T = TypeVar("_T")


def lost_connection(exc: BaseException) -> ConnectionError | None:
    """``exc``, met by a redis-py call (a pipeline, a single command), as the
    :class:`~redis.exceptions.ConnectionError` of a connection closed under it, or None when it is
    not one (a bug, to raise as it is): uvloop's RuntimeError for a write to a closed stream ("...
    the handler is closed", seen from a pool checkout reconnecting while a Sentinel failover
    closed the pool's connections), or an AttributeError on a missing stream raised inside
    redis-py's connection code ("'NoneType' object has no attribute 'writelines'": the cluster
    client closed every connection of a node, those in use too, during a failover's slot-map
    refresh). tests/unit/test_lost_in_transit.py checks both against the pinned redis-py."""
    if isinstance(exc, RuntimeError) and "handler is closed" in str(exc):
        return ConnectionError(f"the connection was closed while in use ({exc})")
    if isinstance(exc, AttributeError) and str(exc).startswith("'NoneType' object has no attribute"):
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        module = tb.tb_frame.f_globals.get("__name__", "") if tb is not None else ""
        if module.startswith("redis.") and module.endswith("connection"):
            return ConnectionError(f"the connection was closed while in use ({exc})")
    return None


def lost_in_transit(fn: Callable[_P, Awaitable[_T]]) -> Callable[_P, Coroutine[Any, Any, _T]]:
    """Decorate a coroutine function whose redis-py calls may meet a connection closed under them
    (:func:`lost_connection`): that becomes a :class:`~redis.exceptions.ConnectionError`, which
    the callers' outage handling knows, instead of crashing their loop. Any other RuntimeError or
    AttributeError is a bug and is raised as it is."""

    @functools.wraps(fn)
    async def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return await fn(*args, **kwargs)
        except (RuntimeError, AttributeError) as exc:
            lost = lost_connection(exc)
            if lost is None:
                raise
            raise lost from exc

    return wrapper


async def send_retried_async(send: Callable[[], Awaitable[_T]], retry: RedisRetry) -> _T:
    """:func:`~scheduler.redisio.batch.send_retried` for asyncio: ``await send()``, sent again
    under ``retry`` while it fails as :func:`~scheduler.redisio.batch.send_again` says."""
    delays = retry.delays()
    while True:
        try:
            return await send()
        except REDIS_ERRORS as exc:
            delay = next(delays, None) if send_again(exc) else None
            if delay is None:
                raise
            await asyncio.sleep(delay)


async def send_packed(conn: Any, packed: Any) -> None:
    """Write ``packed`` (``conn.pack_command`` / ``pack_commands`` output) on ``conn``, bounded by
    its ``socket_timeout`` as redis-py bounds it, raising the same errors (a write that times out
    closes the connection and raises :class:`redis.exceptions.TimeoutError`). redis-py wraps the
    write in ``asyncio.wait_for``, which on Python 3.11 makes a task and costs an event-loop turn
    per write (about 4 µs of a PING round trip's 47 on the 2-core VM, and three writes per job);
    here the connection writes with no timeout of its own, inside :func:`asyncio.timeout`.
    ``socket_timeout`` is put back before this returns; nothing else uses the connection meanwhile
    (its caller holds it). tests/unit/test_redis_py_contract.py checks the behaviour relied on."""
    timeout = conn.socket_timeout
    if not timeout:
        await conn.send_packed_command(packed, check_health=False)
        return
    conn.socket_timeout = None
    try:
        async with asyncio.timeout(timeout):
            await conn.send_packed_command(packed, check_health=False)
    except TimeoutError:  # cancelled mid-write: redis-py closed the connection on the way out
        raise RedisTimeoutError("Timeout writing to socket") from None
    finally:
        conn.socket_timeout = timeout


async def _drop(conn: Any) -> None:
    try:
        await conn.disconnect(nowait=True)
    except Exception:  # closing a broken connection must not hide the error that broke it
        pass


async def drop_and_release(pool: Any, conn: Any) -> None:
    """Close ``conn`` (whatever state its socket is in) and give it back to ``pool``."""
    await _drop(conn)
    await pool.release(conn)
