"""The protocol layer: everything that knows how zsched's data looks in Redis.

- Where things live: :mod:`.keys` (key layout), :mod:`.codec` (the bytes of a record and a
  tombstone), :mod:`.ids` (job ids).
- Talking to Redis: :mod:`.scripts` (loads ``lua/``), :mod:`.transport` (EVALSHA, pipelines,
  retries and which scripts may be re-sent), :mod:`.connection` (URLs to redis-py clients),
  :mod:`.durability` (WAIT / WAITAOF).
- Calls and replies: :mod:`.calls` (producer and operator script calls), :mod:`.tick` (the
  owner's tick, reap, ratelimit, cron_fill), :mod:`.replies` (typed replies), :mod:`.codes`
  (every script status code, mapped to outcomes), :mod:`.listing` (paged listings),
  :mod:`.options` (validated job options), :mod:`.registry` (the worker registry: records of
  live worker processes, not job state).
- Shared vocabulary: :mod:`.errors`, :mod:`.models`, :mod:`.timeutil`, :mod:`.cron`,
  :mod:`.config`.

Modules here import only each other: clients, the tier, the workers and the operator shell build
on this layer, never the other way round (tests/unit/test_architecture.py).
"""
