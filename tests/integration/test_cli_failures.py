"""Known conditions end in one ``zsched: error:`` line, no traceback, and their documented exit code.

The table :data:`CASES` provokes each condition of docs/operations.md ("Exit codes and errors") for
the commands it applies to (an operator command, ``scheduler``, ``worker``, ``dev``), running the
real command as a subprocess; all of them start at once, so the table costs about one start-up.
The error line is all a case prints on stderr (``dev`` aside, which reports what it started).
``--debug`` adds the traceback.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduler.redisio.connection import sync_redis
from scheduler.shell.servers import etcd_request, free_port
from tests.support.servers import EtcdServer
from tests.support.waits import wait_until

ZSCHED = [sys.executable, "-m", "scheduler"]
USER, PASSWORD = "zsched17", "s3cret-pw"
DEADLINE = 60.0


@dataclass
class Env:
    redis_url: str      # a live redis-server
    locked_port: int    # the live redis-server, with the ACL user USER
    dead: int           # a loopback port nothing listens on
    taken: int          # a loopback port something listens on
    dead2: int = 0      # another loopback port nothing listens on

    @property
    def dead_redis(self) -> str:
        return f"redis://127.0.0.1:{self.dead}/0"

    @property
    def dead_sentinels(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.dead},127.0.0.1:{self.dead2}/mymaster"

    @property
    def tls_to_plain_text(self) -> str:
        """TLS to the live, plain-text redis-server: it never answers the handshake."""
        return f"rediss://127.0.0.1:{self.locked_port}/0"

    @property
    def cluster_of_one_plain_server(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.locked_port}"

    @property
    def wrong_password(self) -> str:
        return f"redis://{USER}:wrong-{PASSWORD}@127.0.0.1:{self.locked_port}/0"

    @property
    def tls_file_missing(self) -> str:
        return f"rediss://127.0.0.1:{self.locked_port}/0?ssl_ca_certs=/nonexistent/zsched-ca.pem"


@dataclass(frozen=True)
class Case:
    """``argv(env)`` after ``zsched``, the exit code, a regex the error line must match."""

    name: str
    argv: Callable[[Env], list[str]]
    code: int
    says: str
    env: tuple[tuple[str, str], ...] = ()
    waits: bool = False  # it runs into a timeout (seconds): started first, see the test


WORKER = ["worker", "scheduler.shell.demo:worker"]
TLS_TIMEOUT = (r"cannot reach Redis at rediss://.*: Timeout connecting to 127\.0\.0\.1:\d+ over TLS: no TLS "
               r"handshake within 5 s; .*use redis:// for it \(is redis-server running there, with TLS on that port\?")
BAD_URL = "http://127.0.0.1:6379"
CASES = [
    # operator commands
    Case("stats, Redis unreachable", lambda e: ["stats", "--redis", e.dead_redis], 3,
         r"cannot reach Redis at redis://127\.0\.0\.1:\d+/0: .*check --redis"),
    Case("stats, wrong password", lambda e: ["stats", "--redis", e.wrong_password], 3,
         r"Redis at redis://zsched17:\*\*\*@127\.0\.0\.1:\d+/0 refused the credentials.*fix user:password"),
    Case("stats, TLS file missing", lambda e: ["stats", "--redis", e.tls_file_missing], 4,
         r"cannot read a TLS file named in the Redis URL .*ssl_ca_certs"),
    Case("stats, bad URL", lambda e: ["stats", "--redis", BAD_URL], 2, r"Redis URL .* is invalid: unknown scheme"),
    Case("stats, TLS to a plain-text port", lambda e: ["stats", "--redis", e.tls_to_plain_text], 3, TLS_TIMEOUT,
         waits=True),
    Case("stats, sentinels unreachable", lambda e: ["stats", "--redis", e.dead_sentinels], 3,
         r"^zsched: error: cannot reach Redis at redis\+sentinel://\S+: no sentinel named a usable master "
         r"'mymaster': 127\.0\.0\.1:\d+ connection refused; 127\.0\.0\.1:\d+ connection refused \(are the "
         r"sentinels running, and do they monitor that master name\? check --redis / ZSCHED_REDIS_URL\)$"),
    Case("stats, cluster URL of a plain server", lambda e: ["stats", "--redis", e.cluster_of_one_plain_server], 2,
         r"the Redis at 127\.0\.0\.1:\d+ is not in cluster mode"),
    Case("cron add --grace without --misfire skip",
         lambda e: ["cron", "add", "nightly", "0 9 * * *", "--queue", "q", "--grace", "10", "--redis", e.redis_url],
         2, r"--grace only applies with --misfire skip"),
    # zsched scheduler
    Case("scheduler, wrong password",
         lambda e: ["scheduler", "--redis", e.wrong_password, "--etcd", f"127.0.0.1:{e.dead}"], 3,
         r"refused the credentials"),
    Case("scheduler, TLS file missing", lambda e: ["scheduler", "--redis", e.tls_file_missing], 4,
         r"cannot read a TLS file"),
    Case("scheduler, etcd CA file missing",
         lambda e: ["scheduler", "--redis", e.redis_url, "--etcd", f"https://127.0.0.1:{e.dead}"], 4,
         r"cannot read etcd ca_cert from /nonexistent", env=(("ZSCHED_ETCD_CA", "/nonexistent/etcd-ca.pem"),)),
    Case("scheduler, bad URL", lambda e: ["scheduler", "--redis", BAD_URL], 2, r"is invalid"),
    Case("scheduler, metrics port in use",
         lambda e: ["scheduler", "--redis", e.dead_redis, "--metrics-port", str(e.taken)], 4,
         r"metrics port \d+ on 127\.0\.0\.1 is already in use.*--metrics-port"),
    Case("scheduler, metrics port out of range", lambda e: ["scheduler", "--redis", e.dead_redis, "--metrics-port",
                                                            "99999"], 2,
         r"argument --metrics-port: expected a TCP port number from 1 to 65535, got '99999'"),
    Case("scheduler, metrics port 0", lambda e: ["scheduler", "--metrics-port", "0"], 2, r"from 1 to 65535, got '0'"),
    Case("scheduler, cluster URL of a plain server", lambda e: ["scheduler", "--redis", e.cluster_of_one_plain_server],
         2, r"is not in cluster mode"),
    # zsched worker
    Case("worker, metrics port in use", lambda e: [*WORKER, "--redis", e.redis_url, "--metrics-port", str(e.taken)], 4,
         r"metrics port \d+ on 127\.0\.0\.1 is already in use"),
    Case("worker, metrics port not a number", lambda e: [*WORKER, "--metrics-port", "-1"], 2,
         r"argument --metrics-port: expected a TCP port number from 1 to 65535, got '-1'"),
    Case("worker, wrong password", lambda e: [*WORKER, "--redis", e.wrong_password], 3, r"refused the credentials"),
    Case("worker, TLS file missing", lambda e: [*WORKER, "--redis", e.tls_file_missing], 4, r"cannot read a TLS file"),
    Case("worker, bad URL", lambda e: [*WORKER, "--redis", BAD_URL], 2, r"is invalid"),
    Case("worker, module missing", lambda e: ["worker", "nosuchmodule_zsched:worker"], 2, r"cannot import module"),
    # zsched dev with servers given
    Case("dev, Redis unreachable",
         lambda e: ["dev", "--redis", e.dead_redis, "--etcd", f"127.0.0.1:{e.dead}", "--no-demo", "--home", "dev-home"],
         3, r"cannot reach Redis at redis://127\.0\.0\.1:\d+/0"),
]


@pytest.fixture
def env(redis_url: str) -> Iterator[Env]:
    r = sync_redis(redis_url)
    r.acl_setuser(USER, enabled=True, passwords=[f"+{PASSWORD}"], keys=["*"], commands=["+@all"])
    r.close()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield Env(redis_url, int(redis_url.rsplit(":", 1)[1].split("/")[0]), free_port(), listener.getsockname()[1],
                  free_port())


def _start(case: Case, env: Env, cwd: Path, *pre: str, nice: int = 0) -> subprocess.Popen[str]:
    return subprocess.Popen([*ZSCHED, *pre, *case.argv(env)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=cwd, env={**os.environ, **dict(case.env)},
                            preexec_fn=(lambda: os.nice(nice)) if nice else None)


def test_known_conditions_print_one_error_line_and_their_exit_code(env: Env, tmp_path: Path) -> None:
    # The cases that wait out a timeout start first, and the others yield the CPU to them (nice
    # 5) while all start up: their clock starts at once, so the table ends about when the CPU work
    # of the start-ups does, not a whole timeout after the last start-up. Nice 5, not more: under
    # other processes' load a straggler still gets a third of a normal share, far from DEADLINE.
    order = sorted(CASES, key=lambda case: not case.waits)
    running = [(case, _start(case, env, tmp_path, nice=0 if case.waits else 5)) for case in order]
    problems = []
    for case, proc in running:
        try:
            out, err = proc.communicate(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            problems.append(f"{case.name}: did not end:\n{err[-2000:]}")
            continue
        lines = [line for line in err.splitlines() if line.startswith("zsched: error:")]
        others = [line for line in err.splitlines() if line not in lines]
        if proc.returncode != case.code:
            problems.append(f"{case.name}: exit {proc.returncode}, expected {case.code}:\n{err[-2000:]}")
        elif len(lines) != 1 or not re.search(case.says, lines[0]):
            problems.append(f"{case.name}: expected one error line matching {case.says!r}:\n{err[-2000:]}")
        elif "Traceback" in err:
            problems.append(f"{case.name}: a traceback:\n{err[-3000:]}")
        elif others and not case.name.startswith("dev,"):
            problems.append(f"{case.name}: more than the error line on stderr:\n{err[-2000:]}")
        elif PASSWORD in err + out:
            problems.append(f"{case.name}: the password is printed:\n{err[-2000:]}")
    assert not problems, "\n\n".join(problems)


def test_tls_to_a_plain_text_port_ends_within_the_connect_timeout(env: Env, tmp_path: Path) -> None:
    """``rediss://`` at a plain-text port: the server never answers the TLS handshake, which counts
    against the CLI's 5 s connect timeout (it waited for the 60 s socket timeout, then retried)."""
    t0 = time.monotonic()
    out = subprocess.run([*ZSCHED, "stats", "--redis", env.tls_to_plain_text], capture_output=True, text=True,
                         cwd=tmp_path, timeout=DEADLINE)
    took = time.monotonic() - t0
    assert out.returncode == 3 and re.fullmatch(f"zsched: error: {TLS_TIMEOUT}.*\n", out.stderr), out.stderr
    assert took < 15, f"took {took:.1f} s: 5 s of connect timeout and the start-up of Python were expected"


def test_debug_adds_the_traceback_of_a_known_condition(env: Env, tmp_path: Path) -> None:
    case = CASES[0]
    proc = _start(case, env, tmp_path, "--debug")
    _out, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == case.code and "Traceback" in err, err
    assert err.strip().splitlines()[-1].startswith("zsched: error: cannot reach Redis"), err


# ---------------------------------------------------------------- etcd with auth enabled


ETCD_ROOT_PASSWORD = "etcd-r00t-pw"


def _enable_etcd_auth(endpoint: str) -> None:
    """What ``etcdctl user add root; etcdctl user grant-role root root; etcdctl auth enable`` do,
    through etcd's HTTP gateway (etcdctl is not needed)."""
    etcd_request(endpoint, "/v3/auth/user/add", {"name": "root", "password": ETCD_ROOT_PASSWORD})
    etcd_request(endpoint, "/v3/auth/role/add", {"name": "root"})
    etcd_request(endpoint, "/v3/auth/user/grant", {"user": "root", "role": "root"})
    etcd_request(endpoint, "/v3/auth/enable", {})


def test_scheduler_with_wrong_etcd_credentials_says_so_and_right_ones_work(redis_url: str, fresh_etcd: EtcdServer,
                                                                           tmp_path: Path) -> None:
    _enable_etcd_auth(fresh_etcd.endpoint)
    wrong = f"http://root:not-{ETCD_ROOT_PASSWORD}@{fresh_etcd.endpoint}"
    out = subprocess.run([*ZSCHED, "scheduler", "--redis", redis_url, "--etcd", wrong, "--namespace", "etcdauth"],
                         capture_output=True, text=True, timeout=DEADLINE)
    lines = [line for line in out.stderr.splitlines() if line.startswith("zsched: error:")]
    assert out.returncode == 3, out.stderr
    assert len(lines) == 1 and re.search(r"etcd rejected user 'root'.*check the credentials in --etcd", lines[0]), \
        out.stderr
    assert "Traceback" not in out.stderr and ETCD_ROOT_PASSWORD not in out.stdout + out.stderr, out.stderr
    # the right password, through the environment (argv is visible to every user)
    right = {**os.environ, "ZSCHED_ETCD_ENDPOINTS": f"http://root:{ETCD_ROOT_PASSWORD}@{fresh_etcd.endpoint}"}
    log = tmp_path / "scheduler.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([*ZSCHED, "scheduler", "--redis", redis_url, "--namespace", "etcdauth"],
                                stdout=f, stderr=subprocess.STDOUT, env=right)
    try:
        wait_until(lambda: "partition 0: acquired" in log.read_text(), DEADLINE,
                   what=lambda: f"the scheduler to take partitions:\n{log.read_text()[-2000:]}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "released all partitions (lease revoked)" in text and "Traceback" not in text, text[-2000:]
    assert ETCD_ROOT_PASSWORD not in text, "the etcd password is printed"
