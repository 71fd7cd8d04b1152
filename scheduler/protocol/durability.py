"""``durable=``: what "schedule returned" promises about a job surviving a Redis failure.

* ``None`` (default): the job is on the master. A failover to an asynchronous replica, or a crash
  with AOF ``everysec``, can lose jobs acknowledged in the last moments.
* ``"replica"``: ``WAIT n timeout`` on the same connection after the write: returns once ``n``
  replicas have the job (so a Sentinel failover to one of them keeps it).
* ``"fsync"``: ``WAITAOF 1 0 timeout``: returns once the master's AOF is fsynced (Redis 7.2+).

A confirmation that does not come within the timeout raises :class:`DurabilityTimeout` with the
job ids: the jobs may exist (they are on the master).
"""
from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any

from .errors import DurabilityError, DurabilityTimeout, DurabilityUnsupported

MODES = ("replica", "fsync")


@dataclass(frozen=True)
class Durability:
    """A validated durability request."""

    mode: str
    replicas: int
    timeout_ms: int

    def command(self) -> tuple[Any, ...]:
        """The command to send after the writes, on the same connection."""
        if self.mode == "replica":
            return ("WAIT", self.replicas, self.timeout_ms)
        return ("WAITAOF", 1, 0, self.timeout_ms)

    def check(self, reply: Any, ids: list[str]) -> None:
        """Raise unless ``reply`` (of :meth:`command`) confirms the durability asked for."""
        what = f"{len(ids)} job(s)" if len(ids) != 1 else f"job {ids[0]}"
        if isinstance(reply, Exception):
            raise DurabilityError(
                f"{what} written to the master, but {self.command()[0]} failed: {reply}. The job(s) may exist; "
                "check the server's replication/AOF settings (durable='fsync' needs appendonly yes)", ids)
        if self.mode == "replica":
            got = int(reply)
            if got < self.replicas:
                raise DurabilityTimeout(
                    f"{what} written to the master, but only {got} of {self.replicas} replica(s) confirmed "
                    f"within {self.timeout_ms / 1000:g} s: the job(s) may exist (and would be lost if the master "
                    "failed now). Check with get(id), or schedule again with the same key; check the replicas' "
                    "link (INFO replication) or raise durable_timeout", ids)
        else:
            local = int(reply[0])
            if local < 1:
                raise DurabilityTimeout(
                    f"{what} written to the master, but its AOF was not fsynced within {self.timeout_ms / 1000:g} s: "
                    "the job(s) may exist. Check with get(id); check the disk or raise durable_timeout", ids)


def resolve(mode: object, replicas: object, timeout: object) -> Durability | None:
    """Validate ``durable=`` with the client's ``durable_replicas`` and ``durable_timeout``."""
    if mode is None:
        return None
    if mode not in MODES:
        raise ValueError(f"durable must be None, 'replica' or 'fsync', got {mode!r}")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 100:
        raise ValueError(f"durable_replicas must be an int from 1 to 100, got {replicas!r}")
    # a range test alone refuses nan and inf, and compares a 400-digit int without converting it
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
        raise ValueError(f"durable_timeout must be > 0 and <= 3600 seconds, got {reprlib.repr(timeout)}")
    return Durability(str(mode), replicas, max(1, int(timeout * 1000)))


def waitaof_missing(version: str) -> DurabilityUnsupported:
    return DurabilityUnsupported(
        f"durable='fsync' needs the WAITAOF command (Redis 7.2 or newer); this server is Redis {version}. "
        "Use durable='replica' (WAIT) or upgrade Redis")


def require_waitaof(info: Any) -> None:
    """Raise :class:`DurabilityUnsupported` unless the server (``INFO server`` reply) has WAITAOF.

    ``info`` may also be a cluster's reply from every master (node name -> that node's reply):
    then every master must have it, since a batch's WAIT goes to each node it touched."""
    for version in _versions(info):
        try:
            major, minor = (int(x) for x in version.split(".")[:2])
        except ValueError:
            continue  # unknown version string: let the server answer WAITAOF itself
        if (major, minor) < (7, 2):
            raise waitaof_missing(version)


def _versions(info: Any) -> list[str]:
    """The ``redis_version`` of one ``INFO server`` reply, or of each node's in a per-node mapping."""
    if isinstance(info, dict) and "redis_version" not in info and info \
            and all(isinstance(v, dict) for v in info.values()):
        return [parse_version(v) for v in info.values()]
    return [parse_version(info)]


def parse_version(info: Any) -> str:
    """``redis_version`` from an ``INFO server`` reply (parsed dict or raw text)."""
    if isinstance(info, dict):
        return str(info.get("redis_version", "?"))
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("redis_version:"):
            return line.split(":", 1)[1].strip()
    return "?"
