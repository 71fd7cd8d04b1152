"""``zsched dev``'s stop requests and output (``scheduler.shell.dev_guard``), in-process, no servers:
a closed output never raises and what would have been shown goes to a file; signals wake a wait
at once and only a second SIGINT or SIGTERM hurries the clean-up."""
from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.shell.dev_guard import Output, Stopping


@pytest.fixture
def closed_pipe() -> Iterator[io.TextIOWrapper]:
    """A text stream on a pipe whose reader is gone (``zsched dev | tee`` after tee died)."""
    read, write = os.pipe()
    os.close(read)
    stream = io.TextIOWrapper(io.BufferedWriter(io.FileIO(write, "w")), line_buffering=False)
    yield stream
    stream.close()


def test_a_closed_stdout_never_raises_and_its_lines_go_to_the_fallback_file(
        closed_pipe: io.TextIOWrapper, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", closed_pipe)
    lost: list[str] = []
    fallback = tmp_path / "logs" / "dev.log"
    with Output(fallback, on_stdout_lost=lost.append) as out:
        assert sys.stdout is out.stdout
        print("stopping: workers ...", flush=True)  # the write is buffered; the flush fails
        out.frame("\x1b[H\x1b[2Ja whole view\n")  # dropped: a frame is not worth keeping
        print("stopped, no process left behind", flush=True)
    assert sys.stdout is closed_pipe
    assert lost == ["output closed"]
    text = fallback.read_text()
    assert "stdout lost (BrokenPipeError" in text
    assert "stopping: workers ...\n" in text and text.endswith("stopped, no process left behind\n"), text
    assert "a whole view" not in text
    assert fallback.stat().st_mode & 0o777 == 0o600, "the lines may carry the console's token"
    assert os.readlink(f"/proc/self/fd/{closed_pipe.fileno()}") == os.devnull
    closed_pipe.write("the interpreter's last flush\n")
    closed_pipe.flush()  # goes to /dev/null: no error at exit


def test_a_closed_stderr_alone_does_not_end_the_run(closed_pipe: io.TextIOWrapper, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", closed_pipe)
    lost: list[str] = []
    with Output(tmp_path / "dev.log", on_stdout_lost=lost.append) as out:
        print("zsched dev: worker-1 still running", file=sys.stderr, flush=True)
        assert list(out.lost) == ["stderr"]
    assert lost == []
    assert "worker-1 still running" in (tmp_path / "dev.log").read_text()


@pytest.fixture
def stopping() -> Iterator[Stopping]:
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    s = Stopping()
    s.install()
    yield s
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_a_signal_wakes_a_wait_at_once(stopping: Stopping) -> None:
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
    t0 = time.monotonic()
    timer.start()
    assert stopping.wait(30.0)
    assert time.monotonic() - t0 < 10.0 and stopping.reason == "SIGTERM"


def test_only_a_second_sigint_or_sigterm_hurries_the_clean_up(stopping: Stopping) -> None:
    os.kill(os.getpid(), signal.SIGHUP)  # the terminal closed: the kernel and the shell may both say so
    os.kill(os.getpid(), signal.SIGHUP)
    assert stopping.wait(5.0) and stopping.reason == "SIGHUP"
    assert not stopping.hurry
    os.kill(os.getpid(), signal.SIGINT)
    assert not stopping.wait(0.05, until=lambda: stopping.hurry)
    os.kill(os.getpid(), signal.SIGTERM)
    assert stopping.wait(5.0, until=lambda: stopping.hurry)
    assert stopping.reason == "SIGHUP"  # the first reason is the one reported
