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


class DurabilityError(ZschedError):
    """The jobs were written to the Redis master, but the durability asked for (``durable=``) was
    not confirmed. The jobs *may* exist: they are live on the master now, and are lost only if the
    master fails before replicating or persisting them. ``ids`` are the affected job ids (in the
    order of the call) so the caller can check them with ``get()`` or schedule again with the same
    idempotency key."""

    def __init__(self, message: str, ids: list[str]) -> None:
        super().__init__(message)
        self.ids = ids

    @property
    def job_id(self) -> str | None:
        """The id when the call scheduled one job."""
        return self.ids[0] if len(self.ids) == 1 else None


class DurabilityTimeout(DurabilityError):
    """Fewer replicas (``durable="replica"``) or no local fsync (``durable="fsync"``) confirmed the
    write within ``durable_timeout``."""


class DurabilityUnsupported(ZschedError, ValueError):
    """The server cannot give the durability asked for (e.g. ``durable="fsync"`` needs WAITAOF,
    Redis 7.2+). Raised before anything is written."""


class MisfiredAtSchedule(ZschedError):
    """Jobs with ``misfire="skip"`` were already later than their grace when they reached Redis:
    they were recorded as *misfired* and will not run. Every other job of the call was scheduled.
    ``ids``: all ids of the call, in order; ``misfired``: the ids that misfired."""

    def __init__(self, ids: list[str], misfired: list[str]) -> None:
        what = f"job {misfired[0]}" if len(misfired) == 1 else f"{len(misfired)} jobs"
        super().__init__(
            f"{what} misfired at schedule time: due more than its misfire_grace in the past with misfire='skip', "
            "so it will not run (the others of this call were scheduled; see .ids). Schedule it later, raise "
            "misfire_grace, or use misfire='run_late'")
        self.ids = ids
        self.misfired = misfired

    @property
    def job_id(self) -> str | None:
        """The id when the call scheduled one job."""
        return self.ids[0] if len(self.ids) == 1 else None


class LayoutChanged(ZschedError):
    """The namespace's partition count is being changed (``migrating``) or was changed since this
    process read it, so Redis refused the call before it wrote anything (the layout fence, see
    ``zsched migrate-partitions`` in docs/scaling.md). Clients re-read the count and retry by
    themselves after a finished migration; during one they raise this, and ``migrating`` is True:
    retry after it finishes. Scheduler replicas and workers log it; restart them after a migration."""

    PREFIX = "ZSCHED_LAYOUT"

    def __init__(self, message: str, *, migrating: bool) -> None:
        super().__init__(message)
        self.migrating = migrating

    @classmethod
    def from_reply(cls, exc: BaseException) -> LayoutChanged | None:
        """The refusal an error reply carries, or None when ``exc`` is not the layout fence's."""
        text = str(exc)
        if not text.startswith(cls.PREFIX):
            return None
        detail = text[len(cls.PREFIX):].strip()
        return cls(detail, migrating=detail.startswith("migrating"))


class ScriptArgumentError(ZschedError, ValueError):
    """A script refused an argument before it wrote anything (``ZSCHED_ARG``, lua/_lib_args.lua
    "Argument checks"): nothing changed in Redis. ``script`` is the script, ``argument`` what was
    refused (``ARGV[n]``, or ``ARGV``/``KEYS`` for their count) and ``name`` its name in the
    script's header. The clients check their input before it reaches Redis, so from them this
    means a value they let through (their own check is missing or differs) or scripts of another
    zsched version; a direct ``EVALSHA`` gets it for any argument outside the header's ranges."""

    PREFIX = "ZSCHED_ARG"

    def __init__(self, message: str, *, script: str, argument: str, name: str) -> None:
        super().__init__(message)
        self.script, self.argument, self.name = script, argument, name

    @classmethod
    def from_reply(cls, exc: BaseException) -> ScriptArgumentError | None:
        """The refusal an error reply carries, or None when ``exc`` is not an argument check's."""
        text = str(exc)
        if not text.startswith(cls.PREFIX + " "):
            return None
        head, _, detail = text[len(cls.PREFIX) + 1:].partition(": ")
        script, argument, name = (head.split(" ", 2) + ["", ""])[:3]
        return cls(f"{script} refused {argument} {name}: {detail} (nothing was written; see the header of "
                   f"lua/{script}.lua)", script=script, argument=argument, name=name)


def failure_kind(exc: BaseException) -> str:
    """What kind of failure ``exc`` is, for logs that speak once per kind: a layout refusal while a
    migration runs, one after it ended (the process must restart), or the exception's type. A
    process refused while ``zsched migrate-partitions`` runs must still say "restart it" once the
    refusal changes to that."""
    refusal = LayoutChanged.from_reply(exc)
    if refusal is not None:
        return "layout-migrating" if refusal.migrating else "layout-changed"
    return type(exc).__name__
