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
  ``paused``   paused queues: hash queue -> ms when the pause started (lua/pause.lua; read by claim)
  ``hist:M``   the last hour: hash ``fired:Q`` / ``acked:Q`` / ``failed:Q`` / ``dead:Q`` -> count in minute M
               (Redis ms // 60 000), written with the counters, expiring an hour after its last new
               field (lua/_lib.lua ``tally``; read by the console, :mod:`.history`)
  ``crons``    cron names; ``cron:NAME`` one cron's definition and upcoming occurrences (lua/_lib_cron.lua)
Namespace-wide: ``{ns}:cfg`` (partition count, ``rate:QUEUE`` limits, ``dead:max``, ``dead:ttl_ms``,
``queue:idle_ms``, ``paused:QUEUE`` -> ms: the queue pause every partition's ``paused`` copies),
``{ns}:rl:QUEUE`` token buckets, ``{ns}:ui:session:ID`` one web-console login session each (JSON: who,
when it ends, from where; expires when the session ends; ID is an HMAC of the cookie's id).
The worker registry (:mod:`.registry`), both keys in the slot of ``{ns}``: ``{ns}:workers`` hash
worker id -> ``LAST_MS:`` + msgpack record (LAST_MS: Redis's clock at the worker's last refresh),
``{ns}:workers:live`` sorted set worker id -> ms (Redis clock) until which the record counts as live.
Doorbells (workers/doorbell.py): ``{ns}:bell:QUEUE`` sorted set, member "P" or "P:resume" (partition
P's ready list has jobs), score when it was rung (ms); workers BZPOPMIN on their queues' bells.
``{ns}:sweep:QUEUE``: which worker sweeps the queue this period (SET NX PX by the sweeping worker).

Pub/sub, two layouts (the scripts publish on ``CHAN .. name`` with CHAN = :meth:`Keyspace.channel_prefix`):
  plain (one Redis): ``ns:wake`` (scheduler), ``ns:config`` (config changed), ``ns:epoch-reset``;
  PUBLISH/SUBSCRIBE.
  sharded (``Keyspace(..., sharded=True)``, Redis Cluster; Redis >= 7): ``{ns:p}:wake`` (also "r
  MEMBER QUEUE": ring QUEUE's bell, which is in another slot, for the partition's owner to relay),
  ``{ns:p}:epoch-reset`` per partition, ``{ns}:config``; SPUBLISH/SSUBSCRIBE.
  A channel carries its partition's hash tag (the config channel the ``{ns}`` tag of ``{ns}:cfg``),
  so a message goes only to the node that owns the slot, not over the whole cluster bus.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

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
    if not _NAME_RE.fullmatch(name):  # fullmatch: with match, "$" also matches before a final "\n"
        raise ValueError(
            f"{kind} {name!r} is invalid: expected 1-64 characters of letters, digits, '_', '.', '-', "
            "starting with a letter or digit (no spaces, '{', '}' or ':')"
        )
    return name


def _queue_set(queues: Sequence[str]) -> str:
    """A short, fixed-length name for a set of queues (order and repeats ignored)."""
    return hashlib.sha1("\n".join(sorted(set(queues))).encode()).hexdigest()[:16]


def validate_partitions(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be an integer from 1 to {MAX_PARTITIONS}, got {n!r}")
    return n


@dataclass(frozen=True)
class Keyspace:
    """Key and channel names of one namespace.

    ``sharded``: the pub/sub layout for Redis Cluster (see the module docstring): every channel
    carries a hash tag, and the scripts and clients use SPUBLISH/SSUBSCRIBE (Redis >= 7). The keys
    are the same in both layouts.
    """

    namespace: str
    partitions: int
    sharded: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        validate_name("namespace", self.namespace)
        validate_partitions(self.partitions)

    @property
    def config_key(self) -> str:
        return "{%s}:cfg" % self.namespace

    def channel_prefix(self, partition: int) -> str:
        """What the scripts of ``partition`` get as CHAN (ARGV[2]) and prepend to every channel they
        publish on. Sharded, it is the partition's key prefix ``{ns:p}:``; lua/_lib.lua ``publish``
        tells the modes apart by its first byte (``{``: SPUBLISH), which a namespace name never
        starts with (:func:`validate_name`)."""
        return self.prefix(partition) if self.sharded else f"{self.namespace}:"

    def _namespace_channel(self, name: str) -> str:
        if self.sharded:
            raise ValueError(f"namespace {self.namespace!r} uses sharded pub/sub: its {name} channels are per "
                             f"partition; use {name.replace('-', '_')}_channels()")
        return self.channel_prefix(0) + name

    @property
    def wake_channel(self) -> str:
        """The wake channel of the plain layout (ValueError when sharded: see :meth:`wake_channels`)."""
        return self._namespace_channel("wake")

    def wake_channels(self) -> list[str]:
        """Every wake channel: one for the namespace, or per partition when sharded (element p is
        partition p's). Payload: the partition number."""
        return self._channels("wake")

    @property
    def config_channel(self) -> str:
        """Where clients announce a change of the namespace config: ``ns:config``, or when sharded
        ``{ns}:config`` (the slot of ``{ns}:cfg``, so it is SPUBLISHed in the write's MULTI)."""
        if self.sharded:
            return "{%s}:config" % self.namespace
        return f"{self.namespace}:config"

    def bucket(self, queue: str) -> str:
        """Namespace-wide token bucket of a rate-limited queue (not a partition key)."""
        return "{%s}:rl:%s" % (self.namespace, queue)

    def ui_session_key(self, session: str) -> str:
        """One ``zsched ui`` login session; one key per session, so every command on it names one
        key (Redis Cluster). ``session``: the console's name for it, lowercase hex."""
        if not session or not all(ch in "0123456789abcdef" for ch in session):
            raise ValueError(f"a console session name is lowercase hex, got {session[:80]!r}")
        return "{%s}:ui:session:%s" % (self.namespace, session)

    @property
    def workers_key(self) -> str:
        """The worker registry's records: hash worker id -> ``LAST_MS:`` + msgpack record
        (:mod:`.registry`). Hash tag ``{ns}``: the same slot as :attr:`workers_live_key`."""
        return "{%s}:workers" % self.namespace

    @property
    def workers_live_key(self) -> str:
        """The worker registry's liveness: sorted set worker id -> ms (Redis clock) until which the
        worker's record counts as live."""
        return "{%s}:workers:live" % self.namespace

    def bell(self, queue: str) -> str:
        """``queue``'s doorbell (workers/doorbell.py, lua/_lib.lua ``ring``): a sorted set whose
        members are partition numbers ("P", or "P:resume") whose ready lists have jobs, scored by
        when they were rung (ms). Hash tag ``{ns}``: every bell of the namespace is in one slot, so a
        worker waits on all its queues' bells with one command, on Redis Cluster too."""
        return "{%s}:bell:%s" % (self.namespace, queue)

    def burst_bell(self, queue: str) -> str:
        """``queue``'s burst bell (lua/_lib.lua ``ring``): the bell rung instead of :meth:`bell`
        when a script leaves several jobs ready in a partition at once (``BURST_RING``; a
        tick's only when they come due within ``bells.BURST_SPAN_MS`` of each other), and by
        ``resume``. Every idle worker waits on it, one listener's sleepers too, so a
        burst reaches them all at once while spread traffic stays on the listener. Same members and
        scores as the bell."""
        return "{%s}:bell:%s:b" % (self.namespace, queue)

    def listener(self, queues: Sequence[str]) -> str:
        """With one listener (the default; not with ``zsched worker --no-one-listener``): which
        worker serving exactly ``queues`` waits on their bells now (workers/doorbell.py): a string
        holding its id, set with NX and kept alive with an expiry while it listens. The others of
        that set sleep on :meth:`listen_wake`, so rings go to one warm worker instead of the one
        that has waited longest. Hash tag ``{ns}``, beside the bells."""
        return "{%s}:listen:%s" % (self.namespace, _queue_set(queues))

    def listen_wake(self, queues: Sequence[str]) -> str:
        """Where the workers serving ``queues`` that are not listening wait (a sorted set, expiring
        2 s after its last write): a listener handing its role on adds ``w``, and the worker that
        has waited longest takes the role; a burst claim adds ``h0``, ``h1``, ... and each wakes a
        helper."""
        return "{%s}:listen:%s:wake" % (self.namespace, _queue_set(queues))

    def listen_watch(self, queues: Sequence[str]) -> str:
        """Which sleeper of the workers serving ``queues`` watches the listener (one server): a
        string holding its id, set with NX and kept alive with an expiry while it sleeps. Its bell
        waits time out every ``BELL_WAIT`` so that it finds a dead listener's rings at once; the
        other sleepers' waits last until their next chore is due (workers/listen_role.py)."""
        return "{%s}:listen:%s:watch" % (self.namespace, _queue_set(queues))

    def sweep_turn(self, queue: str) -> str:
        """Whose turn it is to sweep ``queue`` (workers/doorbell.py): a string set with NX and an
        expiry of the sweep period by the worker that sweeps; the others skip that period. Hash tag
        ``{ns}``, beside the bells."""
        return "{%s}:sweep:%s" % (self.namespace, queue)

    @property
    def epoch_reset_channel(self) -> str:
        """Pub/sub channel ``epoch_reset`` publishes a partition number on after resetting it (the
        script builds it as CHAN .. 'epoch-reset'); replicas backing off from an epoch conflict
        retry that partition at once. Plain layout only (ValueError when sharded: see
        :meth:`epoch_reset_channels`)."""
        return self._namespace_channel("epoch-reset")

    def epoch_reset_channels(self) -> list[str]:
        """Every epoch-reset channel: one, or per partition when sharded (element p is partition p's)."""
        return self._channels("epoch-reset")

    def _channels(self, name: str) -> list[str]:
        return [self.channel_prefix(p) + name for p in range(self.partitions if self.sharded else 1)]

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
