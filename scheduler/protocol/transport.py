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
* **Retries in one place** (:class:`RetryPolicy`): connection errors, timeouts and replies that
  mean "not executed" (LOADING, BUSY, MASTERDOWN, READONLY after a failover, NOREPLICAS) are retried with
  capped, fully jittered exponential backoff within a time budget. A call that may have run (the
  connection failed after it was written) is re-sent only when its script is safe to run twice,
  per :data:`RESEND`; ``schedule`` is re-sent with its re-send flag set, which makes the script
  return the ids it already created instead of creating them again.
"""
from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

from .scripts import Script, load_scripts

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:  # redis[hiredis] is a dependency; its C packer is what the hot paths use
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover
    _hiredis_pack = None


def _pack(conn: Any, cmds: list[tuple[Any, ...]]) -> Any:
    """Commands as one buffer. hiredis's packer: redis-py's own ``pack_commands`` converts every
    argument in Python first, which measured as most of the worker's CPU per claim/ack round trip."""
    if _hiredis_pack is None:
        return conn.pack_commands(cmds)
    return [b"".join([_hiredis_pack(c) for c in cmds])]

Call = tuple[str, Sequence[Any], Sequence[Any]]
"""A script call: (script name, keys, args)."""

# -- retry safety -------------------------------------------------------------------------------
# What happens when a script call is sent twice (the first reply was lost):
#   "safe": the second run finds the first one's result and changes nothing it should not
#           (fenced by a lease token or an epoch, or naturally idempotent). Its *reply* may differ
#           (e.g. ack returns 0 "refused" for a job the first run acked).
#   "flag": safe when re-sent with the script's re-send flag (an ARGV position, 0-based in args)
#           set to 1; the first send leaves it 0 so the common path pays nothing for the check.
RESEND: dict[str, str] = {
    "schedule": "flag",     # creates a job only if its id is new (the id is made by the client)
    "tick": "safe",         # fenced by the epoch; a second tick finds fewer due timers
    "reap": "safe",         # fenced by the epoch; only expired leases are reaped
    "claim": "safe",        # never hands out a job that is already running; a lost reply strands
                            # its jobs until their lease expires (then they are reaped)
    "ack": "safe", "fail": "safe", "extend": "safe", "release": "safe",  # fenced by the lease token
    "cancel": "safe", "reschedule": "safe", "requeue": "safe", "purge": "safe",
    "inspect": "safe", "stats": "safe", "dead_list": "safe", "list": "safe",  # read-only
    "ratelimit": "safe",    # a lost reply spends tokens nobody uses: the queue runs a bit slow once
    "cron_set": "safe", "cron_remove": "safe",
    "cron_fill": "safe",    # versioned: a second fill of the same version is ignored
    "epoch_reset": "safe",  # compare-and-set
}
RESEND_FLAG: dict[str, int] = {"schedule": 6}  # 0-based index into args (ARGV[index + 1]) of the flag

# Error replies that mean the command was not executed: safe to send again after a pause.
# NOREPLICAS (min-replicas-to-write not met) is raised at a script's first write, before it wrote.
_NOT_RUN = ("LOADING", "BUSY ", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")
TRANSIENT = (ConnectionError, TimeoutError, OSError)


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often a call is retried after a transient failure.

    Delays are full jitter: uniform in [0, min(cap, base * 2**n)], so clients that failed together
    come back spread out. ``budget`` bounds the total time spent retrying (the call then raises
    the last error); ``attempts`` bounds the number of tries (1 = no retry)."""

    budget: float = 10.0
    attempts: int = 30
    base: float = 0.025
    cap: float = 1.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.budget < 0 or self.base <= 0 or self.cap < self.base:
            raise ValueError(f"invalid RetryPolicy {self!r}: need attempts >= 1, budget >= 0, 0 < base <= cap")

    def delays(self) -> Iterator[float]:
        """Sleep before each retry; ends when the attempts or the time budget are spent."""
        deadline = time.monotonic() + self.budget
        for n in range(self.attempts - 1):
            d = random.uniform(0, min(self.cap, self.base * 2 ** min(n, 30)))
            left = deadline - time.monotonic()
            if left <= 0:
                return
            yield min(d, left)


DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(attempts=1, budget=0)


def _not_run(exc: BaseException) -> bool:
    return isinstance(exc, ResponseError) and str(exc).startswith(_NOT_RUN)


def _is_noscript(exc: BaseException) -> bool:
    return isinstance(exc, NoScriptError) or (isinstance(exc, ResponseError) and str(exc).startswith("NOSCRIPT"))


def resend_safe(calls: Sequence[Call]) -> bool:
    return all(RESEND.get(name) in ("safe", "flag") for name, _, _ in calls)


def mark_resend(call: Call) -> Call:
    """The call as it must be re-sent (with its script's re-send flag set, if it has one)."""
    name, keys, args = call
    i = RESEND_FLAG.get(name)
    if i is None:
        return call
    args = list(args)
    args[i] = 1
    return name, keys, args


class _Batch:
    """Book-keeping of one batch across NOSCRIPT reloads, refusals and re-sends."""

    __slots__ = ("calls", "results", "pending", "scripts", "resent")

    def __init__(self, calls: Sequence[Call], scripts: dict[str, Script]) -> None:
        self.calls = list(calls)
        self.results: list[Any] = [None] * len(calls)
        self.pending = list(range(len(calls)))
        self.scripts = scripts
        self.resent = False

    def commands(self) -> list[tuple[Any, ...]]:
        by = self.scripts
        out = []
        for i in self.pending:
            name, keys, args = self.calls[i]
            out.append(("EVALSHA", by[name].sha, len(keys), *keys, *args))
        return out

    def take(self, replies: Sequence[Any]) -> tuple[list[str], bool]:
        """Store replies; keep pending the calls refused as NOSCRIPT or not-run. Returns the
        scripts to load and whether a not-run refusal asks for a pause before sending again."""
        missing: list[str] = []
        wait = False
        still = []
        for i, r in zip(self.pending, replies):
            if isinstance(r, Exception) and _is_noscript(r):
                missing.append(self.calls[i][0])
                still.append(i)
            elif isinstance(r, Exception) and _not_run(r):
                self.results[i] = r  # reported if the retries run out
                still.append(i)
                wait = True
            else:
                self.results[i] = r
        self.pending = still
        return sorted(set(missing)), wait

    def mark_resent(self) -> None:
        """The connection failed after sending: every pending call may have run."""
        self.resent = True
        for i in self.pending:
            self.calls[i] = mark_resend(self.calls[i])


def _finish(results: list[Any], raise_on_error: bool) -> list[Any]:
    if raise_on_error:
        for r in results:
            if isinstance(r, Exception):
                raise r
    return results


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

    ``retry``: the default :class:`RetryPolicy` of every call (a call may pass its own)."""

    def __init__(self, redis: Any, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.redis = redis
        self.retry = retry
        self.scripts = load_scripts()
        self.resends = 0  # calls sent again after a connection failure (observability, tests)
        self._local = threading.local()

    def _checkout(self) -> _Checkout:
        held: _Checkout | None = getattr(self._local, "held", None)
        pool = self.redis.connection_pool
        if held is not None and held.conn is not None and held.pid == os.getpid() and held.pool is pool:
            conn = held.conn
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
             retry: RetryPolicy | None = None, resend: bool = True) -> Any:
        """Run one script; returns its reply, raises its error reply or the transport error.

        The first attempt takes a short path (one command, no batch book-keeping): producers call
        ``schedule`` one job at a time in hot loops. Anything unusual (NOSCRIPT, a refusal, a
        failed connection) continues on :meth:`call_many`'s path with the same rules."""
        try:
            held = self._checkout()
        except TRANSIENT:
            return self.call_many([(name, keys, args)], retry=retry, resend=resend)[0]
        conn = held.conn
        try:
            conn.send_packed_command(_pack(conn, [("EVALSHA", self.scripts[name].sha, len(keys), *keys, *args)]),
                                     check_health=False)
            return conn.read_response()
        except ResponseError as exc:  # the reply was read: the connection is still in sync
            if _is_noscript(exc) or _not_run(exc):  # it did not run: the general path handles it
                return self.call_many([(name, keys, args)], retry=retry, resend=resend)[0]
            raise
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

    def call_many(self, calls: Sequence[Call], *, retry: RetryPolicy | None = None, resend: bool = True,
                  raise_on_error: bool = True, then: Sequence[Any] | None = None) -> list[Any]:
        """Run several script calls in one round trip; replies in order. With
        ``raise_on_error=False`` an error reply comes back as the exception object in its place.
        ``resend=False``: never send a call again once it may have reached Redis (a failure
        before sending is still retried). ``then``: one more command sent on the same connection
        after the calls (e.g. ``WAIT``); its reply is appended to the list."""
        batch = _Batch(calls, self.scripts)
        policy = retry or self.retry
        delays = policy.delays()
        tail: Any = None
        while True:
            try:
                held = self._checkout()
            except TRANSIENT:  # nothing was sent
                if not self._pause(delays):
                    raise
                continue
            try:
                tail = self._roundtrip(held.conn, batch, then)
            except TRANSIENT:
                self._broken(held)
                if not (resend and resend_safe([batch.calls[i] for i in batch.pending])) or not self._pause(delays):
                    raise
                batch.mark_resent()
                self.resends += 1
                continue
            except BaseException:
                self._broken(held)
                raise
            if batch.pending:  # refused as not run (LOADING, BUSY, READONLY, ...): again later
                if not self._pause(delays):
                    break
                continue
            break
        out = _finish(batch.results, raise_on_error)
        if then is not None:
            out.append(tail)
        return out

    @staticmethod
    def _pause(delays: Iterator[float]) -> bool:
        d = next(delays, None)
        if d is None:
            return False
        time.sleep(d)
        return True

    @staticmethod
    def _roundtrip(conn: Any, batch: _Batch, then: Sequence[Any] | None) -> Any:
        tail: Any = None
        for _ in range(3):  # send; after NOSCRIPT load and send the refused ones again
            cmds = batch.commands()
            if then is not None:
                cmds.append(tuple(then))
            conn.send_packed_command(_pack(conn, cmds), check_health=False)
            replies = []
            for _c in batch.pending:
                try:
                    replies.append(conn.read_response())
                except ResponseError as exc:  # the reply was read: the connection is still in sync
                    replies.append(exc)
            if then is not None:
                try:
                    tail = conn.read_response()
                except ResponseError as exc:
                    tail = exc
            missing, _wait = batch.take(replies)
            if not missing:
                return tail
            for name in missing:
                conn.send_command("SCRIPT", "LOAD", batch.scripts[name].source, check_health=False)
                conn.read_response()
        raise NoScriptError("scripts still missing after loading them twice (is SCRIPT FLUSH running in a loop?)")


class AsyncScriptTransport:
    """The asyncio twin of :class:`ScriptTransport` (a ``redis.asyncio`` client).

    A caller that never has two round trips in flight at once on the same *lane* (e.g. the
    worker's claim loop and its outcome loop) may name it: the lane keeps the pool connection it
    checked out between calls instead of paying the pool's checkout and return (lock, health
    probe, book-keeping) on every round trip. The connection goes back to the pool when a call
    on it fails or :meth:`close` is called."""

    def __init__(self, redis: Any, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.redis = redis
        self.retry = retry
        self.scripts = load_scripts()
        self.resends = 0
        self._lanes: dict[str, Any] = {}

    async def close(self) -> None:
        """Return the lanes' connections to the pool."""
        lanes, self._lanes = self._lanes, {}
        for conn in lanes.values():
            await self.redis.connection_pool.release(conn)

    async def _checkout(self, lane: str | None) -> Any:
        pool = self.redis.connection_pool
        conn = self._lanes.pop(lane, None) if lane is not None else None
        if conn is None:
            return await pool.get_connection()
        try:  # the pool's own checkout probe: reconnects one the server closed (a restart)
            await pool.ensure_connection(conn)
        except BaseException:
            await asyncio.shield(_drop_and_release(pool, conn))
            raise
        return conn

    async def call(self, name: str, keys: Sequence[Any], args: Sequence[Any], *,
                   retry: RetryPolicy | None = None, resend: bool = True) -> Any:
        """Run one script; returns its reply, raises its error reply or the transport error."""
        return (await self.call_many([(name, keys, args)], retry=retry, resend=resend))[0]

    async def call_many(self, calls: Sequence[Call], *, retry: RetryPolicy | None = None, resend: bool = True,
                        raise_on_error: bool = True, then: Sequence[Any] | None = None,
                        lane: str | None = None) -> list[Any]:
        """See :meth:`ScriptTransport.call_many`; ``lane``: see the class docstring."""
        batch = _Batch(calls, self.scripts)
        policy = retry or self.retry
        delays = policy.delays()
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
                tail = await self._roundtrip(conn, batch, then)
            except TRANSIENT:
                await _drop(conn)
                await pool.release(conn)
                if not (resend and resend_safe([batch.calls[i] for i in batch.pending])) \
                        or not await self._pause(delays):
                    raise
                batch.mark_resent()
                self.resends += 1
                continue
            except BaseException:  # cancelled mid-call, or a bug: the reply may be half read
                await asyncio.shield(_drop_and_release(pool, conn))
                raise
            if lane is not None and lane not in self._lanes:
                self._lanes[lane] = conn
            else:
                await pool.release(conn)
            if batch.pending:
                if not await self._pause(delays):
                    break
                continue
            break
        out = _finish(batch.results, raise_on_error)
        if then is not None:
            out.append(tail)
        return out

    @staticmethod
    async def _pause(delays: Iterator[float]) -> bool:
        d = next(delays, None)
        if d is None:
            return False
        await asyncio.sleep(d)
        return True

    @staticmethod
    async def _roundtrip(conn: Any, batch: _Batch, then: Sequence[Any] | None) -> Any:
        tail: Any = None
        for _ in range(3):
            cmds = batch.commands()
            if then is not None:
                cmds.append(tuple(then))
            await conn.send_packed_command(_pack(conn, cmds), check_health=False)
            replies = []
            for _c in batch.pending:
                try:
                    replies.append(await conn.read_response())
                except ResponseError as exc:
                    replies.append(exc)
            if then is not None:
                try:
                    tail = await conn.read_response()
                except ResponseError as exc:
                    tail = exc
            missing, _wait = batch.take(replies)
            if not missing:
                return tail
            for name in missing:
                await conn.send_command("SCRIPT", "LOAD", batch.scripts[name].source, check_health=False)
                await conn.read_response()
        raise NoScriptError("scripts still missing after loading them twice (is SCRIPT FLUSH running in a loop?)")


async def _drop(conn: Any) -> None:
    try:
        await conn.disconnect(nowait=True)
    except Exception:  # closing a broken connection must not hide the error that broke it
        pass


async def _drop_and_release(pool: Any, conn: Any) -> None:
    await _drop(conn)
    await pool.release(conn)
