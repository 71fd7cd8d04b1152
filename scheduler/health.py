"""Liveness and readiness of a zsched process, served as ``/livez`` and ``/readyz`` next to
``/metrics`` (same port, same bind address: :func:`scheduler.metrics.serve`), for Kubernetes
probes and load balancers.

Both are judged here from values the process's event loop writes; the HTTP server runs on a
thread of its own, so it still answers while the loop is stuck, and that is what it reports:

- live: the loop turned within :data:`STALE_AFTER_S` (a heartbeat task stamps the time every
  :data:`BEAT_INTERVAL_S`). A loop blocked by a handler that never awaits, a deadlock or a
  runaway computation stops stamping, and ``/livez`` fails although ``/metrics`` still answers.
- ready: live, and the process's own readiness check (connected to Redis, and for a scheduler
  replica holding a valid etcd lease; for a worker subscribed and claiming) passed on its last
  run, at most :data:`STALE_AFTER_S` ago. The check runs every :data:`BEAT_INTERVAL_S` with a
  :data:`CHECK_TIMEOUT_S` timeout, so a Redis that stops answering is seen within seconds.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .protocol.masking import mask_secrets

log = logging.getLogger("zsched.health")

STALE_AFTER_S = 10.0    # /livez fails once the event loop has not turned for this long
BEAT_INTERVAL_S = 1.0   # how often the loop stamps its heartbeat and runs the readiness check
CHECK_TIMEOUT_S = 2.0   # a readiness check that takes longer counts as failed
PATHS = ("/livez", "/readyz")


@dataclass(frozen=True, slots=True)
class Verdict:
    """One judgement: ``ok`` and why, in words an operator reads in ``kubectl describe pod``."""

    ok: bool
    reason: str


class Health:
    """The heartbeat and readiness verdict of one process. :meth:`beat` and :meth:`set_ready` are
    called on the event loop (by :meth:`run`); :meth:`live` and :meth:`ready` from any thread."""

    def __init__(self, *, stale_after: float = STALE_AFTER_S, clock: Callable[[], float] = time.monotonic) -> None:
        if not stale_after > 0:
            raise ValueError(f"stale_after must be a positive number of seconds, got {stale_after!r}")
        self.stale_after = stale_after
        self.clock = clock
        self._beat: float | None = None
        # (verdict, when it was reached): replaced whole, so a reader on another thread sees one pair
        self._ready: tuple[Verdict, float] = (Verdict(False, "starting"), clock())

    def beat(self) -> None:
        """The loop turned now."""
        self._beat = self.clock()

    def set_ready(self, verdict: Verdict) -> None:
        """The readiness check's result as of now."""
        self._ready = (verdict, self.clock())

    def live(self) -> Verdict:
        """Whether the event loop turned within ``stale_after`` seconds."""
        if self._beat is None:
            return Verdict(False, "the event loop has not started its heartbeat yet")
        age = self.clock() - self._beat
        if age > self.stale_after:
            return Verdict(False, f"the event loop has not turned for {age:.1f}s (limit {self.stale_after:g}s): "
                                  "something blocks it")
        return Verdict(True, f"the event loop turned {age:.1f}s ago")

    def ready(self) -> Verdict:
        """Live, and the last readiness check passed at most ``stale_after`` seconds ago."""
        live = self.live()
        if not live.ok:
            return Verdict(False, live.reason)
        verdict, at = self._ready
        age = self.clock() - at
        if age > self.stale_after:
            return Verdict(False, f"the readiness check has not finished for {age:.1f}s")
        return verdict

    async def run(self, check: Callable[[], Awaitable[Verdict]], *, interval: float = BEAT_INTERVAL_S,
                  timeout: float = CHECK_TIMEOUT_S) -> None:
        """Until cancelled: stamp the heartbeat and run ``check`` every ``interval`` seconds. The
        heartbeat has a task of its own, so a check waiting on a stalled server does not make the
        process look dead; a check that raises or times out is a failed one, with the error
        (secrets masked) as its reason."""
        beating = asyncio.create_task(self._heartbeat(interval), name="health-heartbeat")
        try:
            while True:
                try:
                    async with asyncio.timeout(timeout):  # no task per check, unlike wait_for
                        verdict = await check()
                except TimeoutError:
                    verdict = Verdict(False, f"the readiness check did not answer within {timeout:g}s")
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a Redis or etcd error: that is what not-ready means
                    verdict = Verdict(False, mask_secrets(f"{type(exc).__name__}: {exc}"))
                if verdict.ok != self._ready[0].ok:
                    log.log(logging.INFO if verdict.ok else logging.WARNING, "readiness: %s: %s",
                            "ready" if verdict.ok else "NOT ready", verdict.reason)
                self.set_ready(verdict)
                await asyncio.sleep(interval)
        finally:
            beating.cancel()

    async def _heartbeat(self, interval: float) -> None:
        while True:
            self.beat()
            await asyncio.sleep(interval)


def wsgi_app(health: Health, fallback: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """A WSGI app answering ``GET /livez`` and ``GET /readyz`` from ``health`` (200 with ``ok:
    REASON``, or 503 with ``fail: REASON``; plain text, never cached) and everything else with
    ``fallback`` (the ``/metrics`` app)."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in PATHS:
            return fallback(environ, start_response)
        verdict = health.live() if path == "/livez" else health.ready()
        body = f"{'ok' if verdict.ok else 'fail'}: {verdict.reason}\n".encode()
        start_response("200 OK" if verdict.ok else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"), ("Cache-Control", "no-store"),
                        ("Content-Length", str(len(body)))])
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

    return app
