"""Helpers shared by the worker runtime and the tests: parsing claim replies, retry delays."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from .codec import Record, decode_record
from .errors import PayloadError


@dataclass(frozen=True, slots=True)
class Claimed:
    """One job returned by the ``claim`` script. ``record`` is None when the body is undecodable
    (a poison job: dead-letter it with ``raw_record`` kept for inspection)."""

    raw_id: bytes
    raw_record: bytes
    record: Record | None
    decode_error: str | None
    token: int
    deadline_ms: int
    due_ms: int


def parse_claim(reply: list[Any]) -> tuple[int, list[Claimed]]:
    """``claim`` reply -> (redis now ms, jobs)."""
    now = int(reply[0])
    out: list[Claimed] = []
    for i in range(1, len(reply), 5):
        raw_id, raw_rec, token, deadline, due = reply[i : i + 5]
        try:
            rec: Record | None = decode_record(raw_rec)
            err = None
        except PayloadError as exc:
            rec, err = None, str(exc)
        out.append(Claimed(raw_id, raw_rec, rec, err, int(token), int(deadline), int(due)))
    return now, out


def backoff_delay_ms(attempt: int, base_ms: int, cap_ms: int, rng: random.Random | None = None) -> int:
    """Full-jitter exponential backoff: uniform in [0, min(cap, base * 2**attempt)].

    Full jitter (not "base + jitter") is what breaks up a retry storm: jobs that failed in the same
    second come back spread over the whole window instead of together.
    """
    ceiling = min(cap_ms, base_ms * (2 ** min(attempt, 60)))
    return (rng or random).randint(0, int(ceiling))
