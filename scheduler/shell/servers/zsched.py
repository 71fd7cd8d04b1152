"""``zsched`` child processes (scheduler replicas, workers): ``python -m scheduler ARGS`` with its
output in a log file, for ``zsched dev``, the integration tests and the benchmarks."""

from __future__ import annotations

import atexit
import os
import signal
import sys
import tempfile
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Self

from prometheus_client.parser import text_string_to_metric_families

from .lifeline import Lifeline
from .ports import HOST, free_port
from .process import LOG_TAIL_LINES, ChildProcess, shutdown_all

STOP_TIMEOUT_S = 10.0

# The temp logs made for children started without ``log``: removed when this process exits, so
# a test session or a benchmark does not leave hundreds of them in /tmp (a run of the suite made
# about 900).  Not earlier: tests read a stopped child's output, and a child that outlives us
# (a lifeline child still stopping) keeps writing to the unlinked file harmlessly.
OWNED_LOGS: set[Path] = set()


def remove_owned_logs() -> None:
    """Delete the temp logs :class:`ZschedProc` made (registered with :mod:`atexit`)."""
    for log in list(OWNED_LOGS):
        log.unlink(missing_ok=True)
        OWNED_LOGS.discard(log)


atexit.register(remove_owned_logs)


class ZschedProc(ChildProcess):
    """A ``python -m scheduler ARGS`` child process.

    ``metrics``: add ``--metrics-port`` with a free port (``metrics_port``), for :meth:`metric`.
    ``log``: where its output goes (default: a new ``/tmp/zsched-proc-*.log``, removed when this
    process exits).
    ``new_session``: its own session, so a Ctrl-C in our terminal does not reach it.
    ``lifeline``: it stops by itself (SIGTERM, then SIGKILL) once this process is gone, even if
    this process was SIGKILLed (:mod:`~scheduler.shell.servers.lifeline`); without, it runs on.
    Secrets (a Redis URL with a password) belong in ``env`` (``ZSCHED_REDIS_URL``), never in
    ``args``, where ``ps`` shows them to every user.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        metrics: bool = True,
        log: Path | None = None,
        new_session: bool = False,
        lifeline: Lifeline | None = None,
    ) -> None:
        if log is None:
            fd, name = tempfile.mkstemp(prefix="zsched-proc-", suffix=".log")
            os.close(fd)
            log = Path(name)
            OWNED_LOGS.add(log)
        super().__init__(log)
        self.metrics_port = free_port() if metrics else None
        self.args = list(args) + (["--metrics-port", str(self.metrics_port)] if metrics else [])
        self.env = {**os.environ, **(env or {}), **(lifeline.env() if lifeline else {})}
        self.cwd = cwd
        self.new_session = new_session
        self.lifeline = lifeline

    def argv(self) -> list[str]:
        """The command line: this interpreter running ``-m scheduler`` with ``args``."""
        return [sys.executable, "-m", "scheduler", *self.args]

    def start(self) -> Self:
        """Start the process (no readiness wait: callers know what "ready" means for them)."""
        self.launch(self.argv(), cwd=self.cwd, env=self.env, new_session=self.new_session,
                    pass_fds=self.lifeline.fds if self.lifeline else ())
        return self

    @property
    def pid(self) -> int:
        """The process's pid (it must have been started)."""
        assert self.proc is not None, "not started"
        return self.proc.pid

    @property
    def alive(self) -> bool:
        """True while the process runs."""
        return self.running

    def wait(self, timeout: float) -> int:
        """Wait for the process to exit; its exit code (raises ``subprocess.TimeoutExpired``)."""
        assert self.proc is not None, "not started"
        return self.proc.wait(timeout)

    def term(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait up to ``timeout`` s for the exit code (no SIGKILL)."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM (and SIGCONT, in case it is stopped), SIGKILL after ``timeout`` s."""
        self.shutdown(timeout)

    def output(self) -> str:
        """Everything the process has written so far."""
        return self.log.read_text(errors="replace")

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the log, headed by the command, for assertion messages."""
        return f"--- log of {' '.join(self.args[:9])} (pid {self.proc.pid if self.proc else None}) ---\n" + (
            self.log_tail(lines)
        )

    def scrape(self) -> str:
        """The process's ``/metrics`` page (it must run with ``metrics=True``)."""
        assert self.metrics_port is not None, "started without metrics"
        with urllib.request.urlopen(f"http://{HOST}:{self.metrics_port}/metrics", timeout=2) as r:
            return bytes(r.read()).decode()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of all samples named ``name`` on this process's /metrics whose labels include
        ``labels`` (any labels when none are given)."""
        total = 0.0
        for family in text_string_to_metric_families(self.scrape()):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def try_metric(self, name: str, default: float | None = None, **labels: str) -> float | None:
        """``metric()``, or ``default`` while /metrics does not answer (process starting or frozen)."""
        try:
            return self.metric(name, **labels)
        except OSError:
            return default


def stop_all(procs: Iterable[ZschedProc], timeout: float = STOP_TIMEOUT_S) -> None:
    """``stop()`` every one of ``procs`` at once (SIGTERM to all, SIGKILL to those still up after
    ``timeout`` s): as long as the slowest stop, not the sum."""
    shutdown_all(procs, timeout)


def scheduler_proc(
    redis_url: str,
    etcd: str,
    namespace: str,
    replica: str,
    *,
    ttl: float = 2.0,
    env: dict[str, str] | None = None,
    extra: Sequence[str] = (),
    lifeline: Lifeline | None = None,
) -> ZschedProc:
    """A ``zsched scheduler`` replica (not started) with a metrics port; the Redis URL and the etcd
    endpoints go through the environment (they may carry passwords), over any in ``env``.
    ``lifeline``: it stops by itself once this process is gone (:class:`ZschedProc`)."""
    return ZschedProc(
        ["scheduler", "--namespace", namespace, "--replica-id", replica, "--lease-ttl", str(ttl), *extra],
        env={**(env or {}), "ZSCHED_REDIS_URL": redis_url, "ZSCHED_ETCD_ENDPOINTS": etcd},
        lifeline=lifeline,
    )


def ui_proc(redis_url: str, namespace: str, *, port: int, token: str, etcd: str | None = None,
            read_only: bool = False, log: Path | None = None, new_session: bool = False,
            extra: Sequence[str] = (), lifeline: Lifeline | None = None) -> ZschedProc:
    """A ``zsched ui`` console (not started) on 127.0.0.1:``port``; the Redis URL, the etcd endpoints
    and the token go through the environment (``ps`` shows argv to every user). ``extra``: more
    ``zsched ui`` options."""
    args = ["ui", "--namespace", namespace, "--port", str(port), "--refresh", "1", *extra]
    if read_only:
        args.append("--read-only")
    env = {"ZSCHED_REDIS_URL": redis_url, "ZSCHED_UI_TOKEN": token}
    if etcd:
        env["ZSCHED_ETCD_ENDPOINTS"] = etcd
    return ZschedProc(args, env=env, metrics=False, log=log, new_session=new_session, lifeline=lifeline)
