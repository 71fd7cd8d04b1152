"""Job ids: 15 bytes in Redis, 30 lowercase hex characters in public.

Layout (big-endian):  [0:6] run_at at creation in ms | [6:8] partition | [8:15] 56 random bits.

* Sortable by the job's original due time, unique without coordination (56 random bits,
  monotonic within one generator and millisecond).
* The partition is embedded, so ``get``/``cancel`` of any id know where to look even when the
  partition came from an idempotency key. For unkeyed jobs it is a stable hash of the random bits.
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
_RAND_MAX = (1 << 56) - 1


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


def partition_of(raw: bytes) -> int:
    """Partition a binary id belongs to."""
    return int.from_bytes(raw[6:8], "big")


def run_at_of(raw: bytes) -> int:
    """The run_at (ms) the job was created with; its timer score unless moved since."""
    return int.from_bytes(raw[0:6], "big")


def partition_for_key(key: str, partitions: int) -> int:
    """Stable partition of an idempotency key (crc32, the same on every client and Python version)."""
    return zlib.crc32(key.encode("utf-8")) % partitions


class IdGenerator:
    """Generates ids; thread-safe. Within one millisecond, ids of one generator are monotonic."""

    __slots__ = ("_lock", "_last_ms", "_last_rand")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0

    def new(self, run_at_ms: int, partitions: int, key: str | None = None) -> tuple[bytes, int]:
        """Return (binary id, partition) for a job first due at ``run_at_ms``."""
        ms = run_at_ms if 0 <= run_at_ms <= _MAX_MS else 0
        with self._lock:
            if ms == self._last_ms and self._last_rand < _RAND_MAX:
                rand = self._last_rand + 1
            else:
                rand = int.from_bytes(os.urandom(7), "big") >> 1  # headroom for increments
            self._last_ms, self._last_rand = ms, rand
        rbytes = rand.to_bytes(7, "big")
        if key is None:
            part = zlib.crc32(rbytes) % partitions
        else:
            part = partition_for_key(key, partitions)
        return ms.to_bytes(6, "big") + part.to_bytes(2, "big") + rbytes, part
