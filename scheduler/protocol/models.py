"""Public data types: a job's state, its view (:class:`JobInfo`) and its last error."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class JobState(StrEnum):
    """Where a job is: live (scheduled, ready, running, dead) or finished (done, cancelled,
    misfired: a tombstone kept ``tombstone_ttl`` seconds)."""

    SCHEDULED = "scheduled"
    READY = "ready"
    RUNNING = "running"
    DONE = "done"
    DEAD = "dead"
    CANCELLED = "cancelled"
    MISFIRED = "misfired"


@dataclass(frozen=True)
class JobError:
    """The last error of a job: when, exception type, message, short traceback."""

    at: datetime | None
    type: str
    message: str
    traceback: str = ""

    @property
    def type_name(self) -> str:
        """The type as shown to people: zsched's own exceptions (``workers.errors.PermanentError``,
        ``workers.errors.Retry``) by their class name, the name the API gives them; any other with
        its module, which says where it comes from (``myapp.billing.CardDeclined``). ``type``
        keeps the full name (JSON output, the job page's hover)."""
        module, dot, name = self.type.rpartition(".")
        return name if dot and module.split(".", 1)[0] in ("workers", "scheduler") else self.type

    def __str__(self) -> str:
        return f"{self.type_name}: {self.message}" if self.message else self.type_name


@dataclass(frozen=True)
class JobInfo:
    """What ``get``/``get_many``/``jobs``/``dead`` know about a job, in every state where the job
    exists or has a tombstone.

    Always: ``id``, ``state``. For every state below, including tombstones: ``queue``, ``key``
    (idempotency key, None without one), ``run_at`` (when the current or last attempt was or is
    due: the timer's run_at while scheduled, the due time of the attempt for ready, running and
    dead jobs, also for a job scheduled in the past, e.g. a datetime of 2001), ``created``
    (second precision), ``attempts`` (claims so far) and ``max_attempts``.

    * scheduled (also held back by a rate limit: due, waiting for a token): ``run_at`` is when
      it fires (held: when it became due); ``last_error`` of a failed attempt, if it is a retry.
    * ready: ``run_at`` is when it became due.
    * running: ``lease_deadline``, ``fence`` (the claim's token).
    * dead: ``died_at`` and ``finished_at`` (the same time), ``last_error`` with its traceback.
    * done / cancelled / misfired (tombstones, kept ``tombstone_ttl`` seconds): ``finished_at``,
      ``expires_at`` (when the tombstone goes), and ``last_error`` if an attempt failed before
      (a done job that succeeded on its second attempt keeps the first one's error): its time,
      type and message, the message cut to about 150 bytes, without the traceback. No payload.
      Tombstones written before this summary existed (upgrades) carry only ``expires_at``.
    """

    id: str
    state: JobState
    queue: str | None = None
    key: str | None = None
    run_at: datetime | None = None          # due time of the current or last attempt
    attempts: int = 0                       # claims so far
    max_attempts: int | None = None
    created: datetime | None = None
    lease_deadline: datetime | None = None  # running
    fence: int | None = None                # running: the current claim's token
    died_at: datetime | None = None         # dead
    expires_at: datetime | None = None      # tombstones
    last_error: JobError | None = None
    payload: Any = field(default=None, repr=False)
    finished_at: datetime | None = None     # done, cancelled, misfired, dead
