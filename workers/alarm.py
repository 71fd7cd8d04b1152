"""A precise wake-up for jobs handed off ahead of their due time.

asyncio's own timers wake through ``epoll_wait``, whose timeout is whole milliseconds, rounded
up (uvloop's libuv timers are whole milliseconds too): a job timed with ``asyncio.sleep`` would
start 0-1 ms late (0.5 ms on average) on top of everything else.

On Linux a worker uses one **timerfd** (``CLOCK_MONOTONIC``, the clock of ``time.monotonic()``,
absolute expiry in nanoseconds) armed for the earliest waiting job and watched by the event loop
itself (``add_reader``): the kernel makes the descriptor readable at that instant and the loop's
``epoll_wait`` returns, with no thread, no busy wait and no polling. The :class:`Alarm` thread (a
thread waiting on a condition variable with microsecond timeouts, waking the loop through
``call_soon_threadsafe``) is the fallback where timerfd is missing (not Linux, or the event loop
cannot watch a descriptor) and can be forced with ``ZSCHED_TIMERFD=0``.
"""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import heapq
import itertools
import logging
import math
import os
import sys
import threading
import time
from typing import Any, Protocol

from scheduler.protocol import config

log = logging.getLogger("zsched.worker")


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():  # a shutdown may have cancelled the wait
        fut.set_result(None)


class Waker(Protocol):
    """Resolves futures of the event loop at given ``time.monotonic()`` instants, never before."""

    def at(self, when: float) -> asyncio.Future[None]:
        """A future that is resolved once ``time.monotonic() >= when``."""

    def next_at(self) -> float:
        """The earliest instant a future waits for (``math.inf``: none); a cancelled wait may
        still count until its instant passes, so it can only be early, never late."""

    def close(self) -> None:
        """Stop (futures still pending are left unresolved: their waits are cancelled)."""


class Alarm:
    """The fallback alarm: a thread waits on a condition variable and wakes the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def at(self, when: float) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = self._loop.create_future()
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="zsched-alarm", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (when, next(self._seq), fut))
            if self._heap[0][2] is fut:
                self._cond.notify()
        return fut

    def next_at(self) -> float:
        with self._cond:
            return self._heap[0][0] if self._heap else math.inf

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        loop = self._loop
        with self._cond:
            while not self._closed:
                if not self._heap:
                    self._cond.wait()
                    continue
                delay = self._heap[0][0] - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                _, _, fut = heapq.heappop(self._heap)
                try:
                    loop.call_soon_threadsafe(_wake, fut)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    return


# <sys/timerfd.h>, <time.h>: the same values on every Linux architecture
_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_libc: Any = None


def _timerfd_libc() -> Any:
    """libc with timerfd_create/timerfd_settime typed, or None where there is none."""
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
                libc.timerfd_create.restype = ctypes.c_int
                libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                                 ctypes.c_void_p]
                libc.timerfd_settime.restype = ctypes.c_int
                _libc = libc
            except (OSError, AttributeError):
                pass
    return _libc or None


# A wait due at most this much before the instant the timer is armed for rides on it instead of
# setting the timer again: the jobs of a batch due at one instant get instants a few nanoseconds
# apart (each claim maps Redis's clock onto ours with its own bound), and each one re-armed the
# timer, a ctypes call and a syscall per job. Never early (the timer fires after both instants);
# at most this late, far below a claim's round trip.
ARM_SLACK_S = 20e-6


class TimerFdAlarm:
    """The alarm on a timerfd watched by the event loop (Linux). The descriptor is made on first
    use (a worker that never holds a job has none); if that fails, the :class:`Alarm` thread
    takes over."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        libc = _timerfd_libc()
        if libc is None:
            raise OSError("timerfd is not available")
        self._libc = libc
        self._fd = -1
        self._closed = False
        self._fallback: Alarm | None = None
        self._loop = loop
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._armed = 0.0  # the expiry the timerfd is set for (0: disarmed)
        self._spec = _Itimerspec()
        self.arms = 0  # how many times the kernel timer was set (diagnostics, tests)

    def _open(self) -> bool:
        """Make the descriptor and watch it; False (and the thread from now on) if that fails."""
        fd = self._libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        try:
            if fd < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"timerfd_create: {os.strerror(err)}")
            self._loop.add_reader(fd, self._fired)
        except (OSError, NotImplementedError, RuntimeError) as exc:
            if fd >= 0:
                os.close(fd)
            log.warning("no timerfd for job start times (%s); using a timer thread", exc)
            self._fallback = Alarm(self._loop)
            return False
        self._fd = fd
        return True

    def at(self, when: float) -> asyncio.Future[None]:
        if self._fallback is not None or (self._fd < 0 and not self._closed and not self._open()):
            assert self._fallback is not None
            return self._fallback.at(when)
        fut: asyncio.Future[None] = self._loop.create_future()
        heapq.heappush(self._heap, (when, next(self._seq), fut))
        if not self._armed or when < self._armed - ARM_SLACK_S:
            self._arm(when)
        return fut

    def next_at(self) -> float:
        if self._fallback is not None:
            return self._fallback.next_at()
        return self._heap[0][0] if self._heap else math.inf

    def close(self) -> None:
        self._closed = True
        if self._fallback is not None:
            self._fallback.close()
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        self._heap.clear()

    def _arm(self, when: float) -> None:
        if self._fd < 0:
            return  # closed
        ns = max(1, int(when * 1e9) + 1)  # rounded up: the timer never fires before `when`
        spec = self._spec
        spec.it_value.tv_sec, spec.it_value.tv_nsec = divmod(ns, 1_000_000_000)
        self.arms += 1
        if self._libc.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            # cannot happen with a valid descriptor and time; never leave a job waiting for nothing:
            # an asyncio timer (whole milliseconds, rounded up) checks the heap instead
            log.warning("timerfd_settime failed: %s", os.strerror(ctypes.get_errno()))
            self._loop.call_later(max(0.0, when - time.monotonic()) + 0.001, self._fired)
        self._armed = when

    def _fired(self) -> None:
        if self._fd < 0:
            return  # closed
        try:
            os.read(self._fd, 8)
        except (BlockingIOError, InterruptedError):
            pass  # re-armed since it became readable
        self._armed = 0.0
        heap = self._heap
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            _wake(heapq.heappop(heap)[2])
        while heap and heap[0][2].done():  # cancelled waits (shutdown) need no wake-up
            heapq.heappop(heap)
        if heap:
            self._arm(heap[0][0])


def make_alarm(loop: asyncio.AbstractEventLoop) -> Waker:
    """The worker's alarm: a timerfd on Linux, else (or with ``ZSCHED_TIMERFD=0``) a thread."""
    if not config.switched_off("TIMERFD"):
        try:
            return TimerFdAlarm(loop)
        except (OSError, NotImplementedError, RuntimeError) as exc:
            log.debug("no timerfd alarm (%s); using the alarm thread", exc)
    return Alarm(loop)
