"""Shared fixtures: real redis-server and etcd processes (tests/support/servers.py: the shared
``scheduler.shell.servers`` classes with fault injection)."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.shell.servers import HOST, etcd_delete_all, etcd_revoke_all_leases
from scheduler.shell.servers.ports import PORT_RANGE_ENV, PORTS_FLOOR, port_range
from scheduler.shell.servers.postgres import PostgresServer
from tests.support.helpers import BACKENDS
from tests.support.servers import ClusterServer, ClusterSet, EtcdCluster, EtcdServer, RedisServer, SentinelSet
from tests.support.tls import make_certs


def pytest_configure(config: pytest.Config) -> None:
    """What the processes the tests start inherit from this one."""
    _sigint_as_from_a_terminal()
    _bytecode_cache_for_children()
    _ports_of_this_test_worker()


def _sigint_as_from_a_terminal() -> None:
    """A shell without job control starts a background command (``pytest ... &``, ``nohup``) with
    SIGINT ignored, and every process a test starts inherits that: Python then installs no
    KeyboardInterrupt handler, and a one-shot ``zsched`` command ignores the Ctrl-C a test sends it
    (test_cli_signals failed so, in every run started that way). The tests start their processes
    as a terminal would: SIGINT handled."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _bytecode_cache_for_children() -> None:
    """Bytecode for the processes the tests start. With PYTHONDONTWRITEBYTECODE set (the Dockerfile
    sets it, and so do some shells) every ``python -m scheduler`` child compiles the package's
    modules from source again, about 0.2 s of CPU each, and a run starts hundreds of them, many at
    once on two cores. They keep their bytecode in this user's cache directory instead, outside
    the tree (PYTHONPYCACHEPREFIX); Python checks it against each source's mtime and size, as it
    does __pycache__, so an edited module is compiled again."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zsched-pycache"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable home (a sandbox): compile as before
        return
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)
    # this process too, for the test modules it imports from now on
    sys.pycache_prefix = str(cache)
    sys.dont_write_bytecode = False


def _ports_of_this_test_worker() -> None:
    """Under pytest-xdist (``-n N``, scripts/test's default) each test worker, and every process it
    starts, takes its ports from its own slice of the range: a server a fault test kills and
    restarts on its port must find that port free, not taken by another worker's new server."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and count.isdigit()) or os.environ.get(PORT_RANGE_ENV):
        return
    lo, hi = port_range() or (PORTS_FLOOR, 32767)
    size = (hi - lo + 1) // int(count)
    first = lo + int(worker[2:]) * size
    os.environ[PORT_RANGE_ENV] = f"{first}-{first + size - 1}"


def _revive(server: RedisServer | EtcdServer) -> None:
    """Undo a stray pause/kill of a session server so one bad test can't break the rest."""
    if server.paused:
        server.resume()
    if not server.running:
        server.restart()


# --------------------------------------------------------------------------- redis


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the whole run. Never kill or pause it: use ``fresh_redis``."""
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """URL of the session redis, emptied (FLUSHALL + SCRIPT FLUSH) before the test."""
    _revive(redis_server)
    redis_server.command("FLUSHALL")
    redis_server.command("SCRIPT", "FLUSH")  # so EVALSHA/NOSCRIPT paths start cold
    return redis_server.url


@pytest.fixture
def fresh_redis() -> Iterator[RedisServer]:
    """A dedicated, started redis-server the test may kill/pause/restart; stopped afterwards."""
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def aof_redis() -> Iterator[RedisServer]:
    """Like ``fresh_redis`` but with AOF (appendonly yes, appendfsync everysec): data survives kill -9 + restart."""
    with RedisServer(aof=True) as srv:
        yield srv


@pytest.fixture
def sentinel_set() -> Iterator[SentinelSet]:
    """A started Sentinel setup (1 master, 1 replica, 3 sentinels, every one knowing the others), for
    failover tests; ``.url`` is ``redis+sentinel://...``.  Stopped afterwards (about 2 s to start)."""
    with SentinelSet() as s:
        yield s


@pytest.fixture
def sentinel_set_launched() -> Iterator[SentinelSet]:
    """``sentinel_set`` handed over before its sentinels have found each other and the replica
    (``SentinelSet.launch()``): the test starts its own processes during those ~2 s (Sentinel's
    hello period) and calls ``wait_settled()`` before any failover. Stopped afterwards."""
    s = SentinelSet().launch()
    try:
        yield s
    finally:
        s.stop()


# --------------------------------------------------------------------------- redis cluster


def _revive_cluster(cluster: ClusterSet) -> None:
    """Undo a stray pause/kill of a session cluster node and wait until the cluster is ok again."""
    for node in cluster.nodes:
        if isinstance(node, ClusterServer) and node.paused:
            node.resume()
    for node in cluster.nodes:
        if not node.running:
            cluster.restart_node(node)
    cluster.wait_ok()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterSet]:
    """One Redis Cluster (3 masters, no replicas) for the whole run; ``.url`` is
    ``redis+cluster://...``.  Never kill or pause its nodes, nor leave slots moved: use
    ``redis_cluster_factory`` (or ``redis_cluster_replicas``) for that.  Node timeout 3 s: with no
    replica to promote it only decides how soon a silent node fails the whole cluster, and a longer
    one keeps a loaded machine from seeing CLUSTERDOWN."""
    with ClusterSet(masters=3, node_timeout_ms=3000) as cluster:
        yield cluster


@pytest.fixture
def redis_cluster_url(redis_cluster: ClusterSet) -> str:
    """URL of the session cluster, ok and emptied (FLUSHALL on every master, SCRIPT FLUSH everywhere)."""
    _revive_cluster(redis_cluster)
    for master in redis_cluster.masters():
        master.command("FLUSHALL")
    for node in redis_cluster.running():
        node.command("SCRIPT", "FLUSH")  # so EVALSHA/NOSCRIPT paths start cold
    return redis_cluster.url


@pytest.fixture
def redis_cluster_replicas() -> Iterator[ClusterSet]:
    """A dedicated Redis Cluster of 3 masters with 1 replica each, for failover tests
    (``kill_master()``, ``restart_node()``); stopped afterwards (about 2 s to form)."""
    with ClusterSet(masters=3, replicas=1) as cluster:
        yield cluster


@pytest.fixture
def redis_cluster_factory() -> Iterator[Callable[..., ClusterSet]]:
    """``make(masters=3, replicas=0, **kw)``: a started, dedicated ``ClusterSet`` the test may break;
    every one made is stopped afterwards (processes by pid, temp dirs removed)."""
    made: list[ClusterSet] = []

    def make(masters: int = 3, replicas: int = 0, **kw: Any) -> ClusterSet:
        cluster = ClusterSet(masters, replicas, **kw)
        made.append(cluster)
        return cluster.start()

    yield make
    for cluster in made:
        cluster.stop()


@pytest.fixture
def backend_url(request: pytest.FixtureRequest) -> str:
    """A flushed Redis URL of the backend the test is parametrized with: ``"single"`` (the session
    redis-server, ``redis_url``; also the default when the test is not parametrized) or
    ``"cluster"`` (the session 3-master cluster, ``redis_cluster_url``). Run a test on both with
    ``tests.support.helpers.on_both_backends`` (``parametrize("backend_url", BACKENDS, indirect=True)``);
    build clients with ``scheduler.redisio.connection.sync_redis``/``async_redis``, which follow
    the URL's scheme."""
    kind = getattr(request, "param", "single")
    if kind not in BACKENDS:
        raise ValueError(f"backend_url: unknown backend {kind!r}, expected one of {BACKENDS}")
    return str(request.getfixturevalue("redis_url" if kind == "single" else "redis_cluster_url"))


# --------------------------------------------------------------------------- etcd


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One single-member etcd for the whole run. Never kill or pause it: use ``fresh_etcd``."""
    with EtcdServer() as srv:
        yield srv


@pytest.fixture
def etcd_endpoint(etcd_server: EtcdServer) -> str:
    """``"127.0.0.1:PORT"`` of the session etcd, with every key deleted and lease revoked before the test."""
    _revive(etcd_server)
    etcd_revoke_all_leases(etcd_server.endpoint)
    etcd_delete_all(etcd_server.endpoint)
    return etcd_server.endpoint


@pytest.fixture
def fresh_etcd() -> Iterator[EtcdServer]:
    """A dedicated, started single-member etcd for fault tests; stopped afterwards."""
    with EtcdServer() as srv:
        yield srv


@pytest.fixture
def etcd_cluster() -> Iterator[EtcdCluster]:
    """A started, healthy 3-member etcd cluster for fault tests; stopped afterwards."""
    with EtcdCluster(3) as cluster:
        yield cluster


# --------------------------------------------------------------------------- postgresql


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole run (users' own databases: the fenced effects). fsync is
    off: a test kills processes, never the machine, and the OS keeps what PostgreSQL wrote."""
    with PostgresServer(extra_settings={"fsync": "off", "full_page_writes": "off"}) as srv:
        yield srv


@pytest.fixture
def pg_dsn(pg_server: PostgresServer) -> Iterator[str]:
    """Conninfo of a database of the test's own on the session server, dropped afterwards."""
    import psycopg
    name = f"t{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_server.conninfo, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield f"host={HOST} port={pg_server.port} user=postgres dbname={name}"
    if pg_server.running:
        with psycopg.connect(pg_server.conninfo, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# --------------------------------------------------------------------------- TLS


@pytest.fixture(scope="session")
def tls_certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for 127.0.0.1, its key), made once for the run: two RSA
    keys cost about a second, and no test changes them."""
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def browser() -> Iterator[Any]:
    """The system Chromium under Playwright (the browser tests; imported here only when used)."""
    from playwright.sync_api import sync_playwright

    from tests.support.browser import CHROMIUM

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield b
        finally:
            b.close()
