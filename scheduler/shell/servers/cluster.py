"""Redis Cluster on loopback: :class:`ClusterServer` (one ``redis-server --cluster-enabled yes``) and
:class:`ClusterSet` (N masters with R replicas each, formed with ``redis-cli --cluster create``),
with online resharding (:meth:`ClusterSet.move_slots`).

Tuning, so that a failover is over in a few seconds (measured here: 2-3 s from kill -9 to ok):

- ``cluster-node-timeout`` 1000 ms (:data:`NODE_TIMEOUT_MS`): a silent node is suspected after 1 s,
  failed once a majority of masters agree (gossip, a few hundred ms); its replica then waits
  500-1000 ms (+1 s per rank) before asking for votes.  Anything that holds a node's event loop
  longer (a SIGSTOP, a busy Lua script) makes the cluster fail that node over too.
- ``cluster-replica-validity-factor 0``: a replica may be promoted however long its link was down.
- ``repl-diskless-sync-delay 0``: a full sync starts at once (not after 5 s waiting for more replicas).
- ``save ""``, ``appendonly no`` (unless ``aof=True``): only ``nodes.conf`` is written, which a
  restarted node reads to rejoin with its id and epochs.
- ``cluster-port``: the bus gets its own free port (port + 10000 may be taken or ephemeral).

Every node binds 127.0.0.1 only, in its own temp dir removed by ``stop()``.  Killing nodes, pauses
and stalls are fault injection and live in ``tests/support/servers.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from redis.crc import key_slot

from .ports import HOST, free_port
from .process import ServerError, wait_for
from .redis import RedisServer

CLUSTER_SLOTS = 16384
NODE_TIMEOUT_MS = 1000
REDIS_CLI_ENV = "ZSCHED_REDIS_CLI"  # the redis-cli binary to run (default: from PATH)
MIGRATE_BATCH = 100  # keys per MIGRATE call while resharding


def redis_cli_binary(binary: str | None = None) -> str:
    """``binary``, else $ZSCHED_REDIS_CLI, else ``redis-cli`` from PATH."""
    return binary or os.environ.get(REDIS_CLI_ENV) or "redis-cli"


def slot_of(key: str | bytes) -> int:
    """The cluster slot of ``key``, as Redis computes it (CRC16 of the ``{hash tag}`` if there is one)."""
    return key_slot(key.encode() if isinstance(key, str) else key)


@dataclass(frozen=True)
class NodeLine:
    """One line of ``CLUSTER NODES``: what one node believes about one node (maybe itself)."""

    node_id: str
    port: int  # 0 while the address is unknown
    flags: frozenset[str]  # myself, master, slave, fail?, fail, handshake, noaddr, nofailover
    master_id: str | None  # the master of a replica
    slots: tuple[tuple[int, int], ...]  # owned slot ranges, inclusive
    open_slots: tuple[str, ...]  # "[slot->-id]" (migrating) / "[slot-<-id]" (importing), on myself only

    @property
    def is_master(self) -> bool:
        """Flagged ``master``."""
        return "master" in self.flags

    @property
    def failing(self) -> bool:
        """Flagged ``fail`` or ``fail?`` (suspected) by the node that reported the line."""
        return bool({"fail", "fail?"} & self.flags)


def parse_cluster_nodes(text: str | bytes) -> list[NodeLine]:
    """Parse a ``CLUSTER NODES`` reply (``<id> <ip:port@cport[,host]> <flags> <master> <ping> <pong>
    <epoch> <link> <slot>...``)."""
    raw = text.decode(errors="replace") if isinstance(text, bytes) else text
    out = []
    for line in raw.splitlines():
        f = line.split()
        if len(f) < 8:
            continue
        port_s = f[1].split("@", 1)[0].rsplit(":", 1)[-1]
        slots: list[tuple[int, int]] = []
        opened: list[str] = []
        for s in f[8:]:
            if s.startswith("["):
                opened.append(s)
            else:
                lo, _, hi = s.partition("-")
                slots.append((int(lo), int(hi or lo)))
        port, master = int(port_s) if port_s.isdigit() else 0, None if f[3] == "-" else f[3]
        out.append(NodeLine(f[0], port, frozenset(f[2].split(",")), master, tuple(slots), tuple(opened)))
    return out


def slot_owners(lines: Sequence[NodeLine]) -> dict[tuple[int, int], str]:
    """Slot range -> owning node id, from one node's ``CLUSTER NODES``."""
    return {r: n.node_id for n in lines for r in n.slots}


class ClusterServer(RedisServer):
    """One cluster-enabled ``redis-server`` on loopback: ``<dir>/nodes.conf``, its own bus port.

    ``restart()`` keeps port, bus port and dir, so the node rejoins with its ``nodes.conf`` (a killed
    master whose replica took over comes back as that replica's replica).  ``extra_args`` still come
    last and win over the cluster options."""

    kind = "redis-cluster"

    def __init__(
        self, port: int | None = None, dir: str | os.PathLike[str] | None = None, extra_args: Sequence[str] = (),
        keep: bool = False, binary: str | None = None, *, node_timeout_ms: int = NODE_TIMEOUT_MS,
        bus_port: int | None = None, aof: bool = False, log: Path | None = None,
    ) -> None:  # fmt: skip
        super().__init__(port, dir, extra_args, keep, binary, aof=aof, log=log)
        self.node_timeout_ms = node_timeout_ms
        self._auto_bus = bus_port is None
        self._bus_port = bus_port if bus_port is not None else free_port()
        self._node_id: str | None = None

    @property
    def bus_port(self) -> int:
        """The cluster bus port (``cluster-port``) on 127.0.0.1."""
        return self._bus_port

    @property
    def nodes_conf(self) -> Path:
        """The cluster config file the node keeps up to date (``cluster-config-file``)."""
        return self.dir / "nodes.conf"

    def cluster_args(self) -> list[str]:
        """The cluster options on the command line (see the module docstring for the values)."""
        return [
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.nodes_conf),
            "--cluster-node-timeout", str(self.node_timeout_ms),
            "--cluster-port", str(self._bus_port),
            "--cluster-replica-validity-factor", "0",
            "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip

    def argv(self) -> list[str]:
        """``RedisServer.argv()`` with :meth:`cluster_args` inserted before ``extra_args``."""
        base = super().argv()
        cut = len(base) - len(self.extra_args)
        return [*base[:cut], *self.cluster_args(), *base[cut:]]

    def spawn(self) -> None:
        """Start the process; the node id is read again (a removed dir means a new node)."""
        self._node_id = None
        super().spawn()

    def on_new_port(self) -> None:
        """After a lost port race: a new bus port too, and no ``nodes.conf`` naming the old ports."""
        if self._auto_bus:
            self._bus_port = free_port()
        self.nodes_conf.unlink(missing_ok=True)

    @property
    def node_id(self) -> str:
        """The node's cluster id (``CLUSTER MYID``), kept after the node dies (for ``replicas_of`` etc.)."""
        if self._node_id is None:
            reply = self.command("CLUSTER", "MYID")
            self._node_id = reply.decode() if isinstance(reply, bytes) else str(reply)
        return self._node_id

    def cluster_info(self, timeout: float = 1.0) -> dict[str, str]:
        """``CLUSTER INFO`` as a dict (``cluster_state``, ``cluster_slots_ok``, ``cluster_known_nodes``...)."""
        text = (self.command("CLUSTER", "INFO", timeout=timeout) or b"").decode(errors="replace")
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)

    def cluster_nodes(self, timeout: float = 1.0) -> list[NodeLine]:
        """``CLUSTER NODES`` as this node sees the cluster."""
        return parse_cluster_nodes(self.command("CLUSTER", "NODES", timeout=timeout))

    def myself(self, timeout: float = 1.0) -> NodeLine:
        """This node's own line of ``CLUSTER NODES`` (its role as it sees it)."""
        for line in self.cluster_nodes(timeout):
            if "myself" in line.flags:
                return line
        raise ServerError(f"{self!r}: CLUSTER NODES has no 'myself' line")

    def __repr__(self) -> str:
        return f"ClusterServer(port={self._port}, bus={self._bus_port}, pid={self.pid})"


class ClusterSet:
    """A Redis Cluster on loopback: ``masters`` masters (at least 3) with ``replicas`` replicas each.

    ``start()`` starts ``masters * (1 + replicas)`` :class:`ClusterServer` nodes, forms the cluster
    with ``redis-cli --cluster create ... --cluster-replicas R --cluster-yes`` and waits until
    :meth:`wait_ok`.  Roles are read from the nodes each time (they change after a failover);
    ``nodes`` is every node we started, in start order.  ``node_class`` is the class it starts (the
    tests use a subclass with fault injection).

        with ClusterSet(replicas=1) as c:
            redis.cluster.RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in c.startup_nodes])
    """

    start_timeout = 60.0
    node_class: type[ClusterServer] = ClusterServer

    def __init__(
        self, masters: int = 3, replicas: int = 0, *, node_timeout_ms: int = NODE_TIMEOUT_MS,
        redis_args: Sequence[str] = (), aof: bool = False, keep: bool = False, cli: str | None = None,
    ) -> None:  # fmt: skip
        if masters < 3:
            raise ServerError(f"a Redis Cluster needs at least 3 masters (redis-cli --cluster create), got {masters}")
        if replicas < 0:
            raise ServerError(f"replicas per master must be 0 or more, got {replicas}")
        self.n_masters, self.n_replicas = masters, replicas
        self.keep = keep
        self.cli = redis_cli_binary(cli)
        self.nodes: list[ClusterServer] = [
            self.node_class(extra_args=redis_args, keep=keep, node_timeout_ms=node_timeout_ms, aof=aof)
            for _ in range(masters * (1 + replicas))
        ]
        self.formation_s: float | None = None  # seconds start() took, once it returned

    # -- addresses

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """``(host, port)`` of every node (masters and replicas), for a client to discover the cluster."""
        return [n.addr for n in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...``: every node, as :attr:`startup_nodes`."""
        return "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in self.startup_nodes)

    # -- roles and slots, read from the nodes

    def running(self) -> list[ClusterServer]:
        """The nodes whose process is running (a paused one counts)."""
        return [n for n in self.nodes if n.running]

    def node_by_id(self, node_id: str) -> ClusterServer:
        """The node we started with this cluster id."""
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise ServerError(f"no node of {self!r} has id {node_id}")

    def _own_lines(self) -> list[tuple[ClusterServer, NodeLine]]:
        out = []
        for n in self.running():
            try:
                out.append((n, n.myself(0.5)))
            except (OSError, ServerError):
                continue  # paused or not answering: its role is unknown
        return out

    def masters(self) -> list[ClusterServer]:
        """Running nodes that say they are masters (``CLUSTER NODES``, their own line)."""
        return [n for n, me in self._own_lines() if me.is_master]

    def replicas(self) -> list[ClusterServer]:
        """Running nodes that say they are replicas."""
        return [n for n, me in self._own_lines() if not me.is_master]

    def replicas_of(self, master: ClusterServer) -> list[ClusterServer]:
        """Running nodes that say they replicate ``master``."""
        return [n for n, me in self._own_lines() if not me.is_master and me.master_id == master.node_id]

    def view(self, timeout: float = 0.5) -> list[NodeLine]:
        """``CLUSTER NODES`` as the first running master that answers sees it (masters hear about
        slot moves first: ``move_slots`` tells every master)."""
        for n in self.masters() or self.running():
            try:
                return n.cluster_nodes(timeout)
            except (OSError, ServerError):
                continue
        raise ServerError(f"no node of {self!r} answered CLUSTER NODES")

    def node_for_slot(self, slot: int) -> ClusterServer:
        """The master that owns ``slot`` (per :meth:`view`)."""
        if not 0 <= slot < CLUSTER_SLOTS:
            raise ServerError(f"slot {slot} is out of range 0..{CLUSTER_SLOTS - 1}")
        for (lo, hi), owner in slot_owners(self.view()).items():
            if lo <= slot <= hi:
                return self.node_by_id(owner)
        raise ServerError(f"no node owns slot {slot}")

    def node_for_key(self, key: str | bytes) -> ClusterServer:
        """The master that owns ``key``'s slot."""
        return self.node_for_slot(slot_of(key))

    def slots_of(self, node: ClusterServer) -> list[tuple[int, int]]:
        """The slot ranges ``node`` owns (per :meth:`view`), inclusive."""
        return sorted(r for r, owner in slot_owners(self.view()).items() if owner == node.node_id)

    slot_of = staticmethod(slot_of)

    # -- waiting for a healthy cluster

    def problems(self) -> list[str]:
        """What keeps the cluster from being ok, as every running node sees it (empty: ok)."""
        nodes = self.running()
        if not nodes:
            return ["no node is running"]
        running_ids = {n.node_id for n in nodes}
        maps: dict[int, dict[tuple[int, int], str]] = {}
        out: list[str] = []
        for n in nodes:
            try:
                info, lines = n.cluster_info(0.5), n.cluster_nodes(0.5)
                link = n.info("replication", timeout=0.5).get("master_link_status", "up")  # "up" on a master
            except (OSError, ServerError) as e:
                out.append(f"{n!r}: {e!r}")
                continue
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != str(CLUSTER_SLOTS):
                out.append(f"{n.port}: state={info.get('cluster_state')} slots_ok={info.get('cluster_slots_ok')}")
            seen = {ln.node_id: ln for ln in lines}
            if missing := running_ids - seen.keys():
                out.append(f"{n.port}: does not know {sorted(missing)}")
            if bad := sorted(i[:8] for i in running_ids & seen.keys() if seen[i].failing):
                out.append(f"{n.port}: sees running nodes failing: {bad}")
            me = seen.get(n.node_id)
            if me is not None and me.open_slots:
                out.append(f"{n.port}: open slots {list(me.open_slots)}")
            if link != "up":
                out.append(f"{n.port}: replica link to its master is {link}")
            maps[n.port] = slot_owners(lines)
        if len({tuple(sorted(m.items())) for m in maps.values()}) > 1:
            out.append(f"nodes disagree about slot owners: {maps}")
        return out

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until every running node says ``cluster_state:ok`` with all 16384 slots served, knows
        every running node and suspects none, has no slot half-migrated, its replicas' links are up,
        and all agree on who owns which slot."""
        last: list[str] = []

        def ok() -> bool:
            last[:] = self.problems()
            return not last

        wait_for(ok, timeout, lambda: f"{self!r} to be ok: {last}", 0.05)

    def wait_replicated(self, timeout: float = 10.0) -> None:
        """Wait until every running replica has applied everything its master had written when this
        was called (``master_repl_offset``), so a kill -9 of a master loses nothing acknowledged."""
        goals: list[tuple[ClusterServer, int]] = []
        for r in self.replicas():
            master = self.node_by_id(r.myself().master_id or "")
            goals.append((r, int(master.info("replication")["master_repl_offset"])))

        def caught_up() -> bool:
            return all(int(r.info("replication", 0.5).get("slave_repl_offset", -1)) >= off for r, off in goals)

        wait_for(caught_up, timeout, lambda: f"replicas to reach offsets {[(r.port, o) for r, o in goals]}")

    # -- lifecycle

    def create_command(self) -> list[str]:
        """The ``redis-cli --cluster create`` command line that forms the cluster."""
        addrs = [f"{h}:{p}" for h, p in self.startup_nodes]
        return [self.cli, "--cluster", "create", *addrs, "--cluster-replicas", str(self.n_replicas), "--cluster-yes"]

    def start(self) -> Self:
        """Start every node, form the cluster with ``redis-cli --cluster create`` and :meth:`wait_ok`
        (every replica in sync); on failure kill what was started and raise."""
        t0 = time.monotonic()
        deadline = t0 + self.start_timeout
        try:
            for n in self.nodes:
                n.start()
            if shutil.which(self.cli) is None:
                raise ServerError(f"{self.cli!r} not found; install redis-tools or set ${REDIS_CLI_ENV}")
            cmd = self.create_command()
            done = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=max(1.0, deadline - time.monotonic())
            )
            if done.returncode != 0:
                out = (done.stdout + done.stderr).decode(errors="replace")
                raise ServerError(f"{' '.join(cmd)} exited with {done.returncode}:\n{out[-3000:]}")
            self.wait_ok(max(0.1, deadline - time.monotonic()))
            for n in self.nodes:
                n.node_id  # noqa: B018 - read and kept now: a node killed later is still known by id
        except BaseException:
            self.kill()
            raise
        self.formation_s = time.monotonic() - t0
        return self

    def restart_node(self, node: ClusterServer, timeout: float = 30.0) -> ClusterServer:
        """Start a stopped node again (same ports, same ``nodes.conf``) and wait until the cluster is ok
        with it: a master that was failed over comes back as a replica of its successor, in sync.

        The node must have kept its dir (killed, or ``stop(keep=True)``): without ``nodes.conf`` it
        would start as a new, empty node that no other node knows."""
        if not node.nodes_conf.exists():
            raise ServerError(f"{node!r} has no {node.nodes_conf} to rejoin with: stop it with keep=True, or kill it")
        node.start()
        self.wait_ok(timeout)
        return node

    def kill(self) -> None:
        """SIGKILL every node (dirs kept; ``stop()`` or the atexit hook removes them)."""
        for n in self.nodes:
            n.kill()

    def stop(self, keep: bool | None = None, grace: float = 2.0) -> None:
        """Stop the replicas, then the masters (a master stopping with a lagging replica waits for it)."""
        replicas = set(map(id, self.replicas()))
        for n in sorted(self.nodes, key=lambda n: id(n) not in replicas):
            n.stop(keep, grace=grace)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- resharding (online: clients keep working, following MOVED and ASK)

    def begin_migration(self, slot: int, src: ClusterServer, dst: ClusterServer) -> None:
        """Open ``slot`` for migration: ``IMPORTING`` on ``dst``, then ``MIGRATING`` on ``src``.

        From now on ``src`` answers ``-ASK`` for keys of the slot it does not hold, and ``dst``
        serves them to clients that send ``ASKING`` first."""
        dst.command("CLUSTER", "SETSLOT", slot, "IMPORTING", src.node_id)
        src.command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.node_id)

    def migrate_keys(
        self, slot: int, src: ClusterServer, dst: ClusterServer, batch: int = MIGRATE_BATCH, *,
        timeout_ms: int = 10_000, replace: bool = False, on_batch: Callable[[int, int], None] | None = None,
    ) -> int:  # fmt: skip
        """Move the keys of an open ``slot`` from ``src`` to ``dst`` (``CLUSTER GETKEYSINSLOT`` then
        ``MIGRATE ... KEYS``, ``batch`` at a time) until none is left; returns how many moved.

        Each MIGRATE is atomic for its keys: a write to one of them either lands on ``src`` before
        the move or is redirected (``-ASK``) after it.  ``replace``: overwrite keys that already
        exist on ``dst`` (else ``-BUSYKEY`` stops the move).  ``on_batch(slot, moved_so_far)`` runs
        after each batch (a test can let writers in between)."""
        moved = 0
        while keys := src.command("CLUSTER", "GETKEYSINSLOT", slot, batch):
            flags = ["REPLACE"] if replace else []
            try:
                src.command("MIGRATE", HOST, dst.port, "", 0, timeout_ms, *flags, "KEYS", *keys,
                            timeout=timeout_ms / 1000 + 5)  # fmt: skip
            except ServerError as e:
                raise ServerError(
                    f"MIGRATE of {len(keys)} keys of slot {slot} from {src!r} to {dst!r} failed: {e} "
                    "(BUSYKEY: the key exists on the target; pass replace=True to overwrite)"
                ) from e
            moved += len(keys)
            if on_batch is not None:
                on_batch(slot, moved)
        return moved

    def finish_migration(self, slot: int, src: ClusterServer, dst: ClusterServer) -> None:
        """Give ``slot`` to ``dst``: ``CLUSTER SETSLOT slot NODE dst`` on ``dst`` (which bumps its
        config epoch), then ``src``, then every other running master; replicas learn by gossip."""
        others = [m for m in self.masters() if m is not src and m is not dst]
        for n in (dst, src, *others):
            n.command("CLUSTER", "SETSLOT", slot, "NODE", dst.node_id)

    def move_slots(
        self, slots: Iterable[int], src: ClusterServer, dst: ClusterServer, batch: int = MIGRATE_BATCH, *,
        replace: bool = False, on_batch: Callable[[int, int], None] | None = None, timeout: float = 30.0,
    ) -> int:  # fmt: skip
        """Reshard ``slots`` from master ``src`` to master ``dst`` online, one slot at a time (the
        documented steps: :meth:`begin_migration`, :meth:`migrate_keys`, :meth:`finish_migration`),
        then :meth:`wait_ok`; returns the number of keys moved.  Clients that follow ``MOVED`` and
        ``ASK`` (redis-py's ``RedisCluster``) may keep reading and writing those slots meanwhile."""
        slots = list(slots)
        if src is dst:
            raise ServerError(f"move_slots: source and target are the same node {src!r}")
        masters = self.masters()
        for n in (src, dst):
            if n not in masters:
                raise ServerError(f"move_slots: {n!r} is not a running master (masters: {masters!r})")
        owned = self.slots_of(src)
        if stray := [s for s in slots if not any(lo <= s <= hi for lo, hi in owned)]:
            raise ServerError(f"move_slots: {src!r} does not own slots {stray[:10]} (it owns {owned})")
        moved = 0
        for slot in slots:
            self.begin_migration(slot, src, dst)
            moved += self.migrate_keys(slot, src, dst, batch, replace=replace, on_batch=on_batch)
            self.finish_migration(slot, src, dst)
        self.wait_ok(timeout)
        return moved

    def __repr__(self) -> str:
        return f"ClusterSet({self.n_masters}x{1 + self.n_replicas}, ports={[n.port for n in self.nodes]})"
