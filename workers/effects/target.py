"""What a fenced block is keyed by: the job's namespace, id and step, with its fence and attempt,
taken from a handler's :class:`~workers.job.Job` and checked before anything is written."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .outcomes import EffectsError

STEP_MAX = 64
_STEP = re.compile(r"^[A-Za-z0-9_.:-]*$")


@dataclass(frozen=True, slots=True)
class Target:
    """One fenced block's key (``namespace``, ``job_id``, ``step``) and its attempt's ``fence``."""

    namespace: str
    job_id: str
    step: str
    fence: int
    attempt: int


def target_of(job: Any, step: str = "", namespace: str | None = None) -> Target:
    """The :class:`Target` of ``job`` (what a handler receives) for ``step``; raises
    :class:`EffectsError` for anything else than a job with an id, a fence and an attempt, a step
    that is not up to 64 letters, digits and ``_ . : -``, or no namespace."""
    job_id, fence, attempt = getattr(job, "id", None), getattr(job, "fence", None), getattr(job, "attempt", None)
    if not isinstance(job_id, str) or not job_id or not _whole(fence) or not _whole(attempt):
        raise EffectsError(f"fenced effects need the job a handler received (with id, fence and attempt), "
                           f"got {type(job).__name__}")
    if not isinstance(step, str) or len(step) > STEP_MAX or not _STEP.match(step):
        raise EffectsError(f"effects step {step!r} is not up to {STEP_MAX} letters, digits and '_ . : -'")
    ns = namespace if namespace is not None else getattr(job, "namespace", "")
    if not isinstance(ns, str) or not ns:
        raise EffectsError("fenced effects need the job's namespace: this job has none (built by hand?); "
                           "pass namespace=")
    return Target(ns, job_id, step, int(fence), int(attempt))  # type: ignore[arg-type]  # checked by _whole


def _whole(n: Any) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0
