"""Child processes we start ourselves, each with a log file, and the servers among them.

A :class:`ChildProcess` is signalled only through the pid of the ``Popen`` that started it: nothing
here looks processes up by name, so nothing else on the machine is ever touched.  A
:class:`ServerProcess` adds a directory (a fresh temp dir unless one is given), a readiness probe
and cleanup: an atexit hook kills the servers this process started that are still alive, and temp
dirs left by a run that was SIGKILLed are swept (:func:`sweep_stale_dirs`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol, Self

from ...protocol.errors import ZschedError

STOP_GRACE_S = 5.0
LOG_TAIL_LINES = 40
OWNER_FILE = ".zsched-owner"  # in a temp dir: the pid of the Python process that created it
TMPDIR_ENV = "ZSCHED_TEST_TMPDIR"  # overrides where servers without a given dir make their temp dirs


class ServerError(ZschedError, RuntimeError):
    """A server failed to start or answer."""


class StopFlag(Protocol):
    """What a wait that a stop request must end polls: a :class:`threading.Event`, or ``zsched
    dev``'s signal-safe ``Stopping``."""

    def is_set(self) -> bool:
        """True once a stop was requested."""

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a stop request; :meth:`is_set` then."""


def wait_for(pred: Callable[[], bool], timeout: float, what: Callable[[], str] | str, poll: float = 0.02) -> None:
    """Poll ``pred`` until true; after ``timeout`` s raise ServerError naming ``what`` (str or thunk)."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise ServerError(f"timed out after {timeout}s waiting for {what() if callable(what) else what}")
        time.sleep(poll)


def pid_alive(pid: int) -> bool:
    """True if a process with this pid exists (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_state(pid: int) -> str:
    """The state letter of a process from ``/proc/PID/stat`` (R, S, D, T stopped, Z zombie...).

    Raises OSError once the process is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def tmp_root() -> str | None:
    """Where servers make their temp dirs: $ZSCHED_TEST_TMPDIR, else /dev/shm (etcd fsyncs are free
    on tmpfs), else the OS default (None)."""
    env = os.environ.get(TMPDIR_ENV)
    if env:
        return env
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return None


def sweep_stale_dirs(
    pattern: str = "zsched-*-*", root: str | None = None, in_use: Callable[[Path], bool] | None = None
) -> None:
    """Remove temp dirs matching ``pattern`` under ``root`` (default :func:`tmp_root`) whose owner
    (:data:`OWNER_FILE`) is gone, unless ``in_use(dir)`` says a process still works in it.

    Matters because a run that was SIGKILLed leaves them behind, maybe in /dev/shm (RAM), and etcd
    preallocates a 64 MB WAL.  Dirs without an owner file are not ours (or still being created)."""
    for d in Path(root or tmp_root() or tempfile.gettempdir()).glob(pattern):
        try:
            owner = int((d / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if owner == os.getpid() or pid_alive(owner) or (in_use is not None and in_use(d)):
            continue
        shutil.rmtree(d, ignore_errors=True)


class ChildProcess:
    """One process we started, its stdout and stderr appended to the file ``log``.

    Signals go only to the pid of the ``Popen`` in ``proc``, and only while it runs."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """Pid of the current (or last) process, None if never started."""
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        """True while the process exists (a SIGSTOPped one counts as running)."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def paused(self) -> bool:
        """True while the process is stopped by SIGSTOP (by anyone): it holds its sockets but answers nothing."""
        if not self.running or self.proc is None:
            return False
        try:
            return process_state(self.proc.pid) in ("T", "t")
        except (OSError, IndexError):
            return False

    def launch(
        self,
        argv: Sequence[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        new_session: bool = False,
        pass_fds: Sequence[int] = (),
    ) -> None:
        """Start ``argv`` with stdin from /dev/null and its output appended to the log.

        ``new_session``: its own session, so a Ctrl-C aimed at us (pytest, ``zsched dev``) does not
        reach it and we stop it in our own order. ``pass_fds``: descriptors the child inherits (a
        :class:`~scheduler.shell.servers.lifeline.Lifeline`'s read end); every other one is closed."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=env,
                start_new_session=new_session,
                pass_fds=tuple(pass_fds),
            )

    def signal(self, sig: int) -> None:
        """Send ``sig`` to our process if it is still running."""
        if self.running and self.proc is not None:
            os.kill(self.proc.pid, sig)

    def terminate(self) -> None:
        """Send SIGTERM without waiting (``shutdown()`` does the waiting)."""
        self.signal(signal.SIGTERM)
        self.signal(signal.SIGCONT)  # a SIGSTOPped process would never act on SIGTERM

    def kill(self) -> None:
        """SIGKILL and wait until it is gone."""
        if self.running and self.proc is not None:
            self.signal(signal.SIGKILL)
            self.proc.wait()

    def shutdown(self, grace: float) -> bool:
        """SIGTERM, then SIGKILL if it is still up after ``grace`` s; True if it needed the SIGKILL."""
        return bool(shutdown_all([self], grace))

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the log (for error messages)."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def shutdown_all(children: Iterable[ChildProcess], grace: float) -> list[ChildProcess]:
    """``shutdown(grace)`` of several processes at once: SIGTERM to every one first, then the same
    ``grace`` s for all of them, SIGKILL to those still up; returns those. Stopping N processes
    takes as long as the slowest one, not the sum (a stop is mostly waiting: a worker finishing its
    handlers, a replica handing over)."""
    up = [c for c in children if c.running]
    for c in up:
        c.terminate()
    deadline = time.monotonic() + grace
    killed: list[ChildProcess] = []
    for c in up:
        assert c.proc is not None  # running
        try:
            c.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.kill()
            killed.append(c)
    return killed


# Servers that may be running or still own a temp dir, for the atexit hook.
_live: dict[int, ServerProcess] = {}
_live_lock = threading.Lock()
_swept = threading.Event()
_SETPRIV = shutil.which("setpriv")
# Run by setpriv once the death signal is set: exec the program only if the parent that spawned
# it ($0) is still its parent. A parent that died between fork and prctl() sent no signal, and
# the child, reparented, would run on with nobody to stop it.
_IF_PARENT_ALIVE = '[ "$PPID" = "$0" ] && exec "$@"; exit 125'


def die_with_parent(argv: Sequence[str], sig: signal.Signals = signal.SIGKILL) -> list[str]:
    """``argv`` run so that the kernel sends it ``sig`` when the process that spawns it dies, even
    by SIGKILL (``PR_SET_PDEATHSIG`` through ``setpriv``, then ``sh`` checking the parent is still
    there); the pid stays the program's own (both exec).

    Unchanged where that is not possible or not wanted: no ``setpriv`` on PATH, or a call from
    another thread than the main one, since the signal fires when the spawning *thread* exits (a
    launcher thread of a test would take its servers with it). For our own Python children,
    :class:`~scheduler.shell.servers.lifeline.Lifeline` has none of these limits."""
    if not _SETPRIV or threading.current_thread() is not threading.main_thread():
        return list(argv)
    return [_SETPRIV, "--pdeathsig", sig.name.removeprefix("SIG"), "--", "/bin/sh", "-c", _IF_PARENT_ALIVE,
            str(os.getpid()), *argv]


class ServerProcess(ChildProcess):
    """A server child process with a directory, a log file in it and a readiness probe.

    Subclasses say how to run it (:meth:`argv`) and when it is up (:meth:`ready`).  Without a
    ``dir`` it runs in a fresh temp dir (under :func:`tmp_root`, marked with :data:`OWNER_FILE`),
    removed by ``stop()`` unless ``keep``; a given dir is never removed.
    """

    kind = "server"
    start_timeout = 10.0
    death_signal = signal.SIGKILL  # what the server gets when the process that started it dies

    def __init__(
        self, dir: str | os.PathLike[str] | None = None, keep: bool = False, log: Path | None = None
    ) -> None:
        self._own_dir = dir is None
        if dir is None:
            if not _swept.is_set():  # once per process, before the first temp dir of our own
                _swept.set()
                sweep_stale_dirs()
            self.dir = Path(tempfile.mkdtemp(prefix=f"zsched-{self.kind}-", dir=tmp_root()))
            (self.dir / OWNER_FILE).write_text(str(os.getpid()))
        else:
            self.dir = Path(dir)
        super().__init__(log or self.dir / f"{self.kind}.log")
        self.keep = keep
        self._track()

    def argv(self) -> list[str]:
        """The command line that runs the server (the binary first)."""
        raise NotImplementedError

    def ready(self) -> bool:
        """True once the server answers (polled by ``wait_ready()``)."""
        raise NotImplementedError

    # -- lifecycle
    def spawn(self) -> None:
        """Start the process without waiting for readiness."""
        if self.running:
            raise ServerError(f"{self!r} already running (pid {self.pid})")
        self.dir.mkdir(parents=True, exist_ok=True)
        if self._own_dir:  # the dir may have been removed by stop() and recreated here
            (self.dir / OWNER_FILE).write_text(str(os.getpid()))
        argv = self.argv()
        if shutil.which(argv[0]) is None:
            raise ServerError(f"{argv[0]!r} not found on PATH; run scripts/bootstrap to install it")
        # die with the parent even on SIGKILL (from the main thread only: see die_with_parent)
        self.launch(die_with_parent(argv, self.death_signal), cwd=self.dir, new_session=True)
        self._track()

    def wait_ready(self, timeout: float | None = None, stop: StopFlag | None = None) -> bool:
        """Poll the readiness probe; on failure raise with the log tail. True once ready; False as
        soon as ``stop`` is set (a signal to the process that waits: the server is left running,
        the caller stops it)."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        while True:
            if stop is not None and stop.is_set():
                return False
            if not self.running:
                code = self.proc.returncode if self.proc else None
                raise ServerError(f"{self!r} exited with {code} before ready; log tail:\n{self.log_tail()}")
            if self.ready():
                return True
            if time.monotonic() > deadline:
                raise ServerError(
                    f"{self!r} not ready after {timeout or self.start_timeout}s; log tail:\n{self.log_tail()}"
                )
            if stop is not None:
                stop.wait(0.02)
            else:
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

    def stop(self, keep: bool | None = None, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM, SIGKILL after ``grace`` s (5); then remove our temp dir unless kept."""
        if self.shutdown(grace) and grace >= STOP_GRACE_S:  # a shorter grace is the caller's choice, not news
            print(f"{__name__}: {self!r} ignored SIGTERM for {grace}s; SIGKILL", file=sys.stderr)
        if not (self.keep if keep is None else keep):
            self.remove_dir()
        self._untrack()

    def restart(self) -> Self:
        """Start again on the same port(s) and dir; stops gracefully first if still up."""
        if self.running:
            self.stop(keep=True)
        return self.start()

    def remove_dir(self) -> None:
        """Remove the dir if it is our own temp dir (a given dir is left alone)."""
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _track(self) -> None:
        with _live_lock:
            _live[id(self)] = self

    def _untrack(self) -> None:
        with _live_lock:
            _live.pop(id(self), None)

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
