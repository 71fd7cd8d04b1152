"""Effects that apply once, on zsched's at-least-once delivery (docs/effects.md).

A job can run more than once: its worker died after the work and before the ack, or its handler
outlived its lease and the job ran again elsewhere. Each attempt has the job's stable ``id`` and a
``fence`` that grows with every attempt; these helpers record them beside the handler's writes,
atomically, so that a repeat writes nothing and says so:

* :func:`fenced` / :func:`fenced_async`: a PostgreSQL transaction (psycopg 3) whose writes commit
  once per job (and step); :func:`ddl` and :func:`prune` for its table (``zsched effects``).
* :func:`fenced_write` / :func:`fenced_write_async`: Redis commands on the user's own keys, run in
  one atomic script call once per job (and step), beside a fence key that expires by itself.
* :func:`idempotency_headers`: ``Idempotency-Key`` and the fence for outbound HTTP.

A repeat raises :class:`AlreadyApplied` or :class:`StaleAttempt` (both :class:`EffectSkipped`)
instead of running the block; a handler that lets one escape has its job acked.
"""
from .http import idempotency_headers
from .outcomes import AlreadyApplied, EffectsError, EffectSkipped, EffectsTableMissing, PartialWrite, StaleAttempt
from .postgres import DEFAULT_TABLE, ddl, fenced, fenced_async, prune
from .redis_write import DEFAULT_REDIS_RETENTION, fenced_write, fenced_write_async

__all__ = [
    "DEFAULT_REDIS_RETENTION", "DEFAULT_TABLE", "AlreadyApplied", "EffectSkipped", "EffectsError",
    "EffectsTableMissing", "PartialWrite", "StaleAttempt", "ddl", "fenced", "fenced_async", "fenced_write",
    "fenced_write_async", "idempotency_headers", "prune",
]
