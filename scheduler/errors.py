"""Exceptions raised by zsched. Every message says what was wrong, what was expected and how to fix it."""
from __future__ import annotations


class ZschedError(Exception):
    """Base class for zsched errors."""


class ConfigError(ZschedError, ValueError):
    """The configuration (URL, namespace, partition count, ...) is invalid or conflicts with Redis."""


class PayloadError(ZschedError, ValueError):
    """A payload cannot be encoded, is too large, or a stored body cannot be decoded."""


class ScriptError(ZschedError):
    """A Lua script returned an unexpected reply (a bug or an incompatible Redis)."""


class EpochRefused(ZschedError):
    """Redis refused a scheduler-tier call because a newer owner (higher epoch) has acted on the partition."""

    def __init__(self, partition: int, epoch: int, current: int) -> None:
        super().__init__(
            f"partition {partition}: epoch {epoch} refused, Redis has seen epoch {current}; "
            "another replica owns this partition now, so this replica must stop ticking it"
        )
        self.partition = partition
        self.epoch = epoch
        self.current = current
