"""Lua script loader: reads ``lua/*.lua`` from the installed package, prepends ``_lib.lua`` and
calls scripts by SHA (EVALSHA), loading them again transparently on NOSCRIPT (e.g. after a Redis
restart or failover), also inside pipelines."""
from __future__ import annotations

import hashlib
import os
import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

SCRIPT_NAMES = (
    "schedule", "tick", "claim", "ack", "fail", "extend", "release", "reap",
    "cancel", "reschedule", "requeue", "purge", "inspect", "stats", "dead_list", "ratelimit",
    "cron_set", "cron_remove", "cron_fill",
)


@dataclass(frozen=True)
class Script:
    name: str
    source: str
    sha: str


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFINES = re.compile(r"^local\s+(?:function\s+([A-Za-z_][A-Za-z0-9_]*)|([A-Za-z_][A-Za-z0-9_, ]*?)\s*=)")


def _lib_chunks(lib: str) -> list[tuple[set[str], str]]:
    """Split ``_lib.lua`` into top-level definitions (with the comments above them), each with the
    names it defines."""
    chunks: list[tuple[set[str], list[str]]] = []
    pending: list[str] = []
    for line in lib.splitlines():
        m = _DEFINES.match(line)
        if m:
            names = {m.group(1)} if m.group(1) else {n.strip() for n in m.group(2).split(",")}
            chunks.append((names, pending + [line]))
            pending = []
        elif chunks and (line.startswith((" ", "\t", "end")) or (line.strip() and not line.startswith("--"))):
            chunks[-1][1].append(line)
        else:
            pending.append(line)
    return [(names, "\n".join(lines)) for names, lines in chunks]


def assemble(lib: str, body: str) -> str:
    """The script as sent to Redis: only the ``_lib`` definitions the body needs (transitively), in
    library order, then the body. Redis runs the whole chunk on every call, so unused helpers would
    cost every EVALSHA a few microseconds."""
    chunks = _lib_chunks(lib)
    needed = set(_IDENT.findall(body))
    keep: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, (names, text) in enumerate(chunks):
            if i not in keep and names & needed:
                keep.add(i)
                needed |= set(_IDENT.findall(text))
                changed = True
    parts = [text for i, (_, text) in enumerate(chunks) if i in keep]
    return "\n".join(parts) + "\n" + body


@lru_cache(maxsize=1)
def load_scripts() -> dict[str, Script]:
    """All scripts, read once from the package data (``scheduler.lua``)."""
    pkg = resources.files("scheduler.lua")
    lib = pkg.joinpath("_lib.lua").read_text("utf-8")
    out: dict[str, Script] = {}
    for name in SCRIPT_NAMES:
        src = assemble(lib, pkg.joinpath(f"{name}.lua").read_text("utf-8"))
        out[name] = Script(name, src, hashlib.sha1(src.encode("utf-8")).hexdigest())
    return out


def _is_noscript(exc: BaseException) -> bool:
    return isinstance(exc, NoScriptError) or (isinstance(exc, ResponseError) and str(exc).startswith("NOSCRIPT"))


class Scripts:
    """Runs scripts on a redis-py client (sync) with EVALSHA and NOSCRIPT recovery.

    Single calls go over a connection owned by the calling thread, straight through the
    connection's send/read: redis-py's pooled ``execute_command`` path costs about a quarter of a
    one-job ``schedule`` round trip, and producers call ``schedule`` one by one in hot loops."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.by_name = load_scripts()
        self._local = threading.local()
        self._conns: list[Any] = []
        self._lock = threading.Lock()

    def _conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None or self._local.pid != os.getpid():  # a forked child must not share the socket
            conn = self.redis.connection_pool.make_connection()
            with self._lock:
                self._conns.append(conn)
            self._local.conn, self._local.pid = conn, os.getpid()
        return conn

    def _drop(self, conn: Any) -> None:
        conn.disconnect()
        self._local.conn = None
        with self._lock:
            if conn in self._conns:
                self._conns.remove(conn)

    def close(self) -> None:
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            c.disconnect()

    def call(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        s = self.by_name[name]
        for attempt in range(2):
            conn = self._conn()
            try:
                # like redis-py's pool: a connection that has something to read before we asked
                # anything was closed by the server (e.g. a restart); reconnect before sending
                if conn._sock is not None and conn.can_read(timeout=0):
                    conn.disconnect()
                conn.send_command("EVALSHA", s.sha, len(keys), *keys, *args)
            except (ConnectionError, TimeoutError, OSError):
                # nothing reached Redis on a dead connection (e.g. after a restart): reconnect once
                self._drop(conn)
                if attempt:
                    raise
                continue
            try:
                return conn.read_response()
            except NoScriptError:
                self.redis.script_load(s.source)
                return self.redis.evalsha(s.sha, len(keys), *keys, *args)
            except ResponseError:
                raise  # the connection is still in sync: a reply was read
            except BaseException:
                # the command may have run: never re-send it blindly (schedule is not idempotent
                # without a key); the caller sees the error
                self._drop(conn)
                raise
        raise AssertionError("unreachable")

    def call_many(self, calls: Sequence[tuple[str, Sequence[Any], Sequence[Any]]]) -> list[Any]:
        """Pipeline several script calls in one round trip; NOSCRIPT ones are loaded and re-sent
        (a command refused with NOSCRIPT did not run, so re-sending it cannot apply it twice)."""
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for _ in range(2):
            pipe = self.redis.pipeline(transaction=False)
            for i in pending:
                name, keys, args = calls[i]
                pipe.evalsha(self.by_name[name].sha, len(keys), *keys, *args)
            pending = _collect(calls, pending, pipe.execute(raise_on_error=False), results)
            if not pending:
                break
            for name in {calls[i][0] for i in pending}:
                self.redis.script_load(self.by_name[name].source)
        return _raise_first(results)


class AsyncScripts:
    """The asyncio twin of :class:`Scripts` (redis.asyncio client)."""

    def __init__(self, redis: Any) -> None:
        self.redis = redis
        self.by_name = load_scripts()

    async def call(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        s = self.by_name[name]
        try:
            return await self.redis.evalsha(s.sha, len(keys), *keys, *args)
        except NoScriptError:
            await self.redis.script_load(s.source)
            return await self.redis.evalsha(s.sha, len(keys), *keys, *args)

    async def call_many(self, calls: Sequence[tuple[str, Sequence[Any], Sequence[Any]]]) -> list[Any]:
        results: list[Any] = [None] * len(calls)
        pending = list(range(len(calls)))
        for _ in range(2):
            pipe = self.redis.pipeline(transaction=False)
            for i in pending:
                name, keys, args = calls[i]
                pipe.evalsha(self.by_name[name].sha, len(keys), *keys, *args)
            pending = _collect(calls, pending, await pipe.execute(raise_on_error=False), results)
            if not pending:
                break
            for name in {calls[i][0] for i in pending}:
                await self.redis.script_load(self.by_name[name].source)
        return _raise_first(results)


def _collect(calls: Sequence[Any], pending: list[int], replies: list[Any], results: list[Any]) -> list[int]:
    """Store the pipeline's replies; return the indexes refused with NOSCRIPT (to load and re-send)."""
    missing = []
    for i, r in zip(pending, replies):
        if isinstance(r, Exception) and _is_noscript(r):
            missing.append(i)
        else:
            results[i] = r
    return missing


def _raise_first(results: list[Any]) -> list[Any]:
    for r in results:
        if isinstance(r, Exception):
            raise r
    return results
