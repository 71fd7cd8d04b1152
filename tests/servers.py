"""Real redis-server / etcd processes on loopback for tests and benchmarks.

Importable as ``tests.servers`` from pytest and from ``bench/``: it depends on
the standard library only (no pytest, no redis-py) so it works anywhere.

Every server runs in its own temp dir (data + log), listens on 127.0.0.1 only,
and is signalled only through the pid of the Popen that started it.  An atexit
hook kills whatever this module started and is still alive.
"""

from __future__ import annotations

import atexit
import base64
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Self

HOST = "127.0.0.1"
STOP_GRACE_S = 5.0
LOG_TAIL_LINES = 40

__all__ = [
    "HOST",
    "EtcdCluster",
    "EtcdServer",
    "RedisServer",
    "ServerError",
    "etcd_delete_all",
    "etcd_get",
    "etcd_healthy",
    "etcd_put",
    "etcd_request",
    "etcd_revoke_all_leases",
    "free_port",
    "free_ports",
    "redis_command",
    "sweep_stale_dirs",
]


class ServerError(RuntimeError):
    """A test server failed to start or answer."""


# --------------------------------------------------------------------------- ports

_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """Return a loopback TCP port that is free now and not handed out before.

    Ports are drawn below the kernel's ephemeral range when possible: a server
    that is killed and restarted on the same port could otherwise find it taken
    by some client's outgoing connection.  Falls back to binding port 0.
    """
    with _ports_lock:
        low = _ephemeral_low()
        if low > 20000:
            for _ in range(200):
                port = random.randint(15000, low - 1)
                if port not in _handed_out and _bindable(port):
                    _handed_out.add(port)
                    return port
        for _ in range(50):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((HOST, 0))
                port = int(s.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise ServerError("no free loopback port found")


def free_ports(n: int) -> list[int]:
    """Return ``n`` distinct free ports (etcd needs a client and a peer port)."""
    return [free_port() for _ in range(n)]


# --------------------------------------------------------------------------- protocol helpers


def _read_resp(f: Any) -> Any:
    """Parse one RESP2 reply from a binary file object (minimal, for tests)."""
    line = f.readline()
    if not line:
        raise ConnectionError("connection closed")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body.decode()
    if kind == b"-":
        raise ServerError(body.decode())
    if kind == b":":
        return int(body)
    if kind == b"$":
        n = int(body)
        if n < 0:
            return None
        data = f.read(n + 2)
        return data[:-2]
    if kind == b"*":
        n = int(body)
        return None if n < 0 else [_read_resp(f) for _ in range(n)]
    raise ServerError(f"unexpected RESP line {line!r}")


def redis_command(port: int, *args: str | bytes | int, host: str = HOST, timeout: float = 2.0) -> Any:
    """Send one command over a fresh connection and return the parsed reply."""
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    payload = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(payload)
        with s.makefile("rb") as f:
            return _read_resp(f)


def etcd_request(endpoint: str, path: str, body: dict[str, Any] | None = None, timeout: float = 2.0) -> dict[str, Any]:
    """POST JSON to etcd's v3 HTTP gateway (``path`` like ``/v3/kv/put``)."""
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(
        f"http://{endpoint}{path}", data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out: dict[str, Any] = json.loads(resp.read() or b"{}")
            return out
    except urllib.error.HTTPError as e:
        # The gateway reports gRPC errors as non-2xx with a JSON body; surface its message.
        detail = e.read().decode(errors="replace")
        raise ServerError(f"etcd {path} on {endpoint}: HTTP {e.code}: {detail}") from None
    except http.client.HTTPException as e:  # e.g. a half-started server; not an OSError
        raise ConnectionError(f"etcd {path} on {endpoint}: {e!r}") from None


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def etcd_put(endpoint: str, key: str | bytes, value: str | bytes, timeout: float = 2.0) -> dict[str, Any]:
    """Put one key through the HTTP gateway."""
    return etcd_request(endpoint, "/v3/kv/put", {"key": _b64(key), "value": _b64(value)}, timeout)


def etcd_get(endpoint: str, key: str | bytes, timeout: float = 2.0) -> bytes | None:
    """Get one key's value through the HTTP gateway (None if absent)."""
    kvs = etcd_request(endpoint, "/v3/kv/range", {"key": _b64(key)}, timeout).get("kvs") or []
    return base64.b64decode(kvs[0].get("value", "")) if kvs else None


def etcd_delete_all(endpoint: str, timeout: float = 2.0) -> int:
    """Delete every key (key="\\0", range_end="\\0" means the whole keyspace)."""
    res = etcd_request(endpoint, "/v3/kv/deleterange", {"key": _b64(b"\0"), "range_end": _b64(b"\0")}, timeout)
    return int(res.get("deleted", 0))


def etcd_revoke_all_leases(endpoint: str, timeout: float = 2.0) -> int:
    """Revoke every lease, so a test never sees leases left by an earlier one."""
    leases = etcd_request(endpoint, "/v3/lease/leases", {}, timeout).get("leases") or []
    n = 0
    for lease in leases:
        try:
            etcd_request(endpoint, "/v3/lease/revoke", {"ID": lease["ID"]}, timeout)
            n += 1
        except ServerError:
            pass  # expired between list and revoke
    return n


def _http_get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def etcd_healthy(endpoint: str, timeout: float = 1.0) -> bool:
    """True if ``GET /health`` answers 200 with health "true" (HEAD gets 405)."""
    try:
        status, body = _http_get(f"http://{endpoint}/health", timeout)
        return status == 200 and json.loads(body).get("health") == "true"
    except (OSError, ValueError, http.client.HTTPException):
        return False


# --------------------------------------------------------------------------- process base

# Servers that may be running or still own a temp dir, for the atexit hook.
_live: dict[int, _Server] = {}
_live_lock = threading.Lock()
_SETPRIV = shutil.which("setpriv")


def _default_tmp_root() -> str | None:
    """Temp root: $ZSCHED_TEST_TMPDIR, else /dev/shm (etcd fsyncs are free on tmpfs), else the OS default."""
    env = os.environ.get("ZSCHED_TEST_TMPDIR")
    if env:
        return env
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return None


OWNER_FILE = ".zsched-owner"  # pid of the Python process that created a temp dir


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_dirs() -> None:
    """Remove temp dirs left by runs that were SIGKILLed (their owner pid is gone).

    Matters because they may sit in /dev/shm (RAM) and etcd preallocates a 64 MB WAL.
    """
    root = Path(_default_tmp_root() or tempfile.gettempdir())
    for d in root.glob("zsched-*-*"):
        try:
            owner = int((d / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being created
        if owner != os.getpid() and not _pid_alive(owner):
            shutil.rmtree(d, ignore_errors=True)


class _Server:
    """One child process with a temp dir, a log file and a readiness probe."""

    kind = "server"
    start_timeout = 10.0

    def __init__(self, dir: str | os.PathLike[str] | None = None, keep: bool = False) -> None:
        self._own_dir = dir is None
        if dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix=f"zsched-{self.kind}-", dir=_default_tmp_root()))
            (self.dir / OWNER_FILE).write_text(str(os.getpid()))
        else:
            self.dir = Path(dir)
        self.keep = keep
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self.host = HOST
        self._track()

    # -- to override
    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    @property
    def log_path(self) -> Path:
        return self.dir / f"{self.kind}.log"

    # -- state
    @property
    def pid(self) -> int | None:
        """Pid of the current (or last) process, None if never started."""
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        """True while the process exists (paused counts as running)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        return self._paused and self.running

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- lifecycle
    def spawn(self) -> None:
        """Start the process without waiting for readiness."""
        if self.running:
            raise ServerError(f"{self!r} already running (pid {self.pid})")
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._own_dir:  # the dir may have been removed by stop() and recreated here
            (self.dir / OWNER_FILE).write_text(str(os.getpid()))
        argv = self._argv()
        if shutil.which(argv[0]) is None:
            raise ServerError(f"{argv[0]!r} not found on PATH; run scripts/bootstrap to install it")
        # Die with the parent even on SIGKILL; only from the main thread, since
        # PDEATHSIG fires when the spawning *thread* exits.
        if _SETPRIV and threading.current_thread() is threading.main_thread():
            argv = [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]  # setpriv execs: same pid
        with open(self.log_path, "ab") as log:
            # Own session: a Ctrl-C aimed at pytest must not kill servers mid-teardown.
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.dir,
                start_new_session=True,
            )
        self._paused = False
        self._track()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Poll the readiness probe; on failure raise with the log tail."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while True:
            if not self.running:
                code = self._proc.returncode if self._proc else None
                raise ServerError(f"{self!r} exited with {code} before ready; log tail:\n{self.log_tail()}")
            if self._ready():
                return
            if time.monotonic() > deadline:
                raise ServerError(
                    f"{self!r} not ready after {timeout or self.start_timeout}s; log tail:\n{self.log_tail()}"
                )
            time.sleep(0.02)

    def start(self) -> Self:
        """Spawn and wait until ready (kills the process if it never gets ready)."""
        self.spawn()
        try:
            self.wait_ready()
        except BaseException:
            self.kill()
            raise
        return self

    def _signal(self, sig: int) -> None:
        if self.running and self._proc is not None:
            os.kill(self._proc.pid, sig)

    def _track(self) -> None:
        with _live_lock:
            _live[id(self)] = self

    def _untrack(self) -> None:
        with _live_lock:
            _live.pop(id(self), None)

    def terminate(self) -> None:
        """Send SIGTERM without waiting (``stop()`` does the waiting)."""
        self._signal(signal.SIGTERM)
        self._signal(signal.SIGCONT)  # a SIGSTOPped process would never act on SIGTERM

    def stop(self, keep: bool | None = None, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM, SIGKILL after ``grace`` s (5); then remove our temp dir unless kept."""
        if self.running and self._proc is not None:
            self.terminate()
            try:
                self._proc.wait(grace)
            except subprocess.TimeoutExpired:
                if grace >= STOP_GRACE_S:  # a shorter grace is the caller's choice, not news
                    print(f"tests.servers: {self!r} ignored SIGTERM for {grace}s; SIGKILL", file=sys.stderr)
                self._signal(signal.SIGKILL)
                self._proc.wait()
        self._paused = False
        if not (self.keep if keep is None else keep):
            self.remove_dir()
        self._untrack()

    def kill(self) -> None:
        """SIGKILL and wait; keeps the dir so ``restart()`` finds its data."""
        if self.running and self._proc is not None:
            self._signal(signal.SIGKILL)
            self._proc.wait()
        self._paused = False

    def pause(self) -> None:
        """SIGSTOP: the process keeps its sockets but answers nothing. Returns once every thread
        is stopped (signal delivery is asynchronous: a busy server could still answer otherwise)."""
        self._signal(signal.SIGSTOP)
        self._paused = True
        pid = self.pid
        deadline = time.monotonic() + 2.0
        while pid is not None and time.monotonic() < deadline:
            try:
                states = [Path(f"/proc/{pid}/task/{t}/stat").read_text().rsplit(")", 1)[1].split()[0]
                          for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                break
            if all(st in ("T", "t", "Z", "X") for st in states):
                break
            time.sleep(0.001)

    def resume(self) -> None:
        """SIGCONT after ``pause()``."""
        self._signal(signal.SIGCONT)
        self._paused = False

    def restart(self) -> Self:
        """Start again on the same port(s) and dir; stops gracefully first if still up."""
        if self.running:
            self.stop(keep=True)
        return self.start()

    def remove_dir(self) -> None:
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


sweep_stale_dirs()


@atexit.register
def _kill_leftovers() -> None:
    """Kill servers still running at exit (and drop their temp dirs), so a crashed run leaves nothing behind."""
    with _live_lock:
        servers = list(_live.values())
    for srv in servers:
        try:
            srv.kill()
            if not srv.keep:
                srv.remove_dir()
        except Exception:  # noqa: BLE001, S110 - best effort at exit; one failure must not stop the rest
            pass


# --------------------------------------------------------------------------- redis


class RedisServer(_Server):
    """A throwaway ``redis-server`` on 127.0.0.1 without persistence."""

    kind = "redis"

    def __init__(
        self,
        port: int | None = None,
        dir: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        keep: bool = False,
        binary: str | None = None,
    ) -> None:
        super().__init__(dir, keep)
        self._auto_port = port is None
        self._port = port if port is not None else free_port()
        self.extra_args = list(extra_args)
        self.binary = binary or os.environ.get("ZSCHED_REDIS_SERVER", "redis-server")

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self._port}/0"

    def _argv(self) -> list[str]:
        return [
            self.binary,
            "--port", str(self._port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "no",
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--hz", "100",
            *self.extra_args,
        ]  # fmt: skip

    def _ready(self) -> bool:
        try:
            return bool(redis_command(self._port, "PING", timeout=0.5) == "PONG")
        except (OSError, ServerError):  # refused, or -LOADING while starting
            return False

    def start(self) -> Self:
        # An auto-picked port can be grabbed by someone else before we bind it: retry with a new one.
        for attempt in range(3):
            try:
                super().start()
                return self
            except ServerError:
                if not (self._auto_port and attempt < 2 and "Address already in use" in self.log_tail()):
                    raise
                self._port = free_port()
        return self

    def ping(self, timeout: float = 1.0) -> bool:
        """True if the server answers PING within ``timeout``."""
        try:
            return bool(redis_command(self._port, "PING", timeout=timeout) == "PONG")
        except (OSError, ServerError):
            return False

    def command(self, *args: str | bytes | int, timeout: float = 2.0) -> Any:
        """Run one command (raw RESP, no client library needed)."""
        return redis_command(self._port, *args, timeout=timeout)

    def __repr__(self) -> str:
        return f"RedisServer(port={self._port}, pid={self.pid})"


# --------------------------------------------------------------------------- etcd


class EtcdServer(_Server):
    """One etcd member on loopback; alone by default, or part of an ``EtcdCluster``."""

    kind = "etcd"

    def __init__(
        self,
        client_port: int | None = None,
        peer_port: int | None = None,
        dir: str | os.PathLike[str] | None = None,
        name: str = "n0",
        initial_cluster: str | None = None,
        extra_args: Sequence[str] = (),
        keep: bool = False,
        binary: str | None = None,
    ) -> None:
        super().__init__(dir, keep)
        self.name = name
        self.client_port = client_port if client_port is not None else free_port()
        self.peer_port = peer_port if peer_port is not None else free_port()
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.extra_args = list(extra_args)
        self.binary = binary or os.environ.get("ZSCHED_ETCD", "etcd")
        self.member_id: str | None = None  # raft id (decimal string), filled in by status()

    @property
    def port(self) -> int:
        return self.client_port

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.client_port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        return f"http://{HOST}:{self.peer_port}"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    def _argv(self) -> list[str]:
        return [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--heartbeat-interval", "10",
            "--election-timeout", "100",
            # 3.4 defaults to the deprecated capnslog logger, which ignores
            # --log-level for raft's INFO lines; zap honours it.
            "--logger", "zap",
            "--log-level", "error",
            "--log-outputs", "stderr",
            *self.extra_args,
        ]  # fmt: skip

    def _ready(self) -> bool:
        return etcd_healthy(self.endpoint, timeout=0.5)

    def healthy(self, timeout: float = 1.0) -> bool:
        return etcd_healthy(self.endpoint, timeout)

    def status(self, timeout: float = 1.0) -> dict[str, Any]:
        """``/v3/maintenance/status``: has ``leader`` and ``header.member_id`` (decimal strings)."""
        res = etcd_request(self.endpoint, "/v3/maintenance/status", {}, timeout)
        self.member_id = res.get("header", {}).get("member_id", self.member_id)
        return res

    def __repr__(self) -> str:
        return f"EtcdServer(name={self.name}, client={self.client_port}, peer={self.peer_port}, pid={self.pid})"


class EtcdCluster:
    """A ``size``-member etcd cluster on loopback (3 by default)."""

    start_timeout = 15.0

    def __init__(self, size: int = 3, keep: bool = False, extra_args: Sequence[str] = ()) -> None:
        ports = free_ports(2 * size)
        names = [f"n{i}" for i in range(size)]
        initial = ",".join(f"{n}=http://{HOST}:{ports[2 * i + 1]}" for i, n in enumerate(names))
        self.members: list[EtcdServer] = [
            EtcdServer(
                client_port=ports[2 * i],
                peer_port=ports[2 * i + 1],
                name=n,
                initial_cluster=initial,
                extra_args=extra_args,
                keep=keep,
            )
            for i, n in enumerate(names)
        ]
        self.keep = keep

    @property
    def endpoints(self) -> str:
        """Comma-joined ``127.0.0.1:C1,127.0.0.1:C2,...``."""
        return ",".join(m.endpoint for m in self.members)

    @property
    def endpoint_list(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def start(self) -> Self:
        """Spawn every member first (none is healthy before quorum), then wait for all."""
        try:
            for m in self.members:
                m.spawn()
            deadline = time.monotonic() + self.start_timeout
            for m in self.members:
                m.wait_ready(max(0.1, deadline - time.monotonic()))
            for m in self.members:
                m.status()  # learn member ids while everyone is up
        except BaseException:
            for m in self.members:
                m.kill()
            raise
        return self

    def wait_healthy(self, timeout: float = 10.0, members: Iterable[EtcdServer] | None = None) -> None:
        """Wait until every given (default: every running, unpaused) member reports healthy."""
        todo = list(members) if members is not None else [m for m in self.members if m.running and not m.paused]
        deadline = time.monotonic() + timeout
        while not all(m.healthy(0.5) for m in todo):
            if time.monotonic() > deadline:
                raise ServerError("cluster not healthy; " + "; ".join(f"{m!r}: {m.log_tail(5)}" for m in todo))
            time.sleep(0.05)

    def leader(self, timeout: float = 5.0) -> EtcdServer:
        """The member every reachable member agrees is leader (polls up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        last = "no member answered"
        while True:
            views: dict[str, str] = {}
            for m in self.members:
                if not m.running or m.paused:
                    continue
                try:
                    st = m.status(0.5)
                except (OSError, ServerError) as e:
                    last = f"{m!r}: {e}"
                    continue
                views[m.name] = st.get("leader", "0")
            ids = set(views.values())
            if len(ids) == 1 and "0" not in ids:
                (lid,) = ids
                for m in self.members:
                    if m.member_id == lid:
                        return m
                last = f"leader id {lid} is not a known member"
            elif views:
                last = f"members disagree or have no leader: {views}"
            if time.monotonic() > deadline:
                raise ServerError(f"no single etcd leader after {timeout}s ({last})")
            time.sleep(0.05)

    def stop(self, keep: bool | None = None, grace: float = 1.0) -> None:
        """Stop followers, then the leader once it has stepped down; SIGKILL after ``grace`` s.

        A leader asked to stop first hands leadership to the peer its transport
        has known longest, even a dead or stopping one, and then waits ~5 s for a
        handover that never comes.  A leader that lost quorum steps down within
        one election timeout (CheckQuorum), after which SIGTERM is instant.
        """
        lead: set[str | None] = set()
        for m in self.members:
            if m.running and not m.paused:
                try:
                    lead.add(m.status(0.5).get("leader"))
                except (OSError, ServerError):
                    pass
        followers = [m for m in self.members if m.member_id not in lead]
        leaders = [m for m in self.members if m.member_id in lead]
        for m in followers:
            m.stop(keep, grace=grace)
        deadline = time.monotonic() + grace
        for m in leaders:
            while m.running and time.monotonic() < deadline:
                try:
                    if m.status(0.2).get("leader") != m.member_id:
                        break
                except (OSError, ServerError):
                    break
                time.sleep(0.02)
            m.stop(keep, grace=max(0.1, deadline - time.monotonic()))

    def kill(self) -> None:
        for m in self.members:
            m.kill()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EtcdCluster({self.endpoints})"
