"""The etcd v3 implementation of :class:`~scheduler.coord.api.Coordinator`.

Scheduler replicas own Redis partitions by holding an etcd key that is attached
to their lease.  Everything the rest of the code base needs from etcd goes
through :class:`Coordinator`; :class:`EtcdCoordinator` is the implementation on
top of the PyPI package ``etcd3aio`` (asyncio + ``grpc.aio``).  No module
outside ``scheduler.coord`` imports ``etcd3aio``, so the client library can be
swapped (e.g. for ``aetcd``) by writing another class that satisfies
:class:`Coordinator`.  See ``docs/etcd.md``.

The backend is four modules: :mod:`.endpoints` (endpoint lists, TLS material),
:mod:`.session` (the etcd3aio client, login, deadline-bounded retried calls),
:mod:`.watch` (gap-free watches) and this one, the :class:`Coordinator` methods.

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

import contextlib
import logging
import math
import os
from collections.abc import AsyncGenerator, Sequence
from types import TracebackType
from typing import Any

from etcd3aio import Etcd3Client, EtcdTransientError, prefix_range_end

from ..protocol.etcd_endpoints import Endpoint, parse_endpoints
from .api import KV, LeaseLost, WatchEvent
from .endpoints import load_pem, system_ca_bundle
from .session import EtcdSession, key_bytes
from .watch import watch_prefix

log = logging.getLogger(__name__)


class EtcdCoordinator:
    """:class:`Coordinator` backed by etcd3aio.

    Build it with :meth:`from_endpoints`, then ``await connect()`` (or use it as
    an async context manager).
    """

    def __init__(
        self,
        endpoints: Sequence[Endpoint],
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
        """Members as parsed by :func:`parse_endpoints`, PEM bytes for the TLS material; see
        :meth:`from_endpoints`, which builds these arguments from an endpoint list."""
        self._session = EtcdSession(
            endpoints, tls=tls, timeout=timeout, user=user, password=password, ca_cert=ca_cert,
            cert_key=cert_key, cert_cert=cert_cert, tls_server_name=tls_server_name,
        )

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
        ca = load_pem(ca_cert, "ca_cert")
        if parsed.tls and ca is None:
            ca = system_ca_bundle()
        return cls(
            parsed.endpoints,
            tls=parsed.tls,
            timeout=timeout,
            user=user if user is not None else parsed.user,
            password=password if password is not None else parsed.password,
            ca_cert=ca,
            cert_key=load_pem(cert_key, "cert_key"),
            cert_cert=load_pem(cert_cert, "cert_cert"),
            tls_server_name=tls_server_name,
        )

    # ------------------------------------------------------------------ lifecycle

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The configured members as ``host:port`` (no credentials)."""
        return self._session.endpoints

    @property
    def default_timeout(self) -> float:
        """The deadline of a call that does not give its own, in seconds."""
        return self._session.timeout

    def __repr__(self) -> str:
        scheme = "https" if self._session.tls else "http"
        return f"EtcdCoordinator({scheme}://{','.join(self.endpoints)}, timeout={self.default_timeout})"

    async def connect(self, *, verify: bool = True, timeout: float | None = None) -> None:
        """Create the gRPC channel, log in if credentials were given.

        With ``verify`` (default) one round-trip to etcd is made so that a
        wrong ZSCHED_ETCD_ENDPOINTS fails here, at start-up, with
        :class:`CoordinatorUnavailable` instead of at the first real call.
        Idempotent.
        """
        if await self._session.connect(verify=verify, timeout=timeout):
            log.debug("connected to etcd %s", self)

    async def close(self) -> None:
        """Close the channel.  Running :meth:`watch_prefix` iterators end with
        :class:`CoordinationError`; cancel them first for a quiet shutdown."""
        await self._session.close()

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

        return await self._session.run("grant", op, timeout)

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

        ttl = await self._session.run("keepalive", op, timeout)
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
            await self._session.run("revoke", op, timeout)

    # ------------------------------------------------------------------ kv

    async def put(self, key: str, value: bytes, lease: int | None = None, *, timeout: float | None = None) -> int:
        """Write ``key``; return the revision of the write.

        Raises :class:`LeaseLost` if ``lease`` does not exist (etcd refuses to
        attach a key to a dead lease).
        """

        async def op(c: Etcd3Client, t: float) -> int:
            assert c.kv is not None
            resp = await c.kv.put(key_bytes(key), value, lease=lease or 0, timeout=t)
            return int(resp.header.revision)

        return await self._session.run("put", op, timeout, lease=lease)

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
        k = key_bytes(key)

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
                return _kv(ranged[0])
            return None  # held by another lease (the Else-get is atomic with the compare)

        return await self._session.run("claim_if_absent", op, timeout, lease=lease)

    async def delete_if(self, key: str, create_revision: int, *, timeout: float | None = None) -> bool:
        """Delete ``key`` only if it still has ``create_revision``; one transaction.

        Used to give up a claim without deleting a newer owner's key (same
        name, newer epoch).  Returns ``True`` if this call deleted it.  After an
        ambiguous failure that was retried it may return ``False`` although an
        earlier attempt deleted the key; either way the claim is gone.
        """
        k = key_bytes(key)

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

        return await self._session.run("delete_if", op, timeout)

    async def get(self, key: str, *, timeout: float | None = None) -> KV | None:
        """Linearizable read of one key; ``None`` if absent."""

        async def op(c: Etcd3Client, t: float) -> KV | None:
            assert c.kv is not None
            resp = await c.kv.get(key_bytes(key), timeout=t)
            return _kv(resp.kvs[0]) if resp.kvs else None

        return await self._session.run("get", op, timeout)

    async def get_prefix(self, prefix: str, *, timeout: float | None = None) -> tuple[list[KV], int]:
        """Linearizable read of every key under ``prefix`` (sorted by key).

        Also returns the header revision of the read: the state returned is
        the state at that revision, so ``watch_prefix(prefix, revision + 1)``
        continues without gap or overlap.
        """
        p = key_bytes(prefix)

        async def op(c: Etcd3Client, t: float) -> tuple[list[KV], int]:
            assert c.kv is not None
            resp = await c.kv.get(p, range_end=prefix_range_end(p), timeout=t)
            return [_kv(kv) for kv in resp.kvs], int(resp.header.revision)

        return await self._session.run("get_prefix", op, timeout)

    # ------------------------------------------------------------------ watch

    def watch_prefix(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
        """Yield every change under ``prefix`` from ``start_revision`` on, in order.

        The stream survives broken connections, member failures and etcd
        restarts: it is re-established (through any configured member) from
        the revision after the last event it yielded, so no event is lost or
        repeated (see :mod:`.watch`).  It never ends by itself; it raises
        :class:`WatchCompacted` when the needed revision was compacted
        (re-read with :meth:`get_prefix`, then watch again), and
        :class:`CoordinationError` after :meth:`close` or on a permanent error
        (e.g. permission denied).  Cancelling the consuming task (or
        ``aclose()``) closes the gRPC stream.
        """
        return watch_prefix(self._session, prefix, start_revision)


def _kv(kv: Any) -> KV:
    """A key from an etcd3aio (protobuf) reply."""
    return KV(
        key=bytes(kv.key).decode("utf-8", "surrogateescape"),
        value=bytes(kv.value),
        create_revision=int(kv.create_revision),
        mod_revision=int(kv.mod_revision),
        lease=int(kv.lease),
    )
