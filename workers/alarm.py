"""A precise wake-up for jobs handed off ahead of their due time.

asyncio's own timers wake through ``epoll_wait``, whose timeout is whole milliseconds, rounded
up: a job timed with ``asyncio.sleep`` would start 0-1 ms late (0.5 ms on average) on top of
everything else. One thread per worker waits on a condition variable instead (microsecond
timeouts) and wakes the event loop at the exact time through ``call_soon_threadsafe``. The thread
sleeps while nothing is held, so it costs nothing when no job is waiting.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():  # a shutdown may have cancelled the wait
        fut.set_result(None)


class Alarm:
    """Resolves futures at given ``time.monotonic()`` instants (never before them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def at(self, when: float) -> asyncio.Future[None]:
        """A future of the event loop that is resolved once ``time.monotonic() >= when``."""
        fut: asyncio.Future[None] = self._loop.create_future()
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="zsched-alarm", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (when, next(self._seq), fut))
            if self._heap[0][2] is fut:
                self._cond.notify()
        return fut

    def close(self) -> None:
        """Stop the thread (pending futures are left unresolved: their waits are cancelled)."""
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
