"""Settings from arguments and the environment: every ``ZSCHED_*`` variable zsched's processes
read, and every default they share, is read and written here once (the servers the tests and
``zsched dev`` start have a few variables of their own, next to those servers;
``tests/unit/test_settings_home.py`` holds the rest of the tree to this).

| variable | what | default |
|---|---|---|
| ``ZSCHED_REDIS_URL`` | Redis URL of every command and process | :data:`DEFAULT_REDIS_URL` |
| ``ZSCHED_NAMESPACE`` | namespace | :data:`DEFAULT_NAMESPACE` |
| ``ZSCHED_PARTITIONS`` | expected partition count | the namespace's (16 for a new one) |
| ``ZSCHED_ETCD_ENDPOINTS`` | etcd endpoints of the scheduler tier | :data:`DEFAULT_ETCD_ENDPOINTS` |
| ``ZSCHED_ETCD_CA``, ``ZSCHED_ETCD_CERT``, ``ZSCHED_ETCD_KEY`` | etcd TLS files | none |
| ``ZSCHED_LEASE_TTL`` | the tier's etcd lease TTL, seconds | ``zsched scheduler``'s |
| ``ZSCHED_LOG_LEVEL`` | log level | INFO |
| ``ZSCHED_DEBUG`` | tracebacks for known conditions | off |
| ``ZSCHED_UI_TOKEN`` | the console's sign-in token | a new one per start |
| ``ZSCHED_UVLOOP`` | ``0``: asyncio's own event loop | uvloop |
| ``ZSCHED_TIMERFD`` | ``0``: the workers' alarm thread | a timerfd |
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple, Protocol

from .errors import ConfigError
from .etcd_endpoints import check_etcd_endpoints
from .keys import validate_name, validate_partitions
from .urls import check_url

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_NAMESPACE = "zsched"
DEFAULT_PARTITIONS = 16
DEFAULT_ETCD_ENDPOINTS = "127.0.0.1:2379"
DEFAULT_TOMBSTONE_TTL = 3600.0  # seconds a finished job stays visible to get() (clients, tier, workers)
DEFAULT_LOG_LEVEL = "INFO"
REDIS_HELP = f"Redis URL (env ZSCHED_REDIS_URL, default {DEFAULT_REDIS_URL})"
NAMESPACE_HELP = f"namespace (env ZSCHED_NAMESPACE, default {DEFAULT_NAMESPACE})"
DEFAULT_METRICS_HOST = "127.0.0.1"  # /metrics on loopback unless the operator asks for more


class Options(Protocol):
    """An argparse parser or argument group: what :func:`add_connection_options` adds to."""

    def add_argument(self, *names: str, **kw: Any) -> Any: ...


def add_connection_options(p: Options, *, redis_help: str = REDIS_HELP, namespace_help: str = NAMESPACE_HELP) -> None:
    """``--redis URL`` and ``--namespace NS``, the options every zsched command takes, declared
    here once (a command whose defaults come from elsewhere, the worker's from its Worker object,
    says so in its own help). Both are read through :func:`redis_url` and :func:`namespace`."""
    p.add_argument("--redis", metavar="URL", help=redis_help)
    p.add_argument("--namespace", metavar="NS", help=namespace_help)


def redis_url(value: str | None = None) -> str:
    """The Redis URL to use (argument, else ZSCHED_REDIS_URL, else the local default), checked:
    redis://, rediss://, unix://, redis+sentinel:// / rediss+sentinel:// or redis+cluster:// /
    rediss+cluster:// (see scheduler.protocol.urls)."""
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


def env(name: str) -> str | None:
    """The value of the environment variable ``ZSCHED_<name>``, or None when unset or empty."""
    return os.environ.get(f"ZSCHED_{name}") or None


def log_level(value: str | None = None) -> str:
    """The log level (argument, else ZSCHED_LOG_LEVEL, else INFO), upper-cased."""
    return (value or env("LOG_LEVEL") or DEFAULT_LOG_LEVEL).upper()


def debug() -> bool:
    """ZSCHED_DEBUG set: tracebacks also for the conditions zsched reports in one line."""
    return env("DEBUG") is not None


def switched_off(name: str) -> bool:
    """A feature variable (``ZSCHED_UVLOOP``, ``ZSCHED_TIMERFD``) set to 0, false, no or off."""
    return (env(name) or "").strip().lower() in ("0", "false", "no", "off")


def ui_token() -> str | None:
    """The console's sign-in token from ZSCHED_UI_TOKEN, or None (a new one is made)."""
    return env("UI_TOKEN")


class EtcdTLS(NamedTuple):
    """The etcd TLS files, as ``EtcdCoordinator.from_endpoints`` takes them; None where unset."""

    ca_cert: str | None
    cert_cert: str | None
    cert_key: str | None


def etcd_tls() -> EtcdTLS:
    """The etcd TLS files from ZSCHED_ETCD_CA, ZSCHED_ETCD_CERT and ZSCHED_ETCD_KEY (URLs carry
    user:password and https; files come from the environment)."""
    return EtcdTLS(env("ETCD_CA"), env("ETCD_CERT"), env("ETCD_KEY"))


def lease_ttl_env() -> str | None:
    """ZSCHED_LEASE_TTL as given (stripped), or None; ``zsched scheduler`` checks it."""
    raw = (env("LEASE_TTL") or "").strip()
    return raw or None
