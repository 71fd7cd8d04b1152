"""Following a partition-count change (``zsched migrate-partitions``) in a running producer.

Scripts behind the layout fence refuse a caller whose partition count is not the namespace's
(lua/_lib.lua ``layout_fence``) before writing anything. A client method wrapped here then
re-reads the count and runs once more, so a long-running producer keeps working across a
migration without a restart; while the migration runs it raises
:class:`~scheduler.protocol.errors.LayoutChanged` with ``migrating`` True instead.
"""
from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from redis.exceptions import ResponseError

from ..protocol.errors import LayoutChanged

P = ParamSpec("P")
R = TypeVar("R")


class Reloads(Protocol):
    def reload_layout(self) -> int: ...


class AsyncReloads(Protocol):
    async def reload_layout(self) -> int: ...


S = TypeVar("S", bound=Reloads)
A = TypeVar("A", bound=AsyncReloads)


def reload_needed(exc: ResponseError) -> None:
    """Return when ``exc`` is the layout fence's refusal after a finished migration (the caller
    re-reads the count and runs once more); raise it as LayoutChanged during one, and raise
    ``exc`` itself when it is anything else."""
    refused = LayoutChanged.from_reply(exc)
    if refused is None:
        raise exc
    if refused.migrating:
        raise refused from None


def follows_layout(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Run ``method``; after a layout refusal re-read the partition count and run it once more
    (a refusal during a migration is raised as LayoutChanged)."""
    @functools.wraps(method)
    def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except ResponseError as exc:
            reload_needed(exc)
            self.reload_layout()
        return method(self, *args, **kwargs)
    return wrapper


def follows_layout_async(method: Callable[Concatenate[A, P], Awaitable[R]]
                         ) -> Callable[Concatenate[A, P], Awaitable[R]]:
    """:func:`follows_layout` for coroutine methods."""
    @functools.wraps(method)
    async def wrapper(self: A, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await method(self, *args, **kwargs)
        except ResponseError as exc:
            reload_needed(exc)
            await self.reload_layout()
        return await method(self, *args, **kwargs)
    return wrapper


__all__ = ["follows_layout", "follows_layout_async", "reload_needed"]
