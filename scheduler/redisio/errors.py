"""What a loop that must keep going counts as "Redis failed": it logs, backs off and tries again
on any of these, never ends silently.

Any Redis failure, not only a lost connection: a READONLY old master after a failover, OOM, a
script error, CLUSTERDOWN. ``OSError`` covers refused and reset connections and timeouts
(``ConnectionError`` and, since Python 3.11, ``asyncio.TimeoutError`` are ``OSError``\\ s)."""
from __future__ import annotations

from redis.exceptions import RedisError

REDIS_ERRORS = (RedisError, OSError)
