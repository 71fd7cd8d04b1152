"""Run real ``zsched`` processes (scheduler replicas, workers) for integration and fault tests.
Only processes started here are ever signalled, by their own PID."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Sequence

from tests.servers import free_port

REPO = Path(__file__).resolve().parent.parent


class ZschedProc:
    """A ``python -m scheduler.cli ARGS`` child process with its log in a temp file."""

    def __init__(self, args: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                 metrics: bool = True) -> None:
        self.metrics_port = free_port() if metrics else None
        self.args = list(args) + (["--metrics-port", str(self.metrics_port)] if metrics else [])
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.log = Path(tempfile.mkstemp(prefix="zsched-proc-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "ZschedProc":
        fh = open(self.log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "scheduler.cli", *self.args], stdout=fh,
                                     stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd)
        fh.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait(5)

    def term(self, timeout: float = 10) -> int:
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def scrape(self) -> str:
        assert self.metrics_port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
            return r.read().decode()

    def metric(self, name: str) -> float:
        """Sum of all samples of ``name`` (any labels) on this process's /metrics."""
        total = 0.0
        for line in self.scrape().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total


def scheduler_proc(redis_url: str, etcd: str, namespace: str, replica: str, *, ttl: float = 2.0,
                   env: dict[str, str] | None = None, extra: Sequence[str] = ()) -> ZschedProc:
    return ZschedProc(["scheduler", "--redis", redis_url, "--etcd", etcd, "--namespace", namespace,
                       "--replica-id", replica, "--lease-ttl", str(ttl), *extra], env=env)


def wait_until(pred, timeout: float, interval: float = 0.02, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
