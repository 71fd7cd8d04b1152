"""``zsched dev``: the README's "run it" command starts the whole stack, shows the live view, and
stops everything it started."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.devstack import processes_mentioning
from tests.support.waits import wait_until

UP_BOUND = 90.0  # seconds for the demo stack to show a settled view (start-ups overlap on a busy machine)
HEADER = "zsched dev - namespace devtest"


def _settled(frame: str) -> bool:
    """A frame of the view of the whole stack at work: jobs acked, the demo's queues, the 16
    partitions shared by the 3 replicas, the firing lateness."""
    acked = re.search(r"acked (\d+)\s+retried", frame)
    owners = re.findall(r"^  scheduler-\d\s+(\d+):", frame, re.M)
    return (acked is not None and int(acked.group(1)) > 0 and re.search(r"^emails\s+\d+", frame, re.M) is not None
            and len(owners) == 3 and sum(map(int, owners)) == 16 and "firing lateness" in frame)


def ctrl_c(proc: subprocess.Popen[bytes], err_path: Path) -> None:
    """Still running, it stops on Ctrl-C with status 0 (its stderr shown if not)."""
    assert proc.poll() is None, err_path.read_text()[-3000:]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) == 0, err_path.read_text()[-3000:]


def kill_if_running(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_dev_stack_runs_the_demo_and_leaves_no_process_behind(tmp_path: Path) -> None:
    """The view is read as it is printed, until a whole frame shows the stack at work (about 4 s
    after "stack up" on an idle machine), rather than for a fixed --duration; then Ctrl-C."""
    home = tmp_path / "zs"
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "scheduler", "dev", "--plain", "--home", str(home),
                                 "--namespace", "devtest"], stdout=out, stderr=err, cwd=tmp_path)

    def frames() -> list[str]:  # the whole frames so far (the last one may still be printing)
        return out_path.read_text(errors="replace").split(HEADER)[1:-1]

    try:
        wait_until(lambda: any(map(_settled, frames())) or proc.poll() is not None, UP_BOUND,
                   what=lambda: f"a frame of the stack at work:\n{out_path.read_text()[-3000:]}")
        ctrl_c(proc, err_path)
    finally:
        kill_if_running(proc)
    text = out_path.read_text()
    assert "stack up: export ZSCHED_REDIS_URL=redis://127.0.0.1:" in text
    assert "stopped, no process left behind" in text
    assert (home / "redis").is_dir() and (home / "etcd").is_dir() and (home / "logs" / "worker-1.log").exists()
    assert processes_mentioning(str(home)) == [], "a child process outlived zsched dev"


def test_dev_stack_rides_out_a_redis_stall_and_says_so(tmp_path: Path) -> None:
    """Its Redis frozen (SIGSTOP) past the clients' socket timeouts: the view says so each interval
    instead of ending the run (it stopped everything with a traceback from the demo producer and a
    message naming another Redis), the stack keeps running, and once Redis answers again jobs
    fire and are acked; Ctrl-C still stops everything."""
    home = tmp_path / "zs"
    out_path, err_path = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "scheduler", "dev", "--home", str(home),
                                 "--namespace", "devstall"], stdout=out, stderr=err, cwd=tmp_path)

    def text() -> str:
        return out_path.read_text(errors="replace")

    def running_or_ended(seen: object) -> object:
        return seen or proc.poll() is not None

    try:
        wait_until(lambda: running_or_ended("/s: " in text()), UP_BOUND, what=lambda: f"the view:\n{text()[-3000:]}")
        assert proc.poll() is None, err_path.read_text()[-3000:]
        url = re.search(r"ZSCHED_REDIS_URL=(redis://127\.0\.0\.1:(\d+)/0)", text())
        assert url is not None, text()[-3000:]
        (pid, _cmd), = processes_mentioning(f"redis-server 127.0.0.1:{url.group(2)}")
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_until(lambda: running_or_ended("does not answer" in text()), 90,
                       what=lambda: f"the view to say Redis does not answer:\n{text()[-3000:]}")
        finally:
            with contextlib.suppress(ProcessLookupError):  # gone if zsched dev stopped everything
                os.kill(pid, signal.SIGCONT)
        assert proc.poll() is None, err_path.read_text()[-3000:]
        assert f"Redis at {url.group(1)} does not answer" in text() and "the stack keeps running" in text()
        thawed = len(text())
        wait_until(lambda: running_or_ended(re.search(r"acked [1-9]", text()[thawed:])), 60,
                   what=lambda: f"jobs acked again:\n{text()[-3000:]}")
        ctrl_c(proc, err_path)
    finally:
        kill_if_running(proc)
    everything = text() + err_path.read_text(errors="replace")
    assert "stopped, no process left behind" in text() and "Traceback" not in everything, everything[-3000:]
    assert processes_mentioning(str(home)) == [], "a child process outlived zsched dev"


def test_dev_stack_stops_by_itself_after_its_duration(tmp_path: Path) -> None:
    """``--duration``: the stack (the smallest one) stops by itself, everything it started with it."""
    home = tmp_path / "zs"
    out = subprocess.run([sys.executable, "-m", "scheduler", "dev", "--duration", "1", "--plain", "--no-demo",
                          "--replicas", "1", "--workers", "0", "--home", str(home), "--namespace", "devdur"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "stopping (--duration)" in out.stdout and "stopped, no process left behind" in out.stdout, out.stdout
    assert processes_mentioning(str(home)) == [], "a child process outlived zsched dev"


def test_dev_stack_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    import signal
    import time
    home = tmp_path / "zs"
    proc = subprocess.Popen([sys.executable, "-m", "scheduler", "dev", "--plain", "--no-demo",
                             "--home", str(home), "--namespace", "devint"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        buf = ""
        while "partition owners" not in buf:
            assert time.monotonic() < deadline, buf[-2000:]
            buf += proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        assert "stopped, no process left behind" in rest
        assert processes_mentioning(str(home)) == []
    finally:
        if proc.poll() is None:
            proc.kill()


def test_dev_stack_keeps_a_redis_password_out_of_banners_logs_and_child_command_lines(tmp_path: Path) -> None:
    """A ``--redis`` URL with a password: the banner and the view mask it, and the children get the
    URL through their environment, so ``ps`` (any user's) never shows it."""
    import os
    import signal
    import time

    from tests.support.servers import RedisServer

    secret = "s3cr3t-Pw"
    home = tmp_path / "zs"
    with RedisServer() as srv:
        # an ACL user with a password (the default user stays open for the harness's readiness probe)
        srv.command("ACL", "SETUSER", "app", "on", f">{secret}", "~*", "&*", "+@all")
        url = f"redis://app:{secret}@127.0.0.1:{srv.port}/0"
        proc = subprocess.Popen([sys.executable, "-m", "scheduler", "dev", "--plain", "--no-demo",
                                 "--redis", url, "--replicas", "1", "--workers", "0",
                                 "--home", str(home), "--namespace", "devpw"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
        try:
            deadline = time.monotonic() + 60
            buf = ""
            while "partition owners" not in buf:
                assert time.monotonic() < deadline, buf[-2000:]
                buf += proc.stdout.readline()
            # not zsched dev itself
            children = [pid for pid, _cmd in processes_mentioning(str(home)) if pid != proc.pid]
            assert children, "no child process found"
            for pid in children:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    assert secret.encode() not in f.read(), f"the password is on pid {pid}'s command line"
            proc.send_signal(signal.SIGINT)
            rest, _ = proc.communicate(timeout=60)
            assert proc.returncode == 0
            out = buf + rest
            assert "ZSCHED_REDIS_URL=redis://app:***@127.0.0.1" in out
            assert secret not in out
            for log in (home / "logs").glob("*.log"):
                assert secret not in log.read_text(), f"the password is in {log}"
            assert os.path.exists(home / "logs" / "scheduler-1.log")
            assert "stopped, no process left behind" in rest
            assert processes_mentioning(str(home)) == [], "a child process outlived zsched dev"
        finally:
            if proc.poll() is None:
                proc.kill()
