"""Where a script call goes in a Redis Cluster: the master that owns its partition's slot.

Every key of a partition carries the hash tag ``{ns:p}``, so all keys of one script call hash to
one slot. The slot map is redis-py's (``RedisCluster.nodes_manager``): it is updated from MOVED
redirects and re-read from the cluster after a connection failure, so a resharding or a failover
is followed without a restart. Connections come from the node's own redis-py pool.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, RedisClusterException, RedisError

from .batch import Batch
from .connectors import AsyncCluster


def slot_of(key: Any) -> int:
    """The cluster slot of a key (CRC16 of its hash tag, as Redis computes it)."""
    return int(key_slot(key.encode("utf-8") if isinstance(key, str) else key))


def _node_name(e: AskError) -> str:
    return f"{e.host}:{e.port}"


class Groups:
    """A batch's pending calls grouped by the node to send them to."""

    @staticmethod
    def plan(batch: Batch, node_for_slot: Any, node_by_name: Any) -> dict[str, tuple[Any, list[int]]]:
        """``{node name: (node, call indices)}``: ASK-redirected calls go to the node named in the
        redirect, the others to the master of their slot."""
        out: dict[str, tuple[Any, list[int]]] = {}
        for i in batch.pending:
            ask = batch.ask.get(i)
            if ask is not None:
                node = node_by_name(_node_name(ask), ask)
            else:
                node = node_for_slot(slot_of(batch.calls[i][1][0]))
            out.setdefault(node.name, (node, []))[1].append(i)
        return out


class SyncRoutes:
    """Routing for a blocking ``redis.cluster.RedisCluster``."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def groups(self, batch: Batch) -> list[tuple[Any, list[int]]]:
        nm = self.cluster.nodes_manager
        return list(Groups.plan(batch, nm.get_node_from_slot, self._node).values())

    def _node(self, name: str, ask: AskError) -> Any:
        nm = self.cluster.nodes_manager
        node = nm.get_node(node_name=name)
        if node is None:  # a node we have not met yet (a slot migrating to a new master)
            nm.initialize()
            node = nm.get_node(node_name=name) or nm.get_node_from_slot(ask.slot_id)
        return node

    def pool(self, node: Any) -> Any:
        """The node's redis-py connection pool."""
        return self.cluster.get_redis_connection(node).connection_pool

    def moved(self, redirects: Sequence[MovedError]) -> None:
        """Update the slot map from MOVED redirects (the commands had not run)."""
        for e in redirects:
            self.cluster.nodes_manager.move_slot(e)

    def refresh(self) -> None:
        """Re-read the slot map after a node failed (a failover may have promoted a replica)."""
        try:
            self.cluster.nodes_manager.initialize()
        except RedisError:  # no node reachable right now: the retry loop tries again later
            pass


class AsyncRoutes:
    """Routing for an asyncio ``redis.asyncio.cluster.RedisCluster``."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.ready = False

    async def start(self) -> None:
        """Read the slot map once (the asyncio client connects lazily)."""
        if not self.ready:
            if isinstance(self.cluster, AsyncCluster):
                await self.cluster.read_slot_map()
            else:  # a client not made by async_redis
                await self.cluster.initialize()
            self.ready = True

    def groups(self, batch: Batch) -> list[tuple[Any, list[int]]]:
        nm = self.cluster.nodes_manager
        return list(Groups.plan(batch, nm.get_node_from_slot, self._node).values())

    def _node(self, name: str, ask: AskError) -> Any:
        nm = self.cluster.nodes_manager
        return nm.get_node(node_name=name) or nm.get_node_from_slot(ask.slot_id)

    async def moved(self, redirects: Sequence[MovedError]) -> None:
        """Update the slot map from MOVED redirects (the commands had not run)."""
        for e in redirects:
            await self.cluster.nodes_manager.move_slot(e)

    async def refresh(self) -> None:
        """Re-read the slot map after a node failed (a failover may have promoted a replica)."""
        try:
            await self.cluster.nodes_manager.initialize()
        except RedisError:
            pass


def isolate_failed(batch: Batch, groups: Callable[[Batch], list[tuple[Any, list[int]]]], down: set[str],
                   error: BaseException) -> None:
    """After a node failed and the slot map was re-read: the pending calls it still sends to a
    node that failed this round (or that have no route) come back at once as :class:`NodeFailed`
    instead of holding the other nodes' replies for the whole retry budget (a worker's claims on
    three masters must not wait for, or fail with, the one that died). The others go on."""
    try:
        stuck = [i for node, idx in groups(batch) if node.name in down for i in idx]
    except RedisClusterException:  # still no route for some slot: nothing can go anywhere now
        stuck = list(batch.pending)
    if stuck:
        batch.give_up(stuck, error)

