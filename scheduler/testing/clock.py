"""A fake clock per test stack, and an in-memory Redis (fakeredis with Lua) that reads it.

zsched's scripts read time only with ``redis.call('TIME')``, and Redis expires keys (claim
receipts, rate-limit buckets) by its own clock. :func:`fake_redis` and :func:`fake_async_redis`
build fakeredis clients on one :class:`ClockedServer`, whose sockets answer ``TIME`` from the
server's :class:`FakeClock` and expire keys by it: two stacks in one process have independent
clocks, and nothing of fakeredis is patched process-wide. The production scripts run unchanged;
nothing lets a client pass its own idea of "now" to a script.

What does not follow the fake clock (none of it is used by zsched): hash-field TTLs (``HEXPIRE``)
and stream idle times, which fakeredis reads from the host clock.
"""
from __future__ import annotations

import reprlib
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from ..protocol.codec import finite_number
from ..protocol.timeutil import MAX_MS, to_ms

try:
    import fakeredis
    from fakeredis import FakeAsyncRedisConnection, FakeRedisConnection, FakeServer
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "scheduler.testing needs fakeredis with its Lua extra for the in-memory backend: "
        "pip install -e '.[testing]' in a checkout of zsched (or: pip install 'fakeredis[lua]')") from exc

__all__ = ["ClockedServer", "FakeClock", "fake_async_redis", "fake_redis", "to_epoch_ms"]

# The fakeredis hooks this module builds on (a clock per server needs them: fakeredis reads the
# host clock in module-level code). Checked up front, so an incompatible fakeredis fails with what
# to install, not with an AttributeError in the middle of a test.
_SOCKET_HOOKS = ("_run_command", "_get_server_runtime", "time")


def _incompatible(missing: list[str]) -> ImportError:
    version = getattr(fakeredis, "__version__", "?")
    return ImportError(f"scheduler.testing needs fakeredis 2.41 or a later 2.x (found {version}, which lacks "
                       f"{', '.join(missing)}): pip install 'fakeredis[lua]>=2.41,<3'")


if not all(hasattr(c, "_connect") for c in (FakeRedisConnection, FakeAsyncRedisConnection)):
    raise _incompatible(["FakeRedisConnection._connect"])


def to_epoch_ms(when: datetime | float | int) -> int:
    """An aware datetime or epoch seconds as epoch milliseconds; ValueError for a naive datetime
    or a time outside 1970-01-01 .. 9999-12-31 UTC (as the clients refuse it), TypeError else."""
    if isinstance(when, datetime | int | float) and not isinstance(when, bool):
        return to_ms(when, name="the clock's time")
    hint = " (use advance() to move by one)" if isinstance(when, timedelta) else ""
    raise TypeError(f"expected an aware datetime or epoch seconds, got {type(when).__name__}{hint}")


class FakeClock:
    """A clock that stands still until moved: epoch microseconds, read by the fake Redis's ``TIME``.

    It starts at ``start`` (an aware datetime or epoch seconds; default: the host's time now,
    truncated to the millisecond) and moves only through :meth:`set` and :meth:`advance`, so a
    test sees the same times on every run."""

    def __init__(self, start: datetime | float | None = None) -> None:
        ms = to_epoch_ms(start) if start is not None else int(time.time() * 1000)
        self._us = ms * 1000
        self._lock = threading.Lock()

    @property
    def us(self) -> int:
        """Now, in epoch microseconds."""
        return self._us

    @property
    def ms(self) -> int:
        """Now, in epoch milliseconds."""
        return self._us // 1000

    def as_datetime(self) -> datetime:
        """Now, as an aware UTC datetime."""
        return datetime.fromtimestamp(self._us / 1_000_000, tz=UTC)

    def set(self, when: datetime | float) -> None:
        """Move the clock to ``when`` (an aware datetime or epoch seconds), forwards or back."""
        with self._lock:
            self._us = to_epoch_ms(when) * 1000

    def set_ms(self, ms: int) -> None:
        """Move the clock to ``ms`` epoch milliseconds."""
        with self._lock:
            self._us = int(ms) * 1000

    def advance(self, delta: timedelta | float) -> None:
        """Move the clock forwards by ``delta`` (a timedelta or seconds, >= 0), no further than
        9999-12-31 (ValueError)."""
        seconds = delta.total_seconds() if isinstance(delta, timedelta) else finite_number("delta", delta)
        if seconds < 0:
            raise ValueError(f"cannot advance the clock by a negative amount ({delta!r}); set it instead")
        with self._lock:
            us = self._us + int(round(min(seconds, MAX_MS / 1000) * 1_000_000))
            if us > MAX_MS * 1000:
                raise ValueError(f"cannot advance the clock by {reprlib.repr(seconds)} s: it would pass 9999-12-31 UTC")
            self._us = us


# After every EVAL fakeredis runs a full Lua garbage collection (to free that call's KEYS and ARGV
# tables), ~55 us with zsched's compiled scripts in the heap: a step of the incremental collector
# frees them as surely, the next steps or the collector's own pace do the rest.
_FULL_GC = ("collectgarbage()", b"collectgarbage()")
_GC_STEP = "collectgarbage('step')"


class _CompiledScripts:
    """fakeredis's Lua runtime, compiling each script once: fakeredis compiles the source on every
    EVAL, which costs more than running zsched's scripts (~0.4 ms for the 10 KB ``schedule``).
    Running a compiled chunk is what ``execute`` does after compiling it; the rest is delegated.
    The full collection after each EVAL is made an incremental step (:data:`_FULL_GC`)."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.chunks: dict[bytes | str, Any] = {}

    def execute(self, source: bytes | str) -> Any:
        if source in _FULL_GC:
            source = _GC_STEP
        chunk = self.chunks.get(source)
        if chunk is None:
            chunk = self.chunks[source] = self.runtime.compile(source)
        return chunk()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runtime, name)


class ClockedServer(FakeServer):
    """A fakeredis server (its data, scripts, pub/sub) whose clock is ``clock``."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(version=(7,))
        self.clock = clock

    def compiling(self, runtime: Any) -> Any:
        """This server's Lua runtime, made to compile each script once (:class:`_CompiledScripts`)."""
        if not isinstance(runtime, _CompiledScripts):
            runtime = self._lua_runtime = _CompiledScripts(runtime)
        return runtime


class _ClockedSocketMixin:
    """What makes a fakeredis socket read its server's fake clock: the ``TIME`` command, and the
    time every database expires keys by (fakeredis sets it from the host clock before each
    command; it is set again here, inside every command, scripts' ``redis.call`` included)."""

    _server: ClockedServer

    def time(self) -> list[bytes]:
        us = self._server.clock.us
        return [str(us // 1_000_000).encode(), str(us % 1_000_000).encode()]

    def _get_server_runtime(self, server: ClockedServer) -> Any:
        return server.compiling(super()._get_server_runtime(server))  # type: ignore[misc]

    def _run_command(self, func: Any, sig: Any, args: list[Any], from_script: bool) -> Any:
        now = self._server.clock.us / 1_000_000
        for db in self._server.dbs.values():
            db.time = now
        return super()._run_command(func, sig, args, from_script)  # type: ignore[misc]


_CLOCKED: dict[type, type] = {}


def _clocked(sock: Any) -> Any:
    """``sock`` (a socket a fakeredis connection just made, sync or async) turned into the same
    socket reading the server's fake clock: its class becomes a subclass with
    :class:`_ClockedSocketMixin` in front (made once per socket class, whatever fakeredis names it)."""
    cls = type(sock)
    sub = _CLOCKED.get(cls)
    if sub is None:
        missing = [f"{cls.__name__}.{name}" for name in _SOCKET_HOOKS if not hasattr(cls, name)]
        if missing:
            raise _incompatible(missing)
        sub = _CLOCKED[cls] = type(f"Clocked{cls.__name__}", (_ClockedSocketMixin, cls), {})
    sock.__class__ = sub
    return sock


class _ClockedConnection(FakeRedisConnection):
    def _connect(self) -> Any:
        return _clocked(super()._connect())


class _ClockedAsyncConnection(FakeAsyncRedisConnection):
    async def _connect(self) -> None:
        await super()._connect()
        _clocked(self._sock)


def fake_redis(server: ClockedServer) -> Any:
    """A blocking fakeredis client (``redis.Redis`` API) of ``server``."""
    return fakeredis.FakeRedis(server=server, connection_class=_ClockedConnection)


def fake_async_redis(server: ClockedServer) -> Any:
    """An asyncio fakeredis client (``redis.asyncio.Redis`` API) of ``server``."""
    return fakeredis.FakeAsyncRedis(server=server, connection_class=_ClockedAsyncConnection)
