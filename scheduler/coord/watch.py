"""Watching an etcd prefix without losing or repeating an event across broken streams, member
failures and etcd restarts (:func:`watch_prefix`, behind ``EtcdCoordinator.watch_prefix``).

Why not simply rely on etcd3aio's own reconnect: it resumes from the
response *header* revision, which is the store's current revision, not
the last delivered event.  If the stream breaks after the "created"
reply but before the historical events, or while catching up more than
1000 revisions, those events are skipped.  So the watch remembers the
last yielded event and restarts the stream itself whenever etcd3aio's
stream has been re-created.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Iterator
from typing import Any, cast

from etcd3aio import Etcd3Client, EtcdError, prefix_range_end
from etcd3aio.watch import WatchService

from .api import CoordinationError, CoordinatorUnavailable, WatchCompacted, WatchEvent
from .session import (
    RESUMABLE_WATCH_CODES,
    TRANSIENT_CODES,
    WATCH_BACKOFF_MAX,
    WATCH_BACKOFF_START,
    EtcdSession,
    RpcError,
    describe,
    grpc_cause,
    key_bytes,
    really_cancelled,
)

# one logger for the whole etcd backend, whichever of its modules logs
log = logging.getLogger("scheduler.coord.etcd")

# etcd mvccpb.Event.EventType of a delete (explicit, or the lease's expiry or revoke).
_EVENT_DELETE = 1


async def watch_prefix(session: EtcdSession, prefix: str, start_revision: int) -> AsyncGenerator[WatchEvent, None]:
    """Yield every change under ``prefix`` from ``start_revision`` on, in order (the contract is
    ``EtcdCoordinator.watch_prefix``'s)."""
    watch = _Watch(session, prefix, start_revision)
    p = key_bytes(prefix)
    end = prefix_range_end(p)
    while True:
        client, service = watch.connected()
        watch.stream_start = watch.next_rev
        watch.created = False
        # Typed as AsyncIterator by etcd3aio; it is an async generator.
        stream = cast(
            AsyncGenerator[Any, None],
            service.watch(p, end, start_revision=watch.stream_start, progress_notify=True),
        )
        try:
            async for resp in stream:
                events = await watch.take(resp)
                if events is None:
                    break
                for event in events:
                    yield event
            else:
                log.info("etcd watch stream on %r ended; re-establishing from revision %d", prefix, watch.next_rev)
        except asyncio.CancelledError:
            if really_cancelled():
                raise
            # grpc.aio raises CancelledError (not AioRpcError) from a call
            # that was cancelled under us, e.g. because close() closed
            # the channel.  This task was not cancelled: keep going.
            if session.client is None:
                raise CoordinationError("EtcdCoordinator was closed while watching") from None
            await watch.pause()
        except (RpcError, EtcdError) as exc:
            if session.client is not client:
                if session.client is None:
                    raise CoordinationError("EtcdCoordinator was closed while watching") from exc
                continue  # reconnected: restart on the new channel
            await watch.broken(exc)
        finally:
            await stream.aclose()  # cancels the gRPC call


class _Watch:
    """Where one watch stands: the revision to resume from and the state of the current stream."""

    def __init__(self, session: EtcdSession, prefix: str, start_revision: int) -> None:
        self.session = session
        self.prefix = prefix
        self.next_rev = start_revision   # the revision after the last event yielded
        self.stream_start = start_revision
        self.created = False             # the current stream said "created"
        self.relogged = False            # logged in again after a refusal, not created since
        self.backoff = WATCH_BACKOFF_START

    def connected(self) -> tuple[Etcd3Client, WatchService]:
        """The session's client and its watch service; raises when the session is not connected."""
        client = self.session.client
        if client is None or client.watch is None:
            raise CoordinationError(
                "EtcdCoordinator is closed" if self.session.closed else "EtcdCoordinator.connect() was not called"
            )
        return client, client.watch

    async def take(self, resp: Any) -> Iterator[WatchEvent] | None:
        """The events of one watch response; None when the stream must be re-created."""
        if resp.compact_revision > 0:
            raise WatchCompacted(self.next_rev, int(resp.compact_revision))
        if resp.canceled:
            await self._refused(resp.cancel_reason)
            return None
        if resp.created:
            if self.created:
                # etcd3aio reconnected internally from *its* idea of
                # the revision; restart from ours (see module docstring).
                log.debug("etcd watch on %r reconnected; resuming from revision %d", self.prefix, self.next_rev)
                return None
            self.created = True
            self.relogged = False
            return iter(())
        self.backoff = WATCH_BACKOFF_START
        if not resp.events:
            # Progress notification: only sent to watchers that are
            # caught up, so everything up to header.revision has
            # been delivered.  Advancing keeps a quiet prefix from
            # failing with WatchCompacted on its next reconnect.
            self.next_rev = max(self.next_rev, int(resp.header.revision) + 1)
            return iter(())
        return self._events(resp.events)

    def _events(self, events: Any) -> Iterator[WatchEvent]:
        for ev in events:
            rev = int(ev.kv.mod_revision)
            if rev < self.stream_start:
                continue
            self.next_rev = rev + 1
            yield WatchEvent(
                kind="delete" if ev.type == _EVENT_DELETE else "put",
                key=bytes(ev.kv.key).decode("utf-8", "surrogateescape"),
                value=bytes(ev.kv.value),
                create_revision=int(ev.kv.create_revision),
                mod_revision=rev,
            )

    async def _refused(self, reason: str) -> None:
        """The stream was refused at creation ("created" and "canceled" both set) or cancelled
        later.  With auth, the usual cause is an expired token (etcd reports it this way, not as
        a gRPC error): log in again once (the caller re-creates the stream); else raise."""
        if not self.session.has_credentials or self.relogged:
            raise CoordinationError(f"etcd cancelled the watch on {self.prefix!r}: {reason}")
        self.relogged = True
        log.info("etcd refused the watch on %r (%s); logging in again", self.prefix, reason)
        try:
            await self.session.authenticate(self.session.timeout)
        except CoordinatorUnavailable:
            self.relogged = False  # could not even try; do it on the next refusal

    async def broken(self, exc: Exception) -> None:
        """The stream failed: raise on a permanent error, else wait before resuming."""
        cause = grpc_cause(exc)
        code = cause.code() if cause is not None else None
        if code not in TRANSIENT_CODES and code not in RESUMABLE_WATCH_CODES:
            raise CoordinationError(f"etcd watch on {self.prefix!r} failed: {describe(exc)}") from exc
        log.warning(
            "etcd watch on %r broke (%s); resuming from revision %d in %.2fs",
            self.prefix,
            describe(exc),
            self.next_rev,
            self.backoff,
        )
        await self.pause()

    async def pause(self) -> None:
        """Wait before re-creating the stream (exponential backoff, reset by any response)."""
        await asyncio.sleep(self.backoff)
        self.backoff = min(self.backoff * 2, WATCH_BACKOFF_MAX)
