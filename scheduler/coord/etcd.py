"""Small async interface to etcd v3 used by zsched for partition ownership.

Scheduler replicas own Redis partitions by holding an etcd key that is attached
to their lease.  Everything the rest of the code base needs from etcd goes
through :class:`Coordinator`; :class:`EtcdCoordinator` is the implementation on
top of the PyPI package ``etcd3aio`` (asyncio + ``grpc.aio``).  No other module
imports ``etcd3aio``, so the client library can be swapped (e.g. for ``aetcd``)
by writing another class that satisfies :class:`Coordinator`.  See
``docs/etcd.md``.

Design rules, and why:

* **Every call has a deadline** (the ``timeout`` given to
  :meth:`EtcdCoordinator.from_endpoints`, overridable per call).  Inside that
  deadline transient failures (``UNAVAILABLE``, connection refused, leader
  election in progress) are retried with a short backoff; when it runs out the
  call raises :class:`CoordinatorUnavailable`.  A scheduler that hangs on etcd
  cannot notice that its lease is about to expire, so no call may block
  forever.
* **Failover** between cluster members is done by gRPC's ``round_robin``
  load-balancing policy, which is what etcd3aio configures when it is given
  several endpoints: a dead member's sub-channel goes to TRANSIENT_FAILURE and
  retried calls are sent to the remaining members.
* **Ambiguous writes are resolved, not guessed**: a write whose reply was lost
  may still have been applied.  :meth:`EtcdCoordinator.claim_if_absent` reads
  the key back in the same transaction, so a retry that finds the key attached
  to *our own* lease returns our claim instead of reporting it as taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import os
import socket
import ssl
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar, cast, runtime_checkable
from urllib.parse import unquote, urlsplit

import grpc
import grpc.aio
from etcd3aio import (
    Etcd3Client,
    EtcdConnectionError,
    EtcdError,
    EtcdPermissionDeniedError,
    EtcdTransientError,
    EtcdUnauthenticatedError,
    prefix_range_end,
)

from ..protocol.connection import mask_url

__all__ = [
    "KV",
    "CoordinationError",
    "Coordinator",
    "CoordinatorUnavailable",
    "EtcdCoordinator",
    "LeaseLost",
    "WatchCompacted",
    "WatchEvent",
    "parse_endpoints",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PORT = 2379
_ENV_HINT = (
    "Check that etcd is running and reachable, and that ZSCHED_ETCD_ENDPOINTS "
    "lists its client URLs (e.g. 'http://127.0.0.1:2379' or "
    "'127.0.0.1:2379,127.0.0.1:22379')."
)
# etcd mvccpb.Event.EventType values.
_EVENT_PUT = 0
_EVENT_DELETE = 1
# Backoff between retries of one call (seconds).  Small, because the whole
# retry loop is bounded by the call's deadline anyway.
_RETRY_BACKOFF_START = 0.05
_RETRY_BACKOFF_MAX = 0.5
# Backoff between watch re-establishment attempts (seconds).
_WATCH_BACKOFF_START = 0.1
_WATCH_BACKOFF_MAX = 1.0
# gRPC re-dials a dead server with an exponential backoff that grows to 120 s
# by default, so after a long etcd outage the client would stay disconnected
# for up to two minutes after etcd is back.  Cap it at 1 s.
_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# Sent as gRPC metadata on every call: a member that has lost its leader
# (e.g. it is partitioned away from the quorum) then rejects the call at once
# with UNAVAILABLE ("no leader") and cancels watch streams, instead of letting
# linearizable requests hang until the deadline and watches go silent.  The
# call is then retried on another member.  Same as clientv3.WithRequireLeader.
_REQUIRE_LEADER: tuple[str, str] = ("hasleader", "true")
_TRANSIENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


# --------------------------------------------------------------------------- errors


class CoordinationError(Exception):
    """Base class of every error raised by a :class:`Coordinator`."""


class LeaseLost(CoordinationError):
    """The lease no longer exists (expired or revoked).

    Everything attached to it is gone; the holder must stop acting as owner.
    """

    def __init__(self, lease_id: int, detail: str = "") -> None:
        self.lease_id = lease_id
        msg = f"etcd lease {lease_id:#x} is gone (expired or revoked)"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class WatchCompacted(CoordinationError):
    """A watch cannot resume because etcd compacted the history it needs.

    Events between ``revision`` and ``compact_revision`` are lost for good.
    Re-read the current state with :meth:`Coordinator.get_prefix` and start a
    new watch from the revision it returns + 1.
    """

    def __init__(self, revision: int, compact_revision: int = 0) -> None:
        self.revision = revision
        self.compact_revision = compact_revision
        super().__init__(
            f"cannot watch from revision {revision}: etcd has compacted its history up to "
            f"revision {compact_revision}; re-read the prefix with get_prefix() and "
            f"restart the watch from the returned revision + 1"
        )


class CoordinatorUnavailable(CoordinationError):
    """etcd could not be reached (or had no quorum) within the call's deadline."""


# --------------------------------------------------------------------------- data


@dataclass(frozen=True)
class KV:
    """One key as stored in etcd.

    ``create_revision`` is the cluster revision at which this incarnation of
    the key was created.  It never changes while the key exists and a key
    re-created after a delete always gets a larger one, so zsched uses it as
    the *fencing epoch* of a partition claim.  ``lease`` is 0 for keys without
    a lease.
    """

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class WatchEvent:
    """A change under a watched prefix.

    For ``kind == "delete"`` (explicit delete or lease expiry/revoke) etcd only
    reports the key and the revision of the delete: ``value`` is ``b""`` and
    ``create_revision`` is 0; ``mod_revision`` is the revision of the delete.
    """

    kind: Literal["put", "delete"]
    key: str
    value: bytes
    create_revision: int
    mod_revision: int


# --------------------------------------------------------------------------- interface


@runtime_checkable
class Coordinator(Protocol):
    """What zsched needs from a coordination service (etcd v3 semantics).

    Implementations must give every call a deadline and raise
    :class:`CoordinatorUnavailable` when it passes, :class:`LeaseLost` when a
    lease is gone, and :class:`WatchCompacted` from :meth:`watch_prefix` when
    the requested history is no longer available.
    """

    async def connect(self) -> None:
        """Open connections (idempotent)."""
        ...

    async def close(self) -> None:
        """Close connections; the object may be connected again."""
        ...

    async def grant(self, ttl: float, *, timeout: float | None = None) -> int:
        """Create a lease of at least ``ttl`` seconds and return its id."""
        ...

    async def keepalive_once(self, lease_id: int, *, timeout: float | None = None) -> float:
        """Refresh the lease; return the TTL granted, raise LeaseLost if it is gone."""
        ...

    async def revoke(self, lease_id: int, *, timeout: float | None = None) -> None:
        """Revoke the lease and delete its keys; unknown leases are fine."""
        ...

    async def put(
        self, key: str, value: bytes, lease: int | None = None, *, timeout: float | None = None
    ) -> int:
        """Write ``key`` (optionally attached to ``lease``); return the revision."""
        ...

    async def claim_if_absent(
        self, key: str, value: bytes, lease: int, *, timeout: float | None = None
    ) -> KV | None:
        """Create ``key`` with ``lease`` if it does not exist; None if it does."""
        ...

    async def delete_if(self, key: str, create_revision: int, *, timeout: float | None = None) -> bool:
        """Delete ``key`` only if its create_revision still matches."""
        ...

    async def get(self, key: str, *, timeout: float | None = None) -> KV | None:
        """Read one key (linearizable)."""
        ...

    async def get_prefix(self, prefix: str, *, timeout: float | None = None) -> tuple[list[KV], int]:
        """Read all keys under ``prefix`` plus the revision the read was made at."""
        ...

    def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[WatchEvent]:
        """Yield every change under ``prefix`` from ``start_revision`` on."""
        ...


# --------------------------------------------------------------------------- endpoints


@dataclass(frozen=True)
class _Endpoint:
    host: str  # IPv4 literal or DNS name (resolved at connect time)
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class _ParsedEndpoints:
    endpoints: tuple[_Endpoint, ...]
    tls: bool
    user: str | None
    password: str | None


def parse_endpoints(endpoints: str | Sequence[str]) -> _ParsedEndpoints:
    """Parse ``"h:p,h:p"``, ``"https://h:p"``, ``"http://user:pw@h:p"`` forms.

    A missing scheme means plain ``http``; a missing port means 2379.  All
    endpoints must use the same scheme and the same credentials.  Raises
    ``ValueError`` with the offending item on malformed input.
    """
    items = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    raw = [part.strip() for item in items for part in item.split(",")]
    raw = [r for r in raw if r]
    if not raw:
        raise ValueError("no etcd endpoints given (set ZSCHED_ETCD_ENDPOINTS, e.g. '127.0.0.1:2379')")
    def _masked(item: str) -> str:  # error messages must not carry the password
        return mask_url(item) if "://" in item else mask_url("http://" + item).split("://", 1)[1]

    schemes: set[str] = set()
    creds: set[tuple[str | None, str | None]] = set()
    out: list[_Endpoint] = []
    for item in raw:
        if "://" in item:
            parts = urlsplit(item)
            scheme = parts.scheme.lower()
        else:
            parts = urlsplit("//" + item)
            scheme = "http"
        if scheme not in ("http", "https"):
            raise ValueError(f"etcd endpoint {_masked(item)!r}: scheme must be http or https")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"etcd endpoint {_masked(item)!r}: expected [scheme://][user:password@]host[:port]")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError as exc:
            raise ValueError(f"etcd endpoint {_masked(item)!r}: bad port") from exc
        host = parts.hostname
        if not host:
            raise ValueError(f"etcd endpoint {_masked(item)!r}: missing host")
        if host == "localhost":
            host = "127.0.0.1"  # etcd3aio dials with the ipv4: scheme
        if _is_ipv6(host):
            raise ValueError(f"etcd endpoint {_masked(item)!r}: IPv6 addresses are not supported by the etcd3aio backend")
        schemes.add(scheme)
        user = unquote(parts.username) if parts.username is not None else None
        password = unquote(parts.password) if parts.password is not None else None
        if user is not None or password is not None:
            creds.add((user, password))
        ep = _Endpoint(host, port)
        if ep not in out:
            out.append(ep)
    if len(schemes) > 1:
        raise ValueError("etcd endpoints mix http:// and https://; use one scheme for all members")
    if len(creds) > 1:
        raise ValueError("etcd endpoints carry different user:password@ credentials")
    user, password = creds.pop() if creds else (None, None)
    return _ParsedEndpoints(tuple(out), schemes.pop() == "https", user, password)


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False


def _load_pem(value: bytes | str | os.PathLike[str] | None, what: str) -> bytes | None:
    """Accept PEM bytes, PEM text or a path to a PEM file."""
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        return value.encode()
    path = Path(value)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read etcd {what} from {path}: {exc}") from exc


def _system_ca_bundle() -> bytes:
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return Path(candidate).read_bytes()
    raise ValueError("https etcd endpoint given but no ca_cert and no system CA bundle was found")


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "none"
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    if isinstance(exc, TimeoutError):
        return "no answer before the deadline"
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def _grpc_cause(exc: BaseException) -> grpc.aio.AioRpcError | None:
    """The AioRpcError behind an etcd3aio exception (they chain it as __cause__)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, grpc.aio.AioRpcError):
            return seen
        seen = seen.__cause__
    return None


def _kv_from_pb(kv: object) -> KV:
    return KV(
        key=bytes(kv.key).decode("utf-8", "surrogateescape"),  # type: ignore[attr-defined]
        value=bytes(kv.value),  # type: ignore[attr-defined]
        create_revision=int(kv.create_revision),  # type: ignore[attr-defined]
        mod_revision=int(kv.mod_revision),  # type: ignore[attr-defined]
        lease=int(kv.lease),  # type: ignore[attr-defined]
    )


def _key(key: str) -> bytes:
    return key.encode("utf-8", "surrogateescape")


# --------------------------------------------------------------------------- etcd3aio backend


class EtcdCoordinator:
    """:class:`Coordinator` backed by etcd3aio.

    Build it with :meth:`from_endpoints`, then ``await connect()`` (or use it as
    an async context manager).
    """

    def __init__(
        self,
        endpoints: Sequence[_Endpoint],
        *,
        tls: bool = False,
        timeout: float = 2.0,
        user: str | None = None,
        password: str | None = None,
        ca_cert: bytes | None = None,
        cert_key: bytes | None = None,
        cert_cert: bytes | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint is required")
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        if (cert_key is None) != (cert_cert is None):
            raise ValueError("cert_key and cert_cert must be given together (client certificate auth)")
        if user is not None and password is None:
            raise ValueError("etcd user given without password")
        self._endpoints = tuple(endpoints)
        self._tls = tls or ca_cert is not None
        self._timeout = timeout
        self._user = user
        self._password = password
        self._ca_cert = ca_cert
        self._cert_key = cert_key
        self._cert_cert = cert_cert
        self._tls_server_name = tls_server_name
        self._client: Etcd3Client | None = None
        self._token: str | None = None
        self._connect_lock = asyncio.Lock()
        self._closed = False

    @classmethod
    def from_endpoints(
        cls,
        endpoints: str | Sequence[str],
        *,
        timeout: float = 2.0,
        user: str | None = None,
        password: str | None = None,
        ca_cert: bytes | str | os.PathLike[str] | None = None,
        cert_key: bytes | str | os.PathLike[str] | None = None,
        cert_cert: bytes | str | os.PathLike[str] | None = None,
        tls_server_name: str | None = None,
    ) -> EtcdCoordinator:
        """Build a coordinator from an endpoint list such as ZSCHED_ETCD_ENDPOINTS.

        ``endpoints`` is a comma-separated string or a sequence of
        ``[http[s]://][user:password@]host[:port]`` items; several items are
        members of one cluster and calls fail over between them.  ``user`` /
        ``password`` override credentials embedded in the URLs.  ``https``
        (or a ``ca_cert``) enables TLS; without ``ca_cert`` the system CA
        bundle is used.  ``ca_cert``/``cert_key``/``cert_cert`` are PEM bytes
        or file paths; ``cert_key`` + ``cert_cert`` enable client-certificate
        auth.  ``timeout`` is the default deadline of every call, in seconds.
        """
        parsed = parse_endpoints(endpoints)
        ca = _load_pem(ca_cert, "ca_cert")
        if parsed.tls and ca is None:
            ca = _system_ca_bundle()
        return cls(
            parsed.endpoints,
            tls=parsed.tls,
            timeout=timeout,
            user=user if user is not None else parsed.user,
            password=password if password is not None else parsed.password,
            ca_cert=ca,
            cert_key=_load_pem(cert_key, "cert_key"),
            cert_cert=_load_pem(cert_cert, "cert_cert"),
            tls_server_name=tls_server_name,
        )

    # ------------------------------------------------------------------ lifecycle

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The configured members as ``host:port`` (no credentials)."""
        return tuple(str(e) for e in self._endpoints)

    @property
    def default_timeout(self) -> float:
        return self._timeout

    def __repr__(self) -> str:
        scheme = "https" if self._tls else "http"
        return f"EtcdCoordinator({scheme}://{','.join(self.endpoints)}, timeout={self._timeout})"

    async def connect(self, *, verify: bool = True, timeout: float | None = None) -> None:
        """Create the gRPC channel, log in if credentials were given.

        With ``verify`` (default) one round-trip to etcd is made so that a
        wrong ZSCHED_ETCD_ENDPOINTS fails here, at start-up, with
        :class:`CoordinatorUnavailable` instead of at the first real call.
        Idempotent.
        """
        async with self._connect_lock:
            if self._client is not None:
                return
            self._closed = False
            budget = self._timeout if timeout is None else timeout
            targets, server_name = await self._resolve(budget)
            client = Etcd3Client(
                targets,
                # This class retries itself, bounded by the call's deadline.
                rpc_max_attempts=1,
                watch_reconnect_backoff_seconds=_WATCH_BACKOFF_START,
                watch_max_reconnect_backoff_seconds=_WATCH_BACKOFF_MAX,
                tls_server_name=self._tls_server_name or server_name,
                # etcd3aio uses TLS iff ca_cert is given.
                ca_cert=self._ca_cert if self._tls else None,
                cert_key=self._cert_key if self._tls else None,
                cert_chain=self._cert_cert if self._tls else None,
            )
            _tune_channel(client)
            await client.connect()
            self._client = client
            self._install_metadata()
            try:
                if self._user is not None:
                    await self._authenticate(budget)
                if verify:
                    await self._call("connect", self._ping, timeout)
            except BaseException:
                self._client = None
                await client.close()
                raise
            log.debug("connected to etcd %s", self)

    async def close(self) -> None:
        """Close the channel.  Running :meth:`watch_prefix` iterators end with
        :class:`CoordinationError`; cancel them first for a quiet shutdown."""
        async with self._connect_lock:
            self._closed = True
            client, self._client = self._client, None
            if client is not None:
                await client.close()

    async def __aenter__(self) -> EtcdCoordinator:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------------ leases

    async def grant(self, ttl: float, *, timeout: float | None = None) -> int:
        """Create a lease and return its id.

        etcd TTLs are whole seconds, so ``ttl`` is rounded up.  etcd may grant
        more than asked: it enforces a minimum of 1.5 election timeouts
        (2 s with default settings); :meth:`keepalive_once` returns the real TTL.
        """
        seconds = max(1, math.ceil(ttl))

        async def op(c: Etcd3Client, t: float) -> int:
            assert c.lease is not None
            resp = await c.lease.grant(seconds, timeout=t)
            return int(resp.ID)

        return await self._call("grant", op, timeout)

    async def keepalive_once(self, lease_id: int, *, timeout: float | None = None) -> float:
        """Refresh ``lease_id`` once and return the TTL etcd granted, in seconds.

        Raises :class:`LeaseLost` when etcd answers TTL <= 0 (the lease expired
        or was revoked).  The caller drives the cadence (typically TTL/3) so
        that it, not a hidden background task, knows when refreshes stopped
        succeeding.
        """

        async def op(c: Etcd3Client, t: float) -> int:
            assert c.lease is not None
            # etcd3aio exposes only the raw bidi stream: send one request,
            # read one response, cancel the stream.
            call = c.lease.keep_alive(lease_id)
            try:
                async for resp in call:
                    return int(resp.TTL)
                raise EtcdTransientError("lease keepalive stream closed without a response")
            finally:
                call.cancel()

        ttl = await self._call("keepalive", op, timeout)
        if ttl <= 0:
            raise LeaseLost(lease_id, "keepalive answered TTL <= 0")
        return float(ttl)

    async def revoke(self, lease_id: int, *, timeout: float | None = None) -> None:
        """Revoke ``lease_id``; etcd deletes its keys in the same revision.

        Idempotent: an unknown or already expired lease is not an error.
        """

        async def op(c: Etcd3Client, t: float) -> None:
            assert c.lease is not None
            await c.lease.revoke(lease_id, timeout=t)

        with contextlib.suppress(LeaseLost):
            await self._call("revoke", op, timeout)

    # ------------------------------------------------------------------ kv

    async def put(self, key: str, value: bytes, lease: int | None = None, *, timeout: float | None = None) -> int:
        """Write ``key``; return the revision of the write.

        Raises :class:`LeaseLost` if ``lease`` does not exist (etcd refuses to
        attach a key to a dead lease).
        """

        async def op(c: Etcd3Client, t: float) -> int:
            assert c.kv is not None
            resp = await c.kv.put(_key(key), value, lease=lease or 0, timeout=t)
            return int(resp.header.revision)

        return await self._call("put", op, timeout, lease=lease)

    async def claim_if_absent(
        self, key: str, value: bytes, lease: int, *, timeout: float | None = None
    ) -> KV | None:
        """Create ``key`` attached to ``lease`` unless it exists; one transaction.

        ``If(create_revision(key) == 0) Then(put key value lease) Else(get key)``.

        Returns the new :class:`KV`.  Its ``create_revision`` is the revision
        of this transaction, which is exactly the create_revision etcd stores
        for the key; zsched uses it as the partition's *fencing epoch*: it is
        unique per claim and strictly increases across successive claims of the
        same key, so writes fenced with an older epoch can be rejected.

        Returns ``None`` if the key exists and belongs to someone else.  If it
        exists attached to *this* ``lease``, it is our own claim (e.g. the reply
        of an earlier attempt was lost and the attempt was retried, or the
        caller asked twice) and it is returned as is, with its original
        create_revision, rather than reported as taken: otherwise the owner
        would keep refreshing a lease that guards a partition it believes
        someone else owns.

        Raises :class:`LeaseLost` if ``lease`` no longer exists, and
        ``ValueError`` if ``lease`` is not a lease id (0 / None): a claim
        without a lease would never expire, so its owner could never be
        replaced.
        """
        if not isinstance(lease, int) or lease <= 0:
            raise ValueError(f"claim_if_absent needs a lease id from grant(), got {lease!r}")
        k = _key(key)

        async def op(c: Etcd3Client, t: float) -> KV | None:
            kv = c.kv
            assert kv is not None
            resp = await kv.txn(
                compare=[kv.txn_compare_create_revision(k, 0)],
                success=[kv.txn_op_put(k, value, lease=lease)],
                failure=[kv.txn_op_get(k)],
                timeout=t,
            )
            if resp.succeeded:
                rev = int(resp.header.revision)
                return KV(key=key, value=value, create_revision=rev, mod_revision=rev, lease=lease)
            ranged = resp.responses[0].response_range.kvs
            if ranged and int(ranged[0].lease) == lease:
                return _kv_from_pb(ranged[0])
            return None  # held by another lease (the Else-get is atomic with the compare)

        return await self._call("claim_if_absent", op, timeout, lease=lease)

    async def delete_if(self, key: str, create_revision: int, *, timeout: float | None = None) -> bool:
        """Delete ``key`` only if it still has ``create_revision``; one transaction.

        Used to give up a claim without deleting a newer owner's key (same
        name, newer epoch).  Returns ``True`` if this call deleted it.  After an
        ambiguous failure that was retried it may return ``False`` although an
        earlier attempt deleted the key; either way the claim is gone.
        """
        k = _key(key)

        async def op(c: Etcd3Client, t: float) -> bool:
            kv = c.kv
            assert kv is not None
            resp = await kv.txn(
                compare=[kv.txn_compare_create_revision(k, create_revision)],
                success=[kv.txn_op_delete(k)],
                failure=[],
                timeout=t,
            )
            return bool(resp.succeeded)

        return await self._call("delete_if", op, timeout)

    async def get(self, key: str, *, timeout: float | None = None) -> KV | None:
        """Linearizable read of one key; ``None`` if absent."""

        async def op(c: Etcd3Client, t: float) -> KV | None:
            assert c.kv is not None
            resp = await c.kv.get(_key(key), timeout=t)
            return _kv_from_pb(resp.kvs[0]) if resp.kvs else None

        return await self._call("get", op, timeout)

    async def get_prefix(self, prefix: str, *, timeout: float | None = None) -> tuple[list[KV], int]:
        """Linearizable read of every key under ``prefix`` (sorted by key).

        Also returns the header revision of the read: the state returned is
        the state at that revision, so ``watch_prefix(prefix, revision + 1)``
        continues without gap or overlap.
        """
        p = _key(prefix)

        async def op(c: Etcd3Client, t: float) -> tuple[list[KV], int]:
            assert c.kv is not None
            resp = await c.kv.get(p, range_end=prefix_range_end(p), timeout=t)
            return [_kv_from_pb(kv) for kv in resp.kvs], int(resp.header.revision)

        return await self._call("get_prefix", op, timeout)

    # ------------------------------------------------------------------ watch

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        """Yield every change under ``prefix`` from ``start_revision`` on, in order.

        The stream survives broken connections, member failures and etcd
        restarts: it is re-established (through any configured member) from
        the revision after the last event it yielded, so no event is lost or
        repeated.  It never ends by itself; it raises :class:`WatchCompacted`
        when the needed revision was compacted (re-read with
        :meth:`get_prefix`, then watch again), and :class:`CoordinationError`
        after :meth:`close` or on a permanent error (e.g. permission denied).
        Cancelling the consuming task (or ``aclose()``) closes the gRPC stream.

        Why not simply rely on etcd3aio's own reconnect: it resumes from the
        response *header* revision, which is the store's current revision, not
        the last delivered event.  If the stream breaks after the "created"
        reply but before the historical events, or while catching up more than
        1000 revisions, those events are skipped.  So this loop remembers the
        last yielded event and restarts the watch itself whenever etcd3aio's
        stream has been re-created.
        """
        next_rev = start_revision
        p = _key(prefix)
        end = prefix_range_end(p)
        backoff = _WATCH_BACKOFF_START
        relogged = False
        while True:
            client = self._client
            if client is None or client.watch is None:
                raise CoordinationError(
                    "EtcdCoordinator is closed" if self._closed else "EtcdCoordinator.connect() was not called"
                )
            stream_start = next_rev
            # Typed as AsyncIterator by etcd3aio; it is an async generator.
            stream = cast(
                AsyncGenerator[Any, None],
                client.watch.watch(p, end, start_revision=stream_start, progress_notify=True),
            )
            created = False
            try:
                async for resp in stream:
                    if resp.compact_revision > 0:
                        raise WatchCompacted(next_rev, int(resp.compact_revision))
                    if resp.canceled:
                        # Refused at creation ("created" and "canceled" both set)
                        # or cancelled later.  With auth, the usual cause is an
                        # expired token (etcd reports it this way, not as a
                        # gRPC error): log in again once and re-create the stream.
                        if self._user is not None and not relogged:
                            relogged = True
                            log.info("etcd refused the watch on %r (%s); logging in again", prefix, resp.cancel_reason)
                            try:
                                await self._authenticate(self._timeout)
                            except CoordinatorUnavailable:
                                relogged = False  # could not even try; do it on the next refusal
                            break
                        raise CoordinationError(f"etcd cancelled the watch on {prefix!r}: {resp.cancel_reason}")
                    if resp.created:
                        if created:
                            # etcd3aio reconnected internally from *its* idea of
                            # the revision; restart from ours (see docstring).
                            log.debug("etcd watch on %r reconnected; resuming from revision %d", prefix, next_rev)
                            break
                        created = True
                        relogged = False
                        continue
                    backoff = _WATCH_BACKOFF_START
                    if not resp.events:
                        # Progress notification: only sent to watchers that are
                        # caught up, so everything up to header.revision has
                        # been delivered.  Advancing keeps a quiet prefix from
                        # failing with WatchCompacted on its next reconnect.
                        next_rev = max(next_rev, int(resp.header.revision) + 1)
                        continue
                    for ev in resp.events:
                        rev = int(ev.kv.mod_revision)
                        if rev < stream_start:
                            continue
                        next_rev = rev + 1
                        yield WatchEvent(
                            kind="delete" if ev.type == _EVENT_DELETE else "put",
                            key=bytes(ev.kv.key).decode("utf-8", "surrogateescape"),
                            value=bytes(ev.kv.value),
                            create_revision=int(ev.kv.create_revision),
                            mod_revision=rev,
                        )
                else:
                    log.info("etcd watch stream on %r ended; re-establishing from revision %d", prefix, next_rev)
            except asyncio.CancelledError:
                if _really_cancelled():
                    raise
                # grpc.aio raises CancelledError (not AioRpcError) from a call
                # that was cancelled under us, e.g. because close() closed
                # the channel.  This task was not cancelled: keep going.
                if self._client is None:
                    raise CoordinationError("EtcdCoordinator was closed while watching") from None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _WATCH_BACKOFF_MAX)
            except (grpc.aio.AioRpcError, EtcdError) as exc:
                if self._client is not client:
                    if self._client is None:
                        raise CoordinationError("EtcdCoordinator was closed while watching") from exc
                    continue  # reconnected: restart on the new channel
                cause = _grpc_cause(exc)
                code = cause.code() if cause is not None else None
                if code not in _TRANSIENT_CODES and code not in (
                    grpc.StatusCode.CANCELLED,
                    grpc.StatusCode.UNKNOWN,
                    grpc.StatusCode.INTERNAL,
                    None,
                ):
                    raise CoordinationError(f"etcd watch on {prefix!r} failed: {_describe(exc)}") from exc
                log.warning(
                    "etcd watch on %r broke (%s); resuming from revision %d in %.2fs",
                    prefix,
                    _describe(exc),
                    next_rev,
                    backoff,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, _WATCH_BACKOFF_MAX)
            finally:
                await stream.aclose()  # cancels the gRPC call

    # ------------------------------------------------------------------ internals

    async def _resolve(self, budget: float) -> tuple[list[str], str | None]:
        """Turn endpoints into ``ip:port`` targets (etcd3aio dials ``ipv4:``)."""
        loop = asyncio.get_running_loop()
        targets: list[str] = []
        server_name: str | None = None
        for ep in self._endpoints:
            try:
                ipaddress.IPv4Address(ep.host)
            except ValueError:
                pass
            else:
                targets.append(f"{ep.host}:{ep.port}")
                continue
            server_name = server_name or ep.host  # TLS: verify the certificate against the DNS name
            try:
                async with asyncio.timeout(budget):
                    infos = await loop.getaddrinfo(ep.host, ep.port, family=socket.AF_INET, type=socket.SOCK_STREAM)
            except (OSError, TimeoutError) as exc:
                raise CoordinatorUnavailable(
                    f"cannot resolve etcd endpoint {ep}: {exc or 'timeout'}. {_ENV_HINT}"
                ) from exc
            for info in infos:
                target = f"{info[4][0]}:{ep.port}"
                if target not in targets:
                    targets.append(target)
        return targets, server_name

    def _install_metadata(self) -> None:
        """Attach auth token + require-leader metadata to every etcd3aio service.

        etcd3aio's public API only lets us set the token (``set_token``); the
        require-leader header is added to its per-service ``_metadata`` tuple.
        If a future etcd3aio renames that attribute we silently fall back to
        the token only (calls still work; a leaderless member just answers
        slower).
        """
        client = self._client
        if client is None:
            return
        client.set_token(self._token)
        metadata = ((("token", self._token),) if self._token else ()) + (_REQUIRE_LEADER,)
        for svc in (client.auth, client.cluster, client.kv, client.lease, client.maintenance, client.watch):
            if svc is not None and isinstance(getattr(svc, "_metadata", None), tuple):
                svc._metadata = metadata  # noqa: SLF001

    async def _authenticate(self, budget: float) -> None:
        client = self._client
        assert client is not None and client.auth is not None
        assert self._user is not None and self._password is not None
        # etcd validates a token sent along with Authenticate too, so an
        # expired one would make the login itself fail.  Drop it from the auth
        # service only: concurrent calls keep using the old token (and log in
        # again themselves if it is invalid) instead of going out with none.
        client.auth.set_token(None)
        try:
            async with asyncio.timeout(budget):
                resp = await client.auth.authenticate(self._user, self._password, timeout=budget)
        except grpc.aio.AioRpcError as exc:
            # A wrong password is INVALID_ARGUMENT ("authentication failed,
            # invalid user ID or password"), which etcd3aio passes through raw.
            if exc.code() in _TRANSIENT_CODES:
                raise self._unavailable("authenticate", budget, exc) from exc
            raise CoordinationError(
                f"etcd rejected user {self._user!r}: {_describe(exc)}; check the credentials in "
                f"ZSCHED_ETCD_ENDPOINTS (http://user:password@host:port) and that auth is enabled"
            ) from exc
        except (EtcdUnauthenticatedError, EtcdPermissionDeniedError) as exc:
            raise CoordinationError(
                f"etcd rejected user {self._user!r}: {_describe(exc)}; check the credentials in "
                f"ZSCHED_ETCD_ENDPOINTS (http://user:password@host:port) and that auth is enabled"
            ) from exc
        except (EtcdConnectionError, EtcdTransientError, TimeoutError) as exc:
            raise self._unavailable("authenticate", budget, exc) from exc
        self._token = resp.token
        self._install_metadata()

    @staticmethod
    async def _ping(c: Etcd3Client, t: float) -> None:
        assert c.maintenance is not None
        try:
            await c.maintenance.status(timeout=t)
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _TRANSIENT_CODES:
                raise
        except (EtcdUnauthenticatedError, EtcdPermissionDeniedError):
            pass  # the server answered: it is reachable

    def _unavailable(self, op: str, budget: float, exc: BaseException | None) -> CoordinatorUnavailable:
        return CoordinatorUnavailable(
            f"etcd unavailable: {op} did not succeed within {budget:g}s "
            f"(endpoints: {', '.join(self.endpoints)}; last error: {_describe(exc)}). {_ENV_HINT}"
        )

    async def _call(
        self,
        op_name: str,
        op: Callable[[Etcd3Client, float], Awaitable[T]],
        timeout: float | None,
        *,
        lease: int | None = None,
    ) -> T:
        """Run ``op`` with retries on transient errors, bounded by the deadline.

        Retries go through gRPC's round_robin picker, i.e. to the next healthy
        member.  Error mapping: UNAVAILABLE / DEADLINE_EXCEEDED / deadline ->
        :class:`CoordinatorUnavailable`; "lease not found" -> :class:`LeaseLost`;
        an expired auth token -> re-login once; anything else ->
        :class:`CoordinationError`.
        """
        budget = self._timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        backoff = _RETRY_BACKOFF_START
        last: BaseException | None = None
        relogged = False
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self._unavailable(op_name, budget, last) from last
            client = self._client
            if client is None:
                raise CoordinationError(
                    f"etcd {op_name}: EtcdCoordinator is "
                    + ("closed" if self._closed else "not connected (call connect() first)")
                )
            try:
                async with asyncio.timeout(remaining):
                    return await op(client, remaining)
            except asyncio.CancelledError as exc:
                if _really_cancelled():
                    raise
                # grpc.aio reports a call cancelled under us (e.g. close()
                # closed the channel) as CancelledError; this task was not
                # cancelled, so never let that escape as a cancellation.
                if self._client is not client:
                    raise CoordinationError(f"etcd {op_name}: coordinator closed during the call") from None
                last = exc
            except TimeoutError as exc:
                last = exc
            except (EtcdConnectionError, EtcdTransientError) as exc:
                last = exc
            except EtcdUnauthenticatedError as exc:
                if self._user is not None and not relogged and "token" in str(exc):
                    relogged = True
                    await self._authenticate(max(0.001, deadline - loop.time()))
                    continue
                raise CoordinationError(f"etcd {op_name}: not authenticated: {_describe(exc)}") from exc
            except EtcdPermissionDeniedError as exc:
                raise CoordinationError(f"etcd {op_name}: permission denied: {_describe(exc)}") from exc
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code in _TRANSIENT_CODES:
                    last = exc
                elif code == grpc.StatusCode.NOT_FOUND and "lease not found" in (exc.details() or ""):
                    raise LeaseLost(lease or 0, exc.details() or "") from exc
                elif code == grpc.StatusCode.CANCELLED and self._client is not client:
                    raise CoordinationError(f"etcd {op_name}: coordinator closed during the call") from exc
                else:
                    raise CoordinationError(f"etcd {op_name} failed: {_describe(exc)}") from exc
            pause = min(backoff, deadline - loop.time())
            if pause > 0:
                await asyncio.sleep(pause)
            backoff = min(backoff * 2, _RETRY_BACKOFF_MAX)


def _really_cancelled() -> bool:
    """True if the running task itself is being cancelled (vs. a gRPC call)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _tune_channel(client: Etcd3Client) -> None:
    """Cap gRPC's reconnect backoff (see ``_CHANNEL_OPTIONS``).

    etcd3aio has no public knob for channel options; its ConnectionManager
    keeps them in a list that is read when the channel is created.  If that
    internal changes, the defaults are kept (recovery after long outages is
    then just slower).
    """
    options = getattr(getattr(client, "_manager", None), "grpc_options", None)
    if isinstance(options, list):
        options.extend(_CHANNEL_OPTIONS)
    else:  # pragma: no cover - depends on etcd3aio internals
        log.debug("etcd3aio internals changed; cannot cap gRPC reconnect backoff")
