"""``zsched dev`` stops everything it started, whatever ends it (docs/operations.md, "Stopping"):
its output closing (Ctrl-C on ``zsched dev | tee log`` kills tee too), SIGTERM, its terminal closing
(SIGHUP, then EIO on every write), its own SIGKILL (its children notice by themselves), a second
Ctrl-C during a slow clean-up; and it will not share its data directory with processes of an earlier
run, which would join the new one.

The children are identified by pid (``/proc/DEV/task/*/children``, read once every one of them
serves), never by name, and each must be gone within a bound: the check is "it stops", not a
timing benchmark. Most tests run a small stack (1 replica, 1 worker, the console, redis-server,
etcd); one runs the full default set with the demo.
"""
from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from scheduler import Client
from scheduler.shell.dev import DEV_DRAIN_TIMEOUT
from tests.support.devstack import children_of, still_alive, wait_gone

UP_BOUND = 90.0  # seconds for a stack to serve (several start-ups may overlap on a busy machine)
STOP_BOUND = 20.0  # seconds from what ends zsched dev to its last child being gone
# after a SIGKILL of zsched dev its servers stop at once with it: a worker then keeps trying to
# deliver its last outcomes to Redis for its --drain-timeout before it gives up and exits
KILLED_BOUND = DEV_DRAIN_TIMEOUT + STOP_BOUND
SMALL = ["--no-demo", "--worker", "scheduler.shell.demo:worker", "--workers", "1", "--replicas", "1"]
SMALL_DEMO = ["--workers", "1", "--replicas", "1"]
LIFELINE_LINE = "the process that started this one is gone"

SLOW_APP = '''\
import asyncio

from workers import Worker

worker = Worker(queues=["slow"])


@worker.handler("slow")
async def slow(job):
    await asyncio.Event().wait()  # runs until the worker is killed
'''


class Dev:
    """One ``zsched dev`` run, its output read through a pipe or, with ``terminal``, a pty that is
    its controlling terminal (closing it is closing the terminal window)."""

    def __init__(self, tmp: Path, args: list[str], *, terminal: bool = False, home: Path | None = None) -> None:
        self.home = home or tmp / "zs"
        logs = self.home / "logs"
        self.log_start = {p.name: p.stat().st_size for p in logs.glob("*.log")} if logs.is_dir() else {}
        argv = [sys.executable, "-m", "scheduler", "dev", "--home", str(self.home), "--namespace", "devstop", *args]
        self.terminal = terminal
        if terminal:
            self.fd, follower = pty.openpty()
            # setsid --ctty: a new session whose controlling terminal is the pty (setsid execs: same pid)
            self.proc = subprocess.Popen(["setsid", "--ctty", *argv], stdin=follower, stdout=follower,
                                         stderr=follower, cwd=tmp)
            os.close(follower)
        else:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, cwd=tmp)
            assert self.proc.stdout is not None
            self.fd = self.proc.stdout.fileno()
        self.open = True
        self.text = ""
        self.children: dict[int, str] = {}

    def pump(self, wait: float = 0.0) -> None:
        """Read what the output has (so a terminal never fills up and blocks zsched dev)."""
        while self.open and select.select([self.fd], [], [], wait)[0]:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # a pty whose other side is closed
                data = b""
            if not data:
                return
            self.text += data.decode(errors="replace")
            wait = 0.0

    def until(self, pred: Callable[[], object], bound: float, what: str, exit_ok: bool = False) -> None:
        deadline = time.monotonic() + bound
        while not pred():
            assert time.monotonic() < deadline, f"timed out after {bound:g}s waiting for {what}:\n{self.text[-3000:]}"
            assert exit_ok or self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.text[-3000:]}"
            self.pump(0.05)

    def log(self, name: str) -> str:
        """What this run wrote to ``logs/NAME`` (the logs are appended to across runs)."""
        try:
            with open(self.home / "logs" / name, errors="replace") as f:
                f.seek(self.log_start.get(name, 0))
                return f.read()
        except OSError:
            return ""

    def wait_serving(self, replicas: int, workers: int) -> None:
        """Wait until every child serves (its signal handlers are in place), then note their pids."""
        wanted = {f"scheduler-{i}.log": rf"scheduler replica scheduler-{i} up" for i in range(1, replicas + 1)}
        wanted |= {f"worker-{i}.log": r"worker serving namespace" for i in range(1, workers + 1)}
        wanted["ui.log"] = r"zsched ui: http://"

        def serving() -> bool:
            # a child that exited at start-up (the view says so) will never serve: say why at once
            exited = re.search(r"exited: ([\w-]+(?:, [\w-]+)*)", self.text)
            assert not exited, "\n".join(f"{n}: {self.log(n + '.log')[-1500:]}" for n in exited.group(1).split(", "))
            return "stack up" in self.text and all(re.search(p, self.log(n)) for n, p in wanted.items())

        self.until(serving, UP_BOUND, "every child to serve")
        self.children = children_of(self.proc.pid)
        assert len(self.children) == 2 + replicas + workers + 1, (self.children, self.text[-2000:])

    def close_output(self) -> None:
        """Close our end: the pipe's reader exits (as tee on Ctrl-C), or the terminal is closed."""
        self.open = False
        if self.terminal:
            os.close(self.fd)
        else:
            assert self.proc.stdout is not None
            self.proc.stdout.close()

    def finish(self, bound: float = STOP_BOUND) -> int:
        """Wait for zsched dev to exit (reading its output meanwhile); its exit code."""
        if self.open:
            self.until(lambda: self.proc.poll() is not None, bound, "zsched dev to exit", exit_ok=True)
            self.pump()  # its last lines
        return self.proc.wait(bound)

    def kill_leftovers(self) -> None:
        """After a failure: what this run started must not outlive the test (by pid only)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in still_alive(self.children):
            os.kill(pid, signal.SIGKILL)
        if self.open:
            self.close_output()


@pytest.fixture
def runs() -> Iterator[list[Dev]]:
    started: list[Dev] = []
    yield started
    for dev in started:
        dev.kill_leftovers()


def _assert_all_gone(dev: Dev, bound: float) -> None:
    # (their ports are free then; not checked by connecting: other runs on this machine may take
    # the same preferred ports the moment they are free)
    left = wait_gone(dev.children, bound)
    assert not left, f"children of zsched dev still running {bound:g}s later: {left}"


def _no_traceback(dev: Dev) -> None:
    for log in (dev.home / "logs").glob("*.log"):
        assert "Traceback" not in dev.log(log.name), f"{log.name}:\n{dev.log(log.name)[-3000:]}"


@pytest.mark.parametrize("sig", [None, signal.SIGTERM], ids=["no signal", "SIGTERM"])
def test_dev_stops_everything_when_its_output_pipe_closes(tmp_path: Path, runs: list[Dev],
                                                          sig: signal.Signals | None) -> None:
    """``zsched dev | head``, or a SIGTERM after the reader of its output went away: the first
    write that fails ends the run, and the lines after it go to logs/dev.log."""
    runs.append(dev := Dev(tmp_path, SMALL))
    dev.wait_serving(replicas=1, workers=1)
    dev.close_output()
    if sig is not None:
        dev.proc.send_signal(sig)
    assert dev.finish() == 0
    _assert_all_gone(dev, STOP_BOUND)
    tail = dev.log("dev.log")
    assert re.search(r"stdout lost \(BrokenPipeError", tail), tail
    assert f"stopping ({sig.name if sig else 'output closed'})" in tail, tail
    assert "stopped, no process left behind" in tail, tail
    _no_traceback(dev)


def test_dev_stops_the_full_demo_stack_on_ctrl_c_through_tee(tmp_path: Path, runs: list[Dev]) -> None:
    """The default stack with the demo (3 replicas, 2 workers, the console): Ctrl-C on
    ``./scripts/dev | tee dev.log`` kills tee too, so every write fails from then on; still the
    workers hand their jobs back and the replicas release their leases before the servers stop."""
    runs.append(dev := Dev(tmp_path, []))
    dev.wait_serving(replicas=3, workers=2)
    dev.close_output()
    dev.proc.send_signal(signal.SIGINT)
    assert dev.finish() == 0
    _assert_all_gone(dev, STOP_BOUND)
    assert "stopped, no process left behind" in dev.log("dev.log")
    for i in (1, 2):
        log = dev.log(f"worker-{i}.log")
        assert "worker stopped" in log and "could not deliver" not in log, log[-2000:]
    for i in (1, 2, 3):
        log = dev.log(f"scheduler-{i}.log")
        assert re.search(r"scheduler replica scheduler-\d stopped in", log) and "could not revoke" not in log, log
    _no_traceback(dev)


CLEAR = "\x1b[H\x1b[2J"  # what starts each frame of the view redrawn on a terminal


def test_the_redrawn_view_keeps_the_export_line_and_the_console_on_screen_and_the_run_stops_when_its_terminal_closes(
        tmp_path: Path, runs: list[Dev]) -> None:
    """On a terminal the view clears the screen every second: each frame starts with the lines the
    user needs (the ``export`` line, the console's URL and token). ``--log-level`` after the
    subcommand is taken. Closing the terminal: SIGHUP, and every write to it fails (EIO) from then on."""
    runs.append(dev := Dev(tmp_path, [*SMALL, "--log-level", "DEBUG"], terminal=True))
    dev.wait_serving(replicas=1, workers=1)
    export = re.search(r"stack up: export ZSCHED_REDIS_URL=redis://127\.0\.0\.1:\d+/0 \S+ ZSCHED_NAMESPACE=devstop",
                       dev.text).group(0)
    console = re.search(r"console: http://127\.0\.0\.1:\d+/ \(zsched ui; actions need the token \S+\)",
                        dev.text).group(0)
    dev.until(lambda: dev.text.count(CLEAR) >= 3, UP_BOUND, "three frames of the view")
    frame = dev.text.split(CLEAR)[-2].replace("\r\n", "\n")  # the last complete one
    top = frame.splitlines()
    assert top[0] == export and top[1].startswith("metrics: scheduler-1=127.0.0.1:") and top[2] == console, frame
    assert top[3] == "" and top[4].startswith("zsched dev - namespace devstop") and "partition owners:" in frame, frame
    dev.close_output()
    assert dev.finish() == 0
    _assert_all_gone(dev, STOP_BOUND)
    tail = dev.log("dev.log")
    assert "stopping (SIGHUP)" in tail and "stopped, no process left behind" in tail, tail
    _no_traceback(dev)


def test_children_stop_by_themselves_when_dev_is_killed_and_the_next_run_starts_clean(
        tmp_path: Path, runs: list[Dev]) -> None:
    """SIGKILL of zsched dev (with the demo running): the replica, the worker and the console see
    their lifeline close and stop gracefully, redis-server and etcd get their parent-death signal;
    the next run on the same data directory starts, owns every partition and stops cleanly."""
    runs.append(dev := Dev(tmp_path, SMALL_DEMO))
    dev.wait_serving(replicas=1, workers=1)
    dev.until(lambda: re.search(r"acked [1-9]", dev.text), UP_BOUND, "the demo's first acked job")
    dev.proc.kill()
    dev.proc.wait()
    _assert_all_gone(dev, KILLED_BOUND)
    for name in ("scheduler-1.log", "worker-1.log", "ui.log"):
        assert LIFELINE_LINE in dev.log(name), f"{name}:\n{dev.log(name)[-2000:]}"
    assert "worker stopped" in dev.log("worker-1.log")
    assert "scheduler replica scheduler-1 stopped in" in dev.log("scheduler-1.log")
    _no_traceback(dev)

    runs.append(again := Dev(tmp_path, SMALL_DEMO, home=dev.home))
    again.wait_serving(replicas=1, workers=1)
    # the killed replica could not revoke its lease (etcd stopped with it): it expires within its TTL
    again.until(lambda: re.search(r"owners: scheduler-1 16\b", again.text), UP_BOUND, "one owner of all 16 partitions")
    again.proc.send_signal(signal.SIGINT)
    assert again.finish() == 0
    assert "stopped, no process left behind" in again.text
    _assert_all_gone(again, STOP_BOUND)


def test_a_second_ctrl_c_kills_what_is_left_at_once(tmp_path: Path, runs: list[Dev]) -> None:
    """The first Ctrl-C waits for the worker's running handler (up to its 30 s shutdown grace);
    a second one does not wait: everything left is killed and zsched dev exits."""
    (tmp_path / "slowapp.py").write_text(SLOW_APP)
    runs.append(dev := Dev(tmp_path, ["--no-demo", "--worker", "slowapp:worker", "--workers", "1",
                                      "--replicas", "1"]))
    dev.wait_serving(replicas=1, workers=1)
    url = re.search(r"ZSCHED_REDIS_URL=(\S+)", dev.text).group(1)
    with Client.from_url(url, namespace="devstop").connect() as c:
        c.schedule(timedelta(0), {"n": 1}, queue="slow")
        dev.until(lambda: c.stats().get("slow", {}).get("running") == 1, UP_BOUND, "the slow job to run")
    dev.proc.send_signal(signal.SIGINT)
    dev.until(lambda: "waiting up to 30.0 s for 1 running handler" in dev.log("worker-1.log"), STOP_BOUND,
              "the worker to wait for its handler")
    dev.proc.send_signal(signal.SIGINT)
    assert dev.finish(bound=10.0) == 0
    _assert_all_gone(dev, 5.0)
    assert "killing what is left now" in dev.text, dev.text[-2000:]


@pytest.mark.parametrize("reset", [[], ["--reset"]], ids=["", "--reset"])
def test_dev_refuses_to_share_its_home_with_processes_of_an_earlier_run(tmp_path: Path, reset: list[str]) -> None:
    """A process still writing into ./.zsched (a replica left by an older version, say) would join
    the new run: zsched dev names it in one line and exits 4 before starting anything, and with
    ``--reset`` before removing anything. A process that only reads there (``tail -f``) is not in the way."""
    home = tmp_path / "zs"
    (home / "logs").mkdir(parents=True)
    log = home / "logs" / "scheduler-1.log"
    sleeper = [sys.executable, "-c", "import signal; signal.pause()"]  # until it is killed
    with open(log, "ab") as w, open(log, "rb") as r:  # in sessions of their own, as zsched dev's children are
        writer = subprocess.Popen(sleeper, stdout=w, stderr=w, start_new_session=True)
        reader = subprocess.Popen(sleeper, stdin=r, start_new_session=True)
    try:
        out = subprocess.run([sys.executable, "-m", "scheduler", "dev", "--home", str(home), *SMALL, *reset,
                              "--duration", "3"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        errors = [line for line in out.stderr.splitlines() if line.startswith("zsched:")]
        assert out.returncode == 4, (out.stdout[-2000:], out.stderr[-2000:])
        assert len(errors) == 1, out.stderr
        assert f"pid {writer.pid}: logs/scheduler-1.log" in errors[0] and f"kill {writer.pid}" in errors[0], errors
        assert not re.search(rf"\b{reader.pid}\b", errors[0]), errors
        assert "Traceback" not in out.stderr
        assert "starting redis" not in out.stdout, "it started servers"
        assert log.exists(), "it removed the log of the process still writing it"
        assert writer.poll() is None, "zsched dev stopped a process it did not start"
    finally:
        for p in (writer, reader):
            p.kill()
            p.wait()


def _jobs(url: str) -> int:
    with Client.from_url(url, namespace="devstop").connect() as c:
        return sum(q["scheduled"] for q in c.stats().values())


def test_a_run_says_it_continues_with_the_jobs_of_an_earlier_one_and_reset_starts_fresh(
        tmp_path: Path, runs: list[Dev]) -> None:
    """``--home`` keeps the servers' data: the next run says how many jobs it found in it; with
    ``--reset`` it removes the earlier run's redis/, etcd/ and logs/ first and nothing else there."""
    small = ["--no-demo", "--replicas", "1", "--workers", "0"]
    runs.append(first := Dev(tmp_path, small))
    first.until(lambda: "stack up" in first.text, UP_BOUND, "the stack")
    assert "earlier run" not in first.text  # a new --home: nothing found, nothing said
    url = re.search(r"ZSCHED_REDIS_URL=(\S+)", first.text).group(1)
    with Client.from_url(url, namespace="devstop").connect() as c:
        c.schedule_many([(timedelta(hours=1), {"n": i}) for i in range(3)], queue="later")
    first.proc.send_signal(signal.SIGINT)
    assert first.finish() == 0
    (first.home / "notes.txt").write_text("mine")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "kept").write_text("kept")

    runs.append(again := Dev(tmp_path, small))
    again.until(lambda: "stack up" in again.text, UP_BOUND, "the stack")
    found = [line for line in again.text.splitlines() if "earlier run" in line]
    assert found == ["zsched dev: found data of an earlier run in ./zs (3 jobs in namespace devstop): continuing "
                     "with it; --reset starts fresh"], again.text[-2000:]
    assert _jobs(re.search(r"ZSCHED_REDIS_URL=(\S+)", again.text).group(1)) == 3
    again.proc.send_signal(signal.SIGINT)
    assert again.finish() == 0
    (first.home / "logs" / "link").symlink_to(tmp_path / "elsewhere")  # --reset must not follow it

    runs.append(fresh := Dev(tmp_path, [*small, "--reset"]))
    fresh.until(lambda: "stack up" in fresh.text, UP_BOUND, "the stack")
    assert "zsched dev: --reset: removed the data of the earlier run in ./zs (redis/, etcd/, logs/)" in fresh.text
    assert "found data" not in fresh.text
    assert _jobs(re.search(r"ZSCHED_REDIS_URL=(\S+)", fresh.text).group(1)) == 0
    fresh.proc.send_signal(signal.SIGINT)
    assert fresh.finish() == 0
    assert (first.home / "notes.txt").read_text() == "mine"
    assert (tmp_path / "elsewhere" / "kept").read_text() == "kept"


def test_reset_with_an_external_redis_is_refused_before_anything_starts(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "scheduler", "dev", "--home", str(tmp_path / "zs"), "--reset",
                          "--redis", "redis://127.0.0.1:1/0"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.splitlines() == ["zsched: error: zsched dev: --reset removes the data of the redis-server "
                                       "zsched dev starts; with --redis the jobs live in that server and would stay: "
                                       "drop --reset (or --redis)"]
    assert not (tmp_path / "zs" / "redis").exists()
