"""How a job runs: :class:`JobOptions`, one frozen value checked once, and what it becomes on the wire.

``schedule``, ``schedule_many`` and ``add_cron`` take either ``options=JobOptions(...)`` or the
same options as keyword arguments (:class:`JobOptionFields`), which override ``options`` field by
field. Producers pass the same few option sets again and again, so the keyword form is cached
(:func:`with_overrides`): scheduling one job at a time checks its options once, not per call.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from difflib import get_close_matches
from functools import lru_cache
from typing import Any, TypedDict

from . import codec
from .codec import finite_number
from .keys import validate_name

MISFIRE_POLICIES = ("run_late", "skip")
DEFAULT_SKIP_GRACE = 60.0
MAX_LEASE_S = 7 * 86400
MAX_GRACE_S = 49 * 86400
MAX_BACKOFF_S = 30 * 86400


class JobOptionFields(TypedDict, total=False):
    """The keyword form of :class:`JobOptions` (every field optional)."""

    queue: str
    max_attempts: int
    lease: float
    misfire: str
    misfire_grace: float | None
    backoff: tuple[float, float] | None
    jitter: float


@dataclass(frozen=True, slots=True)
class JobOptions:
    """How a job runs, checked when it is made (TypeError/ValueError saying what is wrong).

    ``queue``: the queue workers claim it from. ``max_attempts``: claims before it is
    dead-lettered (1-255). ``lease``: seconds a worker holds it before it is handed to another
    (0.1 s to 7 days; workers extend it while the handler runs). ``misfire``: ``run_late`` (run
    however late it comes due) or ``skip`` (drop it when it comes due more than
    ``misfire_grace`` seconds late; default 60, up to 49 days). ``backoff``: ``(base, cap)``
    seconds of the full-jitter exponential retry delay (default: the codec's). ``jitter``: spread
    run_at uniformly over ``[at, at + jitter]`` seconds.

    The ``*_ms`` fields are the values sent to the scripts, derived once here.
    """

    queue: str = "default"
    max_attempts: int = 5
    lease: float = 30.0
    misfire: str = "run_late"
    misfire_grace: float | None = None
    backoff: tuple[float, float] | None = None
    jitter: float = 0.0
    lease_ms: int = field(init=False, repr=False, compare=False)
    misfire_skip: bool = field(init=False, repr=False, compare=False)
    misfire_grace_ms: int = field(init=False, repr=False, compare=False)
    backoff_base_ms: int = field(init=False, repr=False, compare=False)
    backoff_cap_ms: int = field(init=False, repr=False, compare=False)
    jitter_ms: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        validate_name("queue", self.queue)
        n = self.max_attempts
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"max_attempts must be an int, got {type(n).__name__}")
        if not 1 <= n <= codec.MAX_ATTEMPTS_LIMIT:
            raise ValueError(f"max_attempts must be from 1 to {codec.MAX_ATTEMPTS_LIMIT}, got {n}")
        lease_s = finite_number("lease", self.lease)
        if not 0.1 <= lease_s <= MAX_LEASE_S:
            raise ValueError(f"lease must be from 0.1 to {MAX_LEASE_S} seconds (7 days), got {self.lease!r}")
        grace_ms = self._grace_ms()
        base_ms, cap_ms = self._backoff_ms()
        jitter_ms = self._jitter_ms()
        derive = object.__setattr__  # frozen: the derived fields are set once, here
        derive(self, "lease_ms", max(1, int(round(lease_s * 1000))))
        derive(self, "misfire_skip", self.misfire == "skip")
        derive(self, "misfire_grace_ms", grace_ms)
        derive(self, "backoff_base_ms", base_ms)
        derive(self, "backoff_cap_ms", cap_ms)
        derive(self, "jitter_ms", jitter_ms)

    def _grace_ms(self) -> int:
        if self.misfire not in MISFIRE_POLICIES:
            raise ValueError(f"misfire must be one of {MISFIRE_POLICIES}, got {self.misfire!r}")
        if self.misfire != "skip":
            if self.misfire_grace is not None:
                raise ValueError("misfire_grace only applies to misfire='skip'; remove it or set misfire='skip'")
            return 0
        g = DEFAULT_SKIP_GRACE if self.misfire_grace is None else finite_number("misfire_grace", self.misfire_grace)
        if not 0 <= g <= MAX_GRACE_S:
            raise ValueError(f"misfire_grace must be from 0 to {MAX_GRACE_S} seconds (49 days), "
                             f"got {self.misfire_grace!r}")
        return int(g * 1000)

    def _backoff_ms(self) -> tuple[int, int]:
        backoff = self.backoff
        if backoff is None:
            return codec.DEFAULT_BACKOFF_BASE_MS, codec.DEFAULT_BACKOFF_CAP_MS
        if not isinstance(backoff, (tuple, list)) or len(backoff) != 2:
            raise TypeError("backoff must be a (base_seconds, cap_seconds) pair")
        b = finite_number("backoff base", backoff[0])
        c = finite_number("backoff cap", backoff[1])
        if not 0 < b <= c <= MAX_BACKOFF_S:
            raise ValueError(f"backoff must satisfy 0 < base <= cap <= 30 days, got {backoff!r}")
        object.__setattr__(self, "backoff", (backoff[0], backoff[1]))  # a list becomes hashable
        return int(b * 1000), int(c * 1000)

    def _jitter_ms(self) -> int:
        j = finite_number("jitter", self.jitter)
        if j < 0:
            raise ValueError(f"jitter must be >= 0 seconds, got {self.jitter!r}")
        return int(j * 1000)

    def record_fields(self) -> dict[str, Any]:
        """The options stored in each job's record (``codec.build_record`` keyword arguments)."""
        return dict(max_attempts=self.max_attempts, lease_ms=self.lease_ms, misfire_skip=self.misfire_skip,
                    misfire_grace_ms=self.misfire_grace_ms, backoff_base_ms=self.backoff_base_ms,
                    backoff_cap_ms=self.backoff_cap_ms)


DEFAULT_OPTIONS = JobOptions()


def with_overrides(base: JobOptions | None, overrides: JobOptionFields) -> JobOptions:
    """``base`` (default: :data:`DEFAULT_OPTIONS`) with the keyword options given; checked once per
    distinct combination (cached), so the per-call cost of keyword options is one dict lookup."""
    if base is None:
        base = DEFAULT_OPTIONS
    elif not isinstance(base, JobOptions):
        raise TypeError(f"options must be a JobOptions, got {type(base).__name__}")
    if not overrides:
        return base
    try:
        return _cached_replace(base, tuple(overrides), *overrides.values())
    except TypeError as exc:
        if "unhashable" not in str(exc):
            raise
        return _replace(base, dict(overrides))  # e.g. backoff given as a list


@lru_cache(maxsize=256, typed=True)  # typed: max_attempts=True must not hit the entry of 1
def _cached_replace(base: JobOptions, names: tuple[str, ...], *values: Any) -> JobOptions:
    return _replace(base, dict(zip(names, values)))


OPTION_NAMES = tuple(JobOptionFields.__annotations__)
"""The job options, in the order the docs list them (the keywords ``schedule`` and friends take)."""


def _replace(base: JobOptions, changes: dict[str, Any]) -> JobOptions:
    # Names are checked here, on a cache miss only, so the hot path stays one dict lookup; a typo
    # would otherwise surface as dataclasses' "JobOptions.__init__() got an unexpected keyword".
    unknown = [name for name in changes if name not in OPTION_NAMES]
    if unknown:
        guesses = [g for name in unknown for g in get_close_matches(name, OPTION_NAMES, 1, 0.5)]
        hint = f" (did you mean {' or '.join(map(repr, guesses))}?)" if guesses else ""
        raise TypeError(f"unknown job option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}"
                        f"{hint}; the job options are {', '.join(OPTION_NAMES)}")
    return replace(base, **changes)
