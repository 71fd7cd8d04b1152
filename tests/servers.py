"""Real redis-server / etcd processes on loopback for tests and benchmarks.

Importable as ``tests.servers`` from pytest and from ``bench/``: it depends on
the standard library only (no pytest, no redis-py) so it works anywhere.

Every server runs in its own temp dir (data + log), listens on 127.0.0.1 only,
and is signalled only through the pid of the Popen that started it.  An atexit
hook kills whatever this module started and is still alive.

Redis faults: ``RedisServer.kill()``/``restart()`` (with ``aof=True`` the data survives a
kill -9), ``pause()``/``resume()`` (SIGSTOP), ``stall(ms)`` (a busy Lua script: every other
client waits), ``save_point()`` + ``crash_to_save_point()`` (a real rollback of acknowledged
writes).  ``SentinelSet`` is a master, a replica and three sentinels for failover tests.
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
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
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
    "RedisStall",
    "SentinelServer",
    "SentinelSet",
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
    "redis_info",
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


def _encode(*args: str | bytes | int) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


def redis_command(port: int, *args: str | bytes | int, host: str = HOST, timeout: float = 2.0) -> Any:
    """Send one command over a fresh connection and return the parsed reply."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(_encode(*args))
        with s.makefile("rb") as f:
            return _read_resp(f)


def redis_info(port: int, section: str | None = None, host: str = HOST, timeout: float = 2.0) -> dict[str, str]:
    """``INFO [section]`` as a dict (``{"role": "master", "connected_slaves": "1", ...}``)."""
    raw = redis_command(port, "INFO", *([section] if section else []), host=host, timeout=timeout)
    out: dict[str, str] = {}
    for line in (raw or b"").decode(errors="replace").splitlines():
        if line and not line.startswith("#") and ":" in line:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    return out


def _pairs(reply: Any) -> dict[str, str]:
    """A flat ``[k1, v1, k2, v2, ...]`` reply (``SENTINEL master``) as a dict of strings."""
    items = [x.decode(errors="replace") if isinstance(x, bytes) else str(x) for x in (reply or [])]
    return dict(zip(items[::2], items[1::2], strict=False))


def _wait_for(pred: Callable[[], bool], timeout: float, what: Callable[[], str] | str, poll: float = 0.02) -> None:
    """Poll ``pred`` until true; after ``timeout`` s raise ServerError naming ``what`` (str or thunk)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise ServerError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
        time.sleep(poll)


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

    def _start_on_free_port(self, on_new_port: Callable[[], None] | None = None) -> Self:
        """``start()`` for servers with one auto-picked ``_port``: the port can be grabbed by someone
        else before we bind it, so retry with a new one, but only before the first successful
        start (a restart must keep its port)."""
        auto = getattr(self, "_auto_port", False)
        for attempt in range(3):
            try:
                _Server.start(self)
                self._started_once = True
                return self
            except ServerError:
                if not (auto and not getattr(self, "_started_once", False) and attempt < 2
                        and "Address already in use" in self.log_tail()):
                    raise
                self._port = free_port()
                if on_new_port is not None:
                    on_new_port()
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
    """A throwaway ``redis-server`` on 127.0.0.1, without persistence unless ``aof=True``.

    ``aof=True`` runs with ``appendonly yes`` and ``appendfsync`` (``everysec`` by default), so a
    kill -9 + ``restart()`` (same port, same dir) reloads the data.  Without AOF a restart starts
    empty, unless a ``save_point()`` left a ``dump.rdb`` in the dir: then it loads that.

    ``conf_lines`` (None: no config file) writes ``<dir>/redis.conf`` before the first start and
    runs with it, so ``CONFIG REWRITE`` works (Sentinel rewrites a server's ``replicaof`` there)
    and a restart keeps what was rewritten; command-line options still win over the file.
    """

    kind = "redis"

    def __init__(
        self,
        port: int | None = None,
        dir: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        keep: bool = False,
        binary: str | None = None,
        *,
        aof: bool = False,
        appendfsync: str = "everysec",
        conf_lines: Sequence[str] | None = None,
    ) -> None:
        super().__init__(dir, keep)
        self._auto_port = port is None
        self._port = port if port is not None else free_port()
        self._started_once = False  # after the first start the port is fixed, even if auto-picked
        self.extra_args = list(extra_args)
        self.binary = binary or os.environ.get("ZSCHED_REDIS_SERVER", "redis-server")
        self.aof = aof
        self.appendfsync = appendfsync
        self.conf_lines: list[str] | None = None if conf_lines is None else list(conf_lines)
        self._once_args: list[str] = []  # appended to the next spawn's argv only

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self._port}/0"

    @property
    def conf_path(self) -> Path:
        return self.dir / "redis.conf"

    @property
    def rdb_path(self) -> Path:
        """Where ``save_point()`` writes (``dbfilename`` is left at its default)."""
        return self.dir / "dump.rdb"

    def _argv(self) -> list[str]:
        return [
            self.binary,
            *([str(self.conf_path)] if self.conf_lines is not None else []),
            "--port", str(self._port),
            "--bind", HOST,
            "--save", "",
            "--appendonly", "yes" if self.aof else "no",
            *(["--appendfsync", self.appendfsync] if self.aof else []),
            "--dir", str(self.dir),
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--hz", "100",
            *self.extra_args,
            *self._once_args,
        ]  # fmt: skip

    def _ready(self) -> bool:
        try:
            return bool(redis_command(self._port, "PING", timeout=0.5) == "PONG")
        except (OSError, ServerError):  # refused, or -LOADING while starting
            return False

    def spawn(self) -> None:
        if self.conf_lines is not None and not self.conf_path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            self.conf_path.write_text("".join(f"{line}\n" for line in self.conf_lines))
        try:
            super().spawn()
        finally:
            self._once_args = []

    def start(self) -> Self:
        return self._start_on_free_port()

    def ping(self, timeout: float = 1.0) -> bool:
        """True if the server answers PING within ``timeout``."""
        try:
            return bool(redis_command(self._port, "PING", timeout=timeout) == "PONG")
        except (OSError, ServerError):
            return False

    def command(self, *args: str | bytes | int, timeout: float = 2.0) -> Any:
        """Run one command (raw RESP, no client library needed)."""
        return redis_command(self._port, *args, timeout=timeout)

    def info(self, section: str | None = None, timeout: float = 2.0) -> dict[str, str]:
        """``INFO [section]`` as a dict of strings."""
        return redis_info(self._port, section, timeout=timeout)

    # -- faults

    def stall(self, ms: float, busy_after_ms: int | None = None) -> RedisStall:
        """Make the server busy for ``ms`` ms: every other client waits (nothing is lost).

        Runs a Lua script that spins on ``redis.call('TIME')`` from its own connection and returns
        once the server has read it (it runs the script in the same step), so a command sent after
        this returns is answered only after the stall.  Returns a ``RedisStall``: ``.join()`` it,
        or use it as a context manager.

        Redis answers ``-BUSY`` to other clients once a script has run for
        ``busy-reply-threshold`` ms (alias ``lua-time-limit``, 5000 by default); for longer stalls
        it is raised for the stall's duration so clients keep waiting.  ``busy_after_ms`` sets it
        instead (e.g. 100: clients get ``BUSY`` errors after 100 ms), restored when the stall ends.
        """
        return RedisStall(self, ms, busy_after_ms)._begin()

    def save_point(self, timeout: float = 30.0) -> None:
        """``SAVE``: write ``dump.rdb`` now; ``crash_to_save_point()`` comes back to this state."""
        reply = self.command("SAVE", timeout=timeout)
        if reply != "OK":
            raise ServerError(f"SAVE on {self!r} answered {reply!r}")

    def crash_to_save_point(self, timeout: float = 10.0) -> Self:
        """Lose every write since the last ``save_point()``: a real rollback of acknowledged writes.

        ``SHUTDOWN NOSAVE NOW``, then start again on the same port and dir, loading the older
        ``dump.rdb`` (an empty dataset if there was no save point).  With ``aof=True`` the AOF is
        deleted, the server starts once from the RDB with ``appendonly no`` and AOF is switched
        back on (``CONFIG SET appendonly yes`` rewrites it from the rolled-back data); a later
        ``restart()`` runs with the usual options again.
        """
        if not self.running or self._proc is None:
            raise ServerError(f"{self!r} is not running")
        if self.paused:
            self.resume()
        aof_dir = self.dir / "appendonlydir"
        if self.aof:
            name = self.command("CONFIG", "GET", "appenddirname")
            if isinstance(name, list) and len(name) == 2:
                aof_dir = self.dir / name[1].decode()
        try:
            self.command("SHUTDOWN", "NOSAVE", "NOW", timeout=timeout)
        except (OSError, ServerError):  # the server closes the connection without a reply
            pass
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise ServerError(f"{self!r} did not exit after SHUTDOWN NOSAVE; log tail:\n{self.log_tail()}") from None
        self._paused = False
        if self.aof:
            shutil.rmtree(aof_dir, ignore_errors=True)
            self._once_args = ["--appendonly", "no"]
        self.start()
        if self.aof:
            self.command("CONFIG", "SET", "appendonly", "yes")

            def aof_on() -> bool:
                p = self.info("persistence")
                if p.get("aof_last_bgrewrite_status") == "err":
                    return True  # reported just below
                return (
                    p.get("aof_enabled") == "1"
                    and p.get("aof_rewrite_in_progress") == "0"
                    and p.get("aof_rewrite_scheduled") == "0"
                    and any(aof_dir.glob("*.manifest"))
                )

            _wait_for(aof_on, timeout, f"AOF rewrite after the rollback of {self!r}")
            if self.info("persistence").get("aof_last_bgrewrite_status") != "ok":
                raise ServerError(f"AOF rewrite failed on {self!r}; log tail:\n{self.log_tail()}")
        return self

    def __repr__(self) -> str:
        return f"RedisServer(port={self._port}, pid={self.pid})"


# Spins until ARGV[1] microseconds have passed on the server's clock; returns the microseconds.
_STALL_LUA = (
    "local t0 = redis.call('TIME') "
    "while true do "
    "local t = redis.call('TIME') "
    "local us = (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) "
    "if us >= tonumber(ARGV[1]) then return us end "
    "end"
)


def _tcp_unread_diag(local_port: int, remote_port: int) -> int | None:
    """``_tcp_unread`` through netlink sock_diag: one exact-socket lookup, however many sockets exist."""
    netlink_sock_diag, sock_diag_by_family, nlm_f_request, nlmsg_error, tcp_established = 4, 20, 1, 2, 1
    addr = socket.inet_aton(HOST) + bytes(12)
    req = (
        struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 1 << tcp_established)
        + struct.pack("!HH", local_port, remote_port)
        + addr
        + addr
        + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)  # any interface, INET_DIAG_NOCOOKIE
    )
    msg = struct.pack("=IHHII", 16 + len(req), sock_diag_by_family, nlm_f_request, 1, 0) + req
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, netlink_sock_diag) as s:
        s.settimeout(1.0)
        s.sendall(msg)
        data = s.recv(65536)
    if len(data) < 16 + 4 + 48 + 12 or struct.unpack_from("=H", data, 4)[0] == nlmsg_error:
        return None  # ENOENT: no such socket
    # inet_diag_msg: family, state, timer, retrans; sockid (sport, dport, src, dst, if, cookie); expires, rqueue
    state = data[17]
    sport, dport = struct.unpack_from("!HH", data, 20)
    if state != tcp_established or (sport, dport) != (local_port, remote_port):
        return None  # the kernel fell back to the listening socket
    return int(struct.unpack_from("=I", data, 16 + 4 + 48 + 4)[0])


def _tcp_unread(local_port: int, remote_port: int) -> int | None:
    """Bytes not yet read by the owner of the IPv4 loopback socket ``local_port`` <- ``remote_port``;
    None if there is no such socket.  Uses sock_diag, else /proc/net/tcp (``rx_queue``), which can
    take tens of ms to read on a machine with thousands of sockets (TIME_WAIT left by tests)."""
    try:
        return _tcp_unread_diag(local_port, remote_port)
    except (OSError, AttributeError, struct.error):  # no AF_NETLINK / sock_diag here
        pass
    try:
        lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return None
    for line in lines:
        f = line.split()
        if len(f) < 5:
            continue
        try:
            if int(f[1].rsplit(":", 1)[1], 16) == local_port and int(f[2].rsplit(":", 1)[1], 16) == remote_port:
                return int(f[4].split(":")[1], 16)
        except (ValueError, IndexError):
            continue
    return None


class RedisStall:
    """A running ``RedisServer.stall()``: a busy Lua script holding the server's command loop.

    ``join()`` waits for the end and returns how long the script ran (server clock, ms), re-raising
    what went wrong in between (e.g. a ConnectionError if the server was killed meanwhile).  As a
    context manager, leaving the block joins.

    ``sent_at`` (``time.monotonic()`` just before the script was sent) is a lower bound of its start,
    so a client blocked by the stall gets its reply after ``sent_at + ms / 1000``: a bound that holds
    however loaded the machine is.  ``started_at`` is when this process saw that the server had read
    the script; on a machine with more busy processes than cores that can lag the real start by tens
    of ms, so timing checks should use stalls of several hundred ms.
    """

    def __init__(self, server: RedisServer, ms: float, busy_after_ms: int | None = None) -> None:
        if ms <= 0:
            raise ValueError("stall needs ms > 0")
        self.server = server
        self.port = server.port
        self.ms = float(ms)
        self.busy_after_ms = busy_after_ms
        self.sent_at = 0.0
        self.started_at = 0.0
        self.elapsed_ms: float | None = None
        self._error: BaseException | None = None
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def _call(self, f: Any, *args: str | bytes | int) -> Any:
        assert self._sock is not None
        self._sock.sendall(_encode(*args))
        return _read_resp(f)

    def _begin(self) -> Self:
        sock = socket.create_connection((HOST, self.port), timeout=5.0)
        self._sock = sock
        f = sock.makefile("rb")
        try:
            # A reply proves the server accepted and registered this connection.
            self._call(f, "CLIENT", "SETNAME", "zsched-test-stall")
            old = int(self._call(f, "CONFIG", "GET", "lua-time-limit")[1])
            want = self.busy_after_ms
            if want is None and self.ms + 1000 >= old:
                want = int(self.ms) + 5000
            restore = old if want is not None and want != old else None
            if restore is not None:
                self._call(f, "CONFIG", "SET", "lua-time-limit", want)
            sock.settimeout(self.ms / 1000 + 10.0)
        except BaseException as e:
            f.close()
            sock.close()
            if isinstance(e, TimeoutError):
                raise ServerError(f"{self.server!r} did not answer within 5 s (paused?)") from e
            raise
        # The reader thread is running before the script is sent: Thread.start() waits for the new
        # thread to be scheduled, which on a loaded machine would eat into the stall.
        self._thread = threading.Thread(target=self._finish, args=(f, restore), name="redis-stall", daemon=True)
        self._thread.start()
        self.sent_at = time.monotonic()
        sock.sendall(_encode("EVAL", _STALL_LUA, 0, int(self.ms * 1000)))
        client_port = int(sock.getsockname()[1])
        # Redis reads a query and runs it in the same step (no I/O threads): once the server's
        # socket has no unread bytes left, the script is running.
        deadline = time.monotonic() + 5.0
        while (unread := _tcp_unread(self.port, client_port)) is not None and unread > 0 and not self.done:
            if time.monotonic() > deadline:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the reader thread, which closes the socket
                raise ServerError(f"{self.server!r} did not read the stall script within 5 s (paused?)")
            time.sleep(0.0005)
        self.started_at = time.monotonic()
        return self

    def _finish(self, f: Any, restore: int | None) -> None:
        assert self._sock is not None
        try:
            self.elapsed_ms = int(_read_resp(f)) / 1000.0
            if restore is not None:
                self._call(f, "CONFIG", "SET", "lua-time-limit", restore)
        except BaseException as e:  # noqa: BLE001 - handed to join()
            self._error = e
        finally:
            f.close()
            self._sock.close()

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> float:
        """Wait for the stall to end (default: up to ``ms`` + 10 s); return its duration in ms."""
        assert self._thread is not None, "stall not started"
        self._thread.join(self.ms / 1000 + 10.0 if timeout is None else timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"stall of {self.ms} ms on port {self.port} still running")
        if self._error is not None:
            raise self._error
        assert self.elapsed_ms is not None
        return self.elapsed_ms

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.join()
        else:  # don't hide the test's own failure behind a join error
            try:
                self.join()
            except BaseException:  # noqa: BLE001, S110
                pass

    def __repr__(self) -> str:
        return f"RedisStall(port={self.port}, ms={self.ms}, done={self.done})"


# --------------------------------------------------------------------------- redis sentinel


class SentinelServer(_Server):
    """One ``redis-server CONF --sentinel`` on loopback, monitoring one master.

    A sentinel rewrites its config file, so each has its own dir with ``sentinel.conf``, written
    before the first start (from ``master_port`` etc. as they are then) and left as the sentinel
    rewrote it for restarts.
    """

    kind = "sentinel"

    def __init__(
        self,
        master_name: str = "mymaster",
        master_port: int = 0,
        port: int | None = None,
        dir: str | os.PathLike[str] | None = None,
        *,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        keep: bool = False,
        binary: str | None = None,
    ) -> None:
        super().__init__(dir, keep)
        self._auto_port = port is None
        self._port = port if port is not None else free_port()
        self._started_once = False
        self.master_name = master_name
        self.master_port = master_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.binary = binary or os.environ.get("ZSCHED_REDIS_SERVER", "redis-server")

    @property
    def port(self) -> int:
        return self._port

    @property
    def addr(self) -> tuple[str, int]:
        return (HOST, self._port)

    @property
    def conf_path(self) -> Path:
        return self.dir / "sentinel.conf"

    def _conf_text(self) -> str:
        n = self.master_name
        return "".join(
            f"{line}\n"
            for line in (
                f"port {self._port}",
                f"bind {HOST}",
                f"dir {self.dir}",
                "daemonize no",
                'logfile ""',
                f"sentinel monitor {n} {HOST} {self.master_port} {self.quorum}",
                f"sentinel down-after-milliseconds {n} {self.down_after_ms}",
                f"sentinel failover-timeout {n} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {n} 1",
            )
        )

    def _argv(self) -> list[str]:
        return [self.binary, str(self.conf_path), "--sentinel"]

    def _ready(self) -> bool:
        try:
            return bool(redis_command(self._port, "PING", timeout=0.5) == "PONG")
        except (OSError, ServerError):
            return False

    def spawn(self) -> None:
        if not self.master_port:
            raise ServerError(f"{self!r}: set master_port before starting")
        self.dir.mkdir(parents=True, exist_ok=True)
        if not self.conf_path.exists():
            self.conf_path.write_text(self._conf_text())
        super().spawn()

    def start(self) -> Self:
        return self._start_on_free_port(lambda: self.conf_path.unlink(missing_ok=True))  # new port, new config

    def command(self, *args: str | bytes | int, timeout: float = 2.0) -> Any:
        return redis_command(self._port, *args, timeout=timeout)

    def master_info(self, timeout: float = 1.0) -> dict[str, str]:
        """``SENTINEL master NAME`` as a dict (``num-slaves``, ``num-other-sentinels``, ``flags``...)."""
        return _pairs(self.command("SENTINEL", "master", self.master_name, timeout=timeout))

    def replicas_info(self, timeout: float = 1.0) -> list[dict[str, str]]:
        """``SENTINEL replicas NAME``, one dict per replica."""
        return [_pairs(r) for r in self.command("SENTINEL", "replicas", self.master_name, timeout=timeout) or []]

    def master_addr(self, timeout: float = 1.0) -> tuple[str, int] | None:
        """``SENTINEL get-master-addr-by-name NAME``: the master this sentinel names now."""
        reply = self.command("SENTINEL", "get-master-addr-by-name", self.master_name, timeout=timeout)
        if not reply:
            return None
        return reply[0].decode(), int(reply[1])

    def __repr__(self) -> str:
        return f"SentinelServer(port={self._port}, master={self.master_name}, pid={self.pid})"


class SentinelSet:
    """Redis under Sentinel on loopback: 1 master, 1 replica (``replicaof``) and 3 sentinels.

    Sentinels use quorum 2, ``down-after-milliseconds`` 1000 and ``failover-timeout`` 5000, so
    after a kill -9 of the master the replica is promoted in about 2.5 s.  The two Redis servers
    run with a config file each, so Sentinel's ``CONFIG REWRITE`` keeps their roles across a
    restart, as in production.  ``master``/``replica`` are the servers in those roles as this
    object last saw them (``start()``, ``wait_failover()``).

        with SentinelSet() as s:
            old = s.kill_master().port
            new = s.wait_failover(old)
    """

    start_timeout = 20.0

    def __init__(
        self,
        master_name: str = "mymaster",
        aof: bool = False,
        *,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        redis_args: Sequence[str] = (),
        keep: bool = False,
    ) -> None:
        self.master_name = master_name
        self.keep = keep
        # A master waits repl-diskless-sync-delay (5 s) for more replicas before a full sync.
        args = ["--repl-diskless-sync-delay", "0", *redis_args]
        self.servers: list[RedisServer] = [
            RedisServer(extra_args=args, keep=keep, aof=aof, conf_lines=[]) for _ in range(2)
        ]
        self.sentinels: list[SentinelServer] = [
            SentinelServer(
                master_name,
                quorum=quorum,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
                keep=keep,
            )
            for _ in range(sentinels)
        ]
        self._master_i = 0

    # -- addresses and roles

    @property
    def master(self) -> RedisServer:
        """The server in the master role (as of ``start()`` or the last ``wait_failover()``)."""
        return self.servers[self._master_i]

    @property
    def replica(self) -> RedisServer:
        """The server in the replica role (after a failover: the old master, maybe not running)."""
        return self.servers[1 - self._master_i]

    @property
    def sentinel_addrs(self) -> list[tuple[str, int]]:
        return [s.addr for s in self.sentinels]

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/NAME/0``."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel_addrs)
        return f"redis+sentinel://{hosts}/{self.master_name}/0"

    def sentinel_command(self, *args: str | bytes | int, timeout: float = 1.0) -> Any:
        """Run a command on the first running sentinel that answers."""
        errors = []
        for s in self.sentinels:
            if not s.running or s.paused:
                continue
            try:
                return s.command(*args, timeout=timeout)
            except (OSError, ServerError) as e:
                errors.append(f"{s!r}: {e}")
        raise ServerError(f"no sentinel answered {args!r}: {errors or 'none running'}")

    def master_ports(self, timeout: float = 0.5) -> dict[int, int | None]:
        """Each running sentinel's view: sentinel port -> the master port it names (None: no answer)."""
        views: dict[int, int | None] = {}
        for s in self.sentinels:
            if not s.running or s.paused:
                continue
            try:
                addr = s.master_addr(timeout)
                views[s.port] = addr[1] if addr else None
            except (OSError, ServerError):
                views[s.port] = None
        return views

    def master_port(self, timeout: float = 5.0) -> int:
        """The master port the first sentinel that answers names (``SENTINEL get-master-addr-by-name``),
        skipping a sentinel that names a master it sees down (``s_down``/``o_down``), as redis-py's
        ``Sentinel`` does: after a failover a lagging sentinel names the old, dead master for up to ~2 s."""
        found: list[int] = []

        def ask() -> bool:
            for s in self.sentinels:
                if not s.running or s.paused:
                    continue
                try:
                    addr = s.master_addr(0.5)
                    mi = s.master_info(0.5)
                except (OSError, ServerError):
                    continue
                flags = mi.get("flags", "").split(",")
                if addr is None or (mi.get("port") == str(addr[1]) and ("s_down" in flags or "o_down" in flags)):
                    continue
                found[:] = [addr[1]]
                return True
            return False

        _wait_for(ask, timeout, lambda: f"a sentinel to name a master that is up: {self._sentinel_views()}")
        return found[0]

    # -- lifecycle

    def _replica_online(self, m: RedisServer, r: RedisServer) -> bool:
        try:
            mi, ri = m.info("replication", timeout=0.5), r.info("replication", timeout=0.5)
        except (OSError, ServerError):
            return False
        return (
            mi.get("connected_slaves") == "1"
            and "state=online" in mi.get("slave0", "")
            and ri.get("master_link_status") == "up"
            and ri.get("master_port") == str(m.port)
        )

    def _sentinel_views(self) -> dict[int, str]:
        out: dict[int, str] = {}
        for s in self.sentinels:
            try:
                mi = s.master_info(0.5)
                reps = s.replicas_info(0.5)
                out[s.port] = (
                    f"flags={mi.get('flags')} port={mi.get('port')} num-slaves={mi.get('num-slaves')} "
                    f"num-other-sentinels={mi.get('num-other-sentinels')} "
                    f"replicas={[(r.get('port'), r.get('flags')) for r in reps]}"
                )
            except (OSError, ServerError) as e:
                out[s.port] = repr(e)
        return out

    def _settled(self, master: RedisServer) -> bool:
        """Every sentinel sees ``master`` up, one healthy replica and all the other sentinels."""
        want_others = str(len(self.sentinels) - 1)
        for s in self.sentinels:
            try:
                mi = s.master_info(0.5)
                reps = s.replicas_info(0.5)
            except (OSError, ServerError):
                return False
            if not (
                mi.get("flags") == "master"
                and mi.get("port") == str(master.port)
                and mi.get("num-slaves") == "1"
                and mi.get("num-other-sentinels") == want_others
                and len(reps) == 1
                and reps[0].get("flags") == "slave"
                and reps[0].get("master-link-status") == "ok"
            ):
                return False
        return True

    def wait_settled(self, timeout: float = 20.0) -> None:
        """Wait until the master has its replica online and every sentinel knows the master, the
        replica and every other sentinel (``SENTINEL master NAME``: num-slaves, num-other-sentinels).

        On a loaded machine Sentinel may fail over once more meanwhile (a just-promoted master that
        is busy with a full sync can miss its down-after window): when every sentinel agrees on the
        other server as master, the roles are swapped and the wait goes on in that direction."""
        def synced() -> bool:
            m, r = self.master, self.replica
            if self._replica_online(m, r):
                return True
            views = set(self.master_ports().values())
            if views == {r.port}:
                try:
                    if redis_info(r.port, "replication", timeout=0.5).get("role") == "master":
                        self._master_i = self.servers.index(r)
                except (OSError, ServerError):
                    pass
            return False

        _wait_for(synced, timeout, lambda: f"{self.replica!r} to sync from {self.master!r}: {self._sentinel_views()}")
        _wait_for(lambda: self._settled(self.master), timeout,
                  lambda: f"sentinels to settle: {self._sentinel_views()}", 0.05)

    def wait_sentinels_steady(self, steady: float = 1.5, timeout: float = 30.0) -> None:
        """Wait until every sentinel has named the current master, without a down flag, for
        ``steady`` seconds (restarting the old master earlier can trigger a second failover)."""
        since: list[float] = []

        def steady_now() -> bool:
            ok = False
            try:
                ok = all(s.master_info(0.5).get("flags") == "master"
                         and s.master_info(0.5).get("port") == str(self.master.port)
                         for s in self.sentinels if s.running)
            except (OSError, ServerError):
                ok = False
            if not ok:
                since.clear()
                return False
            if not since:
                since.append(time.monotonic())
            return time.monotonic() - since[0] >= steady

        _wait_for(steady_now, timeout, lambda: f"sentinels to agree on {self.master!r}: {self._sentinel_views()}", 0.1)

    def start(self) -> Self:
        """Start master, then the replica (waits until it is in sync: sentinels learn replicas from
        the master's INFO), then the sentinels; wait until everyone knows everyone."""
        self._master_i = 0
        m, r = self.servers
        try:
            deadline = time.monotonic() + self.start_timeout
            m.start()
            r.conf_lines = [f"replicaof {HOST} {m.port}"]
            r.start()
            _wait_for(lambda: self._replica_online(m, r), max(0.1, deadline - time.monotonic()),
                      lambda: f"{r!r} to sync from {m!r}; replica log:\n{r.log_tail(10)}")
            for s in self.sentinels:
                s.master_port = m.port
                s.start()
            _wait_for(lambda: self._settled(m), max(0.1, deadline - time.monotonic()),
                      lambda: f"sentinels to settle: {self._sentinel_views()}", 0.05)
        except BaseException:
            self.kill()
            raise
        return self

    def kill_master(self) -> RedisServer:
        """kill -9 the current master; returns it (its port is what ``wait_failover`` needs)."""
        m = self.master
        m.kill()
        return m

    def wait_failover(self, old_port: int, timeout: float = 30.0, all_sentinels: bool = False) -> int:
        """Wait until a sentinel (every running one with ``all_sentinels``) names a master other than
        ``old_port`` and that server reports ``role:master``; return its port and update roles."""
        found: list[int] = []

        def done() -> bool:
            views = self.master_ports()
            named = {p for p in views.values() if p is not None and p != old_port}
            if all_sentinels and (len(named) != 1 or None in views.values() or old_port in views.values()):
                return False
            for p in named:
                try:
                    if redis_info(p, "replication", timeout=0.5).get("role") == "master":
                        found[:] = [p]
                        return True
                except (OSError, ServerError):
                    pass
            return False

        _wait_for(done, timeout, lambda: f"a failover away from port {old_port}: sentinel views "
                                         f"{self.master_ports()}; {self._sentinel_views()}", 0.05)
        new_port = found[0]
        for i, srv in enumerate(self.servers):
            if srv.port == new_port:
                self._master_i = i
                return new_port
        raise ServerError(f"sentinels promoted port {new_port}, which is none of {self.servers!r}")

    def restart_old_master_as_replica(self, timeout: float = 60.0, replicaof_in_config: bool = False) -> RedisServer:
        """Start the old master (killed, now ``replica``) again and wait until it is a synced replica
        of the new master and every sentinel sees it as a healthy replica; returns it.

        By default it comes back as it was killed: a master with its old data (empty without AOF),
        until a sentinel reconfigures it, which Sentinel does only after the instance has reported
        the wrong role for 8 s, so this takes about 20 s.  ``replicaof_in_config=True`` first adds
        ``replicaof NEW_MASTER`` to its config file (as an operator would), so it starts as a
        replica at once (about 1 s).
        """
        old = self.replica
        if not old.running:
            self.wait_sentinels_steady(timeout=timeout)
            if replicaof_in_config:
                with open(old.conf_path, "a") as f:  # the last replicaof line wins
                    f.write(f"replicaof {HOST} {self.master.port}\n")
            old.start()
        self.wait_settled(timeout)
        return old

    def kill(self) -> None:
        """SIGKILL everything (dirs kept; the atexit hook or ``stop()`` removes them)."""
        for srv in [*self.sentinels, *self.servers]:
            srv.kill()

    def stop(self, keep: bool | None = None, grace: float = 2.0) -> None:
        """Stop the sentinels first (no failover while stopping), then the replica, then the master
        (a master asked to stop with replicas attached waits for them to catch up)."""
        for srv in [*self.sentinels, self.replica, self.master]:
            srv.stop(keep, grace=grace)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SentinelSet({self.master_name}, master={self.master!r}, sentinels={[s.port for s in self.sentinels]})"


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
