"""Every status code a script returns, and what it means to a caller, in one file.

Each ``IntEnum`` mirrors the ``Returns:`` line of its script's header (``lua/NAME.lua``): a script
and its enum change together. The producer-side codes map to the client's :class:`Outcome` (what
``cancel``/``reschedule``/``requeue``/``purge`` did, truthy only on success) and through it to a
message for people; a code that no script returns raises :class:`~.errors.ScriptError`, since it
means the scripts loaded in Redis and this client disagree about the protocol. Error replies map
to exceptions here too (:func:`script_error`): a refused argument (``ZSCHED_ARG``) is a
:class:`~.errors.ScriptArgumentError`.
"""
from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, IntEnum
from typing import Any, TypeVar

from .errors import ScriptArgumentError, ScriptError
from .models import JobState

# -- producer side -------------------------------------------------------------------------------


class CancelCode(IntEnum):
    """``lua/cancel.lua``."""

    CANCELLED = 1
    NOT_FOUND = 0          # no live job with that id (unknown, finished, or its tombstone expired)
    RUNNING = -1           # cannot be stopped from outside: it finishes or fails
    DEAD = -2              # purge it instead
    CRON_OCCURRENCE = -3   # a cron always has exactly one pending occurrence: remove the cron


class RescheduleCode(IntEnum):
    """``lua/reschedule.lua``."""

    MOVED = 1
    NOT_FOUND = 0
    RUNNING = -1
    DEAD = -2              # requeue it instead


class RequeueCode(IntEnum):
    """``lua/requeue.lua``: one code per id."""

    REQUEUED = 1
    NOT_DEAD = 0           # already requeued or purged, live, or unknown: nothing changed


class PurgeCode(IntEnum):
    """``lua/purge.lua`` in mode ``ids`` with one id (the script returns how many it purged)."""

    PURGED = 1
    NOT_DEAD = 0


class CronRemoveCode(IntEnum):
    """``lua/cron_remove.lua``."""

    REMOVED = 1
    NOT_FOUND = 0


class CronPauseCode(IntEnum):
    """First element of ``lua/cron_pause.lua`` and ``lua/cron_resume.lua`` replies."""

    CHANGED = 1      # paused now / resumed now
    UNCHANGED = 0    # already paused / was not paused
    NOT_FOUND = -1   # no such cron


# -- worker side ---------------------------------------------------------------------------------


class FailKind(bytes, Enum):
    """The ``kind`` argument of ``lua/fail.lua``; the values are the bytes sent."""

    FAILED = b"f"          # the handler failed: retry while attempts remain
    RETRY = b"r"           # the handler asked for a retry (Retry(delay))
    PERMANENT = b"p"       # permanent failure: dead now


class FailCode(IntEnum):
    """``lua/fail.lua``: one code per job."""

    RETRY_SCHEDULED = 1
    DEAD = 2
    REFUSED = 0            # stale token or not running: the lease was lost


class AckCode(IntEnum):
    """``lua/ack.lua``: one code per job."""

    ACKED = 1
    REFUSED = 0            # stale token: the lease was lost (the job was reaped, maybe claimed again)


class ReleaseCode(IntEnum):
    """``lua/release.lua``: one code per job."""

    RELEASED = 1
    REFUSED = 0


# -- scheduler tier and operator repair ------------------------------------------------------------

EPOCH_REFUSED = -1
"""First element of a ``tick``, ``reap`` or ``cron_fill`` reply whose epoch was refused (a newer
owner fenced the partition); the second element is the newest epoch."""


class CronFillCode(IntEnum):
    """First element of a ``lua/cron_fill.lua`` reply."""

    FILLED = 1             # then the pending occurrence's id
    CHANGED = 0            # the cron changed or vanished meanwhile: recompute
    EPOCH_REFUSED = EPOCH_REFUSED


class EpochResetCode(IntEnum):
    """First element of a ``lua/epoch_reset.lua`` reply (the second is an epoch)."""

    RESET = 1              # then the previous epoch
    CHANGED = 0            # the stored epoch is no longer the expected one; then the current one
    NOTHING_TO_DO = 2      # nothing or 0 stored, as expected


# -- what the client reports -----------------------------------------------------------------------


class Outcome(Enum):
    """What ``cancel``, ``reschedule``, ``requeue``, ``purge``, ``pause``/``resume`` (of a queue),
    ``remove_cron`` or ``pause_cron``/``resume_cron`` did.

    Truthy only for :attr:`DONE`, so ``if client.cancel(job_id):`` reads as before; the other
    members say why nothing changed (nothing was changed in every one of them). ``message``
    explains a member to people; ``state`` is the job's state when the outcome names one.
    """

    DONE = "done"
    NOT_FOUND = "not found"            # cancel/reschedule: no live job with that id
    RUNNING = "running"                # cancel/reschedule: the job is running
    DEAD = "dead"                      # cancel/reschedule: the job is dead
    NOT_DEAD = "not dead"              # requeue/purge: the job is not dead
    CRON_OCCURRENCE = "cron occurrence"  # cancel: the job is a cron's pending occurrence
    UNCHANGED = "unchanged"            # pause/resume (queue or cron): already in that state
    NO_CRON = "no cron"                # remove_cron/pause_cron/resume_cron: no cron has that name

    def __bool__(self) -> bool:
        return self is Outcome.DONE

    @property
    def message(self) -> str:
        """What happened, in words."""
        return _MESSAGES[self]

    @property
    def state(self) -> JobState | None:
        """The job's state as the script saw it, for the outcomes that name one."""
        return _STATES.get(self)


_MESSAGES = {
    Outcome.DONE: "done",
    Outcome.NOT_FOUND: "no live job has that id (unknown, finished, or its tombstone expired)",
    Outcome.RUNNING: "a running job cannot be stopped from outside: it ends when it is acked, fails or its lease "
                     "expires",
    Outcome.DEAD: "the job is dead: requeue it to run it again, or purge it",
    Outcome.NOT_DEAD: "the job is not dead (already requeued or purged, live, or unknown): nothing changed",
    Outcome.CRON_OCCURRENCE: "the job is the pending occurrence of a cron, and a cron always has exactly one: "
                             "remove or replace the cron instead",
    Outcome.UNCHANGED: "it already was in that state (paused, or not paused): nothing changed",
    Outcome.NO_CRON: "no cron has that name (see: zsched cron list)",
}
_STATES = {Outcome.RUNNING: JobState.RUNNING, Outcome.DEAD: JobState.DEAD}

_CANCEL = {CancelCode.CANCELLED: Outcome.DONE, CancelCode.NOT_FOUND: Outcome.NOT_FOUND,
           CancelCode.RUNNING: Outcome.RUNNING, CancelCode.DEAD: Outcome.DEAD,
           CancelCode.CRON_OCCURRENCE: Outcome.CRON_OCCURRENCE}
_RESCHEDULE = {RescheduleCode.MOVED: Outcome.DONE, RescheduleCode.NOT_FOUND: Outcome.NOT_FOUND,
               RescheduleCode.RUNNING: Outcome.RUNNING, RescheduleCode.DEAD: Outcome.DEAD}
_REQUEUE = {RequeueCode.REQUEUED: Outcome.DONE, RequeueCode.NOT_DEAD: Outcome.NOT_DEAD}
_PURGE = {PurgeCode.PURGED: Outcome.DONE, PurgeCode.NOT_DEAD: Outcome.NOT_DEAD}
_CRON_PAUSE = {CronPauseCode.CHANGED: Outcome.DONE, CronPauseCode.UNCHANGED: Outcome.UNCHANGED,
               CronPauseCode.NOT_FOUND: Outcome.NO_CRON}

C = TypeVar("C", bound=IntEnum)


def code_of(enum: type[C], value: Any, script: str) -> C:
    """A script's reply value as its code; ScriptError for a value the script never returns."""
    try:
        return enum(int(value))
    except (TypeError, ValueError):
        known = ", ".join(f"{m.value} {m.name}" for m in enum)
        raise ScriptError(f"{script} returned {value!r}, which is none of its codes ({known}): the scripts "
                          "loaded in Redis do not match this client's version") from None


def _outcome(table: Mapping[C, Outcome], enum: type[C], value: Any, script: str) -> Outcome:
    return table[code_of(enum, value, script)]


def cancel_outcome(reply: Any) -> Outcome:
    """The reply of a ``cancel`` call."""
    return _outcome(_CANCEL, CancelCode, reply, "cancel")


def reschedule_outcome(reply: Any) -> Outcome:
    """The reply of a ``reschedule`` call."""
    return _outcome(_RESCHEDULE, RescheduleCode, reply, "reschedule")


def requeue_outcomes(reply: Any) -> list[Outcome]:
    """The reply of a ``requeue`` call: one outcome per id, in the order sent."""
    return [_outcome(_REQUEUE, RequeueCode, code, "requeue") for code in reply]


def purge_outcome(reply: Any) -> Outcome:
    """The reply of a ``purge`` call in mode ``ids`` with one id."""
    return _outcome(_PURGE, PurgeCode, reply, "purge")


def cron_removed(reply: Any) -> Outcome:
    """The reply of a ``cron_remove`` call: ``DONE`` when the cron existed and is gone now, else
    ``NO_CRON``."""
    removed = code_of(CronRemoveCode, reply, "cron_remove") is CronRemoveCode.REMOVED
    return Outcome.DONE if removed else Outcome.NO_CRON


def cron_pause_status(reply: Any) -> Outcome:
    """The reply of ``cron_pause``/``cron_resume``: ``DONE`` when the cron changed, ``UNCHANGED``
    when it already was in that state, ``NO_CRON`` when there is no such cron."""
    code = code_of(CronPauseCode, reply[0], "cron_pause/cron_resume")
    return _CRON_PAUSE[code]


def toggled(changed: bool) -> Outcome:
    """A queue's pause or resume: ``DONE`` when it changed, else ``UNCHANGED``."""
    return Outcome.DONE if changed else Outcome.UNCHANGED


# -- error replies ----------------------------------------------------------------------------------


def script_error(exc: Exception) -> Exception:
    """The exception a script's error reply stands for: :class:`~.errors.ScriptArgumentError` for a
    refused argument (``ZSCHED_ARG <script> ARGV[n] <name>: expected ..., got ...``, sent before
    the script wrote anything), else the reply's own exception (the layout fence's ``ZSCHED_LAYOUT``
    is read where a client can follow it: :meth:`~.errors.LayoutChanged.from_reply`)."""
    refused = ScriptArgumentError.from_reply(exc)
    if refused is None:
        return exc
    refused.__cause__ = exc
    return refused

