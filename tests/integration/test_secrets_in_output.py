"""No password in any output: every ``zsched`` command, given Redis and etcd URLs with passwords,
against servers that cannot be reached (a closed port), that refuse (accept and hang up) or stall
(accept and never answer), and real servers that refuse the credentials (a Redis ACL user, an etcd
with auth enabled); also with the right credentials, where a command gets that far. All output is
searched: stdout, stderr, the log, the console's pages, /metrics and, for ``zsched dev``, its
children's log files and command lines (``ps`` shows those to every user).

The operator commands are found by walking the parser (a new one that takes ``--redis`` or
``--etcd`` is covered once its required arguments are in :data:`REQUIRED`) and run in-process;
the long-running ones (``scheduler``, ``worker``, ``ui``, ``dev``) run as real processes, stopped
once they have logged a retry. Each password is searched raw, percent-encoded and by its last four
characters (a partial leak).
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import pytest

from scheduler import Client
from scheduler.redisio.connection import sync_redis
from scheduler.shell.cli import build_parser, main
from scheduler.shell.servers import etcd_request, free_port
from tests.support.servers import EtcdServer, RedisServer
from tests.support.waits import wait_until

ZSCHED = [sys.executable, "-m", "scheduler"]
NS = "secrets"
USER = "zsched-secrets"
REDIS_PW = "Pw-redis/7f3k"       # what the commands are given where it is wrong
REDIS_OK_PW = "Pw-redisok/4m8w"  # the ACL user's password, given where Redis must answer
ETCD_PW = "Pw-etcd/9q2x"
ETCD_OK_PW = "Pw-etcdok/2v6n"
SECRETS = [form for pw in (REDIS_PW, REDIS_OK_PW, ETCD_PW, ETCD_OK_PW) for form in (pw, quote(pw, safe=""), pw[-4:])]
DEADLINE = 60.0
LONG_RUNNING = ("scheduler", "worker", "ui", "dev", "relay")
JOB = "0" * 30
# the arguments each operator command requires besides --redis (and --etcd)
REQUIRED: dict[str, list[str]] = {
    "schedule": ["--at", "+1h", "--queue", "q", "--payload", "{}"],
    "job show": [JOB], "job cancel": [JOB], "job reschedule": [JOB, "--at", "+1h"],
    "job list": ["--queue", "q", "--state", "scheduled"],
    "dead list": [], "dead show": [JOB], "dead requeue": [JOB], "dead purge": [JOB], "dead retention": [],
    "stats": [], "workers": [], "queue pause": ["q"], "queue resume": ["q"], "queue list": [],
    "namespace settings": [], "namespace tombstone-ttl": [],
    "cron add": ["nightly", "0 9 * * *", "--queue", "q"], "cron list": [], "cron remove": ["nightly"],
    "cron pause": ["nightly"], "cron resume": ["nightly"],
    "epochs show": [], "epochs reset": ["--partition", "0", "--yes"], "migrate-partitions": ["--to", "4"],
    # the retention comes from the namespace (Redis) before PostgreSQL is reached
    "effects prune": ["--postgres", "no_such_option=1"],
}


def leaks(text: str) -> list[str]:
    """The forms of the passwords that ``text`` shows."""
    return [s for s in SECRETS if s in text]


def commands() -> list[tuple[str, set[str]]]:
    """Every runnable ``zsched`` command (``"job show"``) with its options."""
    out: list[tuple[str, set[str]]] = []

    def walk(p: argparse.ArgumentParser, path: list[str]) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out.append((" ".join(path), {o for a in p._actions for o in a.option_strings}))
            return
        for name, child in subs[0].choices.items():
            walk(child, [*path, name])

    walk(build_parser(), [])
    return out


def operator_commands(option: str) -> list[str]:
    return [name for name, opts in commands() if option in opts and name.split()[0] not in LONG_RUNNING]


# ------------------------------------------------------------------------------ the servers


class Refuser:
    """A loopback port that accepts connections and closes them at once."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="refuser")
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            conn.close()

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.sock.close()


@dataclass
class Targets:
    """The servers: ports and the URLs with passwords to reach them."""

    redis_port: int         # the session redis-server, with the ACL user USER (password REDIS_OK_PW)
    etcd_port: int          # an etcd with auth enabled (user root, password ETCD_OK_PW)
    closed: int = field(default_factory=free_port)
    refusing: int = 0
    stalled: int = 0        # listens, never accepts: connections complete and then hear nothing

    def redis(self, kind: str) -> str:
        """A Redis URL with a password for ``kind`` of server (``ok``: the right credentials)."""
        if kind == "ok":
            return f"redis://{USER}:{quote(REDIS_OK_PW, safe='')}@127.0.0.1:{self.redis_port}/0"
        if kind == "query":  # the password as a query option, to a closed port
            return f"redis://127.0.0.1:{self.closed}/0?password={quote(REDIS_PW, safe='')}"
        port = {"closed": self.closed, "refusing": self.refusing, "stalled": self.stalled,
                "wrong": self.redis_port}[kind]
        timeouts = "?socket_connect_timeout=0.1&socket_timeout=0.1" if kind == "stalled" else ""
        return f"redis://{USER}:{quote(REDIS_PW, safe='')}@127.0.0.1:{port}/0{timeouts}"

    def etcd(self, kind: str) -> str:
        """An etcd endpoint with a password for ``kind`` of server (``ok``: the right credentials)."""
        pw = ETCD_OK_PW if kind == "ok" else ETCD_PW
        port = {"closed": self.closed, "refusing": self.refusing, "stalled": self.stalled,
                "wrong": self.etcd_port, "ok": self.etcd_port}[kind]
        return f"http://root:{quote(pw, safe='')}@127.0.0.1:{port}"


@pytest.fixture(scope="module")
def secured_etcd() -> Iterator[EtcdServer]:
    """An etcd with auth enabled: user root, password ETCD_OK_PW (what ``etcdctl user add root;
    etcdctl user grant-role root root; etcdctl auth enable`` do, through the HTTP gateway)."""
    with EtcdServer() as srv:
        etcd_request(srv.endpoint, "/v3/auth/user/add", {"name": "root", "password": ETCD_OK_PW})
        etcd_request(srv.endpoint, "/v3/auth/role/add", {"name": "root"})
        etcd_request(srv.endpoint, "/v3/auth/user/grant", {"user": "root", "role": "root"})
        etcd_request(srv.endpoint, "/v3/auth/enable", {})
        yield srv


@pytest.fixture
def targets(redis_server: RedisServer, redis_url: str, secured_etcd: EtcdServer) -> Iterator[Targets]:
    r = sync_redis(redis_url)
    r.acl_setuser(USER, enabled=True, passwords=[f"+{REDIS_OK_PW}"], keys=["*"], channels=["*"], commands=["+@all"])
    r.close()
    Client.from_url(redis_url, namespace=NS, partitions=4).connect().close()  # the namespace exists
    refuser = Refuser()
    staller = socket.create_server(("127.0.0.1", 0), backlog=256)
    try:
        yield Targets(redis_server.port, secured_etcd.port, refusing=refuser.port,
                      stalled=staller.getsockname()[1])
    finally:
        refuser.close()
        staller.close()


# ------------------------------------------------------------------- the operator commands


def run_in_process(argv: list[str], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
                   monkeypatch: pytest.MonkeyPatch, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``zsched ARGV`` in this process: its exit code and everything it printed and logged."""
    capsys.readouterr()
    caplog.clear()
    with monkeypatch.context() as m:
        for k, v in (env or {}).items():
            m.setenv(k, v)
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, f"{out}\n{err}\n{caplog.text}"


@pytest.mark.parametrize("redis_kind", ["closed", "refusing", "stalled", "wrong", "query", "ok"])
def test_operator_commands_never_print_a_redis_or_etcd_password(
        redis_kind: str, targets: Targets, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    problems = []
    with_etcd = operator_commands("--etcd")
    for name in operator_commands("--redis"):
        assert name in REQUIRED, f"zsched {name} takes --redis: add its required arguments to REQUIRED"
        argv = [*name.split(), *REQUIRED[name], "--redis", targets.redis(redis_kind), "--namespace", NS]
        if name in with_etcd:
            argv += ["--etcd", targets.etcd("closed"), "--etcd-timeout", "0.2"]
        rc, text = run_in_process(argv, capsys, caplog, monkeypatch)
        # ok: done, or the made-up job or cron is not found (1 or 2)
        expected = {0, 1, 2} if redis_kind == "ok" else {3}
        if rc not in expected or (rc and "zsched: error:" not in text):
            problems.append(f"zsched {name}: exit {rc}, expected {expected}:\n{text[-1500:]}")
        if leaks(text):
            problems.append(f"zsched {name} shows {leaks(text)}:\n{text[-3000:]}")
    assert not problems, "\n\n".join(problems)


@pytest.mark.parametrize("etcd_kind", ["closed", "refusing", "stalled", "wrong"])
def test_operator_commands_that_read_etcd_never_print_its_password(
        etcd_kind: str, targets: Targets, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis answers (the right password), etcd does not: the owners are shown as unknown, with a
    warning that names the endpoints, masked, and why (in the table and in --json)."""
    caplog.set_level(logging.DEBUG)
    names = operator_commands("--etcd")
    assert {"stats", "epochs show"} <= set(names)
    problems = []
    for name in names:
        base = [*name.split(), *REQUIRED[name], "--redis", targets.redis("ok"), "--namespace", NS,
                "--etcd-timeout", "0.3"]
        runs = [(base + ["--etcd", targets.etcd(etcd_kind)], None),
                (base + ["--json"], {"ZSCHED_ETCD_ENDPOINTS": targets.etcd(etcd_kind)})]
        for argv, env in runs:
            rc, text = run_in_process(argv, capsys, caplog, monkeypatch, env)
            if rc != 0 or "did not answer" not in text or "root:***@127.0.0.1" not in text:
                problems.append(f"zsched {name}: exit {rc}, expected 0 and a masked warning:\n{text[-1500:]}")
            if leaks(text):
                problems.append(f"zsched {name} shows {leaks(text)}:\n{text[-3000:]}")
    assert not problems, "\n\n".join(problems)


# ------------------------------------------------------------------ the long-running commands


@dataclass
class Run:
    """A long-running command as a real process, its output in ``log``."""

    name: str
    argv: list[str]
    wait_for: str = ""        # the line that shows it retried (then it is stopped); "" = it must exit
    code: int = 3             # the exit code expected when it exits by itself
    env: dict[str, str] = field(default_factory=dict)
    page: bool = False        # a console: fetch its overview page before stopping it
    metrics: bool = False     # fetch /metrics (on ``port``) before stopping it
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log: Path = Path()
    seen: str = ""            # pages and metrics fetched


def long_running_runs(t: Targets) -> list[Run]:
    worker = ["worker", "scheduler.shell.demo:worker", "--namespace", NS]
    etcd_retry = r"cannot reach etcd at"
    runs: list[Run] = []
    for kind in ("closed", "refusing", "stalled"):
        runs += [
            Run(f"scheduler, Redis {kind}", ["scheduler", "--namespace", NS, "--redis", t.redis(kind), "--etcd",
                                             t.etcd("ok")], wait_for="cannot reach Redis at",
                metrics=kind == "closed"),
            Run(f"scheduler, etcd {kind}", ["scheduler", "--namespace", NS],
                env={"ZSCHED_REDIS_URL": t.redis("ok"), "ZSCHED_ETCD_ENDPOINTS": t.etcd(kind)}, wait_for=etcd_retry),
            Run(f"worker, Redis {kind}", [*worker, "--redis", t.redis(kind)], wait_for="retrying with backoff"),
        ]
    runs += [
        Run("scheduler, Redis password wrong", ["scheduler", "--namespace", NS, "--redis", t.redis("wrong")]),
        Run("scheduler, etcd password wrong", ["scheduler", "--namespace", NS, "--redis", t.redis("ok"),
                                               "--etcd", t.etcd("wrong")]),
        Run("worker, Redis password wrong", [*worker], env={"ZSCHED_REDIS_URL": t.redis("wrong")}),
        Run("worker, Redis password in the query", [*worker, "--redis", t.redis("query")],
            wait_for="retrying with backoff"),
        Run("ui, Redis unreachable", ["ui", "--namespace", NS, "--port", "0", "--redis", t.redis("closed"),
                                      "--etcd", t.etcd("closed")]),
        Run("ui, Redis password wrong", ["ui", "--namespace", NS, "--port", "0", "--redis", t.redis("wrong")]),
    ]
    for kind in ("closed", "wrong"):  # the outbox relay: a PostgreSQL URL with a password too
        pg = re.sub(r"^redis://", "postgresql://", t.redis("closed")).rsplit("/", 1)[0] + "/db"
        runs.append(Run(f"relay, Redis {kind}", ["relay", "--namespace", NS, "--redis", t.redis(kind),
                                                 "--postgres", pg], **({"wait_for": "unavailable"} if kind == "closed"
                                                                       else {})))
    for kind in ("closed", "wrong"):  # the console serves; its overview shows why owners are unknown
        runs.append(Run(f"ui, etcd {kind}", ["ui", "--namespace", NS, "--port", "0", "--redis", t.redis("ok"),
                                             "--etcd", t.etcd(kind)], wait_for=f"/ namespace {NS}", page=True))
    return runs


def _start(run: Run, cwd: Path) -> None:
    run.log = cwd / f"{run.name.replace(' ', '_').replace(',', '')}.log"
    if run.metrics:
        run.port = free_port()
        run.argv += ["--metrics-port", str(run.port)]
    with open(run.log, "wb") as out:
        run.proc = subprocess.Popen([*ZSCHED, *run.argv], stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                    env={**os.environ, **run.env})


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return bytes(resp.read()).decode(errors="replace")


def _finish(run: Run) -> str | None:
    """Wait for the retry line (then fetch what it serves and stop it) or for its exit; a problem
    or None."""
    proc = run.proc
    assert proc is not None
    try:
        if run.wait_for:
            wait_until(lambda: run.wait_for in run.log.read_text() or proc.poll() is not None, DEADLINE,
                       what=lambda: f"{run.name}: {run.wait_for!r}")
            if proc.poll() is not None:
                return f"{run.name}: exited {proc.returncode} before {run.wait_for!r}:\n{run.log.read_text()[-2000:]}"
            if run.page:  # the port it picked (--port 0), from its start-up line
                port = re.search(r"zsched ui: http://127\.0\.0\.1:(\d+)/", run.log.read_text())
                assert port is not None, run.log.read_text()
                run.seen += _fetch(f"http://127.0.0.1:{port.group(1)}/")
                if "owners: unavailable" not in run.seen:
                    return f"{run.name}: the overview does not say why owners are unknown:\n{run.seen[-2000:]}"
            if run.metrics:
                run.seen += _fetch(f"http://127.0.0.1:{run.port}/metrics")
            proc.send_signal(signal.SIGTERM)
            proc.wait(DEADLINE)
        elif proc.wait(DEADLINE) != run.code:
            return f"{run.name}: exit {proc.returncode}, expected {run.code}:\n{run.log.read_text()[-2000:]}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = run.log.read_text()
    if run.wait_for.startswith("cannot reach") and "***@127.0.0.1" not in text:
        return f"{run.name}: the retry line does not name the server (masked):\n{text[-2000:]}"
    shown = leaks(text + run.seen)
    return f"{run.name} shows {shown}:\n{text[-3000:]}\n{run.seen[-2000:]}" if shown else None


def test_long_running_commands_never_print_a_password(targets: Targets, tmp_path: Path) -> None:
    runs = long_running_runs(targets)
    for run in runs:
        _start(run, tmp_path)
    problems = [p for p in (_finish(run) for run in runs) if p]
    assert not problems, "\n\n".join(problems)


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (by /proc/*/stat's parent pid)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, parent in parents.items() if parent == p]
        found += kids
        todo += kids
    return found


def test_dev_keeps_redis_and_etcd_passwords_out_of_its_output_logs_and_child_command_lines(
        targets: Targets, tmp_path: Path) -> None:
    """``zsched dev`` with a Redis and an etcd that need passwords: the children (schedulers, the
    console) get them through their environment, never their argv; banner, view and logs mask them.
    The console's token is printed once, for the operator, and nowhere else."""
    home = tmp_path / "zs"
    log = tmp_path / "dev.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([*ZSCHED, "dev", "--plain", "--no-demo", "--replicas", "1", "--workers", "0",
                                 "--redis", targets.redis("ok"), "--etcd", targets.etcd("ok"), "--home", str(home),
                                 "--namespace", NS], stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_until(lambda: re.search(r"^  scheduler-1 +\d+:", log.read_text(), re.M) is not None
                 or proc.poll() is not None, DEADLINE,
                   what=lambda: f"the dev view to show an owner:\n{log.read_text()[-2000:]}")
        assert proc.poll() is None, log.read_text()[-3000:]
        token = re.search(r"actions need the token (\S+)\)", log.read_text())
        assert token is not None, log.read_text()[-3000:]
        children = _children(proc.pid)
        assert len(children) >= 2, "no scheduler or console child found"
        for pid in children:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # it ended meanwhile
            shown = leaks(cmdline) + ([token.group(1)] if token.group(1) in cmdline else [])
            assert not shown, f"pid {pid}'s command line shows {shown}: {cmdline}"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(DEADLINE) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert f"ZSCHED_ETCD_ENDPOINTS=http://root:***@127.0.0.1:{targets.etcd_port}" in text, text[-3000:]
    assert f"- etcd http://root:***@127.0.0.1:{targets.etcd_port}" in text, text[-3000:]
    assert not leaks(text), f"zsched dev shows {leaks(text)}:\n{text[-3000:]}"
    assert text.count(token.group(1)) == 1, "the console's token is printed more than once"
    for child_log in (home / "logs").glob("*.log"):
        child_text = child_log.read_text()
        assert not leaks(child_text) and token.group(1) not in child_text, f"{child_log} shows a secret"
