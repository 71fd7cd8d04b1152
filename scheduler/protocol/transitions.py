"""The worker's transitions as typed calls: ``claim``, ``ack``, ``fail``, ``extend``, ``release``.

One builder per script, with the argument layout of its header (``lua/claim.lua`` ...), used by
every caller: the worker (``workers/fetch.py``, ``workers/outbox.py``), the testing kit
(``scheduler/testing``), the benchmarks and the tests, so the kit calls a script exactly as
production does. The replies are read by :func:`~.replies.parse_claim` and the codes of
:mod:`.codes`. Nothing here does I/O. ``tests/unit/test_architecture.py`` refuses a script call
built by name outside the protocol layer.

An attempt is named by ``(raw id, token)``: the token its claim returned, the job's fence.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol

from .call import Call
from .codes import FailKind


class Builder(Protocol):
    """What the builders need of a namespace's :class:`~.calls.Calls`: its raw ``call`` (the
    common arguments and the partition's keys) and the tombstone TTL that ``ack`` passes."""

    tomb_ms: int

    def call(self, name: str, partition: int, *args: Any) -> Call:
        """The call of script ``name`` on ``partition`` with ``args`` after the common ones."""
        ...


Attempt = tuple[bytes, int]
"""A claimed job: its binary id and the token of its claim."""


class Failure(NamedTuple):
    """One ``fail`` of an attempt: ``delay_ms`` before the retry (the caller's backoff, or the
    delay the handler asked for), ``error`` as :func:`~.calls.error_arg` builds it."""

    raw_id: bytes
    token: int
    kind: FailKind
    delay_ms: int
    error: bytes


def claim_call(calls: Builder, partition: int, queue: str, n: int, *, request_id: str = "", receipt_ms: int = 0,
               earlier_request_id: str = "", max_due: int | None = None) -> Call:
    """``claim`` of up to ``n`` ready jobs of ``queue`` in ``partition``. ``request_id`` (with
    ``receipt_ms``): keep a receipt so a re-send after a lost reply gets the same jobs back;
    ``earlier_request_id``: a receipt whose reply arrived, which can go now; ``max_due``: the most
    jobs already due to take (the free handler slots; None: all)."""
    return calls.call("claim", partition, queue, n, request_id, receipt_ms if request_id else "",
                      earlier_request_id, "" if max_due is None else max_due)


def _pairs(attempts: Iterable[Attempt]) -> list[bytes | int]:
    out: list[bytes | int] = []
    for raw_id, token in attempts:
        out += (raw_id, token)
    return out


def ack_call(calls: Builder, partition: int, attempts: Iterable[Attempt], tomb_ms: int | None = None) -> Call:
    """``ack`` of ``attempts`` (running -> done), each leaving a tombstone for ``tomb_ms`` (default
    the builder's: the tombstone TTL of the process that acks, a worker's own setting)."""
    return calls.call("ack", partition, calls.tomb_ms if tomb_ms is None else tomb_ms, *_pairs(attempts))


def release_call(calls: Builder, partition: int, attempts: Iterable[Attempt]) -> Call:
    """``release`` of ``attempts`` (running -> ready, the attempt not counted)."""
    return calls.call("release", partition, *_pairs(attempts))


def extend_call(calls: Builder, partition: int, attempts: Iterable[Attempt], lease_ms: int = 0) -> Call:
    """``extend`` of ``attempts``' leases by ``lease_ms`` (0: each job's own lease)."""
    args: list[bytes | int] = []
    for raw_id, token in attempts:
        args += (raw_id, token, lease_ms)
    return calls.call("extend", partition, *args)


def fail_call(calls: Builder, partition: int, failures: Iterable[Failure]) -> Call:
    """``fail`` of each attempt: a retry after its delay while attempts remain, else dead."""
    args: list[bytes | int] = []
    for f in failures:
        args += (f.raw_id, f.token, f.kind.value, f.delay_ms, f.error)
    return calls.call("fail", partition, *args)
