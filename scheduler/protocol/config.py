"""Settings from arguments and the environment (``ZSCHED_*``)."""
from __future__ import annotations

import os

from .connection import check_url
from .errors import ConfigError
from .etcd_endpoints import check_etcd_endpoints
from .keys import validate_name, validate_partitions

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_NAMESPACE = "zsched"
DEFAULT_PARTITIONS = 16
DEFAULT_ETCD_ENDPOINTS = "127.0.0.1:2379"


def redis_url(value: str | None = None) -> str:
    """The Redis URL to use (argument, else ZSCHED_REDIS_URL, else the local default), checked:
    redis://, rediss://, unix://, redis+sentinel:// / rediss+sentinel:// or redis+cluster:// /
    rediss+cluster:// (see scheduler.protocol.connection)."""
    url = value or os.environ.get("ZSCHED_REDIS_URL") or DEFAULT_REDIS_URL
    return check_url(url)


def namespace(value: str | None = None) -> str:
    ns = value or os.environ.get("ZSCHED_NAMESPACE") or DEFAULT_NAMESPACE
    try:
        return validate_name("namespace", ns)
    except ValueError as exc:
        raise ConfigError(f"{exc} (set --namespace or ZSCHED_NAMESPACE)") from None


def partitions(value: int | None = None) -> int | None:
    """An explicit partition count (argument, else ZSCHED_PARTITIONS), or None to adopt the
    namespace's stored count (16 for a new namespace)."""
    if value is not None:
        return validate_partitions(value)
    raw = os.environ.get("ZSCHED_PARTITIONS")
    if raw is None or raw == "":
        return None
    try:
        return validate_partitions(int(raw))
    except ValueError:
        raise ConfigError(f"ZSCHED_PARTITIONS={raw!r} is invalid: expected an integer from 1 to 4096") from None


def etcd_endpoints(value: str | None = None) -> str:
    """The etcd endpoint list of the scheduler tier (argument, else ZSCHED_ETCD_ENDPOINTS, else the
    local default), checked (see scheduler.protocol.etcd_endpoints): a malformed one raises
    ConfigError before anything connects. An empty argument is refused, not taken as "unset"."""
    return optional_etcd_endpoints(value) or DEFAULT_ETCD_ENDPOINTS


def optional_etcd_endpoints(value: str | None = None) -> str | None:
    """The etcd endpoint list (argument, else ZSCHED_ETCD_ENDPOINTS), checked; None when neither is
    given (the operator commands then show partition owners as not configured)."""
    if value is not None:
        return check_etcd_endpoints(value)
    env = os.environ.get("ZSCHED_ETCD_ENDPOINTS")
    return check_etcd_endpoints(env) if env else None


def resolve_partitions(stored: bytes | str | None, wanted: int | None, ns: str) -> int:
    """Compare the namespace's stored partition count with the requested one."""
    if stored is None:
        return wanted or DEFAULT_PARTITIONS
    have = int(stored)
    if wanted is not None and wanted != have:
        raise ConfigError(
            f"namespace {ns!r} has {have} partitions, but this process was started with {wanted}; the count "
            f"belongs to the namespace (only zsched migrate-partitions changes it). Use {have} (unset "
            f"ZSCHED_PARTITIONS or pass partitions={have}), or a new namespace"
        )
    return have
