"""What the end of an attempt reports, and whether a claimed job can reach a handler at all.

Pure functions, shared by the worker's handler runner (``workers/runner.py``) and the testing kit
(``scheduler/testing/run.py``), so both decide alike: the :class:`~workers.job.Job` a handler
receives for a claimed job, or why it cannot have one (:class:`Poison`: an undecodable record or
payload, no handler for the queue; dead-lettered at once), and what an exception or a timeout
means (:class:`Failure`: ``Retry`` retries after its delay, ``PermanentError`` dead-letters now,
anything else is a failure retried after the job's full-jitter backoff).
"""
from __future__ import annotations

import random
import traceback
from typing import NamedTuple

from scheduler.protocol import codec
from scheduler.protocol.calls import error_arg
from scheduler.protocol.codec import Record
from scheduler.protocol.codes import FailKind
from scheduler.protocol.errors import PayloadError
from scheduler.protocol.replies import Claimed, backoff_delay_ms
from scheduler.protocol.timeutil import MAX_MS

from .errors import PermanentError, Retry
from .job import Job
from .registry import HandlerSpec


def type_name(exc: BaseException) -> str:
    """The exception type as stored in a job's last error: builtins by name, others qualified."""
    t = type(exc)
    return t.__qualname__ if t.__module__ in ("builtins", "__main__") else f"{t.__module__}.{t.__qualname__}"


def short_tb(exc: BaseException) -> str:
    """The last frames of the traceback (the job's stored error is bounded anyway)."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-8))


class Poison(NamedTuple):
    """Why a claimed job cannot reach a handler: it is dead-lettered at once with this error."""

    etype: str
    message: str


def job_for(c: Claimed, queue: str, spec: HandlerSpec | None, max_payload_bytes: int,
            namespace: str = "") -> Job | Poison:
    """The :class:`~workers.job.Job` a handler of ``queue`` (in ``namespace``) receives for claimed
    job ``c``, or why it cannot have one (an undecodable record or payload, no handler for the queue)."""
    rec = c.record
    if rec is None:
        return Poison("PoisonJob", f"job record cannot be decoded: {c.decode_error}")
    if spec is None:
        return Poison("NoHandler", f"no handler registered for queue {queue!r} on this worker")
    try:
        payload = codec.unpack_payload(rec.payload_bytes, max_payload_bytes)
    except PayloadError as exc:
        return Poison("PoisonJob", f"payload cannot be decoded: {exc}")
    return Job(c.raw_id, queue, payload, rec.key, rec.attempt, rec.max_attempts, c.due_ms, c.token,
               rec.lease_ms / 1000.0, rec.cron_nominal_ms, rec.cron_missed, namespace)


class Failure(NamedTuple):
    """What a failed attempt reports: the ``fail`` script's kind, retry delay and error argument;
    the outcome name for metrics; the error type and message to log (None for a requested retry,
    which is not a failure)."""

    kind: FailKind
    delay_ms: int
    error: bytes
    outcome: str
    etype: str | None
    message: str | None


def backoff_ms(rec: Record, rng: random.Random | None = None) -> int:
    """The retry delay after attempt ``rec.attempt`` failed: the job's full-jitter backoff."""
    return backoff_delay_ms(rec.attempt, rec.backoff_base_ms, rec.backoff_cap_ms, rng)


def failure_of(exc: BaseException, rec: Record, rng: random.Random | None = None) -> Failure:
    """The outcome of an attempt whose handler raised ``exc``: :class:`Retry` retries after its
    delay (or the backoff), :class:`PermanentError` dead-letters now, anything else is a failure
    retried after the backoff (``fail`` dead-letters it when the attempts are spent). ``rng``:
    the backoff's random source (default: the ``random`` module)."""
    if isinstance(exc, Retry):
        # at most the longest delay the fail script takes (lua/fail.lua: up to timeutil.MAX_MS); a
        # longer one would be refused, and the outcome sent again and again
        delay = backoff_ms(rec, rng) if exc.delay is None else min(int(exc.delay * 1000), MAX_MS)
        return Failure(FailKind.RETRY, delay, error_arg("Retry", str(exc)), "retry", None, None)
    etype, msg = type_name(exc), str(exc)
    err = error_arg(etype, msg, short_tb(exc))
    if isinstance(exc, PermanentError):
        return Failure(FailKind.PERMANENT, 0, err, "permanent", etype, msg)
    return Failure(FailKind.FAILED, backoff_ms(rec, rng), err, "failed", etype, msg)


def timeout_failure(queue: str, timeout: float, rec: Record, rng: random.Random | None = None) -> Failure:
    """The outcome of an attempt whose handler ran past its ``timeout`` (seconds): a failure."""
    msg = f"handler for queue {queue!r} did not finish within {timeout:g} s"
    return Failure(FailKind.FAILED, backoff_ms(rec, rng), error_arg("HandlerTimeout", msg), "timeout",
                   "HandlerTimeout", msg)
