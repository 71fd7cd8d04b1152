"""A job's trace context on the wire: the W3C ``traceparent`` / ``tracestate`` pair a producer's
span had, packed as the record's trace section (``codec.F_TRACE``), and back. Pure: the
OpenTelemetry calls are in ``scheduler/client/tracing.py``; docs/tracing.md explains the design.

The section is the traceparent's fields as bytes (trace id 16, parent span id 8, trace flags 1:
25 bytes instead of the header's 55 characters, as Redis keeps it for every pending job) followed
by the tracestate as ASCII, cut to :data:`~scheduler.protocol.codec.MAX_TRACESTATE` bytes by
dropping list members from the right, as the W3C specification lets a propagator do.
"""
from __future__ import annotations

import re

from .codec import MAX_TRACESTATE, TRACE_ID_BYTES
from .errors import ZschedError

# version 00 exactly; a later version (not ff) is read by its first four fields, as the
# specification asks of a version 00 parser
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?", re.S)
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16
MAX_TRACESTATE_MEMBERS = 32  # the W3C limit on list members


class TraceContextError(ZschedError, ValueError):
    """A trace context that is not W3C format: nothing is stored from it."""


def _tracestate(tracestate: str) -> bytes:
    """The tracestate as stored: printable ASCII, at most 32 members and MAX_TRACESTATE bytes
    (members dropped from the right until it fits), b"" for none."""
    if not tracestate.isascii() or not tracestate.isprintable():
        raise TraceContextError("tracestate must be printable ASCII (W3C trace-context list members key=value, "
                                f"comma-separated), got {tracestate[:60]!r}")
    members = [m.strip() for m in tracestate.split(",") if m.strip()][:MAX_TRACESTATE_MEMBERS]
    out = ",".join(members)
    while len(out) > MAX_TRACESTATE and members:
        members.pop()
        out = ",".join(members)
    return out.encode("ascii")


def trace_section(traceparent: str, tracestate: str | None = None) -> bytes:
    """The trace section of a record for a W3C ``traceparent`` (and ``tracestate``); raises
    :class:`TraceContextError` saying what is wrong with a traceparent that is not one (nothing
    should then be scheduled with it)."""
    if not isinstance(traceparent, str):
        raise TraceContextError(f"traceparent must be a str, got {type(traceparent).__name__}")
    m = _TRACEPARENT.fullmatch(traceparent)
    if m is None or (m[1] == "00" and m[5] is not None) or m[1] == "ff":
        raise TraceContextError("traceparent must be a W3C trace context: 00-<32 lowercase hex trace id>-<16 "
                                f"lowercase hex span id>-<2 hex flags>, got {traceparent[:80]!r}")
    if m[2] == _ZERO_TRACE or m[3] == _ZERO_SPAN:
        raise TraceContextError(f"traceparent has an all-zero trace or span id (invalid in W3C trace context): "
                                f"{traceparent[:80]!r}")
    state = _tracestate(tracestate) if tracestate else b""
    return bytes.fromhex(m[2] + m[3] + m[4]) + state


def trace_headers(section: bytes) -> dict[str, str]:
    """The ``traceparent`` (and ``tracestate`` when there is one) headers a trace section stands
    for, the carrier a W3C propagator extracts from; ValueError for a section too short to be one."""
    if len(section) < TRACE_ID_BYTES:
        raise ValueError(f"a trace section is at least {TRACE_ID_BYTES} bytes, got {len(section)}")
    h = section[:TRACE_ID_BYTES].hex()
    headers = {"traceparent": f"00-{h[:32]}-{h[32:48]}-{h[48:50]}"}
    if len(section) > TRACE_ID_BYTES:
        headers["tracestate"] = section[TRACE_ID_BYTES:].decode("ascii", "replace")
    return headers
