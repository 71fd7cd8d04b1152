"""Job records: the compact binary body stored in Redis, and bounded msgpack for payloads.

Record layout (big-endian), designed so Lua reads it at fixed offsets without a msgpack parser:

  [0:2] queue index (interned per partition)   [2] attempt (claims so far)   [3] max_attempts
  [4]   flags                                    [5:9] created, epoch seconds
  then, in this order, only when the flag is set:
  F_SKIP   uint32 misfire grace ms      F_LEASE  uint32 lease ms (default 30 000)
  F_KEY    uint8 length + key bytes     F_CRON   uint48 nominal ms + uint16 missed (cron occurrences)
  F_OPTS   uint16 length + msgpack map (backoff, ...)
  F_TRACE  uint8 length + the producer's W3C trace context: trace id (16) + span id (8) + trace
           flags (1), then its tracestate as ASCII (at most MAX_TRACESTATE bytes; docs/tracing.md)
  then the payload, msgpack.

With a 98-byte payload a timer member (15-byte id + 9-byte header + payload) is 122 bytes, which
fits jemalloc's 128-byte class: see docs/architecture.md for the byte budget.
"""
from __future__ import annotations

import math
import reprlib
import struct
from dataclasses import dataclass
from typing import Any

import msgpack

from .errors import PayloadError

F_SKIP = 1
F_OPTS = 2
F_KEY = 4
F_LEASE = 8
F_CRON = 16  # a cron occurrence: uint48 nominal ms + uint16 missed occurrences follow the key
F_TRACE = 32  # the producer's trace context follows the options (scheduler/client/tracing.py)

DEFAULT_LEASE_MS = 30_000
DEFAULT_BACKOFF_BASE_MS = 1_000
DEFAULT_BACKOFF_CAP_MS = 3_600_000
DEFAULT_MAX_PAYLOAD = 512 * 1024
MAX_ATTEMPTS_LIMIT = 255
MAX_KEY_BYTES = 200
TRACE_ID_BYTES = 25  # trace id (16) + parent span id (8) + trace flags (1): a W3C traceparent, version 00
MAX_TRACESTATE = 255 - TRACE_ID_BYTES  # the section's length is one byte

_HDR = struct.Struct(">HBBBI")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
HEADER_SIZE = _HDR.size  # 9


@dataclass(frozen=True, slots=True)
class Record:
    """A decoded job record (queue index, not name: names are per-partition interned)."""

    queue_index: int
    attempt: int
    max_attempts: int
    created: int
    misfire_skip: bool
    misfire_grace_ms: int
    lease_ms: int
    key: str | None
    backoff_base_ms: int
    backoff_cap_ms: int
    payload_bytes: bytes
    cron_nominal_ms: int | None = None  # cron occurrences: the nominal time this run stands for
    cron_missed: int = 0                # cron occurrences: earlier occurrences coalesced into it
    trace: bytes | None = None          # the producer's trace context (F_TRACE section), or None


def pack_payload(payload: Any, limit: int) -> bytes:
    """Encode a payload with msgpack; clear errors for unencodable or oversized payloads."""
    try:
        data: bytes = msgpack.packb(payload, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise PayloadError(
            f"payload cannot be encoded with msgpack ({exc}); expected None, bool, int, float, str, "
            "bytes, lists/tuples and dicts of those (no pickle: convert objects to plain data)"
        ) from None
    if len(data) > limit:
        raise PayloadError(
            f"payload is {len(data)} bytes encoded, over the limit of {limit} bytes; store large data "
            "elsewhere and pass a reference, or raise max_payload_bytes"
        )
    return data


def unpack_payload(data: bytes, limit: int = DEFAULT_MAX_PAYLOAD) -> Any:
    """Decode a payload with bounded sizes (a corrupt or hostile body cannot allocate unbounded memory)."""
    if len(data) > limit:
        raise PayloadError(f"stored payload is {len(data)} bytes, over the limit of {limit}")
    try:
        return msgpack.unpackb(
            data, raw=False, strict_map_key=False,
            max_str_len=limit, max_bin_len=limit, max_array_len=limit, max_map_len=limit // 2 + 1,
            max_ext_len=limit,
        )
    except Exception as exc:  # msgpack raises several types (ExtraData, FormatError, ValueError...)
        raise PayloadError(f"stored payload is not valid msgpack: {type(exc).__name__}: {exc}") from None


def build_record(
    payload_bytes: bytes,
    *,
    max_attempts: int,
    created_s: int,
    misfire_skip: bool = False,
    misfire_grace_ms: int = 0,
    lease_ms: int = DEFAULT_LEASE_MS,
    key: str | None = None,
    backoff_base_ms: int = DEFAULT_BACKOFF_BASE_MS,
    backoff_cap_ms: int = DEFAULT_BACKOFF_CAP_MS,
    queue_index: int = 0,
    attempt: int = 0,
    trace: bytes | None = None,
) -> bytes:
    """Assemble a record. Inputs are assumed validated by the caller (see client.validate_*);
    ``trace``: a trace section's content as :func:`trace_section` makes it."""
    flags = 0
    tail = []
    if misfire_skip:
        flags |= F_SKIP
        tail.append(_U32.pack(misfire_grace_ms))
    if lease_ms != DEFAULT_LEASE_MS:
        flags |= F_LEASE
        tail.append(_U32.pack(lease_ms))
    if key is not None:
        kb = key.encode("utf-8")
        flags |= F_KEY
        tail.append(bytes((len(kb),)) + kb)
    if backoff_base_ms != DEFAULT_BACKOFF_BASE_MS or backoff_cap_ms != DEFAULT_BACKOFF_CAP_MS:
        opts = msgpack.packb({"bb": backoff_base_ms, "bc": backoff_cap_ms})
        flags |= F_OPTS
        tail.append(_U16.pack(len(opts)) + opts)
    if trace is not None:
        flags |= F_TRACE
        tail.append(bytes((len(trace),)) + trace)
    head = _HDR.pack(queue_index, attempt, max_attempts, flags, created_s)
    if tail:
        return head + b"".join(tail) + payload_bytes
    return head + payload_bytes


def split_template(rec: bytes) -> tuple[bytes, bytes]:
    """Split a record built without key into (head: header + grace + lease, tail: opts + payload)
    so Lua can insert a key and a cron section between them for each cron occurrence."""
    flags = rec[4]
    if flags & (F_KEY | F_CRON | F_TRACE):
        raise ValueError("cron templates carry no key, cron or trace section")
    pos = HEADER_SIZE + (4 if flags & F_SKIP else 0) + (4 if flags & F_LEASE else 0)
    return rec[:pos], rec[pos:]


def decode_record(rec: bytes) -> Record:
    """Parse a record; raises PayloadError if it is truncated or malformed (poison body)."""
    try:
        q, attempt, max_attempts, flags, created = _HDR.unpack_from(rec, 0)
        pos = HEADER_SIZE
        grace = 0
        lease = DEFAULT_LEASE_MS
        key = None
        bb, bc = DEFAULT_BACKOFF_BASE_MS, DEFAULT_BACKOFF_CAP_MS
        if flags & F_SKIP:
            (grace,) = _U32.unpack_from(rec, pos)
            pos += 4
        if flags & F_LEASE:
            (lease,) = _U32.unpack_from(rec, pos)
            pos += 4
        if flags & F_KEY:
            n = rec[pos]
            key = rec[pos + 1 : pos + 1 + n].decode("utf-8")
            pos += 1 + n
        cron_nominal, cron_missed = None, 0
        if flags & F_CRON:
            cron_nominal = int.from_bytes(rec[pos : pos + 6], "big")
            (cron_missed,) = _U16.unpack_from(rec, pos + 6)
            pos += 8
        if flags & F_OPTS:
            (n,) = _U16.unpack_from(rec, pos)
            opts = msgpack.unpackb(rec[pos + 2 : pos + 2 + n], max_str_len=n, max_map_len=n)
            bb, bc = int(opts.get("bb", bb)), int(opts.get("bc", bc))
            pos += 2 + n
        trace = None
        if flags & F_TRACE:
            n = rec[pos]
            trace = rec[pos + 1 : pos + 1 + n]
            pos += 1 + n
        if pos > len(rec):
            raise ValueError("truncated")
    except Exception as exc:
        raise PayloadError(f"job record is malformed ({type(exc).__name__}: {exc})") from None
    return Record(q, attempt, max_attempts, created, bool(flags & F_SKIP), grace, lease, key, bb, bc, rec[pos:],
                  cron_nominal, cron_missed, trace)


TOMBSTONE_HEADER = 28
TOMBSTONE_STATES = {"d": "done", "c": "cancelled", "m": "misfired"}
_TOMB = struct.Struct(">c6s6sHBB6sIB")


@dataclass(frozen=True, slots=True)
class Tombstone:
    """The summary a finished job (done, cancelled, misfired) leaves in the partition's ``f`` hash
    for ``tombstone_ttl`` (written by ``tombstone`` in lua/_lib.lua).

    Layout (big-endian): letter (``d``/``c``/``m``) | finished ms (6) | expires ms (6) | queue
    index (2) | attempts (1) | max_attempts (1) | due ms of the last attempt (6) | created, epoch
    seconds (4) | key length (1) + key | last error without traceback (``at_ms NUL type NUL
    message``, at most 160 bytes), only when the job had one. 28 bytes for a key-less job without
    error: about 105 bytes of Redis memory per tombstone (docs/architecture.md)."""

    state: str           # "done", "cancelled" or "misfired"
    finished_ms: int
    expires_ms: int
    queue_index: int
    attempts: int
    max_attempts: int
    due_ms: int          # when the last attempt became due (the run_at of a job that never ran)
    created: int         # epoch seconds
    key: str | None
    error: bytes | None  # "at_ms NUL type NUL message", possibly cut short


def decode_tombstone(v: bytes) -> Tombstone:
    """Parse a tombstone summary; raises PayloadError if it is truncated or unknown."""
    try:
        letter, fin, exp, q, attempts, max_attempts, due, created, n = _TOMB.unpack_from(v, 0)
        state = TOMBSTONE_STATES[letter.decode("ascii")]
        if len(v) < TOMBSTONE_HEADER + n:
            raise ValueError("truncated")
        key = v[TOMBSTONE_HEADER:TOMBSTONE_HEADER + n].decode("utf-8", "replace") if n else None
        err = v[TOMBSTONE_HEADER + n:] or None
    except Exception as exc:
        raise PayloadError(f"tombstone summary is malformed ({type(exc).__name__}: {exc})") from None
    return Tombstone(state, int.from_bytes(fin, "big"), int.from_bytes(exp, "big"), q, attempts, max_attempts,
                     int.from_bytes(due, "big"), created, key, err)


def finite_number(name: str, value: object) -> float:
    """Validate a real, finite number (bools refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float: out of every range this is checked against
        raise ValueError(f"{name} must be a finite number, got {reprlib.repr(value)}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return number


RESERVED_KEY_PREFIX = "cron:"  # idempotency keys of cron occurrences (lua/_lib.lua cron_schedule)


def validate_key(key: object) -> str | None:
    """An idempotency key, checked (None: no key): a str of 1-200 bytes of UTF-8, not starting
    with the prefix reserved for cron occurrences; TypeError/ValueError otherwise."""
    if key is None:
        return None
    if not isinstance(key, str):
        raise TypeError(f"key must be a str or None, got {type(key).__name__}")
    n = len(key.encode("utf-8"))
    if not 1 <= n <= MAX_KEY_BYTES:
        raise ValueError(f"key must be 1-{MAX_KEY_BYTES} bytes of UTF-8, got {n} bytes")
    if key.startswith(RESERVED_KEY_PREFIX):
        raise ValueError(f"key {key[:40]!r} is reserved: keys starting with {RESERVED_KEY_PREFIX!r} belong to "
                         "cron occurrences (one producer could otherwise take over a cron's next run); use another "
                         "prefix")
    return key
