"""Failed console logins, throttled per client address.

The first FREE_FAILURES wrong tokens from an address cost nothing (typos); each one after that
locks the address out for twice as long as the one before (1 s, 2 s, 4 s ... at most MAX_LOCK_S),
and a login attempt while locked is refused without looking at the token (429 with Retry-After).
A correct token clears the address. IPv6 clients count by their /64 (one host usually has a whole
/64 to pick addresses from). Memory is bounded: at most MAX_ADDRESSES addresses are remembered,
the one that failed longest ago forgotten first, and an address is forgotten FORGET_S after its
last failure.

Per console process, in memory: a restart forgets. A generated token (32 random characters) cannot
be guessed at any rate; the throttle is what stands between a short ZSCHED_UI_TOKEN and a script.
"""
from __future__ import annotations

import ipaddress
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

FREE_FAILURES = 5
FIRST_LOCK_S = 1.0
MAX_LOCK_S = 900.0
FORGET_S = 3600.0
MAX_ADDRESSES = 10_000


def client_key(address: str) -> str:
    """Whom failures are counted against: the IPv4 address, the IPv6 /64, or the text as given."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


@dataclass
class _Record:
    failures: int = 0
    last: float = 0.0
    locked_until: float = 0.0
    reported: bool = False  # the current lock has been written to the audit log


class LoginThrottle:
    """Failed logins per client (see the module docstring). ``clock``: monotonic seconds (tests).
    Used from the event loop only (no lock)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, free: int = FREE_FAILURES,
                 first_lock: float = FIRST_LOCK_S, max_lock: float = MAX_LOCK_S, forget: float = FORGET_S,
                 max_addresses: int = MAX_ADDRESSES) -> None:
        self.clock = clock
        self.free = free
        self.first_lock = first_lock
        self.max_lock = max_lock
        self.forget = forget
        self.max_addresses = max_addresses
        self._seen: OrderedDict[str, _Record] = OrderedDict()  # least recently failed first

    def __len__(self) -> int:
        return len(self._seen)

    def _record(self, address: str) -> _Record | None:
        key = client_key(address)
        rec = self._seen.get(key)
        if rec is not None and self.clock() - rec.last >= self.forget and self.clock() >= rec.locked_until:
            del self._seen[key]
            return None
        return rec

    def retry_after(self, address: str) -> float:
        """Seconds until ``address`` may try to log in again (0: now)."""
        rec = self._record(address)
        return max(0.0, rec.locked_until - self.clock()) if rec else 0.0

    def first_refusal(self, address: str) -> bool:
        """True once per lock: whether the audit log still has to hear about this lock."""
        rec = self._record(address)
        if rec is None or rec.reported:
            return False
        rec.reported = True
        return True

    def failed(self, address: str) -> tuple[int, float]:
        """Count a wrong token from ``address``: (failures in a row, seconds it is locked for now)."""
        key = client_key(address)
        rec = self._record(address) or _Record()
        now = self.clock()
        rec.failures += 1
        rec.last = now
        lock = 0.0
        if rec.failures > self.free:
            doublings = min(rec.failures - self.free - 1, 30)  # bounded: 2.0 ** 1024 overflows
            lock = min(self.max_lock, self.first_lock * 2.0 ** doublings)
            rec.locked_until, rec.reported = now + lock, False
        self._seen[key] = rec
        self._seen.move_to_end(key)
        while len(self._seen) > self.max_addresses:
            self._seen.popitem(last=False)
        return rec.failures, lock

    def succeeded(self, address: str) -> None:
        """A correct token from ``address``: its failures are forgotten."""
        self._seen.pop(client_key(address), None)


def retry_after_header(seconds: float) -> str:
    """A Retry-After value: whole seconds, rounded up, at least 1."""
    return str(max(1, math.ceil(seconds)))
