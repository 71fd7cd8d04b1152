"""redis-server processes on loopback: :class:`RespServer` (one port, probed with PING), the base
of :class:`RedisServer` here and of ``SentinelServer`` (``sentinel.py``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from .ports import ADDRESS_IN_USE, HOST, free_port
from .process import ServerError, ServerProcess
from .resp import redis_command, redis_info

REDIS_SERVER_ENV = "ZSCHED_REDIS_SERVER"  # the redis-server binary to run (default: from PATH)
PORT_RACE_ATTEMPTS = 3


def redis_binary(binary: str | None = None) -> str:
    """``binary``, else $ZSCHED_REDIS_SERVER, else ``redis-server``."""
    return binary or os.environ.get(REDIS_SERVER_ENV, "redis-server")


class RespServer(ServerProcess):
    """A redis-server process (plain or ``--sentinel``) listening on one loopback port.

    Without a ``port`` one is picked with ``free_port()``; another process can grab it before the
    server binds it, so until the first successful start ``start()`` retries on a new port when the
    log says the address was in use (a restart must keep its port).
    """

    def __init__(
        self, port: int | None, dir: str | os.PathLike[str] | None, keep: bool, log: Path | None = None
    ) -> None:
        super().__init__(dir, keep, log)
        self._auto_port = port is None
        self._port = port if port is not None else free_port()
        self._started_once = False  # after the first start the port is fixed, even if auto-picked

    @property
    def port(self) -> int:
        """The TCP port on 127.0.0.1."""
        return self._port

    @property
    def addr(self) -> tuple[str, int]:
        """``(host, port)``."""
        return (HOST, self._port)

    def on_new_port(self) -> None:
        """Called after a lost port race moved the server to a new port, before it starts again."""

    def ready(self) -> bool:
        """True once the server answers PING (not while it is still loading its data)."""
        return self.ping(timeout=0.5)

    def start(self) -> Self:
        """Spawn and wait until ready, retrying on a new auto-picked port after a lost port race."""
        for attempt in range(PORT_RACE_ATTEMPTS):
            try:
                super().start()
                self._started_once = True
                return self
            except ServerError:
                retry = self._auto_port and not self._started_once and attempt < PORT_RACE_ATTEMPTS - 1
                if not (retry and ADDRESS_IN_USE in self.log_tail()):
                    raise
                self._port = free_port()
                self.on_new_port()
        return self

    def ping(self, timeout: float = 1.0) -> bool:
        """True if the server answers PING within ``timeout``."""
        try:
            return bool(redis_command(self._port, "PING", timeout=timeout) == "PONG")
        except (OSError, ServerError):  # refused, or -LOADING while starting
            return False

    def command(self, *args: str | bytes | int, timeout: float = 2.0) -> Any:
        """Run one command (raw RESP, no client library needed)."""
        return redis_command(self._port, *args, timeout=timeout)


class RedisServer(RespServer):
    """A throwaway ``redis-server`` on 127.0.0.1, without persistence unless ``aof=True``.

    ``aof=True`` runs with ``appendonly yes`` and ``appendfsync`` (``everysec`` by default), so a
    kill -9 + ``restart()`` (same port, same dir) reloads the data.  Without AOF a restart starts
    empty, unless a ``SAVE`` left a ``dump.rdb`` in the dir: then it loads that.

    ``conf_lines`` (None: no config file) writes ``<dir>/redis.conf`` before the first start and
    runs with it, so ``CONFIG REWRITE`` works (Sentinel rewrites a server's ``replicaof`` there)
    and a restart keeps what was rewritten; command-line options still win over the file.
    ``extra_args`` come last on the command line, so they win over everything.
    """

    kind = "redis"

    def __init__(
        self,
        port: int | None = None,
        dir: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        keep: bool = False,
        binary: str | None = None,
        *,
        aof: bool = False,
        appendfsync: str = "everysec",
        conf_lines: Sequence[str] | None = None,
        log: Path | None = None,
    ) -> None:
        super().__init__(port, dir, keep, log)
        self.extra_args = list(extra_args)
        self.binary = redis_binary(binary)
        self.aof = aof
        self.appendfsync = appendfsync
        self.conf_lines: list[str] | None = None if conf_lines is None else list(conf_lines)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{HOST}:{self._port}/0"

    @property
    def conf_path(self) -> Path:
        """The config file (used only with ``conf_lines``)."""
        return self.dir / "redis.conf"

    def argv(self) -> list[str]:
        """``redis-server [CONF] --port P --bind 127.0.0.1 ...`` with ``extra_args`` last."""
        return [
            self.binary,
            *([str(self.conf_path)] if self.conf_lines is not None else []),
            "--port", str(self._port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "yes" if self.aof else "no",
            *(["--appendfsync", self.appendfsync] if self.aof else []),
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--hz", "100",
            *self.extra_args,
        ]  # fmt: skip

    def spawn(self) -> None:
        """Write the config file if it is wanted and missing, then start the process."""
        if self.conf_lines is not None and not self.conf_path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            self.conf_path.write_text("".join(f"{line}\n" for line in self.conf_lines))
        super().spawn()

    def info(self, section: str | None = None, timeout: float = 2.0) -> dict[str, str]:
        """``INFO [section]`` as a dict of strings."""
        return redis_info(self._port, section, timeout=timeout)

    def __repr__(self) -> str:
        return f"RedisServer(port={self._port}, pid={self.pid})"
