"""The settings both clients share: what the constructor checks, how calls are retried, how
durable a write must be before ``schedule`` returns."""
from __future__ import annotations

import warnings
from typing import Any

from ..protocol import config
from ..protocol import durability as dur
from ..protocol.calls import Calls, tombstone_ms
from ..protocol.keys import Keyspace
from ..redisio.connection import is_cluster
from ..redisio.transport import DEFAULT_RETRY, RedisRetry
from .settings import TOMBSTONE_TTL_FIELD, stored_tombstone_ttl

UNSET: Any = object()
"""Default of ``durable=`` on ``schedule``/``schedule_many``: the client's own setting (None is a
setting: no durability wait)."""


def payload_limit(max_payload_bytes: object) -> int:
    """The largest payload accepted, checked."""
    if isinstance(max_payload_bytes, bool) or not isinstance(max_payload_bytes, int) or max_payload_bytes < 1:
        raise ValueError(f"max_payload_bytes must be a positive int, got {max_payload_bytes!r}")
    return max_payload_bytes


def socket_timeout(redis_client: Any) -> float | None:
    """The redis-py client's socket timeout (seconds), None when it has none."""
    if is_cluster(redis_client):
        # a cluster client has no pool of its own: every node's pool is made with the connection
        # arguments its nodes manager keeps (without this the durable_timeout check was skipped)
        kwargs = getattr(getattr(redis_client, "nodes_manager", None), "connection_kwargs", None) or {}
    else:
        pool = getattr(redis_client, "connection_pool", None)
        kwargs = getattr(pool, "connection_kwargs", None) or {}
    t = kwargs.get("socket_timeout")
    return float(t) if isinstance(t, (int, float)) else None


def info_server_command(redis_client: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of the ``INFO server`` read that checks the Redis version: on a cluster, of
    every master (redis-py sends INFO to one node by default, and a cluster in a rolling upgrade
    runs several versions; the scripts run on all masters)."""
    if is_cluster(redis_client):
        return ("server",), {"target_nodes": redis_client.PRIMARIES}
    return ("server",), {}


def resolve_sharded_pubsub(redis_client: Any, override: object) -> bool:
    """Whether a client's namespace uses sharded pub/sub (SPUBLISH/SSUBSCRIBE on channels in each
    partition's slot, Redis >= 7): ``override`` when it is a bool, else (None) when ``redis_client``
    talks to a Redis Cluster, where a plain PUBLISH would be broadcast to every node."""
    if override is None:
        return is_cluster(redis_client)
    if not isinstance(override, bool):
        raise TypeError(f"sharded_pubsub must be True, False or None (automatic), got {override!r}")
    return override


class ClientOptions:
    """Checked constructor arguments of a client: the namespace, transport and durability
    settings, and what its :class:`~scheduler.protocol.calls.Calls` is built from once the
    partition count is read (:meth:`partition_commands`, :meth:`calls`)."""

    def __init__(self, *, namespace: str | None, partitions: int | None, max_payload_bytes: int,
                 tombstone_ttl: float | None, retry: RedisRetry | None, durable: str | None, durable_replicas: int,
                 durable_timeout: float, socket_timeout: float | None = None, sharded: bool = False,
                 cluster: bool = True) -> None:
        self.namespace = config.namespace(namespace)
        self.partitions = config.partitions(partitions)
        self.max_payload_bytes = payload_limit(max_payload_bytes)
        # A process's own tombstone TTL (deprecated: the namespace's, set_tombstone_ttl, is read
        # at connect); checked now so a bad value fails at construction, not at connect.
        self.own_tombstone_ttl = tombstone_ttl
        if tombstone_ttl is not None:
            tombstone_ms(tombstone_ttl)
            warnings.warn("tombstone_ttl= is deprecated: how long finished jobs stay visible is a namespace setting "
                          "now; set it once with Client.set_tombstone_ttl(seconds) or 'zsched namespace "
                          "tombstone-ttl SECONDS' (given here it still overrides the namespace's for this process)",
                          DeprecationWarning, stacklevel=4)
        self.cluster = cluster  # the Redis is a cluster: every script declares every key it writes
        self.retry = retry or DEFAULT_RETRY
        self.durable_replicas = durable_replicas
        self.durable_timeout = durable_timeout
        self.socket_timeout = socket_timeout
        self.sharded = sharded  # the pub/sub layout of the Keyspace (see resolve_sharded_pubsub())
        self.durable = self._check(dur.resolve(durable, durable_replicas, durable_timeout))
        self.resend_schedule = False  # set from the tombstone TTL in use (use_tombstone_ttl)
        self.waitaof_checked = False  # durable="fsync": the server was checked for WAITAOF once

    def partition_commands(self, pipe: Any) -> None:
        """Queue on a pipeline: store the partition count of a new namespace (the one asked for, or
        the default), then read the namespace's count. Safe to send again."""
        cfg = Keyspace(self.namespace, 1).config_key
        pipe.hsetnx(cfg, "partitions", self.partitions or config.DEFAULT_PARTITIONS)
        pipe.hget(cfg, "partitions")
        pipe.hget(cfg, TOMBSTONE_TTL_FIELD)

    def calls(self, replies: list[Any]) -> Calls:
        """The namespace's call builder from the replies of :meth:`partition_commands`, with the
        namespace's tombstone TTL (or the process's own, deprecated); ConfigError when the stored
        count differs from an explicit ``partitions``."""
        count = config.resolve_partitions(replies[1], self.partitions, self.namespace)
        calls = Calls(Keyspace(self.namespace, count, sharded=self.sharded), max_payload_bytes=self.max_payload_bytes,
                      tombstone_ttl=config.DEFAULT_TOMBSTONE_TTL, declare_all_keys=self.cluster)
        self.use_tombstone_ttl(calls, stored_tombstone_ttl(replies[2]))
        return calls

    def use_tombstone_ttl(self, calls: Calls, namespace_ttl: float) -> bool:
        """Build ``calls`` with the namespace's tombstone TTL (unless this process set its own);
        True when that changed it."""
        ttl = namespace_ttl if self.own_tombstone_ttl is None else self.own_tombstone_ttl
        ms = tombstone_ms(ttl)
        # A re-sent schedule recognises its jobs by id, finished ones by their tombstone: re-send
        # only while tombstones outlive the retry window by a wide margin.
        self.resend_schedule = ms >= 2000 * self.retry.budget
        changed, calls.tomb_ms = calls.tomb_ms != ms, ms
        return changed

    def _check(self, d: dur.Durability | None) -> dur.Durability | None:
        t = self.socket_timeout
        if d is not None and t is not None and d.timeout_ms >= t * 1000:
            raise ValueError(f"durable_timeout ({d.timeout_ms / 1000:g} s) must be shorter than the Redis socket "
                             f"timeout ({t:g} s), or every WAIT that runs out would look like a lost connection; "
                             "lower durable_timeout or raise socket_timeout")
        return d

    def durability(self, durable: Any) -> dur.Durability | None:
        """The durability of one call: ``durable`` as given, or the client's (``UNSET``)."""
        if durable is UNSET:
            return self.durable
        return self._check(dur.resolve(durable, self.durable_replicas, self.durable_timeout))
