"""The script transport: the one way zsched runs its Lua scripts on Redis (sync and asyncio).

Every component — the producer clients, the scheduler tier, the workers and the operator CLI —
sends script calls through :class:`ScriptTransport` or :class:`AsyncScriptTransport`:

* **Connections come from redis-py's pool** and go back to it after every round trip (also when
  a call fails, a thread ends or a task is cancelled), so a Redis restart or a thousand
  short-lived threads never exhaust the pool. A connection whose reply was not read completely
  (timeout, cancellation) is disconnected before it is returned: the next user never reads a
  stale reply.
* **One round trip per batch**: several calls are packed and written at once and their replies
  read in order; an error reply of one call does not hide the others'.
* **NOSCRIPT recovery in one place**: a call refused with NOSCRIPT did not run; the script is
  loaded on the same connection and only the refused calls are sent again.
* **Retries in one place** (:class:`RedisRetry`): connection errors, timeouts and replies that
  mean "not executed" (LOADING, BUSY, MASTERDOWN, READONLY after a failover, NOREPLICAS) are retried with
  capped, fully jittered exponential backoff within a time budget. A call that may have run (the
  connection failed after it was written) is re-sent only when its script is safe to run twice,
  per :data:`RESEND`; ``schedule`` is re-sent with its re-send flag set, which makes the script
  return the ids it already created instead of creating them again.
* **Redis Cluster** (a ``RedisCluster`` client): the same transport sends each call to the master
  that owns its partition's slot (:mod:`.routing`), one round trip per node per batch (the
  asyncio transport talks to the nodes concurrently). MOVED updates the slot map and sends the
  call again at once, ASK sends it once to the importing node after ``ASKING`` (neither had
  run); TRYAGAIN and CLUSTERDOWN are "not run" refusals; a connection failure re-reads the slot
  map before the re-send rules above apply. With ``raise_on_error=False`` a node that fails does
  not fail the batch: its calls come back as ``NodeFailed`` and the other nodes' replies are kept
  (a worker serving three masters keeps claiming on two while the third fails over).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from redis.exceptions import NoScriptError, RedisClusterException, ResponseError

from ..protocol.call import Call
from ..protocol.codes import script_error
from ..protocol.scripts import load_scripts
from .batch import (
    DEFAULT_RETRY,
    MAX_REDIRECTS,
    NO_RETRY,
    NO_TAIL,
    RESEND,
    RESEND_FLAG,
    TRANSIENT,
    Batch,
    NodeFailed,
    RedisRetry,
    any_ran,
    evalsha,
    finish,
    is_noscript,
    mark_resend,
    merge_tails,
    not_run,
    pack,
    resend_safe,
)
from .connection import is_cluster
from .routing import SyncRoutes, isolate_failed
from .transport_async import AsyncScriptTransport

__all__ = ["DEFAULT_RETRY", "NO_RETRY", "RESEND", "RESEND_FLAG", "TRANSIENT", "AsyncScriptTransport", "Call",
           "NodeFailed", "RedisRetry", "ScriptTransport", "mark_resend", "resend_safe"]


class _Checkout:
    """A pool connection checked out by one thread. Returned to the pool when the thread ends
    (its thread-local storage is cleared and this object with it), when a call on it fails, or in
    a forked child never (the child's pool starts afresh and must not touch the parent's socket)."""

    __slots__ = ("pool", "conn", "pid")

    def __init__(self, pool: Any, conn: Any) -> None:
        self.pool, self.conn, self.pid = pool, conn, os.getpid()

    def give_back(self, broken: bool) -> None:
        conn, self.conn = self.conn, None
        if conn is None or self.pid != os.getpid():
            return
        if broken:
            conn.disconnect()  # a reply may be half read: never hand this socket to anyone
        self.pool.release(conn)

    def __del__(self) -> None:
        try:
            self.give_back(False)
        except Exception:  # interpreter shutdown or a closed pool: nothing left to return it to
            pass


class ScriptTransport:
    """Runs script calls on a blocking redis-py client. Thread-safe (the pool is).

    Each thread keeps the pool connection it checked out between calls: a producer calling
    ``schedule`` in a loop would otherwise pay the pool's checkout and return (a lock, a health
    probe and book-keeping: about a third of a one-job round trip on loopback, measured). The
    connection goes back to the pool when the thread ends or a call on it fails, so the number
    of connections follows the number of live threads, and a Redis restart costs one reconnect.

    ``retry``: the default :class:`RedisRetry` of every call (a call may pass its own)."""

    def __init__(self, redis: Any, retry: RedisRetry = DEFAULT_RETRY) -> None:
        self.redis = redis
        self.retry = retry
        self.scripts = load_scripts()
        self.resends = 0  # calls sent again after a connection failure (observability, tests)
        self._local = threading.local()
        self._routes = SyncRoutes(redis) if is_cluster(redis) else None

    def _checkout(self, probe: bool = True) -> _Checkout:
        """This thread's connection. ``probe``: first look whether the server closed it (see
        :meth:`call` for when that look is left out)."""
        held: _Checkout | None = getattr(self._local, "held", None)
        pool = self.redis.connection_pool
        if held is not None and held.conn is not None and held.pid == os.getpid() and held.pool is pool:
            conn = held.conn
            if not probe:
                return held
            # as the pool does at checkout: a connection with something to read before we asked
            # anything was closed by the server (e.g. a restart); reconnect before sending
            try:
                if conn.can_read(timeout=0):
                    conn.disconnect()
                    conn.connect()
                return held
            except BaseException:
                held.give_back(True)
                self._local.held = None
                raise
        held = _Checkout(pool, pool.get_connection())
        self._local.held = held
        return held

    def _broken(self, held: _Checkout) -> None:
        held.give_back(True)
        self._local.held = None

    def call(self, name: str, keys: Sequence[Any], args: Sequence[Any], *,
             retry: RedisRetry | None = None, resend: bool = True) -> Any:
        """Run one script; returns its reply, raises its error reply or the transport error.

        The first attempt takes a short path (one command, no batch book-keeping): producers call
        ``schedule`` one job at a time in hot loops. Anything unusual (NOSCRIPT, a refusal, a
        failed connection) continues on :meth:`call_many`'s path with the same rules.

        A call that may be sent again (:data:`RESEND`, and ``resend``) skips the look at the
        connection before sending (three system calls: about a twentieth of a one-job
        ``schedule`` round trip, measured): if the server closed it, the reply fails to come
        and the call is sent again on a new connection, as after any lost reply."""
        if self._routes is not None:
            return self.call_many([(name, keys, args)], retry=retry, resend=resend)[0]
        try:
            held = self._checkout(probe=not (resend and RESEND.get(name) in ("safe", "flag")))
        except TRANSIENT:
            return self.call_many([(name, keys, args)], retry=retry, resend=resend)[0]
        conn = held.conn
        try:
            conn.send_packed_command(pack(conn, [evalsha(self.scripts, (name, keys, args))]),
                                     check_health=False)
            return conn.read_response()
        except ResponseError as exc:  # the reply was read: the connection is still in sync
            if is_noscript(exc) or not_run(exc):  # it did not run: the general path handles it
                return self.call_many([(name, keys, args)], retry=retry, resend=resend)[0]
            mapped = script_error(exc)
            if mapped is exc:
                raise
            raise mapped from exc
        except TRANSIENT:
            self._broken(held)
            call: Call = (name, keys, args)
            if not (resend and resend_safe([call])):
                raise
            self.resends += 1
            return self.call_many([mark_resend(call)], retry=retry, resend=resend)[0]
        except BaseException:
            self._broken(held)
            raise

    def call_many(self, calls: Sequence[Call], *, retry: RedisRetry | None = None, resend: bool = True,
                  raise_on_error: bool = True, then: Sequence[Any] | None = None) -> list[Any]:
        """Run several script calls in one round trip; replies in order. With
        ``raise_on_error=False`` an error reply comes back as the exception object in its place,
        and on a cluster so does a failed node: its calls get :class:`~.batch.NodeFailed` (saying
        whether each may have run) at once, while the other nodes' replies come back as usual.
        ``resend=False``: never send a call again once it may have reached Redis (a failure
        before sending is still retried). ``then``: one more command sent on the same connection
        after the calls (e.g. ``WAIT``); its reply is appended to the list."""
        batch = Batch(calls, self.scripts)
        policy = retry or self.retry
        if self._routes is not None:
            tails = self._cluster(batch, policy.delays(), resend, then, not raise_on_error)
        else:
            tails = [self._single(batch, policy.delays(), resend, then)]
        out = finish(batch.results, raise_on_error)
        if then is not None:
            out.append(merge_tails(tails))
        return out

    def _single(self, batch: Batch, delays: Iterator[float], resend: bool, then: Sequence[Any] | None) -> Any:
        """The batch on one server, over this thread's held connection."""
        tail: Any = None
        while True:
            try:
                held = self._checkout()
            except TRANSIENT:  # nothing was sent
                if not self._pause(delays):
                    raise
                continue
            try:
                got = self._roundtrip(held.conn, batch, then, batch.pending)
                if got is not NO_TAIL:  # else nothing ran: keep the reply that covered what did
                    tail = got
            except TRANSIENT:
                self._broken(held)
                if not (resend and batch.resend_safe()) or not self._pause(delays):
                    raise
                batch.mark_resent()
                self.resends += 1
                continue
            except BaseException:
                self._broken(held)
                raise
            if batch.pending:  # refused as not run (LOADING, BUSY, READONLY, ...): again later
                if not self._pause(delays):
                    return tail
                continue
            return tail

    def _cluster(self, batch: Batch, delays: Iterator[float], resend: bool, then: Sequence[Any] | None,
                 isolate: bool) -> list[Any]:
        """The batch on a cluster: one round trip per node, until every call has its reply.
        ``isolate`` (``raise_on_error=False``): a node that fails is not waited for, see
        :func:`.routing.isolate_failed`."""
        routes = self._routes
        assert routes is not None
        tails: list[Any] = []
        redirects = 0
        while batch.pending:
            failed: BaseException | None = None
            down: set[str] = set()
            try:
                groups = routes.groups(batch)
            except RedisClusterException as exc:  # a slot with no known master (a failover under way)
                groups, failed = [], exc
            for node, idx in groups:
                error = self._on_node(routes.pool(node), batch, then, idx, resend, isolate, tails)
                if error is not None:
                    failed = error
                    down.add(node.name)
            if batch.moved and redirects < MAX_REDIRECTS and failed is None:
                redirects += 1
                routes.moved(batch.moved)
                batch.moved.clear()
                continue
            if batch.moved:
                routes.moved(batch.moved)
                batch.moved.clear()
            if failed is not None:
                routes.refresh()
                if isolate:
                    isolate_failed(batch, routes.groups, down, failed)
            if batch.pending and not self._pause(delays):
                if failed is not None:
                    if not isolate:
                        raise failed
                    batch.give_up(list(batch.pending), failed)
                break
        return tails

    def _on_node(self, pool: Any, batch: Batch, then: Sequence[Any] | None, idx: list[int], resend: bool,
                 isolate: bool, tails: list[Any]) -> BaseException | None:
        """One round trip to one cluster node (its reply to ``then`` goes to ``tails``). Returns
        the transport failure when the calls may go again (re-sendable, or never sent); raises it
        when they may not, unless ``isolate``: then they get :class:`NodeFailed` replies."""
        try:
            conn = pool.get_connection()  # connects: a failure here sent nothing
        except TRANSIENT as exc:
            return exc
        try:
            tails.append(self._roundtrip(conn, batch, then, idx))
        except TRANSIENT as exc:
            conn.disconnect()
            pool.release(conn)
            if not (resend and batch.resend_safe(idx)):
                if not isolate:
                    raise
                batch.give_up(idx, exc, written=True)
                return exc
            batch.mark_resent(idx)
            self.resends += 1
            return exc
        except BaseException:
            conn.disconnect()  # a reply may be half read
            pool.release(conn)
            raise
        pool.release(conn)
        return None

    @staticmethod
    def _pause(delays: Iterator[float]) -> bool:
        d = next(delays, None)
        if d is None:
            return False
        time.sleep(d)
        return True

    @staticmethod
    def _roundtrip(conn: Any, batch: Batch, then: Sequence[Any] | None, idx: Sequence[int]) -> Any:
        """Send the calls ``idx`` (and ``then``) on ``conn``, read every reply; after NOSCRIPT load
        the missing scripts on the same connection and send the refused calls again."""
        tail: Any = None
        ran = False  # a call of this connection ran: the last WAIT covers it (WAIT is per connection)
        idx = list(idx)
        for _ in range(3):
            cmds = batch.commands(idx)
            if then is not None:
                cmds.append(tuple(then))
            asking = [i in batch.ask for i in idx]
            conn.send_packed_command(pack(conn, cmds), check_health=False)
            replies = []
            for ask in asking:
                if ask:
                    conn.read_response()  # ASKING's +OK
                try:
                    replies.append(conn.read_response())
                except ResponseError as exc:  # the reply was read: the connection is still in sync
                    replies.append(exc)
            if then is not None:
                try:
                    tail = conn.read_response()
                except ResponseError as exc:
                    tail = exc
            ran = ran or any_ran(replies)
            refused = [i for i, r in zip(idx, replies) if isinstance(r, Exception) and is_noscript(r)]
            missing, _wait = batch.take(idx, replies)
            if not missing:
                return tail if ran else NO_TAIL
            for name in missing:
                conn.send_command("SCRIPT", "LOAD", batch.scripts[name].source, check_health=False)
                conn.read_response()
            idx = refused
        raise NoScriptError("scripts still missing after loading them twice (is SCRIPT FLUSH running in a loop?)")
