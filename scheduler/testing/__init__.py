"""zsched in-process, for testing applications and zsched itself (docs/testing.md).

- :class:`~.stack.TestStack`: an in-memory Redis (fakeredis with Lua) with a fake clock, or a real
  Redis; a :class:`~scheduler.Client` bound to it; time travel (``advance``, ``now =``); the
  scheduler tier's transitions and a worker's handlers run in-process (``run_due``); inspection
  (``scheduled``, ``ready``, ``dead``) and assertions (``assert_scheduled``, ...). The pytest
  plugin (:mod:`.pytest_plugin`) gives a fresh one per test as the fixture ``zsched_stack``.
- :class:`~.transitions.Ops`: claims, acks, fails, extends and releases jobs and runs the tier's
  ``tick`` and ``reap`` one script call at a time, by calling the same scripts a worker and a
  scheduler replica call, without starting either.

Names are imported on first use, so loading the pytest plugin (which every pytest run in an
environment with zsched does) imports neither fakeredis nor the client.
"""
from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .assertions import ANY
    from .clock import FakeClock
    from .run import Run, RunReport
    from .stack import TestStack, TimeTravelUnavailable
    from .transitions import Ops

__all__ = ["ANY", "FakeClock", "Ops", "Run", "RunReport", "TestStack", "TimeTravelUnavailable"]

_WHERE = {"ANY": "assertions", "FakeClock": "clock", "Ops": "transitions", "Run": "run", "RunReport": "run",
          "TestStack": "stack", "TimeTravelUnavailable": "stack"}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)
