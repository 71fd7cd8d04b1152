"""Which function handles which queue: ``@worker.handler(queue)`` fills a :class:`HandlerRegistry`."""
from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.protocol.keys import validate_name

from .job import Job
from .options import check_positive

Handler = Callable[[Job], Any]


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """A registered handler: the function, whether it is a coroutine function (it then runs on
    the event loop, else in the thread pool), and its timeout in seconds (None: no limit)."""

    fn: Handler
    is_async: bool
    timeout: float | None


class HandlerRegistry:
    """One handler per queue, in registration order."""

    def __init__(self) -> None:
        self._specs: dict[str, HandlerSpec] = {}

    def decorator(self, queue: str, *, timeout: float | None = None) -> Callable[[Handler], Handler]:
        """The decorator behind ``@worker.handler(queue, timeout=...)``. The queue name and the
        timeout are checked at once, the function when it is decorated."""
        validate_name("queue", queue)
        if timeout is not None:
            check_positive("timeout", timeout)

        def register(fn: Handler) -> Handler:
            self.register(queue, fn, timeout=timeout)
            return fn

        return register

    def register(self, queue: str, fn: Handler, *, timeout: float | None = None) -> None:
        """Make ``fn`` the handler of ``queue``; ValueError if the queue already has one."""
        validate_name("queue", queue)
        if timeout is not None:
            check_positive("timeout", timeout)
        if not callable(fn):
            raise TypeError(f"handler for queue {queue!r} must be callable, got {type(fn).__name__}")
        if queue in self._specs:
            raise ValueError(f"queue {queue!r} already has a handler ({self._specs[queue].fn!r}); "
                             "one handler per queue")
        # An object whose __call__ is a coroutine function is awaited like an async def.
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)
        self._specs[queue] = HandlerSpec(fn, is_async, float(timeout) if timeout is not None else None)

    def __getitem__(self, queue: str) -> HandlerSpec:
        return self._specs[queue]

    def __contains__(self, queue: object) -> bool:
        return queue in self._specs

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def for_queues(self, queues: Iterable[str], timeouts: Mapping[str, float]) -> dict[str, HandlerSpec | None]:
        """The spec each served queue runs (None: no handler, its jobs are dead-lettered as
        ``NoHandler``), with ``timeouts`` (``Worker(handler_timeouts=...)``) overriding the
        decorator's."""
        out: dict[str, HandlerSpec | None] = {}
        for q in queues:
            spec = self._specs.get(q)
            t = timeouts.get(q)
            if spec is not None and t is not None:
                spec = HandlerSpec(spec.fn, spec.is_async, float(t))
            out[q] = spec
        return out
