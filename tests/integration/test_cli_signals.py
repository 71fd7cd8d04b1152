"""Every ``zsched`` process stops on SIGINT and SIGTERM in every phase (docs/operations.md, "Stopping").

:data:`LONG_RUNNING` is the table of long-running commands and the phase each row catches them in
(start-up against an unreachable Redis or etcd, serving): a new command gets a row. Each test
starts every row at once (their start-ups overlap, so the table costs about one start-up), waits
for the line that proves the process is in that phase, signals it, and checks that it ends within
:data:`STOP_BOUND` s with the documented exit code (0). The bound is generous: the check is "it
stops", not a timing benchmark. One-shot commands (a paced ``dead requeue``, ``migrate-partitions``
waiting for running jobs) exit 130 on SIGINT and 143 on SIGTERM and say how to continue.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest

from scheduler import Client
from scheduler.protocol.codes import FailKind
from scheduler.shell.servers import free_port
from scheduler.testing.transitions import Ops
from tests.support.devstack import processes_mentioning
from tests.support.servers import EtcdServer

STOP_BOUND = 6.0  # seconds from the signal to the exit
PHASE_BOUND = 30.0  # seconds to reach the phase under test (start-ups overlap on a busy machine)
ZSCHED = [sys.executable, "-m", "scheduler"]
# The paced requeue (1 job/s) must still be running at the signal, sent once both phases are
# reached: each takes PHASE_BOUND at most, so it lasts longer than both (30 jobs at 5/s ended
# before the signal on a loaded machine and exited 0).
REQUEUE_JOBS = int(2 * PHASE_BOUND) + 10

APP = '''\
from workers import Worker

worker = Worker.from_url({url!r}, namespace="sigapp")


@worker.handler("default")
async def handle(job):
    pass


if __name__ == "__main__":
    worker.run()
'''


@dataclass
class Env:
    """What the rows are built from: live servers, a loopback port nothing listens on, a temp dir."""

    redis_url: str
    etcd: str
    tmp: Path
    dead: int = field(default_factory=free_port)

    @property
    def dead_redis(self) -> str:
        return f"redis://127.0.0.1:{self.dead}/0"

    @property
    def dead_etcd(self) -> str:
        return f"127.0.0.1:{self.dead}"


@dataclass(frozen=True)
class Row:
    """A long-running command in one phase: ``argv(env)`` (after ``python``), the regex of the
    output line that proves it reached the phase, and what its output must show once stopped."""

    name: str
    argv: Callable[[Env], list[str]]
    phase: str
    after: tuple[str, ...] = ()
    exit_code: int = 0


def _app(env: Env) -> list[str]:
    (env.tmp / "sigapp.py").write_text(APP.format(url=env.dead_redis))
    return ["-m", "sigapp"]


def _namespace(redis_url: str, ns: str) -> str:
    with Client.from_url(redis_url, namespace=ns).connect() as c:
        c.schedule(time.time() + 3600, {"n": 0}, queue="q")  # only schedule creates a namespace
    return ns


LONG_RUNNING = [
    Row("scheduler, Redis unreachable",
        lambda e: [*ZSCHED[1:], "scheduler", "--redis", e.dead_redis, "--etcd", e.dead_etcd],
        r"cannot reach Redis at redis://127\.0\.0\.1:\d+/0: .*retrying"),
    Row("scheduler, etcd unreachable",
        lambda e: [*ZSCHED[1:], "scheduler", "--redis", e.redis_url, "--etcd", e.dead_etcd, "--namespace", "sig"],
        r"cannot reach etcd at 127\.0\.0\.1:\d+: .*retrying"),
    Row("scheduler, serving",
        lambda e: [*ZSCHED[1:], "scheduler", "--redis", e.redis_url, "--etcd", e.etcd, "--namespace", "sig",
                   "--lease-ttl", "2"],
        r"scheduler replica \S+ up", after=(r"scheduler replica \S+ stopped in",)),
    Row("worker, Redis unreachable",
        lambda e: [*ZSCHED[1:], "worker", "scheduler.shell.demo:worker", "--redis", e.dead_redis],
        r"startup: Redis unavailable", after=(r"INFO zsched\.worker: worker stopped",)),
    Row("worker, serving",
        lambda e: [*ZSCHED[1:], "worker", "scheduler.shell.demo:worker", "--redis", e.redis_url, "--namespace", "sig"],
        r"worker serving namespace 'sig'", after=(r"worker stopped",)),
    # worker.run() as the program's entry point (docs/workers.md): it logs although the app set up no logging
    Row("python -m app (worker.run()), Redis unreachable", _app,
        r"WARNING zsched\.worker: startup: Redis unavailable", after=(r"INFO zsched\.worker: worker stopped",)),
    # the console serves without etcd (owners show as unknown); the namespace must exist
    Row("ui, serving, etcd unreachable",
        lambda e: [*ZSCHED[1:], "ui", "--redis", e.redis_url, "--namespace", _namespace(e.redis_url, "sigui"),
                   "--etcd", e.dead_etcd, "--port", str(free_port())],
        r"zsched ui: http://127\.0\.0\.1:\d+/ namespace sigui"),
    Row("relay, PostgreSQL unreachable",
        lambda e: [*ZSCHED[1:], "relay", "--redis", e.redis_url, "--namespace", "sig",
                   "--postgres", f"host=127.0.0.1 port={e.dead} user=postgres dbname=none"],
        r"relay: PostgreSQL at .* unavailable .*retrying", after=(r"relay stopped: moved 0 row",)),
    Row("dev, etcd unreachable, output not a terminal",
        lambda e: [*ZSCHED[1:], "dev", "--redis", e.redis_url, "--etcd", e.dead_etcd, "--no-demo", "--replicas", "1",
                   "--workers", "0", "--namespace", "sigdev", "--home", str(e.tmp / "dev")],
        # the compact line of a view that is not on a terminal
        r"(?m)^\d\d:\d\d:\d\d .*lateness p50 .* owners: ",
        after=(r"stopped, no process left behind",)),
]


class Proc:
    """A ``zsched`` process with stdout and stderr in one file (no pipe to fill up)."""

    def __init__(self, row: Row, env: Env, tag: str, extra_env: dict[str, str] | None = None) -> None:
        self.row = row
        self.log = env.tmp / f"{tag}.log"
        cwd = env.tmp
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, *row.argv(env)], stdout=out, stderr=subprocess.STDOUT,
                                         cwd=cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})})

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def reached(self) -> bool:
        if re.search(self.row.phase, self.output()):
            return True
        assert self.proc.poll() is None, f"{self.row.name}: exited {self.proc.returncode}:\n{self.output()[-3000:]}"
        return False


@pytest.fixture
def env(redis_url: str, etcd_endpoint: str, tmp_path: Path) -> Env:
    return Env(redis_url, etcd_endpoint, tmp_path)


def _wait(pred: Callable[[], bool], bound: float, what: str) -> None:
    deadline = time.monotonic() + bound
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {bound:g}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def started() -> Iterator[list[Proc]]:
    procs: list[Proc] = []
    yield procs
    for p in procs:  # only after a failure: what we started must not outlive the test
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_long_running_commands_stop_on_a_signal_in_every_phase(env: Env, started: list[Proc],
                                                               sig: signal.Signals) -> None:
    for i, row in enumerate(LONG_RUNNING):
        started.append(Proc(row, env, f"p{i}"))
    for p in started:
        _wait(p.reached, PHASE_BOUND, f"{p.row.name}: {p.row.phase!r}")
    signalled = {}
    for p in started:
        p.proc.send_signal(sig)
        signalled[p] = time.monotonic()
    problems = []
    for p in started:
        try:
            code = p.proc.wait(max(0.1, signalled[p] + STOP_BOUND - time.monotonic()))
        except subprocess.TimeoutExpired:
            problems.append(f"{p.row.name}: still running {STOP_BOUND:g}s after {sig.name}:\n{p.output()[-2000:]}")
            continue
        out = p.output()
        if code != p.row.exit_code:
            problems.append(f"{p.row.name}: exit {code}, expected {p.row.exit_code}:\n{out[-2000:]}")
        problems += [f"{p.row.name}: no {a!r} in:\n{out[-2000:]}" for a in p.row.after if not re.search(a, out)]
        if "Traceback" in out:
            problems.append(f"{p.row.name}: a traceback:\n{out[-3000:]}")
    assert not problems, "\n\n".join(problems)
    dev = next(p for p in started if p.row.name.startswith("dev"))
    assert "\x1b[2J" not in dev.output(), "the view redraws the screen although its output is a file"
    assert processes_mentioning(str(env.tmp / "dev")) == [], "a child of zsched dev outlived it"


# ------------------------------------------------------------------------------- one-shot commands


def _kill(client: Client, n: int) -> None:
    client.schedule_many([(timedelta(0), {"n": i}) for i in range(n)], queue="q")
    ops = Ops(client)
    for job in ops.claim("q", n):
        ops.fail(job, FailKind.PERMANENT)


def _one_shot(argv: list[str], tmp: Path, tag: str) -> tuple[subprocess.Popen[str], Path]:
    log = tmp / f"{tag}.err"
    with open(log, "w") as err:
        proc = subprocess.Popen([*ZSCHED, *argv], stdout=subprocess.DEVNULL, stderr=err, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, log


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_one_shot_commands_stop_on_a_signal_and_say_how_to_continue(redis_url: str, tmp_path: Path,
                                                                     sig: signal.Signals, code: int) -> None:
    ns_requeue, ns_migrate = f"sigrq{sig.value}", f"sigmg{sig.value}"
    with Client.from_url(redis_url, namespace=ns_requeue, partitions=2).connect() as c:
        _kill(c, REQUEUE_JOBS)
    with Client.from_url(redis_url, namespace=ns_migrate, partitions=2).connect() as c:
        c.schedule(timedelta(0), {"n": 0}, queue="q")
        assert len(Ops(c).claim("q", 1)) == 1  # a running job: the migration waits for it
    procs = {
        "requeue": _one_shot(["dead", "requeue", "--all", "--rate", "1", "--redis", redis_url,
                              "--namespace", ns_requeue], tmp_path, "requeue"),
        "migrate": _one_shot(["migrate-partitions", "--to", "4", "--wait-running", "60", "--redis", redis_url,
                              "--namespace", ns_migrate], tmp_path, "migrate"),
    }
    try:
        with Client.from_url(redis_url, namespace=ns_requeue).connect() as c:
            _wait(lambda: c.stats().get("q", {}).get("ready", 0) >= 1, PHASE_BOUND, "the first requeued job")
        _wait(lambda: "still running" in procs["migrate"][1].read_text(), PHASE_BOUND, "the migration to wait")
        for proc, _log in procs.values():
            proc.send_signal(sig)
        for name, (proc, log) in procs.items():
            assert proc.wait(STOP_BOUND) == code, f"{name}: {log.read_text()}"
            errors = [line for line in log.read_text().splitlines() if line.startswith("zsched:")]
            assert len(errors) == 1 and errors[0].startswith(f"zsched: interrupted by {sig.name}"), errors
            assert "Traceback" not in log.read_text()
        line = next(x for x in procs["requeue"][1].read_text().splitlines() if x.startswith("zsched:"))
        n = int(re.search(r"(\d+) job\(s\) were requeued", line).group(1))
        assert 1 <= n < REQUEUE_JOBS and "run the same command again" in line, line
        with Client.from_url(redis_url, namespace=ns_requeue).connect() as c:
            assert c.stats()["q"]["ready"] == n, "the line says how many were requeued"
    finally:
        for proc, _log in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ------------------------------------------------------------------ zsched dev while its servers start

FAKE_ETCD = "#!/bin/sh\n# an etcd that never answers: zsched dev is caught waiting for it to come up\nexec sleep 600\n"


def _children(pid: int) -> set[tuple[int, str]]:
    """(pid, start time) of the running children of ``pid`` (the start time tells a reused pid apart)."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add((int(entry), fields[19]))
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_dev_stops_on_a_signal_while_its_servers_start(tmp_path: Path, started: list[Proc],
                                                       sig: signal.Signals) -> None:
    fake = tmp_path / "etcd-never-ready"
    fake.write_text(FAKE_ETCD)
    fake.chmod(0o755)
    row = Row("dev, starting its servers",
              lambda e: [*ZSCHED[1:], "dev", "--no-demo", "--replicas", "1", "--workers", "0", "--namespace",
                         "sigdevup", "--home", str(e.tmp / "dev")],
              r"starting etcd on 127\.0\.0\.1:\d+", after=(r"stopped, no process left behind",))
    # ZSCHED_ETCD: the etcd binary zsched dev runs (scheduler.shell.servers.etcd)
    started.append(p := Proc(row, Env("", "", tmp_path), "devup", {"ZSCHED_ETCD": str(fake)}))
    _wait(p.reached, PHASE_BOUND, row.phase)
    _wait(lambda: len(_children(p.proc.pid)) == 2, PHASE_BOUND, "redis-server and etcd to be spawned")
    children = _children(p.proc.pid)
    assert "stack up" not in p.output(), "etcd came up: the test did not catch the start-up phase"
    p.proc.send_signal(sig)
    assert p.proc.wait(STOP_BOUND) == 0, p.output()
    out = p.output()
    assert all(re.search(a, out) for a in row.after) and "Traceback" not in out, out
    left = [pid for pid, start in children if _alive_as(pid, start)]
    assert not left, f"children of zsched dev still running: {left}"


def _alive_as(pid: int, start: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19] == start
    except OSError:
        return False


# ------------------------------------------------------------------ scheduler shutdown with etcd gone


@pytest.mark.parametrize("how", ["SIGSTOP", "kill -9"])
def test_scheduler_stops_promptly_when_etcd_is_gone(redis_url: str, fresh_etcd: EtcdServer, tmp_path: Path,
                                                     started: list[Proc], how: str) -> None:
    row = Row("scheduler, serving",
              lambda e: [*ZSCHED[1:], "scheduler", "--redis", e.redis_url, "--etcd", e.etcd, "--namespace", "sigetcd",
                         "--lease-ttl", "10"],
              r"partition \d+: acquired", after=(r"could not revoke the etcd lease on shutdown .* expires by itself",
                                                 r"scheduler replica \S+ stopped in"))
    started.append(p := Proc(row, Env(redis_url, fresh_etcd.endpoint, tmp_path), "etcdgone"))
    _wait(p.reached, PHASE_BOUND, row.phase)
    try:
        if how == "SIGSTOP":
            fresh_etcd.pause()
        else:
            fresh_etcd.kill()
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(STOP_BOUND) == 0, p.output()
    finally:
        if fresh_etcd.paused:
            fresh_etcd.resume()
    out = p.output()
    assert all(re.search(a, out) for a in row.after) and "Traceback" not in out, out
