"""``zsched dev``: the README's "run it" command starts the whole stack, shows the live view, and
stops everything it started."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.devstack import processes_mentioning


def test_dev_stack_runs_the_demo_and_leaves_no_process_behind(tmp_path: Path) -> None:
    home = tmp_path / "zs"
    out = subprocess.run([sys.executable, "-m", "scheduler", "dev", "--duration", "12", "--plain",
                          "--home", str(home), "--namespace", "devtest"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "stack up: export ZSCHED_REDIS_URL=redis://127.0.0.1:" in text
    assert "stopped, no process left behind" in text
    last = text.rsplit("zsched dev - namespace devtest", 1)[1]
    acked = int(re.search(r"acked (\d+)\s+retried", last).group(1))
    assert acked > 0, last
    assert re.search(r"^emails\s+\d+", last, re.M), last
    owners = re.findall(r"^  scheduler-\d\s+(\d+):", last, re.M)
    assert len(owners) == 3 and sum(map(int, owners)) == 16, last
    assert "firing lateness" in last
    assert (home / "redis").is_dir() and (home / "etcd").is_dir() and (home / "logs" / "worker-1.log").exists()
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
