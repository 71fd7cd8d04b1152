"""Key layout. Every key of a partition starts with the hash tag ``{ns:p}``, so a partition is one
Redis Cluster slot and no script touches two partitions.

Per partition ``{ns:p}:`` +
  ``t``        timers: sorted set, member = id(15) + record, score = run_at ms      (state scheduled)
  ``m``        moved: hash id -> timer score, only for jobs whose score is not the id's run_at
  ``r:QUEUE``  ready list of ids, LPUSH in, RPOP out (FIFO)                           (state ready)
  ``j``        bodies of jobs that are not in ``t``: hash id -> due ms (6 bytes) .. record
  ``i``        in-flight: sorted set id -> lease deadline ms                          (state running)
  ``l``        lease tokens: hash id -> token (the job's fence)
  ``d``        dead letter: sorted set id -> time of death ms                          (state dead)
  ``e``        last errors: hash id -> plain text ``at_ms NUL type NUL message NUL traceback``, not
               msgpack (built by ``error_blob`` in lua/_lib.lua and by ``calls.error_arg`` for
               ``fail``, which the script prefixes with the time; read by ``replies.parse_error``)
  ``k``        idempotency keys: hash key -> id, while the job is live
  ``h:QUEUE``  held: sorted set id -> due ms, due jobs waiting for a rate-limit token (scheduled)
  ``x``        legacy tombstones (before ``f``): sorted set id..state-letter -> expiry ms; only drained by tick
  ``q``        queue names interned to small numbers: ``n:NAME`` -> idx, ``i:IDX`` -> name
  ``qfree``    retired queue indexes: sorted set idx -> when it may be reused
  ``g``        gauges per queue (``s:Q`` scheduled, ``h:Q`` held, ``a:Q`` running, ``d:Q`` dead)
  ``c``        counters per queue (``scheduled:Q``, ``fired:Q``, ...) exported by the partition owner
  ``meta``     ``fence`` (last lease token: above the server clock in µs), ``epoch`` (highest scheduler epoch seen),
               ``fcur`` (cursor of the incremental HSCAN that trims expired ``f`` entries)
  ``f``        finished jobs (tombstones: done, cancelled, misfired): hash id -> packed summary (state,
               finished and expiry ms, queue index, attempts, max_attempts, due ms of the last attempt,
               created, key, and the last error as in ``e`` without its traceback, cut at 160 bytes;
               layout in lua/_lib.lua ``tombstone``)
  ``cr:RID``   claim receipts: the ids a claim with request id RID handed out (re-sent claims)
  ``crons``    cron names; ``cron:NAME`` one cron's definition and upcoming occurrences (lua/_lib_cron.lua)
Namespace-wide: ``{ns}:cfg`` (partition count, ``rate:QUEUE`` limits, ``dead:max``, ``dead:ttl_ms``,
``queue:idle_ms``), ``{ns}:rl:QUEUE`` token buckets. Pub/sub: ``ns:wake`` (scheduler),
``ns:ready:QUEUE`` (workers), ``ns:config`` (config changed), ``ns:epoch-reset``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
MAX_PARTITIONS = 4096

# Order matters: scripts refer to these by position (see the KEYS header of each lua file).
PARTITION_KEYS = ("t", "m", "j", "i", "l", "d", "e", "k", "x", "q", "g", "c", "meta", "f")


def validate_name(kind: str, name: object) -> str:
    """Check a namespace or queue name: 1-64 chars of letters, digits, ``_ . -``, starting alnum.

    ``{``, ``}`` and ``:`` are refused because they would let a name reach another partition's
    keys or break the hash tag.
    """
    if not isinstance(name, str):
        raise TypeError(f"{kind} must be a str, got {type(name).__name__}")
    if not _NAME_RE.match(name):
        raise ValueError(
            f"{kind} {name!r} is invalid: expected 1-64 characters of letters, digits, '_', '.', '-', "
            "starting with a letter or digit (no spaces, '{', '}' or ':')"
        )
    return name


def validate_partitions(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be an integer from 1 to {MAX_PARTITIONS}, got {n!r}")
    return n


@dataclass(frozen=True)
class Keyspace:
    """Key names of one namespace."""

    namespace: str
    partitions: int

    def __post_init__(self) -> None:
        validate_name("namespace", self.namespace)
        validate_partitions(self.partitions)

    @property
    def config_key(self) -> str:
        return "{%s}:cfg" % self.namespace

    @property
    def wake_channel(self) -> str:
        return f"{self.namespace}:wake"

    @property
    def config_channel(self) -> str:
        return f"{self.namespace}:config"

    def bucket(self, queue: str) -> str:
        """Namespace-wide token bucket of a rate-limited queue (not a partition key)."""
        return "{%s}:rl:%s" % (self.namespace, queue)

    def ready_channel(self, queue: str) -> str:
        return f"{self.namespace}:ready:{queue}"

    @property
    def epoch_reset_channel(self) -> str:
        """Pub/sub channel ``epoch_reset`` publishes a partition number on after resetting it (the
        script builds it as CHAN .. 'epoch-reset'); replicas backing off from an epoch conflict
        retry that partition at once."""
        return f"{self.namespace}:epoch-reset"

    @property
    def ready_channel_prefix(self) -> str:
        return f"{self.namespace}:ready:"

    def prefix(self, partition: int) -> str:
        return "{%s:%d}:" % (self.namespace, partition)

    def partition_keys(self, partition: int) -> list[str]:
        """The fixed keys of a partition, in PARTITION_KEYS order."""
        p = self.prefix(partition)
        return [p + s for s in PARTITION_KEYS]

    def ready(self, partition: int, queue: str) -> str:
        return f"{self.prefix(partition)}r:{queue}"

    def key(self, partition: int, suffix: str) -> str:
        return self.prefix(partition) + suffix
