"""A throwaway PostgreSQL server for the baseline benchmark (``bench/pg_baseline.py``).

``initdb`` into a temp dir on disk (not tmpfs: fsync must cost what it costs), then
``postgres -D DIR -p PORT -k SOCKDIR -c listen_addresses=127.0.0.1`` with the durability
defaults spelled out (fsync, synchronous_commit, full_page_writes on). Stopped with SIGINT
(fast shutdown) sent to the pid this module started, and only that pid.

PostgreSQL refuses to run as root. When we are root, initdb and postgres run as an
unprivileged system user (``postgres`` if the Debian package created it, else ``nobody``)
through ``subprocess.Popen(user=, group=, extra_groups=[])``, which changes uid in the child
before exec, so the pid we hold is the postmaster's own. The temp dir is chowned to that user.

Standard library only (plus the port, temp-dir and parent-death helpers of
``scheduler.shell.servers``), so a missing driver never hides a missing server.
"""
from __future__ import annotations

import atexit
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .ports import HOST, free_port
from .process import OWNER_FILE, ServerError, die_with_parent, pid_alive, sweep_stale_dirs

INSTALL_HINT = (
    "PostgreSQL server binaries (initdb, postgres) not found. Install them with "
    "`apt-get install postgresql` (Debian/Ubuntu), or point "
    "ZSCHED_PG_BIN at the directory that holds them."
)
# Durability exactly as PostgreSQL ships it, written out so the output can state it.
DURABLE_SETTINGS = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}


class PostgresMissing(ServerError):
    """initdb/postgres are not installed."""


class PostgresError(ServerError):
    """The server failed to initialise, start or stop."""


def _version_key(path: str) -> tuple[int, ...]:
    m = re.search(r"/postgresql/(\d+(?:\.\d+)?)/bin", path)
    return tuple(int(x) for x in m.group(1).split(".")) if m else (0,)


def find_bindir() -> Path:
    """Directory with ``initdb`` and ``postgres``: $ZSCHED_PG_BIN, else the newest Debian
    ``/usr/lib/postgresql/N/bin``, else ``pg_config --bindir``, else PATH."""
    cands: list[str] = []
    if os.environ.get("ZSCHED_PG_BIN"):
        cands.append(os.environ["ZSCHED_PG_BIN"])
    cands += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    if shutil.which("pg_config"):
        try:
            cands.append(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                                        timeout=5).stdout.strip())
        except (OSError, subprocess.SubprocessError):
            pass
    for name in ("postgres", "initdb"):
        found = shutil.which(name)
        if found:
            cands.append(str(Path(found).resolve().parent))
    for d in cands:
        if d and all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "postgres")):
            return Path(d)
    raise PostgresMissing(INSTALL_HINT)


def _run_as() -> pwd.struct_passwd | None:
    """The unprivileged account to run PostgreSQL as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    wanted = os.environ.get("ZSCHED_PG_USER")
    for name in ([wanted] if wanted else []) + ["postgres", "nobody"]:
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        if pw.pw_uid != 0:
            return pw
    raise PostgresError("running as root and no unprivileged user (postgres, nobody) to run PostgreSQL as")


def _tmp_root() -> str:
    """On disk, never tmpfs: $ZSCHED_PG_TMPDIR, else the OS temp dir (/tmp)."""
    return os.environ.get("ZSCHED_PG_TMPDIR") or tempfile.gettempdir()


def filesystem_of(path: str | os.PathLike[str]) -> str:
    """``fstype on mountpoint (device)`` of the mount holding ``path`` (longest prefix in /proc/mounts)."""
    p = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                    best = (mnt, fstype, dev)
    except OSError:
        pass
    return f"{best[1]} on {best[0] or '?'} ({best[2]})"


def _postmaster_alive(d: Path) -> bool:
    """A postmaster still runs in temp dir ``d`` (it may outlive the Python process that started it)."""
    try:
        return pid_alive(int((d / "data" / "postmaster.pid").read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        return False


def _proc_stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()  # [0] is the state (field 3)


_live: set[PostgresServer] = set()


class PostgresServer:
    """``with PostgresServer() as pg: psycopg.connect(pg.conninfo)``."""

    def __init__(self, extra_settings: dict[str, str] | None = None, port: int | None = None) -> None:
        self.bindir = find_bindir()
        self.user = _run_as()
        self.port = port if port is not None else free_port()
        self.settings = {**DURABLE_SETTINGS, **(extra_settings or {})}
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._orphans: list[int] = []  # backends of a postmaster killed by kill9()

    # -- paths and identity
    @property
    def data_dir(self) -> Path:
        assert self.dir is not None
        return self.dir / "data"

    @property
    def sock_dir(self) -> Path:
        assert self.dir is not None
        return self.dir / "sock"

    @property
    def log_path(self) -> Path:
        assert self.dir is not None
        return self.dir / "postgres.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def conninfo(self) -> str:
        return f"host={HOST} port={self.port} user=postgres dbname=postgres"

    @property
    def run_as(self) -> str:
        return self.user.pw_name if self.user else pwd.getpwuid(os.geteuid()).pw_name

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- lifecycle
    def _popen_kw(self) -> dict[str, Any]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}
        kw: dict[str, Any] = {"env": env, "cwd": str(self.dir), "stdin": subprocess.DEVNULL}
        if self.user:
            kw.update(user=self.user.pw_uid, group=self.user.pw_gid, extra_groups=[])
        return kw

    def _init(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="zsched-postgres-", dir=_tmp_root()))
        (self.dir / OWNER_FILE).write_text(str(os.getpid()))
        self.sock_dir.mkdir()
        if self.user:
            for p in (self.dir, self.sock_dir):
                os.chown(p, self.user.pw_uid, self.user.pw_gid)
        argv = [str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                "-E", "UTF8", "--locale=C", "--no-sync"]  # --no-sync: initdb's own files only
        with open(self.log_path, "ab") as log:
            res = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=120, **self._popen_kw())
        if res.returncode != 0:
            raise PostgresError(f"initdb failed ({res.returncode}); log tail:\n{self.log_tail()}")

    def start(self, timeout: float = 30.0) -> PostgresServer:
        # temp dirs of earlier runs that were SIGKILLed (owner gone, postmaster gone)
        sweep_stale_dirs("zsched-postgres-*", _tmp_root(), _postmaster_alive)
        self._init()
        return self._launch(timeout)

    def kill9(self) -> None:
        """SIGKILL to the postmaster (a crash; its backends exit when they notice), keeping the data
        directory for :meth:`restart`."""
        if self._proc is not None and self._proc.poll() is None:
            self._orphans = self.server_pids()[1:]
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait(10)

    def restart(self, timeout: float = 60.0) -> PostgresServer:
        """Start the server again on its data directory and port after :meth:`kill9` (crash
        recovery replays the WAL: committed transactions survive). First waits for the killed
        postmaster's backends to exit: while one holds the shared memory, postgres refuses to start."""
        assert self.dir is not None and not self.running
        deadline = time.monotonic() + timeout
        while any(pid_alive(p) for p in self._orphans):
            if time.monotonic() > deadline:
                raise PostgresError(f"backends of the killed postgres still up after {timeout}s: {self._orphans}")
            time.sleep(0.02)
        self._orphans = []
        return self._launch(timeout)

    def _launch(self, timeout: float) -> PostgresServer:
        argv = [str(self.bindir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                "-k", str(self.sock_dir), "-c", f"listen_addresses={HOST}"]
        for k, v in self.settings.items():
            argv += ["-c", f"{k}={v}"]
        # set by setpriv after the uid change (a uid change would clear it); then execs: same pid
        argv = die_with_parent(argv)
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                          **self._popen_kw())
        _live.add(self)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        """postmaster.pid's status line says ``ready`` and the TCP port accepts."""
        deadline = time.monotonic() + timeout
        pidfile = self.data_dir / "postmaster.pid"
        while True:
            if not self.running:
                raise PostgresError(f"postgres exited ({self._proc.returncode if self._proc else None}) "
                                    f"before ready; log tail:\n{self.log_tail()}")
            try:
                lines = pidfile.read_text().splitlines()
                if len(lines) >= 8 and lines[7].strip() == "ready":
                    with socket.create_connection((HOST, self.port), timeout=0.5):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise PostgresError(f"postgres not ready after {timeout}s; log tail:\n{self.log_tail()}")
            time.sleep(0.02)

    def stop(self, grace: float = 15.0, keep: bool = False) -> None:
        """SIGINT (fast shutdown) to our postmaster; SIGQUIT, then SIGKILL, if it lingers."""
        if self._proc is not None and self._proc.poll() is None:
            for sig, wait in ((signal.SIGINT, grace), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.kill(self._proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self._proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    print(f"pg_server: postgres pid {self._proc.pid} still up {wait}s after {sig.name}",
                          file=sys.stderr)
        _live.discard(self)
        if self.dir is not None and not keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- measurement
    def server_pids(self) -> list[int]:
        """The postmaster and its children (backends, checkpointer, walwriter, autovacuum, ...)."""
        pm = self.pid
        if pm is None:
            return []
        pids = [pm]
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    if int(_proc_stat(int(name))[1]) == pm:
                        pids.append(int(name))
                except (OSError, IndexError, ValueError):
                    continue
        return pids

    def cpu_seconds(self) -> float:
        """CPU seconds (user + system) of every server process so far: the postmaster's own and
        its reaped children's (cutime/cstime), plus the live children's. Deltas of this count
        children that exit in between (autovacuum workers) once, through the postmaster."""
        pm = self.pid
        if pm is None:
            return 0.0
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0
        for pid in self.server_pids():
            try:
                f = _proc_stat(pid)
            except OSError:
                continue  # exited meanwhile: its time is now in the postmaster's cutime
            total += int(f[11]) + int(f[12])
            if pid == pm:
                total += int(f[13]) + int(f[14])
        return total / ticks


@atexit.register
def _stop_leftovers() -> None:
    for srv in list(_live):
        try:
            srv.stop(grace=5.0)
        except Exception:  # noqa: BLE001, S110 - best effort at exit
            pass
