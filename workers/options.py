"""The worker's settings as one checked, immutable value (``Worker.options``).

Every setting is checked when a :class:`WorkerOptions` is made, so a bad value fails where it is
written (``Worker(...)`` or ``worker.configure(...)``), never later inside a running worker.
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from scheduler.metrics import check_host, check_port
from scheduler.protocol import codec, config
from scheduler.protocol.calls import tombstone_ms
from scheduler.protocol.keys import validate_name
from scheduler.protocol.registry import MAX_INTERVAL_S

DEFAULT_CONCURRENCY = 16
# jobs handed off ahead of their due time that may wait on top of the handler slots, at most: a
# claim takes no more than the handlers start within 50 ms (workers/pace.py DuePace.claim_size).
# A wake-up that takes 4 burst rings (pace.TAKE_MAX) claims those partitions' bursts whole with it
DEFAULT_PREFETCH = 256
DEFAULT_SHUTDOWN_GRACE = 30.0
# at shutdown, how long undelivered outcomes (acks, failures, hand-backs) are retried while Redis
# is unreachable before the worker exits without them (their jobs run again after their leases)
DEFAULT_DRAIN_TIMEOUT = 10.0
DEFAULT_IDLE_SWEEP = 2.0
DEFAULT_METRICS_HOST = config.DEFAULT_METRICS_HOST
# seconds between refreshes of the worker's registry record (zsched workers); one small script
# call per interval, and a killed worker drops out of the live list 3 intervals after its last one
DEFAULT_REGISTRY_INTERVAL = 5.0
# how long an ack may wait for others of its partition to share its script call (workers/outbox.py);
# 0: sent within about a millisecond, as before the option
DEFAULT_ACK_LINGER = 0.0
MAX_ACK_LINGER = 1.0

def check_positive(name: str, value: object, *, integer: bool = False) -> float:
    """``value`` if it is a finite number > 0 (an int when ``integer``); TypeError or ValueError
    naming ``name`` otherwise. bool is refused: ``True`` is never meant as 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise TypeError(f"{name} must be {'an int' if integer else 'a number'}, got {type(value).__name__}")
    if codec.finite_number(name, value) <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def _queues(queues: Sequence[str]) -> tuple[str, ...]:
    if isinstance(queues, str):
        raise TypeError("queues must be a list of queue names, not a str")
    qs = [validate_name("queue", q) for q in queues]
    if not qs:
        raise ValueError("queues must name at least one queue")
    return tuple(dict.fromkeys(qs))  # first occurrence wins, order kept


def _timeouts(timeouts: Mapping[str, float]) -> Mapping[str, float]:
    for q, t in timeouts.items():
        validate_name("queue", q)
        check_positive(f"handler_timeouts[{q!r}]", t)
    return MappingProxyType({q: float(t) for q, t in timeouts.items()})


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be >= 0 seconds, got {value!r}")
    seconds = codec.finite_number(name, value)
    if seconds < 0:
        raise ValueError(f"{name} must be >= 0 seconds, got {value!r}")
    return seconds


def _payload_limit(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_payload_bytes must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """A worker's settings, checked and normalised (see :class:`~workers.Worker` for their meaning).

    ``redis_url`` and ``namespace`` of None mean "from the environment, else the default" and are
    resolved when the worker starts; ``queues`` of None means "the queues that have handlers";
    ``partitions`` of None adopts the namespace's stored count.
    """

    redis_url: str | None = None
    namespace: str | None = None
    queues: Sequence[str] | None = None  # stored as a tuple, duplicates dropped
    concurrency: int = DEFAULT_CONCURRENCY
    prefetch: int | None = None  # None: DEFAULT_PREFETCH (prefetch_slots)
    handler_timeouts: Mapping[str, float] = field(default_factory=dict, hash=False)
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    tombstone_ttl: float | None = None  # deprecated: the namespace's (Client.set_tombstone_ttl)
    max_payload_bytes: int = codec.DEFAULT_MAX_PAYLOAD
    partitions: int | None = None
    metrics_port: int | None = None
    metrics_host: str = DEFAULT_METRICS_HOST
    idle_sweep: float = DEFAULT_IDLE_SWEEP
    redis_options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    sharded_pubsub: bool | None = None  # None: sharded exactly on a Redis Cluster (AsyncClient's rule)
    registry_interval: float = DEFAULT_REGISTRY_INTERVAL
    one_listener: bool = True  # one worker of a set of queues waits on the bells (workers/doorbell.py)
    ack_linger: float = DEFAULT_ACK_LINGER  # seconds an ack may wait to share a call (workers/outbox.py)

    def __post_init__(self) -> None:
        # Normalised in place (frozen: through object.__setattr__); checking an already
        # normalised value again gives the same value, so replace() can re-run all of this.
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if self.redis_url is not None:
            put("redis_url", config.redis_url(self.redis_url))
        if self.namespace is not None:
            put("namespace", config.namespace(self.namespace))
        if self.queues is not None:
            put("queues", _queues(self.queues))
        check_positive("concurrency", self.concurrency, integer=True)
        if self.prefetch is not None and (isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int)
                                          or self.prefetch < 0):
            raise ValueError(f"prefetch must be an int >= 0 (jobs held ahead of their due time), got {self.prefetch!r}")
        put("metrics_host", check_host(self.metrics_host))
        put("handler_timeouts", _timeouts(self.handler_timeouts))
        put("shutdown_grace", _seconds("shutdown_grace", self.shutdown_grace))
        put("drain_timeout", _seconds("drain_timeout", self.drain_timeout))
        put("metrics_port", None if self.metrics_port is None else check_port(self.metrics_port))
        if self.tombstone_ttl is not None:
            put("tombstone_ttl", float(tombstone_ms(self.tombstone_ttl)) / 1000)
            warnings.warn("Worker(tombstone_ttl=) is deprecated: how long finished jobs stay visible is a namespace "
                          "setting now (Client.set_tombstone_ttl(seconds), 'zsched namespace tombstone-ttl'); given "
                          "here it still overrides the namespace's for this worker's acks", DeprecationWarning,
                          stacklevel=4)
        put("max_payload_bytes", _payload_limit(self.max_payload_bytes))
        put("idle_sweep", float(check_positive("idle_sweep", self.idle_sweep)))
        put("registry_interval", float(check_positive("registry_interval", self.registry_interval)))
        if self.registry_interval > MAX_INTERVAL_S:
            raise ValueError(f"registry_interval must be at most {MAX_INTERVAL_S:g} seconds, "
                             f"got {self.registry_interval!r}")
        put("redis_options", MappingProxyType(dict(self.redis_options)))
        if self.sharded_pubsub is not None and not isinstance(self.sharded_pubsub, bool):
            raise TypeError(f"sharded_pubsub must be True, False or None (automatic), got {self.sharded_pubsub!r}")
        if not isinstance(self.one_listener, bool):
            raise TypeError(f"one_listener must be True or False, got {self.one_listener!r}")
        put("ack_linger", float(_seconds("ack_linger", self.ack_linger)))
        if self.ack_linger > MAX_ACK_LINGER:
            raise ValueError(f"ack_linger must be from 0 to {MAX_ACK_LINGER:g} seconds, got {self.ack_linger!r}")

    @property
    def prefetch_slots(self) -> int:
        """The prefetch allowance in effect: ``prefetch`` when given, else :data:`DEFAULT_PREFETCH`.
        (Until 2026-12-04 one listener defaulted to the concurrency: it then took a burst's first
        partitions whole while the workers it woke had room. Bursts now ring every idle worker:
        docs/architecture.md "Waking workers".)"""
        return DEFAULT_PREFETCH if self.prefetch is None else self.prefetch

    def updated(self, **changes: Any) -> WorkerOptions:
        """A copy with the given settings changed; ``None`` leaves a setting as it is, and
        ``handler_timeouts`` are merged into the current ones (a queue given again is replaced)."""
        given = {k: v for k, v in changes.items() if v is not None}
        if "handler_timeouts" in given:
            given["handler_timeouts"] = {**self.handler_timeouts, **given["handler_timeouts"]}
        return replace(self, **given)


def redis_options_arg(redis_options: Mapping[str, Any] | None,
                      redis_kwargs: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``redis_kwargs``, the old name of ``redis_options`` (``Client.from_url`` calls it so):
    still taken, with a DeprecationWarning; both at once is a TypeError."""
    if redis_kwargs is None:
        return redis_options
    if redis_options is not None:
        raise TypeError("give redis_options or its deprecated old name redis_kwargs, not both")
    warnings.warn("Worker(redis_kwargs=...) is deprecated: call it redis_options, as Client.from_url does",
                  DeprecationWarning, stacklevel=3)
    return redis_kwargs
