"""The cron side of a partition's firing loop: each cron keeps a table of upcoming occurrences
in Redis (``cron_fill``); the owner computes them here (croniter, time zones, jitter) when a
tick reports a table running low and when it takes the partition over."""
from __future__ import annotations

import logging
import time
from zoneinfo import ZoneInfo

from ..protocol.call import Call
from ..protocol.calls import Calls
from ..protocol.cron import LOOKAHEAD, occurrences, with_jitter
from ..protocol.tick import CRON_FIELDS, CronTable, cron_fill_call, cron_key, crons_key, parse_cron_table
from ..redisio.transport import AsyncScriptTransport
from ..redisio.transport_async import lost_in_transit

log = logging.getLogger("zsched.scheduler")


# Both read with redis-py directly (no script): a connection closed under the read (a failover)
# reaches the runner as the ConnectionError it handles, not as a bug (lost_in_transit).
@lost_in_transit
async def cron_names(scripts: AsyncScriptTransport, core: Calls, partition: int) -> list[str]:
    """The names of the crons of ``partition``, sorted."""
    return sorted(n.decode() for n in await scripts.redis.smembers(crons_key(core.ks, partition)))


@lost_in_transit
async def fill_calls(scripts: AsyncScriptTransport, core: Calls, partition: int, epoch: int, names: list[str],
                     only_if_needed: bool = False) -> list[Call]:
    """The ``cron_fill`` calls that top up the tables of crons ``names`` of ``partition`` (their
    tables read in one pipeline; a removed cron is skipped). ``only_if_needed``: only the tables
    with no pending occurrence or fewer than half of :data:`LOOKAHEAD` planned."""
    pipe = scripts.redis.pipeline(transaction=False)
    for name in names:
        pipe.hmget(cron_key(core.ks, partition, name), *CRON_FIELDS)
    rows = await pipe.execute()
    now_ms = int(time.time() * 1000)
    calls = []
    for name, row in zip(names, rows):
        table = parse_cron_table(row)
        if table is None:
            continue  # removed
        if only_if_needed and table.pending and table.upcoming >= LOOKAHEAD // 2:
            continue
        planned = plan_occurrences(name, table, now_ms)
        if planned:
            calls.append(cron_fill_call(core, partition, epoch, name, table.version, planned))
    return calls


def plan_occurrences(name: str, table: CronTable, now_ms: int) -> list[tuple[int, int]]:
    """The next ``(nominal ms, fire ms)`` occurrences of a cron after what its table has planned (or
    after ``now_ms`` when nothing is pending), jittered; [] (logged) when the definition cannot be
    evaluated. Also used by :mod:`scheduler.testing`, which refills crons on its fake clock."""
    spec = table.spec()
    after = now_ms if table.last_planned_ms is None else table.last_planned_ms
    try:
        nominals = occurrences(spec["expr"], ZoneInfo(spec["tz"]), after, LOOKAHEAD)
    except Exception as exc:  # a definition we cannot evaluate any more: say so, keep going
        log.error("cron %r: cannot compute occurrences (%s)", name, exc)
        return []
    jitter_ms = int(float(spec.get("jitter") or 0) * 1000)
    return with_jitter(nominals, jitter_ms)
