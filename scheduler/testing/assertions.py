"""Assertions on a test stack's jobs that say, when they fail, what was there instead.

:class:`StackAssertions` is mixed into :class:`~scheduler.testing.TestStack`::

    stack.assert_scheduled("emails", payload={"to": "a@example.com"}, at=timedelta(hours=4))
    stack.assert_dead("emails", error="PermanentError")
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from ..protocol.models import JobInfo, JobState

__all__ = ["ANY", "StackAssertions"]


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()
"""Matches every value (the default of the assertions' filters)."""


def _describe(info: JobInfo) -> str:
    parts = [f"id={info.id}", f"run_at={info.run_at.isoformat() if info.run_at else None}",
             f"attempts={info.attempts}/{info.max_attempts}"]
    if info.key is not None:
        parts.append(f"key={info.key!r}")
    parts.append(f"payload={info.payload!r}")
    if info.last_error is not None:
        parts.append(f"last_error={info.last_error.type}: {info.last_error.message}")
    return ", ".join(parts)


class StackAssertions:
    """pytest-friendly assertions over the jobs of a stack; each returns the job it matched."""

    @property
    def now(self) -> datetime:
        raise NotImplementedError

    def jobs_in(self, state: JobState | str, queue: str | None = None) -> list[JobInfo]:
        raise NotImplementedError

    def get(self, job_id: str) -> JobInfo | None:
        raise NotImplementedError

    def _at(self, at: datetime | timedelta | None) -> datetime | None:
        if isinstance(at, timedelta):
            return self.now + at
        if at is not None and (at.tzinfo is None or at.tzinfo.utcoffset(at) is None):
            raise ValueError(f"at must be timezone-aware (or a timedelta from the stack's now), got {at!r}")
        return at

    def _assert_in(self, state: JobState, queue: str, payload: Any, at: datetime | timedelta | None, key: Any,
                   error: str | None = None) -> JobInfo:
        when = self._at(at)
        found = self.jobs_in(state, queue)

        def matches(info: JobInfo) -> bool:
            if payload is not ANY and info.payload != payload:
                return False
            if key is not ANY and info.key != key:
                return False
            if when is not None and info.run_at != when:
                return False
            if error is not None:
                err = info.last_error
                return err is not None and (error == err.type or error in err.message or error in err.type)
            return True

        hits = [i for i in found if matches(i)]
        if hits:
            return hits[0]
        wanted = [f"payload={payload!r}" if payload is not ANY else "", f"key={key!r}" if key is not ANY else "",
                  f"at={when.isoformat()}" if when is not None else "", f"error~{error!r}" if error else ""]
        filters = ", ".join(w for w in wanted if w) or "anything"
        lines = [f"expected a {state.value} job on queue {queue!r} with {filters}"
                 f" (stack time {self.now.isoformat()}); found {len(found)} {state.value} job(s) on {queue!r}"
                 + (":" if found else "")]
        lines += [f"  - {_describe(i)}" for i in found[:20]]
        if len(found) > 20:
            lines.append(f"  ... and {len(found) - 20} more")
        raise AssertionError("\n".join(lines))

    def assert_scheduled(self, queue: str, *, payload: Any = ANY, at: datetime | timedelta | None = None,
                         key: Any = ANY) -> JobInfo:
        """A job of ``queue`` is scheduled with this ``payload`` (compared with ==), idempotency
        ``key`` and run time ``at`` (an aware datetime, or a timedelta from the stack's now); the
        filters left out match anything. Returns the first match; AssertionError listing the
        queue's scheduled jobs otherwise."""
        return self._assert_in(JobState.SCHEDULED, queue, payload, at, key)

    def assert_ready(self, queue: str, *, payload: Any = ANY, key: Any = ANY) -> JobInfo:
        """A job of ``queue`` is ready (due, waiting for a worker) with this payload and key."""
        return self._assert_in(JobState.READY, queue, payload, None, key)

    def assert_dead(self, queue: str, *, payload: Any = ANY, key: Any = ANY, error: str | None = None) -> JobInfo:
        """A job of ``queue`` is dead-lettered with this payload and key; ``error``: its last
        error's type (``"PermanentError"``, ``"ValueError"``, qualified for non-builtins) or a part
        of its type or message."""
        return self._assert_in(JobState.DEAD, queue, payload, None, key, error)

    def assert_state(self, job_id: str, state: JobState | str) -> JobInfo:
        """Job ``job_id`` is in ``state`` (``"done"``, ``"scheduled"``, ...); returns its JobInfo."""
        want = JobState(state)
        info = self.get(job_id)
        if info is None:
            raise AssertionError(f"job {job_id} is unknown (never scheduled here, or its tombstone expired); "
                                 f"expected it {want.value}")
        if info.state is not want:
            raise AssertionError(f"job {job_id} is {info.state.value}, expected {want.value}: {_describe(info)}")
        return info
