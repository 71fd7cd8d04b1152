"""Start, stop and signals: the state the worker's loops share for one ``serve()``.

A first SIGTERM/SIGINT (or ``Worker.stop()``) asks for a graceful stop; a second one exits the
process at once. Loops sleep through :meth:`Lifecycle.wait_stop` so backoff never delays a stop,
and run under :func:`supervise` so a bug in one iteration does not end the worker.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import signal
from collections.abc import Awaitable, Callable

from scheduler.runtime import stop_signals

from .turns import Turns

log = logging.getLogger("zsched.worker")


class Lifecycle:
    """``stop_requested``: a stop was asked for. ``stopping``: the shutdown has begun (no new
    claims); ``drain_deadline``: until when undelivered outcomes are still retried. ``ready``:
    subscribed and swept once. ``stopped``: ``serve()`` has finished. ``redis_answered``: when
    (monotonic) Redis last answered the listen loop's bell wait (which an idle worker sends every
    few seconds anyway) or a round trip of claims: the readiness check needs no round trip of its
    own while that is recent. ``turns``: the idle turns the periodic chores ride on (:mod:`.turns`)."""

    def __init__(self) -> None:
        self.stop_requested = asyncio.Event()
        self.stopped = asyncio.Event()
        self.ready = asyncio.Event()
        self.stopping = False
        self.drain_deadline = math.inf
        self.redis_answered = -math.inf
        self.turns = Turns()

    async def wait_stop(self, delay: float) -> bool:
        """Sleep ``delay`` s; True at once if a stop was requested (so backoff never delays shutdown)."""
        if self.stop_requested.is_set():
            return True
        try:
            async with asyncio.timeout(delay):
                await self.stop_requested.wait()
            return True
        except TimeoutError:
            return False

    def install_signals(self, loop: asyncio.AbstractEventLoop, grace: float) -> list[signal.Signals]:
        """Handle SIGTERM and SIGINT on ``loop`` where the platform allows it (the main thread);
        returns the signals installed, for :meth:`remove_signals`."""
        return stop_signals(loop, functools.partial(self._on_signal, grace=grace))

    @staticmethod
    def remove_signals(loop: asyncio.AbstractEventLoop, installed: list[signal.Signals]) -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals, grace: float) -> None:
        if self.stop_requested.is_set():
            log.warning("second %s: exiting now; unfinished jobs run again after their leases expire", sig.name)
            logging.shutdown()
            os._exit(1)
        log.info("%s: stopping; running handlers have %.1f s to finish (signal again to exit at once)",
                 sig.name, grace)
        self.stop_requested.set()


async def supervise(name: str, fn: Callable[[], Awaitable[None]]) -> None:
    """Keep a loop alive: a bug in one iteration is logged and the loop restarts after a pause."""
    while True:
        try:
            await fn()
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("worker %s loop crashed; restarting in 1 s", name)
            await asyncio.sleep(1.0)
