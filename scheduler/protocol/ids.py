"""Job ids: 15 bytes in Redis, 30 lowercase hex characters in public.

Layout (big-endian):  [0:6] run_at at creation in ms | [6:10] placement hash h | [10:15] 40 random bits.

* Sortable by the job's original due time, unique without coordination (40 random bits, plus 32
  in h for an unkeyed job; ids of one generator are monotonic within a millisecond).
* The job's partition is ``h % partitions``, for any partition count: ``get``/``cancel`` of any
  id know where to look, and ``zsched migrate-partitions`` knows where every job goes under a new
  count without a lookup table. For a keyed job h is ``crc32(key)``, so the job lives where its
  idempotency key does (:func:`partition_for_key`); for a cron's occurrence, ``crc32(name)``.
* The creation ``run_at`` lets Redis find a pending job in its timer set without a per-job index
  (see docs/architecture.md, "Where the bytes go"): the timer member *is* the job.
"""
from __future__ import annotations

import os
import threading
import zlib

ID_BYTES = 15
ID_CHARS = 30
_MAX_MS = (1 << 48) - 1
_RAND_MAX = (1 << 40) - 1


def encode_id(raw: bytes) -> str:
    """Binary id (15 bytes) to its public 30-character hex form (C-fast, sorts like the bytes)."""
    return raw.hex()


def decode_id(text: str) -> bytes:
    """Public id to its 15 binary bytes; raises ValueError with the expected format."""
    if not isinstance(text, str) or len(text) != ID_CHARS:
        raise ValueError(
            f"job id must be a {ID_CHARS}-character zsched id (hex, as returned by schedule), got {text!r}"
        )
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"job id {text!r} is not hex; expected {ID_CHARS} characters 0-9a-f") from None


def placement_of(raw: bytes) -> int:
    """The placement hash h of a binary id (bytes 6-10): its partition is ``h % partitions``."""
    return int.from_bytes(raw[6:10], "big")


def partition_of(raw: bytes, partitions: int) -> int:
    """Partition a binary id belongs to in a namespace of ``partitions`` partitions."""
    return int.from_bytes(raw[6:10], "big") % partitions


def run_at_of(raw: bytes) -> int:
    """The run_at (ms) the job was created with; its timer score unless moved since."""
    return int.from_bytes(raw[0:6], "big")


def placement_for_key(key: str) -> int:
    """Placement hash of an idempotency key or cron name (crc32: the same on every client and
    Python version)."""
    return zlib.crc32(key.encode("utf-8"))


def partition_for_key(key: str, partitions: int) -> int:
    """Stable partition of an idempotency key or cron name."""
    return placement_for_key(key) % partitions


class IdGenerator:
    """Generates ids; thread-safe. Within one millisecond, ids of one generator are monotonic."""

    __slots__ = ("_lock", "_last_ms", "_last_rand", "_seed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0
        self._seed = 0

    def new(self, run_at_ms: int, partitions: int, key: str | None = None) -> tuple[bytes, int]:
        """Return (binary id, partition) for a job first due at ``run_at_ms``."""
        ms = run_at_ms if 0 <= run_at_ms <= _MAX_MS else 0
        with self._lock:
            if ms == self._last_ms and self._last_rand < _RAND_MAX:
                rand = self._last_rand + 1
            else:
                fresh = os.urandom(9)
                rand = int.from_bytes(fresh[:5], "big") >> 1  # headroom for increments
                self._seed = int.from_bytes(fresh[5:], "big")
            self._last_ms, self._last_rand = ms, rand
            seed = self._seed
        head, tail = ms.to_bytes(6, "big"), rand.to_bytes(5, "big")
        # Unkeyed: h spreads jobs evenly as a hash of the rest of the id, started from 32 random
        # bits drawn with 'rand'. Two generators that drew overlapping 'rand' ranges in the same
        # millisecond still differ in h (CRC is linear: other start, other result for the same
        # bytes), so an unkeyed id carries 72 random bits, not 40.
        h = zlib.crc32(head + tail, seed) if key is None else placement_for_key(key)
        return head + h.to_bytes(4, "big") + tail, h % partitions
