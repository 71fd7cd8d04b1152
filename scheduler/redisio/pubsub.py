"""Subscriptions to the wake-up channels, in either pub/sub layout of :mod:`.keys`.

The scheduler tier and the workers listen through :func:`subscription`, one interface whatever
the layout:

* **plain** (``Keyspace.sharded`` false): redis-py's ``PubSub`` and SUBSCRIBE, exactly as before
  sharded pub/sub existed;
* **sharded on one Redis** (>= 7; a deployment that opted in with ``sharded_pubsub=True``, or a
  test): SSUBSCRIBE on the same single connection;
* **sharded on a Redis Cluster**: redis-py's ``ClusterPubSub`` sends each SSUBSCRIBE to the node
  that owns the channel's slot (one connection per node). Every node connection is read at once,
  each by its own task: redis-py's ``get_sharded_message`` visits the nodes in turn and waits its
  timeout on each, so a listener would either poll every node or hear a message late.

Messages come back as redis-py dicts with the sharded types renamed (``smessage`` -> ``message``,
``ssubscribe`` -> ``subscribe``), so a listener handles both layouts with one loop. On a cluster,
a partition whose slot moved to another node (Redis then sends an ``sunsubscribe`` nobody asked
for, or a node answers ``MOVED``) makes :meth:`Subscription.get_message` refresh the slot map and
raise :class:`ChannelMoved`, a connection error (any other failure of a node connection is
raised as it is, or as :class:`SubscriptionLost`): the caller's loop re-subscribes as after any
outage (on the new owners now) and sweeps, so a message missed meanwhile costs latency, never a job.
"""
from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from redis.exceptions import AskError, RedisError
from redis.exceptions import ConnectionError as RedisConnectionError

from ..protocol.errors import ZschedError
from .connection import is_cluster

# sharded message types -> the plain ones the listeners handle
_PLAIN_TYPE = {"smessage": "message", "ssubscribe": "subscribe", "sunsubscribe": "unsubscribe"}
_SUBSCRIBE_TYPES = ("subscribe", "unsubscribe")
RESCAN = 1.0  # seconds between looks for node connections redis-py opened on its own (local, no I/O)

Message = dict[str, Any]


class SubscriptionLost(ZschedError, RedisConnectionError):
    """The subscription no longer covers every channel it subscribed to: make a new one."""


class ChannelMoved(SubscriptionLost):
    """A subscribed channel's slot moved to another cluster node: subscribe again."""


class ChannelsPending(SubscriptionLost):
    """Some channels were left out of the subscription because their cluster node could not be
    reached: subscribe again (the node's failure was already seen when it broke)."""


class Subscription(ABC):
    """A subscription to some wake-up channels. Not reusable after :meth:`aclose` or an error:
    make a new one."""

    @abstractmethod
    async def subscribe(self, channels: Sequence[str]) -> Sequence[str]:
        """Send the subscriptions; returns the channels subscribed, one ``subscribe`` message
        confirming each (unless subscribe messages are ignored). On a cluster, channels of a node
        that cannot be reached are left out (the others are not held hostage by it) and
        :meth:`get_message` raises :class:`SubscriptionLost` within a second or so, so the caller
        subscribes again; it raises here only when no channel could be subscribed."""

    @abstractmethod
    async def get_message(self, timeout: float | None) -> Message | None:
        """The next message (``type`` ``message``, ``subscribe`` or ``pong``; ``channel`` and
        ``data`` as redis-py gives them), or None after ``timeout`` seconds (None: wait for one).
        Raises the connection's error when it fails."""

    @abstractmethod
    async def ping(self) -> None:
        """Ask for a ``pong`` message, which proves every connection of the subscription alive."""

    @abstractmethod
    async def aclose(self) -> None:
        """Close the connections."""


def subscription(redis: Any, sharded: bool, *, ignore_subscribe_messages: bool = False) -> Subscription:
    """A subscription on ``redis`` (an asyncio redis-py client or cluster client) in the layout of
    ``sharded`` (``Keyspace.sharded``)."""
    ps = redis.pubsub(ignore_subscribe_messages=ignore_subscribe_messages)
    if sharded and is_cluster(redis):
        return ClusterSubscription(ps, ignore_subscribe_messages)
    return SingleSubscription(ps, sharded)


class SingleSubscription(Subscription):
    """One connection to one Redis: SUBSCRIBE, or SSUBSCRIBE when ``sharded``."""

    def __init__(self, ps: Any, sharded: bool) -> None:
        self.ps = ps
        self.sharded = sharded

    async def subscribe(self, channels: Sequence[str]) -> Sequence[str]:
        if self.sharded:
            await self.ps.ssubscribe(*channels)
        else:
            await self.ps.subscribe(*channels)
        return channels

    async def get_message(self, timeout: float | None) -> Message | None:
        msg: Message | None = await self.ps.get_message(timeout=timeout)
        if msg is not None and self.sharded:
            msg["type"] = _PLAIN_TYPE.get(msg["type"], msg["type"])
        return msg

    async def ping(self) -> None:
        await self.ps.ping()

    async def aclose(self) -> None:
        await self.ps.aclose()


class ClusterSubscription(Subscription):
    """SSUBSCRIBE through redis-py's ``ClusterPubSub``: one connection per node owning a
    subscribed channel, each read by its own task into one queue."""

    def __init__(self, ps: Any, ignore_subscribe_messages: bool) -> None:
        self.ps = ps
        self.ignore_subscribe_messages = ignore_subscribe_messages
        self._queue: asyncio.Queue[Message | BaseException] = asyncio.Queue()
        self._readers: dict[Any, asyncio.Task[None]] = {}  # node PubSub -> its reader
        self._pongs_due: set[Any] = set()  # node connections that owe a pong to the last ping()
        self._unreachable: set[str] = set()  # nodes whose channels could not be subscribed
        self._retry_at: float | None = None  # when to ask the caller to subscribe them again

    async def subscribe(self, channels: Sequence[str]) -> Sequence[str]:
        await self.ps.cluster.initialize()  # the slot map, if this client has sent nothing yet
        by_node: dict[str, list[str]] = {}
        for ch in channels:
            by_node.setdefault(self.ps.cluster.get_node_from_key(ch).name, []).append(ch)
        done: list[str] = []
        error: BaseException | None = None
        for name, group in by_node.items():
            try:
                await self.ps.ssubscribe(*group)
                done += group
            except (RedisError, OSError) as exc:  # that node is down (a failover under way)
                self._unreachable.add(name)
                error = exc
        if error is not None:
            if not done:
                raise error
            # the other nodes' wake-ups are heard meanwhile; the caller subscribes again soon
            self._retry_at = asyncio.get_running_loop().time() + RESCAN
        self._watch()
        return done

    def _live(self) -> list[Any]:
        """The node connections of the subscription, without those of unreachable nodes."""
        return [ps for name, ps in list(self.ps.node_pubsub_mapping.items()) if name not in self._unreachable]

    def _watch(self) -> None:
        """Start a reader for each node connection without one (redis-py opens one per node, also
        when it re-routes a channel after a slot-map refresh)."""
        for node_ps in self._live():
            if node_ps not in self._readers:
                self._readers[node_ps] = asyncio.create_task(self._read(node_ps), name="zsched-sharded-pubsub")

    async def _read(self, node_ps: Any) -> None:
        """Move one node's messages to the queue until its connection fails."""
        put = self._queue.put_nowait
        try:
            while True:
                msg = await node_ps.get_message(timeout=None)
                if msg is None:
                    continue
                t = _PLAIN_TYPE.get(msg["type"], msg["type"])
                msg["type"] = t
                if t == "unsubscribe":  # nobody here unsubscribes: the slot moved away from this node
                    put(ChannelMoved(f"shard channel {msg['channel']!r} left its node (slot moved)"))
                    return
                if t == "pong":
                    if node_ps in self._pongs_due:
                        self._pongs_due.discard(node_ps)
                        if not self._pongs_due:  # every node answered the ping
                            put(msg)
                    continue
                if t == "subscribe" and self.ignore_subscribe_messages:
                    continue
                put(msg)
        except asyncio.CancelledError:
            raise
        except (RedisError, OSError) as exc:
            put(ChannelMoved(f"a node refused a shard channel: {exc}") if _is_redirect(exc) else exc)
        except Exception as exc:  # e.g. redis-py closed this node's connection after re-routing its channels
            put(SubscriptionLost(f"reading a node's shard channels failed: {exc!r}"))

    async def get_message(self, timeout: float | None) -> Message | None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            self._watch()
            if self._retry_at is not None and loop.time() >= self._retry_at:
                raise ChannelsPending(f"the shard channels of unreachable node(s) {sorted(self._unreachable)} "
                                      "are not subscribed: subscribe again")
            wait = RESCAN if deadline is None else min(RESCAN, deadline - loop.time())
            try:
                item = await asyncio.wait_for(self._queue.get(), max(0.0, wait))
            except TimeoutError:
                if deadline is not None and loop.time() >= deadline:
                    return None
                continue
            if isinstance(item, BaseException):
                if isinstance(item, ChannelMoved):
                    await self._refresh_slots()
                raise item
            return item

    async def _refresh_slots(self) -> None:
        """Re-read the slot map so the next subscription goes to the new owners (best effort: the
        caller's next attempt fails and retries if this one cannot reach the cluster)."""
        with contextlib.suppress(RedisError, OSError):
            await self.ps.cluster.nodes_manager.initialize()

    async def ping(self) -> None:
        nodes = self._live()
        if not nodes:
            self._queue.put_nowait({"type": "pong", "pattern": None, "channel": None, "data": b""})
            return
        self._pongs_due = set(nodes)  # before sending: a pong may come back before the next send
        for node_ps in nodes:
            await node_ps.ping()

    async def aclose(self) -> None:
        readers = list(self._readers.values())
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        self._readers.clear()
        await self.ps.aclose()


def _is_redirect(exc: BaseException) -> bool:
    """A ``MOVED``/``ASK`` reply (``MovedError`` is an ``AskError``): the channel's slot is served by
    another node."""
    return isinstance(exc, AskError)
