"""Namespace-wide settings kept in the config hash ``{ns}:cfg``: rate limits, dead-letter
retention, queue retirement and how long finished jobs stay visible (the tombstone TTL). The
clients write them (checked here); the scheduler tier reads them back with the ``parse_*``
functions and is told of a change on the config channel."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..protocol import config
from ..protocol.calls import tombstone_ms
from ..protocol.codec import finite_number
from ..protocol.keys import Keyspace, validate_name

DEFAULT_QUEUE_IDLE = 86400.0  # seconds an empty queue stays interned (Client.set_queue_retirement)
QUEUE_IDLE_FIELD = "queue:idle_ms"


def validate_rate(queue: str, per_second: object, burst: object | None) -> tuple[float, float]:
    """Check a rate limit; burst defaults to a quarter second's worth (at least 1 job): small enough
    that a herd starts as a stream, large enough that a briefly delayed owner does not lose tokens."""
    validate_name("queue", queue)
    rate = finite_number("per_second", per_second)
    if not 0 < rate <= 1_000_000:
        raise ValueError(f"per_second must be > 0 and <= 1000000 jobs/s, got {per_second!r}")
    b = max(1.0, rate / 4) if burst is None else finite_number("burst", burst)
    if not 1 <= b <= 10_000_000:
        raise ValueError(f"burst must be from 1 to 10000000 jobs, got {burst!r}")
    return rate, b


def rate_limit_fields(queue: str, per_second: object, burst: object | None) -> dict[str, str | None]:
    """Validate a rate limit; the config field to write."""
    rate, b = validate_rate(queue, per_second, burst)
    return {f"rate:{queue}": f"{rate!r} {b!r}"}


def no_rate_limit_fields(queue: str) -> dict[str, str | None]:
    """The config field that removes a queue's rate limit (None = delete)."""
    validate_name("queue", queue)
    return {f"rate:{queue}": None}


def parse_rate_limits(cfg: Mapping[Any, Any]) -> dict[str, tuple[float, float]]:
    """Queue -> (jobs per second, burst) from the namespace config; unreadable entries are skipped."""
    out: dict[str, tuple[float, float]] = {}
    for k, v in cfg.items():
        if k.startswith(b"rate:"):
            try:
                rate, burst = (float(x) for x in v.split())
            except ValueError:
                continue
            out[k[5:].decode()] = (rate, burst)
    return out


def retention_fields(max_dead: object, dead_ttl: object) -> dict[str, str | None]:
    """Validate a dead-letter retention setting; the config fields to write (None = delete)."""
    if max_dead is not None and (isinstance(max_dead, bool) or not isinstance(max_dead, int)
                                 or not 1 <= max_dead <= 10**12):
        raise ValueError(f"max_dead must be None (no cap) or an int from 1 to 10**12, got {max_dead!r}")
    ttl_ms = None
    if dead_ttl is not None:
        ttl = finite_number("dead_ttl", dead_ttl)
        if not 1 <= ttl <= 10 * 365 * 86400:
            raise ValueError(f"dead_ttl must be None (keep forever) or 1 s to 10 years, got {dead_ttl!r}")
        ttl_ms = str(int(ttl * 1000))
    return {"dead:max": None if max_dead is None else str(max_dead), "dead:ttl_ms": ttl_ms}


def parse_dead_retention(cfg: Mapping[Any, Any]) -> tuple[int | None, float | None]:
    """(max_dead, dead_ttl seconds) from the namespace config; None where unset or unreadable."""
    def num(field: bytes) -> int | None:
        try:
            v = int(cfg[field])
        except (KeyError, ValueError):
            return None
        return v if v > 0 else None

    ttl_ms = num(b"dead:ttl_ms")
    return num(b"dead:max"), None if ttl_ms is None else ttl_ms / 1000.0


def queue_idle_field(idle: object) -> str:
    """Validate a queue retirement time; the config value (ms, '0' = never)."""
    if idle is None:
        return "0"
    t = finite_number("idle", idle)
    if not 0.001 <= t <= 10 * 365 * 86400:
        raise ValueError(f"idle must be None (never retire) or 1 ms to 10 years, got {idle!r}")
    return str(max(1, int(t * 1000)))


def parse_queue_idle(cfg: Mapping[Any, Any]) -> float | None:
    """The queue retirement time in seconds (the default when unset); None = never."""
    raw = cfg.get(QUEUE_IDLE_FIELD.encode(), cfg.get(QUEUE_IDLE_FIELD))
    try:
        ms = DEFAULT_QUEUE_IDLE * 1000 if raw is None else int(raw)
    except ValueError:
        ms = DEFAULT_QUEUE_IDLE * 1000
    return ms / 1000.0 if ms > 0 else None


TOMBSTONE_TTL_FIELD = "tomb:ttl_ms"


def tombstone_ttl_fields(ttl: object) -> dict[str, str | None]:
    """Validate a tombstone TTL (seconds, 0 = keep no tombstone); the config field to write."""
    return {TOMBSTONE_TTL_FIELD: str(tombstone_ms(ttl))}


def parse_tombstone_ttl(cfg: Mapping[Any, Any]) -> float:
    """The namespace's tombstone TTL in seconds (:data:`~scheduler.protocol.config.DEFAULT_TOMBSTONE_TTL`
    when unset or unreadable)."""
    raw = cfg.get(TOMBSTONE_TTL_FIELD.encode(), cfg.get(TOMBSTONE_TTL_FIELD))
    return stored_tombstone_ttl(raw)


def stored_tombstone_ttl(raw: object) -> float:
    """The tombstone TTL (seconds) from the stored field's value (bytes, str or None)."""
    try:
        ms = int(raw) if raw is not None else -1  # type: ignore[call-overload]
    except (TypeError, ValueError):
        ms = -1
    return ms / 1000.0 if ms >= 0 else config.DEFAULT_TOMBSTONE_TTL


def config_commands(pipe: Any, ks: Keyspace, fields: Mapping[str, str | None], what: str) -> None:
    """Queue the namespace-config writes (None deletes a field) and the change notice the
    scheduler tier listens for. Sharded, the notice is an SPUBLISH on ``{ns}:config``, the slot
    of ``{ns}:cfg``: it rides in the same MULTI on a cluster and reaches only that slot's node."""
    for k, v in fields.items():
        if v is None:
            pipe.hdel(ks.config_key, k)
        else:
            pipe.hset(ks.config_key, k, v)
    if ks.sharded:
        pipe.spublish(ks.config_channel, what)
    else:
        pipe.publish(ks.config_channel, what)
