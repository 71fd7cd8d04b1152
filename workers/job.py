"""The object a handler receives."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from scheduler.protocol.ids import encode_id
from scheduler.protocol.timeutil import ms_to_datetime


class Job:
    """One claimed attempt of a job, as passed to a handler.

    Attributes:
        id: public job id string, as returned by ``schedule`` (stable across attempts: use it as an
            idempotency key downstream).
        key: the idempotency key given at schedule time, or None.
        queue: queue name.
        payload: the decoded payload (msgpack: None, bool, int, float, str, bytes, lists, dicts).
        attempt: 1 for the first run, 2 for the first retry, ...
        max_attempts: attempts allowed before the job is dead-lettered.
        run_at: aware datetime (UTC) when this attempt became due.
        fence: lease token of this attempt; grows with every claim of the job. Pass it to
            downstream systems so they can refuse a write from an older (stale) attempt.
        lease: the lease (visibility timeout) in seconds; the worker extends it while you run.
        cron_nominal: for an occurrence of a cron, the nominal time it stands for (after an outage
            with ``misfire="run_late"``, the latest missed occurrence); None for other jobs.
        cron_missed: for a cron catch-up run, how many earlier missed occurrences it also covers.
        namespace: the zsched namespace the job belongs to (ids are unique within one; the fenced
            effects of :mod:`workers.effects` record it beside the id).
    """

    # Cheap to build (one per job on the hot path): id and run_at are computed on first use.
    __slots__ = ("_raw_id", "_id", "key", "queue", "payload", "attempt", "max_attempts", "_due_ms",
                 "_run_at", "fence", "lease", "_lost", "_cron_ms", "cron_missed", "namespace")

    def __init__(self, raw_id: bytes, queue: str, payload: Any, key: str | None, attempt: int,
                 max_attempts: int, due_ms: int, fence: int, lease: float, cron_nominal_ms: int | None = None,
                 cron_missed: int = 0, namespace: str = "") -> None:
        self._raw_id = raw_id
        self._id: str | None = None
        self.key = key
        self.queue = queue
        self.payload = payload
        self.attempt = attempt
        self.max_attempts = max_attempts
        self._due_ms = due_ms
        self._run_at: datetime | None = None
        self.fence = fence
        self.lease = lease
        self._lost = False  # set by the worker (no reference back to it: no cycles to collect)
        self._cron_ms = cron_nominal_ms
        self.cron_missed = cron_missed
        self.namespace = namespace

    @property
    def id(self) -> str:
        if self._id is None:
            self._id = encode_id(self._raw_id)
        return self._id

    @property
    def due_ms(self) -> int:
        """When this attempt became due, in ms since the epoch (``run_at`` as a number)."""
        return self._due_ms

    @property
    def run_at(self) -> datetime:
        if self._run_at is None:
            self._run_at = ms_to_datetime(self._due_ms)
        return self._run_at  # type: ignore[return-value]

    @property
    def cron_nominal(self) -> datetime | None:
        return ms_to_datetime(self._cron_ms) if self._cron_ms is not None else None

    @property
    def lease_lost(self) -> bool:
        """True once the worker knows this attempt's lease is gone (a heartbeat was refused): the
        job may already run elsewhere and this attempt's outcome will be ignored. A long handler
        may check it to stop early."""
        return self._lost

    def mark_lease_lost(self) -> None:
        """Called by the worker when Redis refused a heartbeat or outcome of this attempt: from
        then on :attr:`lease_lost` is True."""
        self._lost = True

    def __repr__(self) -> str:
        return (f"Job(id={self.id!r}, queue={self.queue!r}, attempt={self.attempt}/{self.max_attempts}, "
                f"fence={self.fence})")
