"""Redis connections from URLs: plain, TLS, unix socket and Sentinel, sync and asyncio.

Every component (clients, the scheduler tier, workers, the operator CLI) builds its Redis client
here, so a URL means the same thing everywhere:

* ``redis://[user:password@]host:port/db`` and ``rediss://...`` (TLS; ``?ssl_ca_certs=...`` etc.)
* ``unix:///path/to/redis.sock?db=0``
* ``redis+sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db]`` and
  ``rediss+sentinel://...`` (TLS to the master and the sentinels). ``user:password`` authenticate
  to the master; sentinels that need their own credentials take ``?sentinel_username=`` and
  ``?sentinel_password=``. The master is looked up through the sentinels on every new connection,
  so a failover is followed without a restart.
* ``redis+cluster://[user:password@]host:port[,host:port...]`` and ``rediss+cluster://...`` (TLS):
  Redis Cluster, through redis-py's ``RedisCluster``. The listed nodes are only where the client
  starts; it learns the whole cluster from any of them and follows slot moves and failovers
  (``MOVED``/``ASK`` redirects are followed by redis-py: a redirected command had not run).

Clients are built with redis-py's own retry switched off: zsched's script transport
(:mod:`scheduler.transport`) decides which calls may be re-sent, and a library that re-sends a
non-idempotent command on its own runs a job twice.
"""
from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aredis
import redis.asyncio.cluster as acluster
import redis.cluster as rcluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from ..protocol.urls import (
    CLUSTER_SCHEMES,
    SENTINEL_SCHEMES,
    ClusterTarget,
    SentinelTarget,
    check_url,
    parse_cluster_url,
    parse_sentinel_url,
)
from .connectors import (
    AsyncCluster,
    AsyncMasterConnection,
    AsyncMasterTLSConnection,
    AsyncSentinel,
    MasterConnection,
    MasterTLSConnection,
    Sentinel,
    TLSConnection,
    address,
    cluster_failure,
)

# Defaults for long-running components; producers may pass their own (see Client.from_url).
DEFAULT_SOCKET_CONNECT_TIMEOUT = 5.0
# A reply that takes longer than this is treated as lost (the transport then re-sends what is safe
# to re-send); without one, a Redis host that vanished mid-call would hang the caller for good.
DEFAULT_SOCKET_TIMEOUT = 10.0

SyncRedis = redis.Redis | rcluster.RedisCluster
"""A blocking client: one server (plain, TLS, unix socket, Sentinel-discovered) or a cluster."""
AsyncRedis = aredis.Redis | acluster.RedisCluster
"""An asyncio client: one server or a cluster."""


def is_cluster(client: object) -> bool:
    """Whether ``client`` (sync or asyncio) talks to a Redis Cluster."""
    return isinstance(client, rcluster.RedisCluster | acluster.RedisCluster)


def _cluster_kwargs(url: str, kw: dict[str, Any]) -> tuple[ClusterTarget, dict[str, Any]]:
    t = parse_cluster_url(url)
    ckw = {**_coerce(t.options), **kw}
    if t.username:
        ckw.setdefault("username", t.username)
    if t.password:
        ckw.setdefault("password", t.password)
    if t.ssl:
        ckw["ssl"] = True
    return t, ckw


def _coerce(options: dict[str, str]) -> dict[str, Any]:
    """Query options of a Sentinel URL as connection keyword arguments (numbers and booleans
    converted the way redis-py's own URL parser does)."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        if k in ("socket_timeout", "socket_connect_timeout", "health_check_interval"):
            out[k] = float(v)
        elif k in ("ssl_check_hostname", "socket_keepalive"):
            out[k] = v.lower() in ("1", "true", "yes", "on")
        else:
            out[k] = v
    return out


def _defaults(kwargs: dict[str, Any], retry: Any) -> dict[str, Any]:
    kw = dict(kwargs)
    kw.setdefault("socket_connect_timeout", DEFAULT_SOCKET_CONNECT_TIMEOUT)
    kw.setdefault("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
    kw.setdefault("socket_keepalive", True)
    kw["retry"] = retry  # redis-py must never re-send a command by itself (see module docstring)
    return kw


def _sentinel_parts(url: str, kw: dict[str, Any]) -> tuple[SentinelTarget, dict[str, Any], dict[str, Any]]:
    t = parse_sentinel_url(url)
    master_kw = {**_coerce(t.options), **kw}
    if t.username:
        master_kw.setdefault("username", t.username)
    if t.password:
        master_kw.setdefault("password", t.password)
    master_kw["db"] = t.db
    skw: dict[str, Any] = {k: v for k, v in master_kw.items()
                           if k in ("socket_timeout", "socket_connect_timeout", "socket_keepalive", "retry")}
    skw.setdefault("socket_timeout", 2.0)  # a silent sentinel must not hang a failover lookup
    if t.sentinel_options.get("sentinel_username"):
        skw["username"] = t.sentinel_options["sentinel_username"]
    if t.sentinel_options.get("sentinel_password"):
        skw["password"] = t.sentinel_options["sentinel_password"]
    if t.ssl:
        master_kw["ssl"] = True
        for k, v in master_kw.items():
            if k.startswith("ssl"):
                skw[k] = v
    return t, master_kw, skw


def sync_redis(url: str, **kwargs: Any) -> SyncRedis:
    """A blocking redis-py client for ``url`` (any supported scheme), without redis-py retries."""
    check_url(url)
    kw = _defaults(kwargs, Retry(NoBackoff(), 0))
    scheme = url.split("://", 1)[0].lower()
    if scheme in CLUSTER_SCHEMES:
        c, ckw = _cluster_kwargs(url, kw)
        nodes = [rcluster.ClusterNode(h, p) for h, p in c.nodes]  # type: ignore[no-untyped-call, unused-ignore]
        if c.ssl:
            # Only a pool made "from a URL" takes a connection class: the first node as that URL,
            # the others as startup nodes (TLSConnection: the handshake fits the connect timeout)
            ckw = {k: v for k, v in ckw.items() if k != "ssl"}
            ckw.update(url=f"redis://{address(*c.nodes[0])}", connection_class=TLSConnection)
            nodes = nodes[1:]
        try:
            return rcluster.RedisCluster(startup_nodes=nodes, **ckw)
        except RedisClusterException as exc:
            # The blocking cluster client reads the slot map at once (the asyncio one on first
            # use). No node answering is a connection error, as for one server: callers handle
            # that (the CLI exits 3 "cannot reach Redis"), not redis-py's own exception class.
            failure = cluster_failure(c.nodes, exc)
            if failure is exc:
                raise
            raise failure from exc
    if scheme in SENTINEL_SCHEMES:
        t, master_kw, skw = _sentinel_parts(url, kw)
        tls = bool(master_kw.pop("ssl", False))
        s = Sentinel(t.sentinels, tls=tls, sentinel_kwargs=skw, **master_kw)
        master: redis.Redis = s.master_for(  # type: ignore[no-untyped-call, unused-ignore]
            t.master_name, connection_class=MasterTLSConnection if tls else MasterConnection)
        return master
    if scheme == "rediss":
        kw["connection_class"] = TLSConnection
    return redis.Redis.from_url(url, **kw)


def async_redis(url: str, **kwargs: Any) -> AsyncRedis:
    """An asyncio redis-py client for ``url`` (any supported scheme), without redis-py retries."""
    check_url(url)
    kw = _defaults(kwargs, AsyncRetry(NoBackoff(), 0))
    scheme = url.split("://", 1)[0].lower()
    if scheme in CLUSTER_SCHEMES:
        c, ckw = _cluster_kwargs(url, kw)
        return AsyncCluster(c.nodes, **ckw)
    if scheme in SENTINEL_SCHEMES:
        t, master_kw, skw = _sentinel_parts(url, kw)
        tls = bool(master_kw.pop("ssl", False))  # the sentinels' keywords keep theirs
        s = AsyncSentinel(list(t.sentinels), sentinel_kwargs=skw, **master_kw)  # type: ignore[no-untyped-call, unused-ignore]
        amaster: aredis.Redis = s.master_for(
            t.master_name, connection_class=AsyncMasterTLSConnection if tls else AsyncMasterConnection)
        return amaster
    return aredis.Redis.from_url(url, **kw)


def permanent_failure(exc: BaseException) -> str | None:
    """Why retrying a failed Redis connection cannot help, or None when it may (an outage).

    ``"credentials"``: Redis refused the user or password of the URL. ``"tls-files"``: a
    certificate or key file named in the URL (``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``)
    cannot be read. Long-running processes retry an outage at start-up and give up at once on
    these; the CLI words its message by them."""
    if isinstance(exc, redis.AuthenticationError):
        return "credentials"
    seen: BaseException | None = exc
    for _ in range(5):  # redis-py raises ConnectionError while handling the OSError of the file
        if seen is None:
            break
        if isinstance(seen, FileNotFoundError | PermissionError | IsADirectoryError):
            return "tls-files"
        seen = seen.__cause__ or seen.__context__
    return None
