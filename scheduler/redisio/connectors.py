"""What zsched needs from redis-py's connections beyond what they do by themselves.

* A TLS handshake that never waits longer than the connect timeout. The blocking client does the
  handshake under the *socket* timeout (60 s for the CLI), so ``rediss://`` pointed at a
  plain-text port, which never answers a handshake, hung a command for a minute per attempt.
  :class:`TLSConnection` bounds the TCP connect and the handshake together by
  ``socket_connect_timeout``. (The asyncio client already runs both under that timeout.)
* Sentinel and Cluster failures that say which addresses failed and why, in one short line:
  redis-py's ``MasterNotFoundError`` quotes every sentinel client's ``repr`` (about 1 KB of pool
  internals), and its cluster error names only the last node tried (the asyncio one is not even a
  ``ConnectionError``, so retry loops did not recognise an outage). :class:`Sentinel`,
  :class:`AsyncSentinel` and :class:`AsyncCluster` raise ``MasterNotFoundError`` /
  :class:`ClusterUnreachable` (both ``redis.ConnectionError``) with a message naming each address,
  and :class:`NotACluster` (a ConfigError) when the nodes answer but are no cluster.

:mod:`scheduler.redisio.connection` builds every client from these.
"""
from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Awaitable, Sequence
from typing import Any

import redis
import redis.asyncio.cluster as acluster
import redis.asyncio.connection as aconnection
import redis.asyncio.sentinel as asentinel
import redis.sentinel as sentinel
from redis.exceptions import RedisClusterException, ResponseError

from ..protocol.errors import ConfigError, ZschedError

Address = tuple[str, int]


def address(host: str, port: int | str) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _why(exc: BaseException) -> str:
    """What went wrong with one server, in a few words: the OS's reason when a socket failed
    (``connection refused``), rather than redis-py's message that repeats the address."""
    if isinstance(exc, redis.AuthenticationError):
        return f"refused the credentials ({exc})"
    if isinstance(exc, redis.TimeoutError | TimeoutError):
        return "did not answer in time"
    if isinstance(exc, ResponseError):
        return f"answered with an error ({str(exc).strip()})"
    seen: BaseException | None = exc
    for _ in range(5):  # redis-py raises ConnectionError while handling the OSError
        if isinstance(seen, ssl.SSLError):  # its errno is OpenSSL's, not the OS's
            detail = getattr(seen, "verify_message", None) or seen.reason or seen
            return f"failed the TLS handshake ({detail})"
        if isinstance(seen, OSError) and seen.errno:
            return os.strerror(seen.errno).lower()
        if seen is None:
            break
        seen = seen.__cause__ or seen.__context__
    return str(exc).strip() or type(exc).__name__


# ---------------------------------------------------------------------------------- TLS


class TLSConnection(redis.SSLConnection):
    """A blocking TLS connection whose TCP connect and TLS handshake together take at most
    ``socket_connect_timeout``; the socket timeout applies from the first command on."""

    def _connect(self) -> socket.socket:
        # redis-py sets the socket timeout right after the TCP connect and handshakes under it:
        # make that the connect timeout for the length of the call
        keep = self.socket_timeout
        self.socket_timeout = self.socket_connect_timeout
        try:
            sock: socket.socket = super()._connect()  # type: ignore[no-untyped-call, unused-ignore]
        except TimeoutError:
            raise redis.TimeoutError(
                f"Timeout connecting to {address(self.host, self.port)} over TLS: no TLS handshake within "
                f"{self.socket_connect_timeout:g} s; a plain-text Redis port never answers one, use redis:// "
                "for it") from None
        finally:
            self.socket_timeout = keep
        sock.settimeout(keep)
        return sock


# ----------------------------------------------------------------------------- Sentinel


def _master_label(host: str, port: int, pool: Any) -> str:
    return f"{address(host, port)} (master {pool.service_name!r}, named by the sentinels)"


class MasterConnection(sentinel.SentinelManagedConnection):
    """A blocking connection to the master the sentinels name; its errors say it is that master."""

    def _host_error(self) -> str:
        return _master_label(self.host, self.port, self.connection_pool)


class MasterTLSConnection(MasterConnection, TLSConnection):
    """:class:`MasterConnection` over TLS, handshake within the connect timeout."""


class AsyncMasterConnection(asentinel.SentinelManagedConnection):
    """An asyncio connection to the master the sentinels name; its errors say it is that master."""

    def _host_error(self) -> str:
        return _master_label(self.host, self.port, self.connection_pool)


class AsyncMasterTLSConnection(AsyncMasterConnection, aconnection.SSLConnection):
    """:class:`AsyncMasterConnection` over TLS (asyncio handshakes within the connect timeout)."""


LOOKUP_ERRORS = (redis.ConnectionError, redis.TimeoutError, ResponseError)
"""What asking one sentinel may raise, after which the next one is asked."""


class MasterLookup:
    """One master lookup over a Sentinel's sentinels, in order (what the blocking and the asyncio
    ``discover_master`` share): feed it each sentinel's answer or error; it says when a master was
    found (and puts that sentinel first for the next lookup) or, at the end, what each one said."""

    def __init__(self, owner: Any, service: str) -> None:
        self.owner = owner
        self.service = service
        self.outcomes: list[str] = []

    def failed(self, client: Any, exc: BaseException) -> None:
        """``client`` could not be asked."""
        why = f"is not a sentinel ({str(exc).strip()})" if isinstance(exc, ResponseError) else _why(exc)
        self.outcomes.append(f"{_sentinel_address(client)} {why}")

    def answered(self, client: Any, masters: dict[str, Any]) -> Address | None:
        """``client``'s SENTINEL MASTERS reply: the master's address when it names one that is up."""
        state = masters.get(self.service)
        why = _judge(self.service, state, self.owner.check_master_state)
        if why is None and state is not None:
            sentinels = self.owner.sentinels
            n = sentinels.index(client)
            sentinels[0], sentinels[n] = client, sentinels[0]
            return state["ip"], state["port"]
        self.outcomes.append(f"{_sentinel_address(client)} {why}")
        return None

    def not_found(self, cls: type[redis.ConnectionError]) -> redis.ConnectionError:
        """The error when no sentinel named a usable master (``cls``: the blocking or the asyncio
        module's MasterNotFoundError, which redis-py tells apart), one line naming each sentinel."""
        said = "; ".join(self.outcomes) or "no sentinel address"
        return cls(f"no sentinel named a usable master {self.service!r}: {said}")


def _sentinel_address(client: Any) -> str:
    kw = client.connection_pool.connection_kwargs
    return address(kw.get("host", "?"), kw.get("port", "?"))


def _judge(service: str, state: dict[str, Any] | None, check: Any) -> str | None:
    """Why a sentinel's view of ``service`` gives no master to use (None: use it)."""
    if state is None:
        return f"does not monitor a master named {service!r}"
    if check(state, service):
        return None
    where = address(str(state.get("ip")), state.get("port", "?"))
    if state.get("is_sdown") or state.get("is_odown"):
        return f"reports the master down ({where}, flags {state.get('flags', '?')})"
    if not state.get("is_master"):
        return f"reports {where} is no master now (a failover in progress?)"
    return f"sees too few other sentinels ({state.get('num-other-sentinels')}) to trust its master"


class Sentinel(sentinel.Sentinel):
    """redis-py's blocking Sentinel with a one-line, per-sentinel error when no master is found,
    and TLS sentinels whose handshake fits the connect timeout."""

    def __init__(self, sentinels: Sequence[Address], *, tls: bool, sentinel_kwargs: dict[str, Any],
                 **connection_kwargs: Any) -> None:
        super().__init__(list(sentinels), sentinel_kwargs=sentinel_kwargs, **connection_kwargs)  # type: ignore[no-untyped-call, unused-ignore]
        if tls:  # redis.Redis(ssl=True) would pick redis-py's own TLS connection class
            kw = {k: v for k, v in sentinel_kwargs.items() if k != "ssl"}
            self.sentinels = [redis.Redis(connection_pool=redis.ConnectionPool(
                connection_class=TLSConnection, host=h, port=p, **kw)) for h, p in sentinels]

    def discover_master(self, service_name: str) -> Address:
        """The master's address from the first sentinel that names one that is up (that sentinel
        is asked first next time); MasterNotFoundError saying what each sentinel answered."""
        lookup = MasterLookup(self, service_name)
        for client in list(self.sentinels):
            try:
                found = lookup.answered(client, client.sentinel_masters())  # type: ignore[arg-type]
            except LOOKUP_ERRORS as exc:
                lookup.failed(client, exc)
                continue
            if found is not None:
                return found
        raise lookup.not_found(sentinel.MasterNotFoundError)


class AsyncSentinel(asentinel.Sentinel):
    """redis-py's asyncio Sentinel with a one-line, per-sentinel error when no master is found."""

    async def discover_master(self, service_name: str) -> Address:
        """As :meth:`Sentinel.discover_master`."""
        lookup = MasterLookup(self, service_name)
        for client in list(self.sentinels):
            try:
                masters = await client.sentinel_masters()
            except LOOKUP_ERRORS as exc:
                lookup.failed(client, exc)
                continue
            if (found := lookup.answered(client, masters)) is not None:  # type: ignore[arg-type]
                return found
        raise lookup.not_found(asentinel.MasterNotFoundError)


# ------------------------------------------------------------------------------ Cluster


class ClusterUnreachable(ZschedError, redis.ConnectionError):
    """No node of a Redis Cluster could be reached: the message lists the nodes tried. A
    ConnectionError, so the callers' outage handling (retries, ``zsched`` exit 3) applies."""


class NotACluster(ConfigError):
    """The nodes of a ``redis+cluster://`` URL answer, but are not in cluster mode: the URL is wrong."""


def cluster_failure(nodes: Sequence[Address], exc: RedisClusterException) -> Exception:
    """What redis-py's "Redis Cluster cannot be connected" (not even a RedisError) means, naming the
    nodes: ClusterUnreachable when none answered, NotACluster when they answered as plain servers, a
    ResponseError when they refused CLUSTER SLOTS (e.g. NOPERM); ``exc`` itself for anything else
    (e.g. slots not covered in the middle of a failover, which callers already handle as it is)."""
    tried = ", ".join(address(h, p) for h, p in nodes)
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 6:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    refused = next((e for e in chain if isinstance(e, ResponseError)), None)  # the answer to CLUSTER SLOTS
    if refused is not None and "cluster support disabled" in str(refused):
        return NotACluster(f"the Redis at {tried} is not in cluster mode ('cluster-enabled no'): use "
                           "redis://host:port for a single server, or name the cluster's nodes in "
                           "redis+cluster:// (set --redis or ZSCHED_REDIS_URL)")
    if refused is not None:  # e.g. NOPERM: an ACL user that may not run CLUSTER SLOTS
        return ResponseError(f"Redis Cluster at {tried} refused CLUSTER SLOTS: {refused}")
    cause = next((e for e in chain[1:] if isinstance(e, OSError | redis.ConnectionError | redis.TimeoutError)), None)
    if cause is None:
        return exc
    return ClusterUnreachable(f"no node of the cluster answered (tried {tried}; the last one "
                              f"{_why(cause)})")


class AsyncCluster(acluster.RedisCluster):
    """redis-py's asyncio RedisCluster whose start-up failure names the nodes tried and is a
    ConnectionError (:class:`ClusterUnreachable`) or a :class:`NotACluster`, as the blocking one's."""

    def __init__(self, nodes: Sequence[Address], **kwargs: Any) -> None:
        super().__init__(startup_nodes=[acluster.ClusterNode(h, p) for h, p in nodes], **kwargs)
        self.start_nodes = tuple(nodes)
        self._options = dict(kwargs)

    def another(self) -> AsyncCluster:
        """A new client of the same cluster with the same options, sharing no node or connection
        with this one (it reads the slot map on first use)."""
        return AsyncCluster(self.start_nodes, **self._options)

    async def initialize(self, *args: Any, **kwargs: Any) -> AsyncCluster:
        """Read the slot map (on first use, and again after a topology change)."""
        await self._named_failures(super().initialize(*args, **kwargs))
        return self

    async def read_slot_map(self) -> None:
        """Read the slot map only, for a transport that routes its calls itself. Unlike
        :meth:`initialize` it does not ask one node for its command table (``COMMAND``), so a
        master that is down (which redis-py may pick for that) does not fail it; the start-up
        nodes that answer are enough."""
        await self._named_failures(self.nodes_manager.initialize())

    async def _named_failures(self, start: Awaitable[Any]) -> None:
        try:
            await start
        except RedisClusterException as exc:
            failure = cluster_failure(self.start_nodes, exc)
            if failure is exc:
                raise
            raise failure from exc

