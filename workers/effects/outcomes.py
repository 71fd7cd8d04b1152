"""What a fenced block can report instead of running: the exceptions of :mod:`workers.effects`.

Two kinds, told apart by their base class:

* :class:`EffectSkipped`: the block did not run and wrote nothing because another attempt of the
  same job already recorded its effects (:class:`AlreadyApplied`: an earlier or the same attempt;
  :class:`StaleAttempt`: a newer one, this attempt's lease was lost). The job's work is done: a
  handler may catch it and return, and a handler that lets it escape has its job acked by the
  worker (logged, counted as ``skipped``), never retried: retrying could only skip again.
* :class:`EffectsError`: the block could not be fenced at all (a connection already inside a
  transaction, a closed connection, a missing effects table, a Redis write that failed part-way):
  an ordinary exception, so the job fails and is retried by its backoff.
"""
from __future__ import annotations

from datetime import datetime

from scheduler.protocol.errors import ZschedError


class EffectSkipped(ZschedError):
    """Another attempt of this job recorded its effects: this block ran nothing and wrote nothing.

    Attributes:
        job_id: the job's id.
        step: the block's step name ('' unless the handler fences several stores).
        fence: this attempt's fence.
        recorded_fence: the fence of the attempt whose effects are recorded.
        recorded_attempt: that attempt's number (None where the store does not keep it).
        applied_at: when they were recorded (None where the store does not keep it).
    """

    def __init__(self, job_id: str, step: str, fence: int, recorded_fence: int,
                 recorded_attempt: int | None = None, applied_at: datetime | None = None) -> None:
        self.job_id = job_id
        self.step = step
        self.fence = fence
        self.recorded_fence = recorded_fence
        self.recorded_attempt = recorded_attempt
        self.applied_at = applied_at
        super().__init__(self._text())

    def _text(self) -> str:
        step = f" (step {self.step!r})" if self.step else ""
        by = f"attempt {self.recorded_attempt} " if self.recorded_attempt is not None else ""
        at = f" at {self.applied_at.isoformat()}" if self.applied_at is not None else ""
        return (f"job {self.job_id}{step}: effects already recorded by {by}(fence {self.recorded_fence}){at}; "
                f"this attempt (fence {self.fence}) wrote nothing")

    def __reduce__(self) -> tuple[type[EffectSkipped], tuple[str, str, int, int, int | None, datetime | None]]:
        return (type(self), (self.job_id, self.step, self.fence, self.recorded_fence, self.recorded_attempt,
                             self.applied_at))


class AlreadyApplied(EffectSkipped):
    """An attempt with this fence or a lower one (an earlier attempt of the job, or this attempt
    entering the same step twice) committed its effects: a repeat, nothing to do."""


class StaleAttempt(EffectSkipped):
    """An attempt with a higher fence committed its effects: this attempt lost its lease and the
    job ran again elsewhere, which did the work; this one must not write."""


class EffectsError(ZschedError):
    """The block could not be fenced (the message says why and what to do); nothing was written
    by it. The handler's job fails and is retried like any other error."""


class EffectsTableMissing(EffectsError):
    """The effects table does not exist: create it with ``zsched effects apply`` (or print the DDL
    with ``zsched effects ddl``)."""


class PartialWrite(EffectsError):
    """A fenced Redis write failed at one of its commands (a wrong type, say): Redis has no
    rollback, so the commands before it stayed applied. The fence was recorded with the failure, so
    no later attempt applies them again: every attempt raises this until the keys are repaired and
    the fence key deleted (the message names both)."""

    def __init__(self, message: str, applied: int) -> None:
        self.applied = applied
        super().__init__(message)

    def __reduce__(self) -> tuple[type[PartialWrite], tuple[str, int]]:
        return (type(self), (str(self), self.applied))


def skip(job_id: str, step: str, fence: int, recorded_fence: int, recorded_attempt: int | None = None,
         applied_at: datetime | None = None) -> EffectSkipped:
    """The exception for a block whose step is recorded with ``recorded_fence``: a newer attempt's
    (higher fence) is :class:`StaleAttempt`, any other :class:`AlreadyApplied`."""
    cls = StaleAttempt if recorded_fence > fence else AlreadyApplied
    return cls(job_id, step, fence, recorded_fence, recorded_attempt, applied_at)
