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
from collections.abc import Sequence
from pathlib import Path

from tests.servers import free_port

REPO = Path(__file__).resolve().parent.parent


class ZschedProc:
    """A ``python -m scheduler ARGS`` child process with its log in a temp file."""

    def __init__(self, args: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
                 metrics: bool = True) -> None:
        self.metrics_port = free_port() if metrics else None
        self.args = list(args) + (["--metrics-port", str(self.metrics_port)] if metrics else [])
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self.log = Path(tempfile.mkstemp(prefix="zsched-proc-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ZschedProc:
        fh = open(self.log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "scheduler", *self.args], stdout=fh,
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

    def metric(self, name: str, **labels: str) -> float:
        """Sum of all samples of ``name`` on this process's /metrics whose labels include ``labels``
        (any labels when none are given)."""
        total = 0.0
        for line in self.scrape().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                if labels:
                    have = _labels(line[len(name):].rsplit(" ", 1)[0])
                    if any(have.get(k) != v for k, v in labels.items()):
                        continue
                total += float(line.rsplit(" ", 1)[1])
        return total

    def try_metric(self, name: str, default: float | None = None, **labels: str) -> float | None:
        """``metric()``, or ``default`` while /metrics does not answer (process starting or frozen)."""
        try:
            return self.metric(name, **labels)
        except OSError:
            return default

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log, prefixed with the command, for assertion messages."""
        text = "\n".join(self.output().splitlines()[-lines:])
        return f"--- log of {' '.join(self.args[:9])} (pid {self.proc.pid if self.proc else None}) ---\n{text}"


def _labels(text: str) -> dict[str, str]:
    """``{a="x",b="y"}`` -> {"a": "x", "b": "y"} (Prometheus text format; no escaped quotes expected)."""
    text = text.strip()
    if not text.startswith("{"):
        return {}
    out: dict[str, str] = {}
    for part in text[1:-1].split('",'):
        if "=" in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip().strip('"')
    return out


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
