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

import hashlib
import os
import threading
import zlib
from collections.abc import Sequence

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


ID_NAME_MAX = 1024  # bytes of a name an id is derived from (schedule_many(ids_from=)): hashed, never stored


def id_names(ids_from: Sequence[str] | None, count: int) -> list[str] | None:
    """``ids_from`` of a batch of ``count`` jobs, checked: one distinct name of 1 to
    :data:`ID_NAME_MAX` bytes per job (None: ids are generated)."""
    if ids_from is None:
        return None
    names = list(ids_from)
    if len(names) != count:
        raise ValueError(f"ids_from names {len(names)} jobs, the batch has {count}")
    for n, name in enumerate(names):
        if not isinstance(name, str) or not 1 <= len(name.encode("utf-8")) <= ID_NAME_MAX:
            raise ValueError(f"ids_from[{n}]: expected a name of 1 to {ID_NAME_MAX} bytes, got {name!r:.80}")
    if len(set(names)) != len(names):
        raise ValueError("ids_from: two jobs of the batch have the same name (they would get the same id)")
    return names


def derived_id(run_at_ms: int, name: str, key: str | None, partitions: int) -> tuple[bytes, int]:
    """(binary id, partition) derived from ``name``, a caller's stable name for the job ("the
    outbox row 42 of table T"): the same name and time give the same id, so a batch sent again
    (a relay that died before recording that it had sent it) finds its jobs, or their tombstones,
    instead of creating them twice. The random part is a hash of the name, so distinct names do
    not collide in practice (40 bits, with h: 72 for an unkeyed job, as for generated ids)."""
    if not 0 <= run_at_ms <= _MAX_MS:
        raise ValueError(f"a derived id needs a time in ms from 0 to {_MAX_MS}, got {run_at_ms}")
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=9).digest()
    head, tail = run_at_ms.to_bytes(6, "big"), digest[:5]
    h = zlib.crc32(head + tail, int.from_bytes(digest[5:], "big")) if key is None else placement_for_key(key)
    return head + h.to_bytes(4, "big") + tail, h % partitions


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
