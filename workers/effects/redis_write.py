"""Fenced writes to the user's own Redis keys: a handler's commands apply once per job, whatever
the attempts, in one atomic script call on the user's server (not zsched's, unless it is the same).

::

    from workers.effects import fenced_write

    @worker.handler("payments")
    def pay(job):
        fenced_write(shop_redis, job, [
            ("INCRBY", "{acct:42}:balance", job.payload["amount"]),
            ("RPUSH", "{acct:42}:ledger", job.id),
        ])

The call runs one Lua script (EVALSHA, EVAL when the server does not have it yet) that reads a
per-job *fence key* first: ``{TAG}:zsched:fx:NAMESPACE:JOBID[:STEP]``, TAG being the first key's
hash tag (its ``{...}`` content, else the whole key), so it lives in the first key's cluster slot.

* No fence key: every check comes first (the keys' types against the commands), then the fence key
  is set to ``FENCE ATTEMPT MS`` with a TTL of ``retention``, then the commands run in order; their
  replies are returned (as a script returns them: ``b'OK'`` for SET, integers, bytes, None).
* A fence key: nothing is written; :class:`AlreadyApplied` (it records this fence or a lower one:
  an earlier attempt, or this call re-sent after a lost reply, whose writes did apply, once) or
  :class:`StaleAttempt` (a newer attempt's: this one lost its lease) is raised. Both are
  :class:`EffectSkipped`: a handler that lets one escape has its job acked.
* A command refused by the type check, or the first command failing: nothing written,
  :class:`EffectsError` (the job fails and retries by its backoff).
* A later command failing at run time (a value that is not an integer, a type an earlier command
  of the call changed): Redis has no rollback, so the commands before it stay applied. The fence
  key then records the failure, without TTL, and this and every later attempt raise
  :class:`PartialWrite` (never applying those commands twice) until someone repairs the keys and
  deletes the fence key the message names.

The fence key lives ``retention`` (default a day): a duplicate arriving later is not recognised,
so keep it longer than a job can take from its first attempt to its last. A handler's commands
(and its first key) must be the same in every attempt: derive them from the payload, not from the
clock. Commands allowed, with their arities: :data:`~.redis_commands.ALLOWED`; a call has at most
1000 commands and 8 MiB of keys and arguments. Integers above 2**53 in replies lose precision
(Lua numbers are doubles); the stored values are exact.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from redis.exceptions import NoScriptError

from scheduler.protocol.timeutil import MAX_MS

from .outcomes import EffectsError
from .redis_commands import Plan, plan
from .redis_script import SCRIPT, SHA, outcome
from .target import Target, target_of

DEFAULT_REDIS_RETENTION = timedelta(days=1)

_SYNC = (redis.Redis, redis.cluster.RedisCluster)
_ASYNC = (redis.asyncio.Redis, redis.asyncio.cluster.RedisCluster)
_PIPELINES = (redis.client.Pipeline, redis.cluster.ClusterPipeline, redis.asyncio.client.Pipeline,
              redis.asyncio.cluster.ClusterPipeline)
_CLUSTERS = (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster)


def retention_ms(retention: timedelta | float) -> int:
    """``retention`` (a timedelta or seconds) in whole milliseconds, from 1; raises
    :class:`EffectsError` otherwise."""
    if isinstance(retention, bool) or not isinstance(retention, (timedelta, int, float)):
        raise EffectsError(f"fenced_write retention is a timedelta or seconds, got {type(retention).__name__}")
    seconds = retention.total_seconds() if isinstance(retention, timedelta) else float(retention)
    if not math.isfinite(seconds) or not 0.001 <= seconds <= MAX_MS / 1000:
        raise EffectsError(f"fenced_write retention must be from 1 ms to {MAX_MS // 86_400_000} days, got "
                           f"{retention!r}; keep it longer than a job's first attempt to its last")
    return round(seconds * 1000)


def _prepare(r: Any, job: Any, commands: Sequence[Any], step: str, retention: timedelta | float,
             namespace: str | None, *, asynchronous: bool) -> tuple[Plan, Target]:
    if isinstance(r, _PIPELINES):
        raise EffectsError("fenced_write sends its own script call: give it the client, not a pipeline "
                           "(its commands would be queued, not run)")
    wanted, other = (_ASYNC, _SYNC) if asynchronous else (_SYNC, _ASYNC)
    if not isinstance(r, wanted):
        fn = "fenced_write_async" if asynchronous else "fenced_write"
        hint = ("; this is a redis.asyncio client: use fenced_write_async" if isinstance(r, _ASYNC) else
                "; this is a blocking client: use fenced_write" if isinstance(r, other) else "")
        raise EffectsError(f"{fn} needs a redis-py {'redis.asyncio ' if asynchronous else ''}Redis or "
                           f"RedisCluster client, got {type(r).__name__}{hint}")
    t = target_of(job, step, namespace)
    return plan(commands, t, retention_ms(retention), r.get_encoder().encode,
                same_slot=isinstance(r, _CLUSTERS)), t


def fenced_write(r: redis.Redis | redis.cluster.RedisCluster, job: Any, commands: Sequence[Sequence[Any]], *,
                 step: str = "", retention: timedelta | float = DEFAULT_REDIS_RETENTION,
                 namespace: str | None = None) -> list[Any]:
    """Run ``commands`` (``(NAME, KEY, *ARGS)`` tuples) on ``r`` in one atomic call, once per
    (job, ``step``) over all the job's attempts; returns their replies.

    Raises :class:`AlreadyApplied` or :class:`StaleAttempt` (both :class:`EffectSkipped`) when an
    attempt's writes are already recorded (nothing written); :class:`PartialWrite` when a command
    failed after earlier ones applied (now, or in an earlier attempt); :class:`EffectsError` for a
    command or argument it does not send, keys in two cluster slots (a cluster client), a wrong
    client, or a call Redis refused before any write. ``step`` names one of several fenced writes of
    a handler; ``retention``: how long the fence key lives; ``namespace`` defaults to the job's.
    Redis' own errors (connection, OOM, READONLY) propagate as they are: nothing was written then,
    except after a lost reply, when the retry reports :class:`AlreadyApplied`."""
    p, t = _prepare(r, job, commands, step, retention, namespace, asynchronous=False)
    try:
        reply = r.evalsha(SHA, len(p.keys), *p.keys, *p.args)
    except NoScriptError:  # not in this server's script cache yet: EVAL runs and caches it
        reply = r.eval(SCRIPT, len(p.keys), *p.keys, *p.args)
    return outcome(reply, p, t)


async def fenced_write_async(r: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster, job: Any,
                             commands: Sequence[Sequence[Any]], *, step: str = "",
                             retention: timedelta | float = DEFAULT_REDIS_RETENTION,
                             namespace: str | None = None) -> list[Any]:
    """:func:`fenced_write` for an asyncio handler and a ``redis.asyncio`` client."""
    p, t = _prepare(r, job, commands, step, retention, namespace, asynchronous=True)
    try:
        reply = await r.evalsha(SHA, len(p.keys), *p.keys, *p.args)
    except NoScriptError:
        reply = await r.eval(SCRIPT, len(p.keys), *p.keys, *p.args)
    return outcome(reply, p, t)
