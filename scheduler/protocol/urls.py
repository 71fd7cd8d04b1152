"""Redis URLs, parsed and checked without connecting: plain, TLS, unix socket, Sentinel and
Cluster (the schemes :mod:`scheduler.redisio.connection` builds clients for). Pure: settings and
the CLI check a URL here before anything talks to Redis, and a message never shows a password.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

from .errors import ConfigError
from .masking import mask_secrets

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
PLAIN_SCHEMES = ("redis", "rediss", "unix")

# Query options of Sentinel URLs that go to the sentinels, not to the master.
_SENTINEL_ONLY = ("sentinel_username", "sentinel_password")
_HINT = ("expected redis://[user:password@]host:port/db, rediss:// for TLS, unix:///path, or "
         "redis+sentinel://[user:password@]host:port[,host:port...]/MASTER_NAME[/db] "
         "(rediss+sentinel:// for TLS), or redis+cluster://[user:password@]host:port[,host:port...] "
         "(rediss+cluster:// for TLS)")


@dataclass(frozen=True)
class ClusterTarget:
    """A parsed cluster URL: the nodes to start from, TLS, credentials, connection options."""

    nodes: tuple[tuple[str, int], ...]
    ssl: bool
    username: str | None
    password: str | None
    options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SentinelTarget:
    """A parsed Sentinel URL."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int
    ssl: bool
    username: str | None
    password: str | None
    options: dict[str, str] = field(default_factory=dict)
    sentinel_options: dict[str, str] = field(default_factory=dict)


def _bad(url: str, why: str) -> ConfigError:
    return ConfigError(f"Redis URL {mask_secrets(url)!r} is invalid: {why}; {_HINT} (set --redis or ZSCHED_REDIS_URL)")


def check_url(url: str) -> str:
    """Validate a Redis URL (any supported scheme); returns it unchanged."""
    if any(c.isspace() for c in url):  # not shown: masking cannot tell where such a password ends
        raise ConfigError(f"the Redis URL contains whitespace (percent-encode a space in a password as %20); "
                          f"{_HINT} (set --redis or ZSCHED_REDIS_URL)")
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in SENTINEL_SCHEMES:
        parse_sentinel_url(url)
    elif scheme in CLUSTER_SCHEMES:
        parse_cluster_url(url)
    elif scheme not in PLAIN_SCHEMES:
        raise _bad(url, f"unknown scheme {scheme + '://' if scheme else '(none)'}")
    else:
        try:
            urlsplit(url).port  # noqa: B018 - parsing it is the check
        except ValueError:
            # checked here, not left to redis-py: its message quotes what it took for the port,
            # which is part of the password when the password has an unencoded / ? or #
            raise _bad(url, "the address is not [user:password@]host:port (percent-encode @ : / ? # in "
                            "a user name or password)") from None
    return url


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Split ``redis+sentinel://[user:pass@]h:p[,h:p...]/MASTER[/db][?opts]``."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SENTINEL_SCHEMES:
        raise _bad(url, "not a Sentinel URL")
    username, password, hosts = _hosts(url, parts.netloc, "sentinel", 26379)
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise _bad(url, "no master name (the name the sentinels monitor, e.g. /mymaster)")
    if len(path) > 2:
        raise _bad(url, "the path must be /MASTER_NAME or /MASTER_NAME/DB")
    db = 0
    if len(path) == 2:
        try:
            db = int(path[1])
        except ValueError:
            raise _bad(url, f"database {path[1]!r} is not a number") from None
    opts: dict[str, str] = {}
    sopts: dict[str, str] = {}
    for k, v in parse_qs(parts.query, keep_blank_values=True).items():
        (sopts if k in _SENTINEL_ONLY else opts)[k] = v[-1]
    return SentinelTarget(tuple(hosts), unquote(path[0]), db, scheme == "rediss+sentinel", username, password,
                          opts, sopts)


def _hosts(url: str, netloc: str, what: str, default_port: int) -> tuple[str | None, str | None,
                                                                        list[tuple[str, int]]]:
    """Credentials and the ``host:port[,host:port...]`` list of a multi-host URL."""
    username = password = None
    if "@" in netloc:
        creds, netloc = netloc.rsplit("@", 1)
        user, _, pw = creds.partition(":")
        username, password = (unquote(user) or None), (unquote(pw) or None)
    hosts: list[tuple[str, int]] = []
    for raw in netloc.split(","):
        item = raw.strip()
        if not item:
            continue
        if item.startswith("["):  # [::1]:26379
            host, _, port_s = item[1:].partition("]:")
        else:
            host, _, port_s = item.rpartition(":")
            if not host:
                host, port_s = item, str(default_port)
        try:
            port = int(port_s)
        except ValueError:
            raise _bad(url, f"{what} address {item!r} has no valid port") from None
        if not host or not 0 < port < 65536:
            raise _bad(url, f"{what} address {item!r} is not host:port")
        hosts.append((host, port))
    if not hosts:
        raise _bad(url, f"no {what} address")
    return username, password, hosts


def parse_cluster_url(url: str) -> ClusterTarget:
    """Split ``redis+cluster://[user:pass@]h:p[,h:p...][?opts]``. A cluster has only database 0,
    so a path other than ``/`` or ``/0`` is refused."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in CLUSTER_SCHEMES:
        raise _bad(url, "not a cluster URL")
    username, password, hosts = _hosts(url, parts.netloc, "cluster node", 6379)
    if parts.path.strip("/") not in ("", "0"):
        raise _bad(url, f"Redis Cluster has only database 0, got path {parts.path!r}")
    opts = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    return ClusterTarget(tuple(hosts), scheme == "rediss+cluster", username, password, opts)
