"""Liveness and readiness of a zsched process, served as ``/livez`` and ``/readyz`` next to
``/metrics`` (same port, same bind address: :func:`scheduler.metrics.serve`), for Kubernetes
probes and load balancers.

Both are judged when a probe asks, by the HTTP server's thread (the server runs on a thread of its
own, so it still answers while the event loop is stuck, and that is what it reports). Nothing runs
between probes: an idle process is not woken once a second to stamp a heartbeat nobody reads.

- live: the event loop answers. A probe hands the loop a callback (``call_soon_threadsafe``) and
  waits up to :data:`ANSWER_WAIT_S` for it to run. A callback still waiting :data:`STALE_AFTER_S`
  after it was handed over (later probes do not hand over another) means the loop has not turned
  for that long: a handler that never awaits, a deadlock or a runaway computation, and ``/livez``
  fails although ``/metrics`` still answers.
- ready: live, and the process's own readiness check (connected to Redis, and for a scheduler
  replica holding a valid etcd lease; for a worker subscribed and claiming) passes, run on the loop
  for this probe with a :data:`CHECK_TIMEOUT_S` timeout, so a Redis that stops answering fails the
  next probe. A verdict younger than :data:`CHECK_REUSE_S` answers without a new check, and
  concurrent probes share one check: whatever probes, the check runs at most once a second.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .protocol.masking import mask_secrets

log = logging.getLogger("zsched.health")

STALE_AFTER_S = 10.0    # /livez fails once the event loop has left a probe unanswered this long
ANSWER_WAIT_S = 0.25    # how long a probe waits for the event loop to answer before judging
CHECK_REUSE_S = 1.0     # a readiness verdict this recent answers a probe without a new check
CHECK_TIMEOUT_S = 2.0   # a readiness check that takes longer counts as failed
PATHS = ("/livez", "/readyz")


@dataclass(frozen=True, slots=True)
class Verdict:
    """One judgement: ``ok`` and why, in words an operator reads in ``kubectl describe pod``."""

    ok: bool
    reason: str


class Health:
    """The liveness and readiness of one process. :meth:`run` serves them from the running event
    loop until cancelled; :meth:`live` and :meth:`ready` are called from other threads (the HTTP
    server's), never from the loop itself, which they wait on."""

    def __init__(self, *, stale_after: float = STALE_AFTER_S, answer_wait: float = ANSWER_WAIT_S,
                 reuse: float = CHECK_REUSE_S, timeout: float = CHECK_TIMEOUT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        for name, value in (("stale_after", stale_after), ("answer_wait", answer_wait), ("timeout", timeout)):
            if not value > 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if not reuse >= 0:
            raise ValueError(f"reuse must be zero or a positive number of seconds, got {reuse!r}")
        self.stale_after = stale_after
        self.answer_wait = answer_wait
        self.reuse = reuse
        self.timeout = timeout
        self.clock = clock
        self._cond = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._check: Callable[[], Awaitable[Verdict]] | None = None
        self._started = False
        self._asked: float | None = None  # when a probe handed the loop its callback; None once run
        self._answered = -math.inf        # when the loop last ran one
        # (verdict, when it was reached): replaced whole, so a reader on another thread sees one pair
        self._ready: tuple[Verdict, float] = (Verdict(False, "starting"), -math.inf)
        self._judging: concurrent.futures.Future[None] | None = None

    def _answer(self) -> None:
        """On the loop: it turned now."""
        with self._cond:
            self._answered = self.clock()
            self._asked = None
            self._cond.notify_all()

    def live(self) -> Verdict:
        """Whether the event loop answers (waits up to ``answer_wait`` for it)."""
        with self._cond:
            loop = self._loop
            if loop is None:
                return Verdict(False, "the process has stopped serving its probes" if self._started
                               else "the event loop has not started its probes yet")
            if self._asked is None:
                self._asked = self.clock()
                try:
                    loop.call_soon_threadsafe(self._answer)
                except RuntimeError:  # closed under us: run() is ending
                    self._asked = None
                    return Verdict(False, "the event loop has stopped")
            asked = self._asked
            self._cond.wait_for(lambda: self._asked is None or self._loop is None, self.answer_wait)
            if self._asked is None and self._answered >= asked:
                return Verdict(True, f"the event loop answered in {1000 * (self._answered - asked):.2f} ms")
            waited = self.clock() - asked
        if waited > self.stale_after:
            return Verdict(False, f"the event loop has not turned for {waited:.1f}s (limit {self.stale_after:g}s): "
                                  "something blocks it")
        return Verdict(True, f"the event loop has not answered for {waited:.1f}s (limit {self.stale_after:g}s)")

    def ready(self) -> Verdict:
        """Live, and the readiness check passes (run now, unless a verdict younger than ``reuse``
        or a check already running answers; waits up to ``timeout`` for it)."""
        live = self.live()
        if not live.ok:
            return live
        with self._cond:
            loop, check = self._loop, self._check
            if loop is None or check is None:
                return Verdict(False, "the process has stopped serving its probes")
            fut = self._judging
            if (fut is None or fut.done()) and self.clock() - self._ready[1] >= self.reuse:
                fut = self._judging = asyncio.run_coroutine_threadsafe(self._judge(check), loop)
        if fut is not None and not fut.done():
            try:
                fut.result(self.timeout + self.answer_wait)  # the check times out on the loop first
            except concurrent.futures.TimeoutError:
                return Verdict(False, f"the readiness check did not answer within {self.timeout:g}s")
            except concurrent.futures.CancelledError:
                return Verdict(False, "the process has stopped serving its probes")
        return self._ready[0]

    async def _judge(self, check: Callable[[], Awaitable[Verdict]]) -> None:
        """On the loop: run ``check`` with the timeout; what it raises is a failed check, with the
        error (secrets masked) as its reason. A change of verdict is logged."""
        try:
            async with asyncio.timeout(self.timeout):  # no task per check, unlike wait_for
                verdict = await check()
        except TimeoutError:
            verdict = Verdict(False, f"the readiness check did not answer within {self.timeout:g}s")
        except Exception as exc:  # a Redis or etcd error: that is what not-ready means
            verdict = Verdict(False, mask_secrets(f"{type(exc).__name__}: {exc}"))
        if verdict.ok != self._ready[0].ok:
            log.log(logging.INFO if verdict.ok else logging.WARNING, "readiness: %s: %s",
                    "ready" if verdict.ok else "NOT ready", verdict.reason)
        self._ready = (verdict, self.clock())

    async def run(self, check: Callable[[], Awaitable[Verdict]]) -> None:
        """Serve the probes from the running loop, judging readiness with ``check``, until
        cancelled. Costs nothing between probes: it only waits to be cancelled."""
        with self._cond:
            self._loop, self._check, self._started = asyncio.get_running_loop(), check, True
            self._ready = (Verdict(False, "starting"), -math.inf)
        try:
            await asyncio.Event().wait()
        finally:
            if self._judging is not None:
                self._judging.cancel()  # a probe waiting on it answers now, not at its timeout
            with self._cond:
                self._loop = self._check = None
                self._asked = None
                self._cond.notify_all()


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
