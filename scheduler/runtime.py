"""Process-level settings shared by the long-running processes (scheduler replicas, workers):
the event loop, garbage-collector tuning and the logging of entry points."""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
import threading
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any, TypeVar

from .protocol import config
from .protocol.masking import mask_secrets

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop of zsched's processes: uvloop's when it is installed (a dependency on Linux
    and macOS), unless ``ZSCHED_UVLOOP=0``; None: asyncio's own. uvloop runs the same callbacks
    with less CPU per loop iteration (per claim, tick, notification and handler start), which is
    what bounds the lateness of a busy host."""
    if config.switched_off("UVLOOP"):
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``, for the start-up log line."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_deferred: list[signal.Signals] = []  # stop signals that came while the loop was being set up


def _defer(signum: int, frame: FrameType | None) -> None:
    _deferred.append(signal.Signals(signum))


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop of :func:`loop_factory`.

    From here until ``main`` installs its handlers with :func:`stop_signals`, SIGTERM and SIGINT
    are remembered instead of acted on, then handed to those handlers: the process's earlier
    handlers raise (KeyboardInterrupt), and raised inside the loop's set-up (uvloop's C code)
    that was a traceback instead of the command's orderly stop."""
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, _defer)
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(main)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _deferred.clear()  # a signal ``main`` never took: it ended by itself meanwhile


def stop_signals(loop: asyncio.AbstractEventLoop, handler: Callable[[signal.Signals], None]) -> list[signal.Signals]:
    """Handle SIGTERM and SIGINT on ``loop`` with ``handler(sig)`` where the platform allows it (the
    main thread); a stop signal that came while :func:`run` set the loop up is handed to it at once.
    Returns the signals installed (for ``loop.remove_signal_handler``)."""
    installed: list[signal.Signals] = []
    for sig in STOP_SIGNALS:
        try:
            loop.add_signal_handler(sig, handler, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or the platform
            pass
    if installed:
        while _deferred:
            loop.call_soon(handler, _deferred.pop(0))
    return installed


def settle_gc() -> None:
    """Call once start-up is done: move everything allocated so far (modules, clients, scripts)
    out of the collector's reach and make young-generation collections rarer. A full collection
    over start-up objects is a multi-millisecond pause that lands on a firing or a handler start;
    the hot paths free their objects by reference counting, so little is left for the collector."""
    gc.collect()
    gc.freeze()
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(gen0, 5000), gen1, gen2)


LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""How zsched's processes log: ``2026-12-01 09:00:00,123 INFO zsched.worker: worker serving ...``."""


class MaskingFormatter(logging.Formatter):
    """Formats like :class:`logging.Formatter`, then masks secrets
    (:func:`~scheduler.protocol.masking.mask_secrets`) in the whole line, traceback included: the
    last line of defence for a message, ours or a library's, that quotes a URL with a password."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record))


def _handler() -> logging.Handler:
    handler = logging.StreamHandler()
    handler.setFormatter(MaskingFormatter(LOG_FORMAT))
    return handler


def entry_point_logging(level: str | None = None, *, whole_process: bool = False) -> None:
    """Set up logging for a program's entry point; never called on import (a library must not
    configure the application's logging).

    ``zsched`` (which owns its process) passes ``whole_process``: the root logger gets a stderr
    handler, so the handlers' own loggers print too. ``Worker.run()`` (the entry point of
    ``python -m myapp.tasks``) does not: only zsched's loggers (``zsched.*``) print, to stderr, and
    only when the application has configured no logging itself (the root logger has no handler),
    so a worker always says that it started and stopped. Either way lines are masked
    (:class:`MaskingFormatter`). ``level``: default ``ZSCHED_LOG_LEVEL``, else INFO."""
    level = config.log_level(level)
    if whole_process:
        logging.basicConfig(level=level, handlers=[_handler()])
        return
    ours = logging.getLogger("zsched")
    if logging.getLogger().handlers or ours.handlers:
        return
    ours.addHandler(_handler())
    if ours.level == logging.NOTSET:
        ours.setLevel(level)
