"""Children stop when the process that started them is gone, even by SIGKILL
(``scheduler.shell.servers``: :class:`Lifeline` for our own ``zsched`` processes,
:func:`die_with_parent` for the servers), without the limits of the kernel's parent-death signal
that matter to the test and benchmark launchers: a launcher thread that ends does not take its
children with it, and a parent that died before the signal was set does not leave a server behind.
"""
from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from scheduler.shell.servers import die_with_parent, free_port
from tests.support.devstack import start_time, wait_gone

BOUND = 10.0  # seconds for the children of a killed parent to be gone (it is "they stop", not a benchmark)

# A parent that starts a worker (retrying an unreachable Redis: it runs until stopped) with a
# lifeline from a thread that then ends, and `sleep` with a SIGTERM parent-death signal.
PARENT = """\
import signal, subprocess, sys, threading, time
from pathlib import Path
from scheduler.shell.servers import Lifeline, ZschedProc, die_with_parent

lifeline = Lifeline(grace=30)
kids = {}
def launch():
    kids["worker"] = ZschedProc(["worker", "scheduler.shell.demo:worker", "--redis", sys.argv[1]], metrics=False,
                                log=Path(sys.argv[2]), lifeline=lifeline).start()
launcher = threading.Thread(target=launch)
launcher.start()
launcher.join()
sleeper = subprocess.Popen(die_with_parent(["sleep", "600"], signal.SIGTERM))
print(kids["worker"].pid, sleeper.pid, flush=True)
threading.Event().wait()  # until the test kills this process
"""


def test_children_stop_when_their_parent_is_killed_even_if_their_launcher_thread_ended(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, f"redis://127.0.0.1:{free_port()}/0", str(log)],
                              stdout=subprocess.PIPE, text=True)
    kids: dict[int, str] = {}
    try:
        assert parent.stdout is not None
        assert select.select([parent.stdout], [], [], 60)[0], "the parent printed no pids"
        worker, sleeper = map(int, parent.stdout.readline().split())
        kids = {pid: st for pid in (worker, sleeper) if (st := start_time(pid)) is not None}
        assert len(kids) == 2
        deadline = time.monotonic() + 60
        while "Redis unavailable" not in log.read_text():  # serving well after its launcher thread ended
            assert time.monotonic() < deadline and start_time(worker) is not None, log.read_text()
            time.sleep(0.05)
        parent.kill()
        parent.wait()
        assert not wait_gone(kids, BOUND), f"still running {BOUND:g}s after their parent was killed"
        out = log.read_text()
        assert "the process that started this one is gone; stopping" in out and "worker stopped" in out, out
        assert "Traceback" not in out, out
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        for pid in kids:
            if start_time(pid) == kids[pid]:
                os.kill(pid, signal.SIGKILL)


def test_a_server_whose_parent_died_before_its_death_signal_was_set_does_not_run() -> None:
    """``die_with_parent`` names the parent it expects: run by any other process (as when the
    parent died between fork and prctl and the child was reparented) the program never starts."""
    argv = die_with_parent(["sleep", "30"])
    assert argv[-2:] == ["sleep", "30"] and argv[0].endswith("setpriv")
    # an intermediate shell that forks (the command is not its last): setpriv's parent is not us
    t0 = time.monotonic()
    orphan = subprocess.run(["/bin/sh", "-c", '"$@"; exit $?', "sh", *argv], timeout=20)
    assert orphan.returncode == 125 and time.monotonic() - t0 < 20
    child = subprocess.Popen(argv)  # from its expected parent: it runs (sleep's pid is the child's own)
    try:
        deadline = time.monotonic() + 10
        while not re.match(rb"sleep\x0030", Path(f"/proc/{child.pid}/cmdline").read_bytes()):
            assert time.monotonic() < deadline and child.poll() is None, "sleep did not start"
            time.sleep(0.02)
    finally:
        child.kill()
        child.wait()
