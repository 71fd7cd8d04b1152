"""The connection under :class:`~scheduler.coord.etcd.EtcdCoordinator`: one etcd3aio client (a gRPC
channel to every configured member), its login, and :meth:`EtcdSession.call`, which gives every
request a deadline, retries transient failures inside it and maps etcd3aio's and gRPC's errors to
the :mod:`scheduler.coord.api` ones.

The only module that imports gRPC; with :mod:`.watch`, the only ones that know etcd3aio's errors.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

# grpcio ships no type information: its names are Any here
import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
from etcd3aio import (
    Etcd3Client,
    EtcdConnectionError,
    EtcdPermissionDeniedError,
    EtcdTransientError,
    EtcdUnauthenticatedError,
)

from ..protocol.etcd_endpoints import Endpoint
from ..protocol.masking import mask_secrets
from .api import CoordinationError, CoordinatorUnavailable, LeaseLost
from .endpoints import ENV_HINT, resolve

# one logger for the whole etcd backend, whichever of its modules logs
log = logging.getLogger("scheduler.coord.etcd")

T = TypeVar("T")

# Backoff between retries of one call (seconds).  Small, because the whole
# retry loop is bounded by the call's deadline anyway.
RETRY_BACKOFF_START = 0.05
RETRY_BACKOFF_MAX = 0.5
# Backoff between watch re-establishment attempts (seconds).
WATCH_BACKOFF_START = 0.1
WATCH_BACKOFF_MAX = 1.0
# gRPC re-dials a dead server with an exponential backoff that grows to 120 s
# by default, so after a long etcd outage the client would stay disconnected
# for up to two minutes after etcd is back.  Cap it at 1 s.
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# Sent as gRPC metadata on every call: a member that has lost its leader
# (e.g. it is partitioned away from the quorum) then rejects the call at once
# with UNAVAILABLE ("no leader") and cancels watch streams, instead of letting
# linearizable requests hang until the deadline and watches go silent.  The
# call is then retried on another member.  Same as clientv3.WithRequireLeader.
REQUIRE_LEADER: tuple[str, str] = ("hasleader", "true")
TRANSIENT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# Besides the transient ones, the codes a broken (not refused) watch stream ends with; None: an
# etcd3aio error without a gRPC cause.
RESUMABLE_WATCH_CODES = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL,
                                   None})
# The error of a failed gRPC call (etcd3aio passes some through unwrapped).
RpcError = grpc.aio.AioRpcError
# etcd3aio keeps each service's gRPC metadata in this attribute (not public API, see
# EtcdSession.install_metadata).
_SERVICE_METADATA_ATTR = "_metadata"


def describe(exc: BaseException | None) -> str:
    """A short, log-friendly account of an error from etcd3aio or gRPC, masked (it goes into our
    messages and logs, and a library's message may quote an address with credentials)."""
    if exc is None:
        return "none"
    if isinstance(exc, grpc.aio.AioRpcError):
        return mask_secrets(f"{exc.code().name}: {exc.details()}")
    if isinstance(exc, TimeoutError):
        return "no answer before the deadline"
    text = mask_secrets(str(exc) or type(exc).__name__)
    return text if len(text) <= 300 else text[:300] + "..."


def grpc_cause(exc: BaseException) -> grpc.aio.AioRpcError | None:
    """The AioRpcError behind an etcd3aio exception (they chain it as __cause__)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, grpc.aio.AioRpcError):
            return seen
        seen = seen.__cause__
    return None


def really_cancelled() -> bool:
    """True if the running task itself is being cancelled (vs. a gRPC call)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def key_bytes(key: str) -> bytes:
    """An etcd key as sent on the wire (keys that are not UTF-8 round-trip through surrogates)."""
    return key.encode("utf-8", "surrogateescape")


def _tune_channel(client: Etcd3Client) -> None:
    """Cap gRPC's reconnect backoff (see ``CHANNEL_OPTIONS``).

    etcd3aio has no public knob for channel options; its ConnectionManager
    keeps them in a list that is read when the channel is created.  If that
    internal changes, the defaults are kept (recovery after long outages is
    then just slower).
    """
    options = getattr(getattr(client, "_manager", None), "grpc_options", None)
    if isinstance(options, list):
        options.extend(CHANNEL_OPTIONS)
    else:  # pragma: no cover - depends on etcd3aio internals
        log.debug("etcd3aio internals changed; cannot cap gRPC reconnect backoff")


class EtcdSession:
    """An etcd3aio client with its credentials, login and deadline-bounded, retried calls."""

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
        """Arguments as for :class:`~scheduler.coord.etcd.EtcdCoordinator`; raises ``ValueError``
        on an inconsistent set."""
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

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The configured members as ``host:port`` (no credentials)."""
        return tuple(str(e) for e in self._endpoints)

    @property
    def tls(self) -> bool:
        return self._tls

    @property
    def timeout(self) -> float:
        """Default deadline of a call, in seconds."""
        return self._timeout

    @property
    def client(self) -> Etcd3Client | None:
        """The connected etcd3aio client; None before :meth:`connect` and after :meth:`close`."""
        return self._client

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (and no :meth:`connect` since)."""
        return self._closed

    @property
    def has_credentials(self) -> bool:
        """Whether calls are made as a user (so an expired token can be renewed by logging in)."""
        return self._user is not None

    async def connect(self, *, verify: bool = True, timeout: float | None = None) -> bool:
        """Create the gRPC channel, log in if credentials were given; with ``verify``, make one
        round trip. Returns False when already connected (nothing done)."""
        async with self._connect_lock:
            if self._client is not None:
                return False
            self._closed = False
            budget = self._timeout if timeout is None else timeout
            targets, server_name = await resolve(self._endpoints, budget)
            client = Etcd3Client(
                targets,
                # This class retries itself, bounded by the call's deadline.
                rpc_max_attempts=1,
                watch_reconnect_backoff_seconds=WATCH_BACKOFF_START,
                watch_max_reconnect_backoff_seconds=WATCH_BACKOFF_MAX,
                tls_server_name=self._tls_server_name or server_name,
                # etcd3aio uses TLS iff ca_cert is given.
                ca_cert=self._ca_cert if self._tls else None,
                cert_key=self._cert_key if self._tls else None,
                cert_chain=self._cert_cert if self._tls else None,
            )
            _tune_channel(client)
            await client.connect()
            self._client = client
            self.install_metadata()
            try:
                if self._user is not None:
                    await self.authenticate(budget)
                if verify:
                    await self.run("connect", _ping, timeout)
            except BaseException:
                self._client = None
                await client.close()
                raise
            return True

    async def close(self) -> None:
        """Close the channel; the session may be connected again."""
        async with self._connect_lock:
            self._closed = True
            client, self._client = self._client, None
            if client is not None:
                await client.close()

    def install_metadata(self) -> None:
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
        metadata = ((("token", self._token),) if self._token else ()) + (REQUIRE_LEADER,)
        for svc in (client.auth, client.cluster, client.kv, client.lease, client.maintenance, client.watch):
            if svc is not None and isinstance(getattr(svc, _SERVICE_METADATA_ATTR, None), tuple):
                setattr(svc, _SERVICE_METADATA_ATTR, metadata)

    async def authenticate(self, budget: float) -> None:
        """Log in (again) with the configured user; the new token is used by every later call."""
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
            if exc.code() in TRANSIENT_CODES:
                raise self.unavailable("authenticate", budget, exc) from exc
            raise self._rejected(exc) from exc
        except (EtcdUnauthenticatedError, EtcdPermissionDeniedError) as exc:
            raise self._rejected(exc) from exc
        except (EtcdConnectionError, EtcdTransientError, TimeoutError) as exc:
            raise self.unavailable("authenticate", budget, exc) from exc
        self._token = resp.token
        self.install_metadata()

    def _rejected(self, exc: BaseException) -> CoordinationError:
        return CoordinationError(
            f"etcd rejected user {self._user!r}: {describe(exc)}; check the credentials in --etcd / "
            f"ZSCHED_ETCD_ENDPOINTS (http://user:password@host:port) and that auth is enabled"
        )

    def unavailable(self, op: str, budget: float, exc: BaseException | None) -> CoordinatorUnavailable:
        """The error for ``op`` not succeeding within ``budget`` seconds (``exc``: the last failure)."""
        return CoordinatorUnavailable(
            f"etcd unavailable: {op} did not succeed within {budget:g}s "
            f"(endpoints: {', '.join(self.endpoints)}; last error: {describe(exc)}). {ENV_HINT}"
        )

    async def run(
        self,
        op_name: str,
        op: Callable[[Etcd3Client, float], Awaitable[T]],
        timeout: float | None,
        *,
        lease: int | None = None,
    ) -> T:
        """Run ``op(client, seconds left)`` with retries on transient errors, bounded by the
        deadline (``timeout``, default the session's).

        Retries go through gRPC's round_robin picker, i.e. to the next healthy
        member.  Error mapping: UNAVAILABLE / DEADLINE_EXCEEDED / deadline ->
        :class:`CoordinatorUnavailable`; "lease not found" -> :class:`LeaseLost`
        (naming ``lease``); an expired auth token -> re-login once; anything
        else -> :class:`CoordinationError`.
        """
        budget = self._timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        backoff = RETRY_BACKOFF_START
        last: BaseException | None = None
        relogged = False
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise self.unavailable(op_name, budget, last) from last
            client = self._connected(op_name)
            try:
                async with asyncio.timeout(remaining):
                    return await op(client, remaining)
            except asyncio.CancelledError as exc:
                if really_cancelled():
                    raise
                last = self._cancelled_under_us(op_name, client, exc)
            except (TimeoutError, EtcdConnectionError, EtcdTransientError) as exc:
                last = exc
            except EtcdUnauthenticatedError as exc:
                if self._user is None or relogged or "token" not in str(exc):
                    raise CoordinationError(f"etcd {op_name}: not authenticated: {describe(exc)}") from exc
                relogged = True
                await self.authenticate(max(0.001, deadline - loop.time()))
                continue
            except EtcdPermissionDeniedError as exc:
                raise CoordinationError(f"etcd {op_name}: permission denied: {describe(exc)}") from exc
            except grpc.aio.AioRpcError as exc:
                last = self._rpc_failed(op_name, client, exc, lease)
            pause = min(backoff, deadline - loop.time())
            if pause > 0:
                await asyncio.sleep(pause)
            backoff = min(backoff * 2, RETRY_BACKOFF_MAX)

    def _connected(self, op_name: str) -> Etcd3Client:
        client = self._client
        if client is None:
            raise CoordinationError(
                f"etcd {op_name}: EtcdCoordinator is "
                + ("closed" if self._closed else "not connected (call connect() first)")
            )
        return client

    def _cancelled_under_us(self, op_name: str, client: Etcd3Client,
                            exc: asyncio.CancelledError) -> asyncio.CancelledError:
        """grpc.aio reports a call cancelled under us (e.g. close() closed the channel) as
        CancelledError; the task was not cancelled, so never let that escape as a cancellation:
        an error if the session was closed, else a failure to retry (returned)."""
        if self._client is not client:
            raise CoordinationError(f"etcd {op_name}: coordinator closed during the call") from None
        return exc

    def _rpc_failed(self, op_name: str, client: Etcd3Client, exc: grpc.aio.AioRpcError,
                    lease: int | None) -> grpc.aio.AioRpcError:
        """Raise the error a raw gRPC failure stands for, or return it when it is worth a retry."""
        code = exc.code()
        if code in TRANSIENT_CODES:
            return exc
        if code == grpc.StatusCode.NOT_FOUND and "lease not found" in (exc.details() or ""):
            raise LeaseLost(lease or 0, exc.details() or "") from exc
        if code == grpc.StatusCode.CANCELLED and self._client is not client:
            raise CoordinationError(f"etcd {op_name}: coordinator closed during the call") from exc
        raise CoordinationError(f"etcd {op_name} failed: {describe(exc)}") from exc


async def _ping(c: Etcd3Client, t: float) -> None:
    """One round trip that any reachable member answers (even to a client it refuses)."""
    assert c.maintenance is not None
    try:
        await c.maintenance.status(timeout=t)
    except grpc.aio.AioRpcError as exc:
        if exc.code() in TRANSIENT_CODES:
            raise
    except (EtcdUnauthenticatedError, EtcdPermissionDeniedError):
        pass  # the server answered: it is reachable
