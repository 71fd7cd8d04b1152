"""Headers for outbound HTTP calls that carry a job's identity, so an API that honours
idempotency keys (Stripe, Adyen, most payment and messaging APIs: ``Idempotency-Key``) applies a
repeated call once, and one of your own can refuse a stale attempt by its fence."""
from __future__ import annotations

from typing import Any

from .target import target_of


def idempotency_headers(job: Any, *, step: str = "") -> dict[str, str]:
    """``Idempotency-Key`` (the job id, plus ``:step`` for a handler's second, third... call),
    ``Zsched-Fence`` (grows with every attempt: a server that keeps the highest fence it saw per key
    can refuse an older attempt) and ``Zsched-Attempt``. The key is the same for every attempt of
    the job: that is what lets the server recognise a repeat."""
    t = target_of(job, step, namespace=getattr(job, "namespace", None) or "-")
    key = f"{t.job_id}:{t.step}" if t.step else t.job_id
    return {"Idempotency-Key": key, "Zsched-Fence": str(t.fence), "Zsched-Attempt": str(t.attempt)}
