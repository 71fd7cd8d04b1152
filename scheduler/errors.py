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
