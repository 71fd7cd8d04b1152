"""Helpers for testing applications and zsched itself: run the production Lua transitions in-process.

- :mod:`.transitions`: :class:`~.transitions.Ops`, which claims, acks, fails, extends and releases
  jobs and runs the scheduler tier's ``tick`` and ``reap``, by calling the same scripts a worker
  and a scheduler replica call, without starting either.
"""
