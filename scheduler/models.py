"""Public data types."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any


class JobState(str, Enum):
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

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


@dataclass(frozen=True)
class JobInfo:
    """What ``get`` knows about a job. For done/cancelled/misfired (tombstones) only id, state and
    ``expires_at`` are known."""

    id: str
    state: JobState
    queue: str | None = None
    key: str | None = None
    run_at: datetime | None = None          # scheduled: when it fires
    attempts: int = 0                       # claims so far
    max_attempts: int | None = None
    created: datetime | None = None
    lease_deadline: datetime | None = None  # running
    fence: int | None = None                # running: the current claim's token
    died_at: datetime | None = None         # dead
    expires_at: datetime | None = None      # tombstones
    last_error: JobError | None = None
    payload: Any = field(default=None, repr=False)
