"""The real servers the tests use: ``scheduler.shell.servers`` with fault injection added.

Starting, stopping, ports, temp dirs and cleanup are the shared module's; what is here only breaks
things, on purpose:

- every server: ``pause()``/``resume()`` (SIGSTOP, :class:`tests.support.faults.Pausable`); ``kill()`` and
  ``restart()`` (with ``aof=True`` Redis data survives a kill -9) are the shared ones;
- ``RedisServer.stall(ms)`` (a busy Lua script: every other client waits), ``save_point()`` +
  ``crash_to_save_point()`` (a real rollback of acknowledged writes);
- ``SentinelSet.kill_master()`` and ``restart_old_master_as_replica()`` (role swaps);
- ``ClusterSet.kill_master()`` (kill -9 of a Redis Cluster master, until its replica took over;
  ``restart_node()``, shared, brings the old master back as a replica);
- ``EtcdCluster``, ``SentinelSet`` and ``ClusterSet`` start these fault-capable servers.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Self

from scheduler.shell import servers
from scheduler.shell.servers import HOST, ServerError
from tests.support.faults import Pausable, RedisStall
from tests.support.waits import wait_until

__all__ = [
    "ClusterServer",
    "ClusterSet",
    "EtcdCluster",
    "EtcdServer",
    "RedisServer",
    "RedisStall",
    "SentinelServer",
    "SentinelSet",
]


class RedisServer(Pausable, servers.RedisServer):
    """A throwaway redis-server (``scheduler.shell.servers.RedisServer``) that tests may break."""

    def stall(self, ms: float, busy_after_ms: int | None = None) -> RedisStall:
        """Make the server busy for ``ms`` ms: every other client waits (nothing is lost).

        Runs a Lua script that spins on ``redis.call('TIME')`` from its own connection and returns
        once the server has read it (it runs the script in the same step), so a command sent after
        this returns is answered only after the stall.  Returns a ``RedisStall``: ``.join()`` it,
        or use it as a context manager.

        Redis answers ``-BUSY`` to other clients once a script has run for
        ``busy-reply-threshold`` ms (alias ``lua-time-limit``, 5000 by default); for longer stalls
        it is raised for the stall's duration so clients keep waiting.  ``busy_after_ms`` sets it
        instead (e.g. 100: clients get ``BUSY`` errors after 100 ms), restored when the stall ends.
        """
        return RedisStall(self, ms, busy_after_ms).begin()

    def save_point(self, timeout: float = 30.0) -> None:
        """``SAVE``: write ``dump.rdb`` now; ``crash_to_save_point()`` comes back to this state."""
        reply = self.command("SAVE", timeout=timeout)
        if reply != "OK":
            raise ServerError(f"SAVE on {self!r} answered {reply!r}")

    def crash_to_save_point(self, timeout: float = 10.0) -> Self:
        """Lose every write since the last ``save_point()``: a real rollback of acknowledged writes.

        ``SHUTDOWN NOSAVE NOW``, then start again on the same port and dir, loading the older
        ``dump.rdb`` (an empty dataset if there was no save point).  With ``aof=True`` the AOF is
        deleted, the server starts once from the RDB with ``appendonly no`` and AOF is switched
        back on (``CONFIG SET appendonly yes`` rewrites it from the rolled-back data); a later
        ``restart()`` runs with the usual options again.
        """
        if not self.running or self.proc is None:
            raise ServerError(f"{self!r} is not running")
        if self.paused:
            self.resume()
        aof_dir = self.dir / "appendonlydir"
        if self.aof:
            name = self.command("CONFIG", "GET", "appenddirname")
            if isinstance(name, list) and len(name) == 2:
                aof_dir = self.dir / name[1].decode()
        try:
            self.command("SHUTDOWN", "NOSAVE", "NOW", timeout=timeout)
        except (OSError, ServerError):  # the server closes the connection without a reply
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise ServerError(f"{self!r} did not exit after SHUTDOWN NOSAVE; log tail:\n{self.log_tail()}") from None
        if not self.aof:
            return self.start()
        shutil.rmtree(aof_dir, ignore_errors=True)
        usual = self.extra_args
        self.extra_args = [*usual, "--appendonly", "no"]  # last on the command line: wins, this start only
        try:
            self.start()
        finally:
            self.extra_args = usual
        self.command("CONFIG", "SET", "appendonly", "yes")

        def aof_on() -> bool:
            p = self.info("persistence")
            if p.get("aof_last_bgrewrite_status") == "err":
                return True  # reported just below
            return (
                p.get("aof_enabled") == "1"
                and p.get("aof_rewrite_in_progress") == "0"
                and p.get("aof_rewrite_scheduled") == "0"
                and any(aof_dir.glob("*.manifest"))
            )

        wait_until(aof_on, timeout, what=f"AOF rewrite after the rollback of {self!r}")
        if self.info("persistence").get("aof_last_bgrewrite_status") != "ok":
            raise ServerError(f"AOF rewrite failed on {self!r}; log tail:\n{self.log_tail()}")
        return self


class SentinelServer(Pausable, servers.SentinelServer):
    """A sentinel that tests may pause."""


class EtcdServer(Pausable, servers.EtcdServer):
    """An etcd member that tests may pause."""


class EtcdCluster(servers.EtcdCluster):
    """An etcd cluster of members that tests may pause."""

    member_class = EtcdServer


class SentinelSet(servers.SentinelSet):
    """Redis under Sentinel with fault-capable servers, and role swaps.

        with SentinelSet() as s:
            old = s.kill_master().port
            new = s.wait_failover(old)
    """

    redis_class = RedisServer
    sentinel_class = SentinelServer

    def kill_master(self) -> servers.RedisServer:
        """kill -9 the current master; returns it (its port is what ``wait_failover`` needs)."""
        m = self.master
        m.kill()
        return m

    def restart_old_master_as_replica(
        self, timeout: float = 60.0, replicaof_in_config: bool = False
    ) -> servers.RedisServer:
        """Start the old master (killed, now ``replica``) again and wait until it is a synced replica
        of the new master and every sentinel sees it as a healthy replica; returns it.

        By default it comes back as it was killed: a master with its old data (empty without AOF),
        until a sentinel reconfigures it, which Sentinel does only after the instance has reported
        the wrong role for 8 s, so this takes about 20 s.  ``replicaof_in_config=True`` first adds
        ``replicaof NEW_MASTER`` to its config file (as an operator would), so it starts as a
        replica at once (about 1 s).
        """
        old = self.replica
        if not old.running:
            self.wait_sentinels_steady(timeout=timeout)
            if replicaof_in_config:
                with open(old.conf_path, "a") as f:  # the last replicaof line wins
                    f.write(f"replicaof {HOST} {self.master.port}\n")
            old.start()
        self.wait_settled(timeout)
        return old


class ClusterServer(RedisServer, servers.ClusterServer):
    """A Redis Cluster node that tests may pause, stall or kill (a pause or a stall longer than the
    cluster's node timeout makes the cluster fail it over)."""


class ClusterSet(servers.ClusterSet):
    """A Redis Cluster of fault-capable nodes, and master failovers.

        with ClusterSet(replicas=1) as c:
            old = c.node_for_key("{ns:0}:t")
            new = c.kill_master(old)      # its replica, promoted; the cluster is ok again
            c.restart_node(old)           # back as new's replica, in sync
    """

    node_class = ClusterServer

    def kill_master(self, master: servers.ClusterServer | None = None, timeout: float = 30.0) -> servers.ClusterServer:
        """kill -9 ``master`` (default: the first master that has a replica), then wait until one of
        its replicas says it is a master and :meth:`wait_ok` holds again (every slot served, every
        running node agreeing); returns the promoted replica.

        Writes the replica had not received yet are lost, as in production: call
        ``wait_replicated()`` first to lose nothing acknowledged."""
        masters = self.masters()
        if master is None:
            master = next((m for m in masters if self.replicas_of(m)), None)
            if master is None:
                raise ServerError(f"no master of {self!r} has a replica: start it with replicas=1")
        elif master not in masters:
            raise ServerError(f"{master!r} is not a running master of {self!r} (masters: {masters!r})")
        candidates = self.replicas_of(master)
        if not candidates:
            raise ServerError(f"{master!r} has no replica: nothing would take over; start with replicas=1")
        master.kill()
        promoted: list[servers.ClusterServer] = []
        last: list[str] = []

        def taken_over() -> bool:
            if not promoted:
                for r in candidates:
                    try:
                        if r.myself(0.5).is_master:
                            promoted.append(r)
                            break
                    except (OSError, ServerError):
                        continue
            last[:] = self.problems() if promoted else ["no replica promoted yet"]
            return not last

        wait_until(taken_over, timeout, 0.05, lambda: f"a replica of {master!r} to take over: {last}")
        return promoted[0]
