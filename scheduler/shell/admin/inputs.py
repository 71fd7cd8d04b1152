"""Reading an operator's arguments: WHEN and DURATION, payloads, job ids and queue names, each
refused with a BadInput that says what was wrong and what is expected."""
from __future__ import annotations

import json
import math
import re
import sys
import time
from datetime import datetime, timedelta
from typing import Any

from ...protocol.ids import decode_id
from ...protocol.keys import validate_name
from ...protocol.timeutil import MIN_EPOCH_S, ms_to_datetime, to_ms
from .errors import BadInput

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DUR_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_EPOCH = re.compile(r"\d+(?:\.\d+)?")
WHEN_FORMS = ("ISO-8601 with a zone (2026-12-01T09:00:00+01:00 or 2026-12-01T08:00:00Z), "
              "+DURATION from now (+90s, +4h, +1d2h30m), 'now', or epoch seconds (1767225600)")


def parse_duration(text: str, *, name: str = "duration") -> float:
    """``7d``, ``12h``, ``90s``, ``500ms``, ``1d2h30m``, ``2w`` -> seconds (float, >= 0).

    A unit is required (a bare number is ambiguous): ms, s, m, h, d, w. Each unit may appear once.
    """
    if not isinstance(text, str):
        raise BadInput(f"{name} must be a string like 7d or 1h30m, got {type(text).__name__}")
    s = text.strip().lower()
    pos, total, seen = 0, 0.0, set()
    for m in _DUR_PART.finditer(s):
        if m.start() != pos or m.group(2) in seen:
            break
        seen.add(m.group(2))
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        hint = " (a unit is required: 90 seconds is 90s)" if _EPOCH.fullmatch(s) else ""
        raise BadInput(f"{name} {text!r} is invalid{hint}: expected a number with a unit (ms, s, m, h, d, w), "
                       "or several in a row like 1d2h30m")
    if not math.isfinite(total) or total > 10_000 * 365 * 86400:
        raise BadInput(f"{name} {text!r} is too large")
    return total


def parse_schedule_when(text: str) -> int | timedelta:
    """A WHEN for scheduling: ``now`` and ``+DURATION`` stay relative (a timedelta, resolved by
    Redis's clock when the job is written, so a skewed host clock cannot move the job); other
    forms are absolute epoch milliseconds (see :func:`parse_when`)."""
    t = text.strip() if isinstance(text, str) else text
    if isinstance(t, str) and t.lower() == "now":
        return timedelta(0)
    if isinstance(t, str) and t.startswith("+"):
        parse_when(t)  # the same checks and messages as every other WHEN
        return timedelta(seconds=parse_duration(t[1:], name=f"WHEN {t!r}: duration"))
    return parse_when(text)


def parse_when(text: str, *, now: float | None = None, name: str = "WHEN") -> int:
    """Parse a WHEN argument into epoch milliseconds.

    Accepted: ISO-8601 with a zone (``2026-12-01T09:00:00+01:00``, ``...Z``), ``+DURATION`` from now
    (``+90s``, ``+4h``, ``+1d2h30m``), ``now``, or epoch seconds (``1767225600``, ``1767225600.5``).
    Naive ISO times are refused: a scheduler must not guess which zone the operator meant.
    """
    if not isinstance(text, str):
        raise BadInput(f"{name} must be a string, got {type(text).__name__}")
    t = text.strip()
    now_s = time.time() if now is None else now
    try:
        if t.lower() == "now":
            return to_ms(now_s, name=name)
        if t.startswith("+"):
            return to_ms(now_s + parse_duration(t[1:], name=f"{name} {t!r}: duration"), name=name)
        if _EPOCH.fullmatch(t):
            secs = float(t)
            if secs >= 1e11:
                raise BadInput(f"{name} {text!r} looks like epoch milliseconds; expected epoch seconds "
                               f"(e.g. {int(secs) // 1000})")
            if 0 <= secs < MIN_EPOCH_S:  # a duration given without its "+" and unit
                when = ms_to_datetime(int(secs * 1000))
                raise BadInput(f"{name} {text!r} is epoch seconds, i.e. {when:%Y-%m-%dT%H:%M:%SZ}; numbers below 1e9 "
                               f"are refused as likely durations: +{t}s is {t} seconds from now")
            return to_ms(secs, name=name)
    except BadInput:
        raise
    except (ValueError, TypeError) as exc:
        raise BadInput(f"{name} {text!r} is out of range: {exc}") from None
    iso = t[:-1] + "Z" if t.endswith("z") else t
    try:
        dt = datetime.fromisoformat(iso)
    except ValueError:
        raise BadInput(f"{name} {text!r} is invalid: expected {WHEN_FORMS}") from None
    if dt.tzinfo is None or dt.utcoffset() is None:
        example = dt.isoformat()
        raise BadInput(f"{name} {text!r} has no time zone: add Z for UTC or an offset, e.g. {example}Z or "
                       f"{example}+01:00 (naive times are refused so a job never runs an hour off)")
    try:
        return to_ms(dt, name=name)
    except ValueError as exc:
        raise BadInput(f"{name} {text!r} is out of range: {exc}") from None


def parse_payload(text: str) -> Any:
    """A ``--payload`` argument: a JSON document, ``@path`` (a JSON file) or ``-`` (JSON on stdin)."""
    source = "--payload"
    if text == "-":
        text, source = sys.stdin.read(), "--payload - (stdin)"
    elif text.startswith("@"):
        path = text[1:]
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise BadInput(f"--payload {text!r}: cannot read {path}: {exc.strerror or exc}") from None
        source = f"--payload @{path}"
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); "
                       "expected a JSON document such as '{\"to\": \"a@example.com\"}' (quote it for the "
                       "shell), @file.json or - for stdin") from None


def parse_job_id(text: str) -> str:
    """Check a job id's format (30 hex characters); returns it lowercased."""
    t = text.strip().lower()
    try:
        decode_id(t)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    return t


def parse_queue(text: str) -> str:
    """Check a queue name (BadInput saying what a name may contain)."""
    try:
        return validate_name("queue", text)
    except (ValueError, TypeError) as exc:
        raise BadInput(str(exc)) from None

