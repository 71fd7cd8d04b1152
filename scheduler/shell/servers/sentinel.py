"""Redis under Sentinel on loopback: :class:`SentinelServer` (one ``redis-server --sentinel``) and
:class:`SentinelSet` (a master, a replica and three sentinels that know each other)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from .ports import HOST
from .process import ServerError, wait_for
from .redis import RedisServer, RespServer, redis_binary
from .resp import redis_info, reply_pairs


class SentinelServer(RespServer):
    """One ``redis-server CONF --sentinel`` on loopback, monitoring one master.

    A sentinel rewrites its config file, so each has its own dir with ``sentinel.conf``, written
    before the first start (from ``master_port`` etc. as they are then) and left as the sentinel
    rewrote it for restarts.
    """

    kind = "sentinel"

    def __init__(
        self,
        master_name: str = "mymaster",
        master_port: int = 0,
        port: int | None = None,
        dir: str | os.PathLike[str] | None = None,
        *,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        keep: bool = False,
        binary: str | None = None,
    ) -> None:
        super().__init__(port, dir, keep)
        self.master_name = master_name
        self.master_port = master_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.binary = redis_binary(binary)

    @property
    def conf_path(self) -> Path:
        """``sentinel.conf`` in the sentinel's dir."""
        return self.dir / "sentinel.conf"

    def _conf_text(self) -> str:
        n = self.master_name
        return "".join(
            f"{line}\n"
            for line in (
                f"port {self._port}",
                f"bind {HOST}",
                f"dir {self.dir}",
                "daemonize no",
                'logfile ""',
                f"sentinel monitor {n} {HOST} {self.master_port} {self.quorum}",
                f"sentinel down-after-milliseconds {n} {self.down_after_ms}",
                f"sentinel failover-timeout {n} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {n} 1",
            )
        )

    def argv(self) -> list[str]:
        """``redis-server sentinel.conf --sentinel``."""
        return [self.binary, str(self.conf_path), "--sentinel"]

    def spawn(self) -> None:
        """Write ``sentinel.conf`` if missing, then start the process."""
        if not self.master_port:
            raise ServerError(f"{self!r}: set master_port before starting")
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.conf_path.exists():
            self.conf_path.write_text(self._conf_text())
        super().spawn()

    def on_new_port(self) -> None:
        """A new port needs a new config file (it names the port)."""
        self.conf_path.unlink(missing_ok=True)

    def master_info(self, timeout: float = 1.0) -> dict[str, str]:
        """``SENTINEL master NAME`` as a dict (``num-slaves``, ``num-other-sentinels``, ``flags``...)."""
        return reply_pairs(self.command("SENTINEL", "master", self.master_name, timeout=timeout))

    def replicas_info(self, timeout: float = 1.0) -> list[dict[str, str]]:
        """``SENTINEL replicas NAME``, one dict per replica."""
        return [reply_pairs(r) for r in self.command("SENTINEL", "replicas", self.master_name, timeout=timeout) or []]

    def master_addr(self, timeout: float = 1.0) -> tuple[str, int] | None:
        """``SENTINEL get-master-addr-by-name NAME``: the master this sentinel names now."""
        reply = self.command("SENTINEL", "get-master-addr-by-name", self.master_name, timeout=timeout)
        if not reply:
            return None
        return reply[0].decode(), int(reply[1])

    def __repr__(self) -> str:
        return f"SentinelServer(port={self._port}, master={self.master_name}, pid={self.pid})"


class SentinelSet:
    """Redis under Sentinel on loopback: 1 master, 1 replica (``replicaof``) and 3 sentinels.

    Sentinels use quorum 2, ``down-after-milliseconds`` 1000 and ``failover-timeout`` 5000, so
    after the master dies the replica is promoted in about 2.5 s.  The two Redis servers run with
    a config file each, so Sentinel's ``CONFIG REWRITE`` keeps their roles across a restart, as in
    production.  ``master``/``replica`` are the servers in those roles as this object last saw
    them (``start()``, ``wait_settled()``, ``wait_failover()``).  ``redis_class`` and
    ``sentinel_class`` are the classes it starts (a subclass may add methods to them).

        with SentinelSet() as s:
            print(s.url)
    """

    start_timeout = 20.0
    redis_class: type[RedisServer] = RedisServer
    sentinel_class: type[SentinelServer] = SentinelServer

    def __init__(
        self,
        master_name: str = "mymaster",
        aof: bool = False,
        *,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        redis_args: Sequence[str] = (),
        keep: bool = False,
    ) -> None:
        self.master_name = master_name
        self.keep = keep
        # A master waits repl-diskless-sync-delay (5 s) for more replicas before a full sync.
        args = ["--repl-diskless-sync-delay", "0", *redis_args]
        self.servers: list[RedisServer] = [
            self.redis_class(extra_args=args, keep=keep, aof=aof, conf_lines=[]) for _ in range(2)
        ]
        self.sentinels: list[SentinelServer] = [
            self.sentinel_class(
                master_name,
                quorum=quorum,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
                keep=keep,
            )
            for _ in range(sentinels)
        ]
        self._master_i = 0

    # -- addresses and roles

    @property
    def master(self) -> RedisServer:
        """The server in the master role (as of ``start()`` or the last ``wait_failover()``)."""
        return self.servers[self._master_i]

    @property
    def replica(self) -> RedisServer:
        """The server in the replica role (after a failover: the old master, maybe not running)."""
        return self.servers[1 - self._master_i]

    @property
    def sentinel_addrs(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every sentinel."""
        return [s.addr for s in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/NAME/0``."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel_addrs)
        return f"redis+sentinel://{hosts}/{self.master_name}/0"

    def _answering(self) -> list[SentinelServer]:
        return [s for s in self.sentinels if s.running and not s.paused]

    def sentinel_command(self, *args: str | bytes | int, timeout: float = 1.0) -> Any:
        """Run a command on the first running sentinel that answers."""
        errors = []
        for s in self._answering():
            try:
                return s.command(*args, timeout=timeout)
            except (OSError, ServerError) as e:
                errors.append(f"{s!r}: {e}")
        raise ServerError(f"no sentinel answered {args!r}: {errors or 'none running'}")

    def master_ports(self, timeout: float = 0.5) -> dict[int, int | None]:
        """Each running sentinel's view: sentinel port -> the master port it names (None: no answer)."""
        views: dict[int, int | None] = {}
        for s in self._answering():
            try:
                addr = s.master_addr(timeout)
                views[s.port] = addr[1] if addr else None
            except (OSError, ServerError):
                views[s.port] = None
        return views

    def master_port(self, timeout: float = 5.0) -> int:
        """The master port the first sentinel that answers names (``SENTINEL get-master-addr-by-name``),
        skipping a sentinel that names a master it sees down (``s_down``/``o_down``), as redis-py's
        ``Sentinel`` does: after a failover a lagging sentinel names the old, dead master for up to ~2 s."""
        found: list[int] = []

        def ask() -> bool:
            for s in self._answering():
                try:
                    addr = s.master_addr(0.5)
                    mi = s.master_info(0.5)
                except (OSError, ServerError):
                    continue
                flags = mi.get("flags", "").split(",")
                if addr is None or (mi.get("port") == str(addr[1]) and ("s_down" in flags or "o_down" in flags)):
                    continue
                found[:] = [addr[1]]
                return True
            return False

        wait_for(ask, timeout, lambda: f"a sentinel to name a master that is up: {self.sentinel_views()}")
        return found[0]

    # -- waiting for a state

    def _replica_online(self, m: RedisServer, r: RedisServer) -> bool:
        try:
            mi, ri = m.info("replication", timeout=0.5), r.info("replication", timeout=0.5)
        except (OSError, ServerError):
            return False
        return (
            mi.get("connected_slaves") == "1"
            and "state=online" in mi.get("slave0", "")
            and ri.get("master_link_status") == "up"
            and ri.get("master_port") == str(m.port)
        )

    def sentinel_views(self) -> dict[int, str]:
        """What each sentinel says about the master and its replicas (for error messages)."""
        out: dict[int, str] = {}
        for s in self.sentinels:
            try:
                mi = s.master_info(0.5)
                reps = s.replicas_info(0.5)
                out[s.port] = (
                    f"flags={mi.get('flags')} port={mi.get('port')} num-slaves={mi.get('num-slaves')} "
                    f"num-other-sentinels={mi.get('num-other-sentinels')} "
                    f"replicas={[(r.get('port'), r.get('flags')) for r in reps]}"
                )
            except (OSError, ServerError) as e:
                out[s.port] = repr(e)
        return out

    def _settled(self, master: RedisServer) -> bool:
        """Every sentinel sees ``master`` up, one healthy replica and all the other sentinels."""
        want_others = str(len(self.sentinels) - 1)
        for s in self.sentinels:
            try:
                mi = s.master_info(0.5)
                reps = s.replicas_info(0.5)
            except (OSError, ServerError):
                return False
            if not (
                mi.get("flags") == "master"
                and mi.get("port") == str(master.port)
                and mi.get("num-slaves") == "1"
                and mi.get("num-other-sentinels") == want_others
                and len(reps) == 1
                and reps[0].get("flags") == "slave"
                and reps[0].get("master-link-status") == "ok"
            ):
                return False
        return True

    def wait_settled(self, timeout: float = 20.0) -> None:
        """Wait until the master has its replica online and every sentinel knows the master, the
        replica and every other sentinel (``SENTINEL master NAME``: num-slaves, num-other-sentinels).

        On a loaded machine Sentinel may fail over once more meanwhile (a just-promoted master that
        is busy with a full sync can miss its down-after window): when every sentinel agrees on the
        other server as master, the roles are swapped and the wait goes on in that direction."""

        def synced() -> bool:
            m, r = self.master, self.replica
            if self._replica_online(m, r):
                return True
            views = set(self.master_ports().values())
            if views == {r.port}:
                try:
                    if redis_info(r.port, "replication", timeout=0.5).get("role") == "master":
                        self._master_i = self.servers.index(r)
                except (OSError, ServerError):
                    pass
            return False

        wait_for(synced, timeout, lambda: f"{self.replica!r} to sync from {self.master!r}: {self.sentinel_views()}")
        wait_for(
            lambda: self._settled(self.master), timeout, lambda: f"sentinels to settle: {self.sentinel_views()}", 0.05
        )

    def wait_sentinels_steady(self, steady: float = 1.5, timeout: float = 30.0) -> None:
        """Wait until every sentinel has named the current master, without a down flag, for
        ``steady`` seconds (restarting the old master earlier can trigger a second failover)."""
        since: list[float] = []

        def steady_now() -> bool:
            ok = False
            try:
                ok = all(
                    s.master_info(0.5).get("flags") == "master"
                    and s.master_info(0.5).get("port") == str(self.master.port)
                    for s in self.sentinels
                    if s.running
                )
            except (OSError, ServerError):
                ok = False
            if not ok:
                since.clear()
                return False
            if not since:
                since.append(time.monotonic())
            return time.monotonic() - since[0] >= steady

        wait_for(steady_now, timeout, lambda: f"sentinels to agree on {self.master!r}: {self.sentinel_views()}", 0.1)

    def wait_failover(self, old_port: int, timeout: float = 30.0, all_sentinels: bool = False) -> int:
        """Wait until a sentinel (every running one with ``all_sentinels``) names a master other than
        ``old_port`` and that server reports ``role:master``; return its port and update roles."""
        found: list[int] = []

        def done() -> bool:
            views = self.master_ports()
            named = {p for p in views.values() if p is not None and p != old_port}
            if all_sentinels and (len(named) != 1 or None in views.values() or old_port in views.values()):
                return False
            for p in named:
                try:
                    if redis_info(p, "replication", timeout=0.5).get("role") == "master":
                        found[:] = [p]
                        return True
                except (OSError, ServerError):
                    pass
            return False

        wait_for(
            done,
            timeout,
            lambda: f"a failover away from port {old_port}: sentinel views {self.master_ports()}; "
            f"{self.sentinel_views()}",
            0.05,
        )
        new_port = found[0]
        for i, srv in enumerate(self.servers):
            if srv.port == new_port:
                self._master_i = i
                return new_port
        raise ServerError(f"sentinels promoted port {new_port}, which is none of {self.servers!r}")

    # -- lifecycle

    def start(self) -> Self:
        """:meth:`launch`, then wait until everyone knows everyone (within ``start_timeout`` in all)."""
        deadline = time.monotonic() + self.start_timeout
        self.launch()
        m = self.master
        try:
            wait_for(
                lambda: self._settled(m),
                max(0.1, deadline - time.monotonic()),
                lambda: f"sentinels to settle: {self.sentinel_views()}",
                0.05,
            )
        except BaseException:
            self.kill()
            raise
        return self

    def launch(self) -> Self:
        """Start master, then the replica (waits until it is in sync: sentinels learn replicas from
        the master's INFO), then the sentinels, and return before the sentinels have found each
        other and the replica (about 2 s, their hello period; :meth:`wait_settled` waits for it).
        Each sentinel names the master of its config at once, so clients can start meanwhile; a
        failover needs the settled state."""
        self._master_i = 0
        m, r = self.servers
        try:
            deadline = time.monotonic() + self.start_timeout
            m.start()
            r.conf_lines = [f"replicaof {HOST} {m.port}"]
            r.start()
            wait_for(
                lambda: self._replica_online(m, r),
                max(0.1, deadline - time.monotonic()),
                lambda: f"{r!r} to sync from {m!r}; replica log:\n{r.log_tail(10)}",
            )
            for s in self.sentinels:
                s.master_port = m.port
                s.start()
        except BaseException:
            self.kill()
            raise
        return self

    def kill(self) -> None:
        """SIGKILL everything (dirs kept; the atexit hook or ``stop()`` removes them)."""
        for srv in [*self.sentinels, *self.servers]:
            srv.kill()

    def stop(self, keep: bool | None = None, grace: float = 2.0) -> None:
        """Stop the sentinels first (no failover while stopping), then the replica, then the master
        (a master asked to stop with replicas attached waits for them to catch up)."""
        for srv in [*self.sentinels, self.replica, self.master]:
            srv.stop(keep, grace=grace)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SentinelSet({self.master_name}, master={self.master!r}, sentinels={[s.port for s in self.sentinels]})"
