"""What ends ``zsched dev``, and what makes it stop everything it started whatever that is.

- :class:`Stopping`: SIGINT, SIGTERM and SIGHUP (the terminal was closed) ask for a stop; a
  second SIGINT or SIGTERM asks to hurry (kill what is left). Set from signal handlers, so it
  takes no lock: a ``threading.Event`` does, and a handler that runs while its own thread holds
  that lock (in ``Event.wait``) deadlocks.
- :class:`Output`: stdout and stderr that may go away (a pipe whose reader exited: Ctrl-C on
  ``zsched dev | tee log`` kills tee too; a closed terminal). A failed write never raises, so
  output is never a reason to skip stopping the children; the lines after it go to a file.
- :func:`survivors`: processes of an earlier run that still write into the data directory, which
  would otherwise join this run (and run its jobs).
"""
from __future__ import annotations

import io
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import TextIO

UNFLUSHED_KEPT = 200  # writes since the last flush that a failing flush hands to the fallback file
PPID_FIELD, SESSION_FIELD = 1, 3  # in /proc/PID/stat, counted after the command name


class Stopping:
    """Why ``zsched dev`` should stop (:attr:`reason`, empty until then), and whether to hurry."""

    HURRY_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # SIGHUP may come twice (kernel, shell) with nobody there

    def __init__(self) -> None:
        self.reason = ""
        self.impatient = 0  # SIGINTs and SIGTERMs so far
        self._read, self._write = os.pipe()  # a self-pipe: wakes a wait from a signal handler
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def install(self) -> None:
        """Handle SIGINT, SIGTERM and SIGHUP (from the main thread)."""
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        self.impatient += sig in self.HURRY_SIGNALS
        self.request(sig.name)

    def request(self, reason: str) -> None:
        """Ask for a stop (the first reason is kept); safe in a signal handler."""
        self.reason = self.reason or reason
        try:
            os.write(self._write, b"!")
        except BlockingIOError:  # the pipe is full of wake-ups already
            pass

    def is_set(self) -> bool:
        """True once a stop was requested."""
        return bool(self.reason)

    @property
    def hurry(self) -> bool:
        """A second SIGINT or SIGTERM came: kill what is left instead of waiting for it."""
        return self.impatient >= 2

    def wait(self, timeout: float, until: Callable[[], bool] | None = None, poll: float | None = None) -> bool:
        """Wait up to ``timeout`` s for ``until()`` (default :meth:`is_set`) to become true, checking it
        after each signal and every ``poll`` s (default: only then); its last value."""
        cond = until or self.is_set
        deadline = time.monotonic() + timeout
        while not cond():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # a signal's handler writes the pipe: a signal that comes just before the select still wakes it
            select.select([self._read], [], [], left if poll is None else min(left, poll))
            try:
                os.read(self._read, 4096)
            except BlockingIOError:
                pass
        return True


class Output:
    """Installs itself over ``sys.stdout`` and ``sys.stderr`` (and the logging handlers that write
    to them) from :meth:`install` (or entering a ``with`` block) to :meth:`restore`. When a write
    or flush fails (``EPIPE``, ``EIO``...), the stream is marked lost: its descriptor is pointed at
    /dev/null (so nothing, not even the interpreter's last flush at exit, fails on it again),
    ``on_stdout_lost("output closed")`` is called when it is stdout, and what is written from then
    on (and what was being written) goes to ``fallback``."""

    def __init__(self, fallback: Path, on_stdout_lost: Callable[[str], None]) -> None:
        self.fallback = fallback
        self.on_stdout_lost = on_stdout_lost
        self.lost: dict[str, str] = {}  # stream name -> why
        self._file: TextIO | None = None
        self._file_lock = threading.Lock()  # the demo producer's thread may log too
        self._saved: list[tuple[object, str, object]] = []

    def __enter__(self) -> Output:
        return self.install()

    def __exit__(self, tp: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.restore()

    def install(self) -> Output:
        """Put the streams in place; returns self."""
        self.stdout = _Stream(self, "stdout", sys.stdout)
        self.stderr = _Stream(self, "stderr", sys.stderr)
        self._swap(sys, "stdout", self.stdout)
        self._swap(sys, "stderr", self.stderr)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream in (self.stdout.raw, self.stderr.raw):
                self._swap(handler, "stream", self.stdout if handler.stream is self.stdout.raw else self.stderr)
        return self

    def restore(self) -> None:
        """Put the original streams back (those that were lost stay pointed at /dev/null)."""
        for owner, attr, value in reversed(self._saved):
            setattr(owner, attr, value)
        self._saved.clear()
        with self._file_lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _swap(self, owner: object, attr: str, value: object) -> None:
        self._saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def frame(self, text: str) -> None:
        """Write a view frame to stdout; dropped (not kept in ``fallback``) once stdout is lost."""
        if "stdout" not in self.lost:
            self.stdout.write(text, keep=False)
            self.stdout.flush()

    def lose(self, stream: _Stream, exc: BaseException) -> None:
        """``stream`` failed with ``exc``: from now on its text goes to ``fallback``."""
        detail = getattr(exc, "strerror", None) or str(exc)
        why = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        self.lost[stream.name] = why
        try:
            fd = stream.raw.fileno()
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            os.close(null)
        except (OSError, ValueError):  # no descriptor (replaced by a test): nothing to silence
            pass
        self.keep(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} zsched dev (pid {os.getpid()}): {stream.name} "
                  f"lost ({why}); what it would have shown follows\n")
        if stream.name == "stdout":
            self.on_stdout_lost("output closed")

    def keep(self, text: str) -> None:
        """Append ``text`` to ``fallback`` (best effort: a full disk must not stop the clean-up)."""
        with self._file_lock:
            try:
                if self._file is None:
                    self.fallback.parent.mkdir(parents=True, exist_ok=True)
                    # 0600: the lines may carry the console's token
                    fd = os.open(self.fallback, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                    self._file = open(fd, "a", encoding="utf-8", errors="replace")  # noqa: SIM115
                self._file.write(text)
                self._file.flush()
            except OSError:
                pass


class _Stream(io.TextIOBase):
    """``sys.stdout`` or ``sys.stderr`` under :class:`Output`: the same text to the same place until
    a write fails, then to the fallback file."""

    def __init__(self, out: Output, name: str, raw: TextIO) -> None:
        super().__init__()
        self.out, self.name, self.raw = out, name, raw
        self._unflushed: list[str] = []  # written since the last flush: lost with it if the flush fails

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.raw, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        return self.name not in self.out.lost and self.raw.isatty()

    def fileno(self) -> int:
        return self.raw.fileno()

    def writable(self) -> bool:
        return True

    def write(self, text: str, keep: bool = True) -> int:
        if self.name in self.out.lost:
            if keep:
                self.out.keep(text)
            return len(text)
        if keep:
            self._unflushed.append(text)
            del self._unflushed[:-UNFLUSHED_KEPT]  # written without a flush: the last ones are enough
        try:
            self.raw.write(text)
        except (OSError, ValueError) as exc:  # ValueError: the stream was closed
            self._fail(exc)
        return len(text)

    def flush(self) -> None:
        if self.name in self.out.lost:
            return
        try:
            self.raw.flush()
            self._unflushed.clear()
        except (OSError, ValueError) as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        unflushed, self._unflushed = "".join(self._unflushed), []
        self.out.lose(self, exc)
        self.out.keep(unflushed)


def survivors(home: Path) -> list[tuple[int, str]]:
    """Processes with a file under ``home`` open for writing, with that file's path relative to
    ``home``: children of an earlier ``zsched dev`` that were not stopped (their log is their
    stdout; a server writes its data files), or of one still running. Those children lead
    sessions of their own (``zsched dev`` starts every one so), and only such processes count:
    not ``tee .zsched/out.log`` in this run's pipeline, nor this process and its ancestors (a
    login shell leads its session). Neither does a reader (``tail -f``, a shell whose directory
    is there), nor a process of another user, which cannot be inspected."""
    home = home.resolve()
    found: list[tuple[int, str]] = []
    ours = _ancestors()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in ours or _stat(int(entry), SESSION_FIELD) != int(entry):
            continue
        fd_dir = f"/proc/{entry}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                target = Path(os.readlink(f"{fd_dir}/{fd}"))
                if not target.is_relative_to(home) or not _open_for_writing(f"/proc/{entry}/fdinfo/{fd}"):
                    continue
            except (OSError, ValueError):
                continue
            found.append((int(entry), str(target.relative_to(home))))
            break
    return found


def _stat(pid: int, field: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[field])
    except (OSError, ValueError, IndexError):
        return None


def _ancestors() -> set[int]:
    """This process and its ancestors (a shell that sent its own output into ``home``)."""
    chain = {os.getpid()}
    pid: int | None = os.getppid()
    while pid and pid not in chain:
        chain.add(pid)
        pid = _stat(pid, PPID_FIELD)
    return chain


def _open_for_writing(fdinfo: str) -> bool:
    with open(fdinfo) as f:
        for line in f:
            if line.startswith("flags:"):
                return int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY
    return False
