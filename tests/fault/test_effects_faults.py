"""Fenced effects under forced duplicates, in PostgreSQL (``fenced``) and in Redis
(``fenced_write``): 2 000 jobs append to a ledger and add to per-account balances while workers
kill -9 themselves after the write and before the ack, a worker is stopped (SIGSTOP) past its
lease so another attempt runs, then continued, and zsched's Redis restarts once. Afterwards the
ledger has one entry per job and every balance is exact, and the attempts recorded outside the
fenced write prove the duplicates happened."""
from __future__ import annotations

import os
import signal
import textwrap
from collections import Counter
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
import redis

from scheduler import Client
from scheduler.shell.servers import ZschedProc
from tests.support.servers import RedisServer
from tests.support.waits import wait_for
from tests.support.workers import TierStandIn
from workers.effects import ddl

pytestmark = pytest.mark.fault

JOBS = 2000
ACCOUNTS = 10
LEASE = 2.0
KILL_AFTER_COMMIT = {150, 900, 1500}  # jobs whose first run's worker dies between commit and ack
STOP_BEFORE = 600                     # the job whose first run's worker stops before its fenced block

# The handler module: STORE's write() in a fenced block; the attempt is recorded outside it first.
APP = '''
import os, signal, threading
from workers import Worker

KILL = {kill}
STOP = {stop}
ACCOUNTS = {accounts}
worker = Worker.from_url(None, concurrency=8)
{store}


def _first(what, n):
    # The first run of the handler for n, whatever its attempt number: a worker killed with jobs
    # claimed ahead (prefetch) spends their first attempts without running them.
    try:
        os.close(os.open("%s-%d" % (what, n), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


@worker.handler("pay")
def pay(job):
    n = job.payload["n"]
    record_attempt(job)  # committed at once, outside the fence: the proof that duplicates happened
    if n == STOP and _first("stop", n):
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen past the lease: the job runs again elsewhere
    write(job, n)
    if n in KILL and _first("kill", n):
        os.kill(os.getpid(), signal.SIGKILL)  # written, not acked
'''

POSTGRES_APP = '''
import psycopg
from workers.effects import fenced

DSN = os.environ["FX_DSN"]
_local = threading.local()


def _conn():
    c = getattr(_local, "conn", None)
    if c is None or c.closed:
        # lock_timeout: a stopped worker's open transactions hold their rows' locks until it is
        # continued; without it this worker's threads would all wait on them (docs/effects.md)
        c = _local.conn = psycopg.connect(DSN, options="-c lock_timeout=200")
    return c


def record_attempt(job):
    c = _conn()
    c.execute("INSERT INTO attempts VALUES (%s, %s, %s, %s)", (job.id, job.attempt, job.fence, os.getpid()))
    c.commit()


def write(job, n):
    c = _conn()
    with fenced(c, job):
        c.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, n))
        c.execute("UPDATE balances SET amount = amount + %s WHERE account = %s", (n, n % ACCOUNTS))
'''

REDIS_APP = '''
import redis
from workers.effects import fenced_write

R = redis.Redis.from_url(os.environ["FX_REDIS"])


def record_attempt(job):
    R.rpush("{fx}:attempts", "%s %d %d" % (job.id, job.attempt, os.getpid()))


def write(job, n):
    fenced_write(R, job, [("RPUSH", "{fx}:ledger", job.id), ("INCRBY", "{fx}:balance:%d" % (n % ACCOUNTS), n)])
'''


class PostgresStore:
    """The ledger, balances and attempts as tables of the test's database."""

    app = POSTGRES_APP

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.env = {"FX_DSN": dsn}
        with psycopg.connect(dsn) as c:
            c.execute(ddl())
            c.execute("CREATE TABLE ledger (job_id text, n int)")
            c.execute("CREATE TABLE attempts (job_id text, attempt int, fence bigint, pid int)")
            c.execute("CREATE TABLE balances (account int PRIMARY KEY, amount bigint NOT NULL)")
            c.execute("INSERT INTO balances SELECT a, 0 FROM generate_series(0, %s) a", (ACCOUNTS - 1,))
            c.commit()

    def _rows(self, sql: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.dsn) as c:
            return c.execute(sql).fetchall()

    def ledger(self) -> list[str]:
        return [str(r[0]) for r in self._rows("SELECT job_id FROM ledger")]

    def balances(self) -> dict[int, int]:
        return {int(a): int(b) for a, b in self._rows("SELECT account, amount FROM balances")}  # type: ignore[call-overload]

    def attempts(self) -> list[tuple[str, int]]:
        return [(str(j), int(p)) for j, p in self._rows("SELECT job_id, pid FROM attempts")]  # type: ignore[call-overload]

    def attempt_pids(self, job_id: str) -> list[int]:
        with psycopg.connect(self.dsn) as c:
            return [int(r[0]) for r in c.execute("SELECT pid FROM attempts WHERE job_id = %s", (job_id,))]


class RedisStore:
    """The ledger, balances and attempts as keys of a Redis of the application's own."""

    app = REDIS_APP

    def __init__(self, url: str) -> None:
        self.r = redis.Redis.from_url(url)
        self.env = {"FX_REDIS": url}

    def ledger(self) -> list[str]:
        return [x.decode() for x in self.r.lrange("{fx}:ledger", 0, -1)]

    def balances(self) -> dict[int, int]:
        return {a: int(self.r.get(f"{{fx}}:balance:{a}") or 0) for a in range(ACCOUNTS)}

    def attempts(self) -> list[tuple[str, int]]:
        out = []
        for line in self.r.lrange("{fx}:attempts", 0, -1):
            job_id, _attempt, pid = line.decode().split()
            out.append((job_id, int(pid)))
        return out

    def attempt_pids(self, job_id: str) -> list[int]:
        return [p for j, p in self.attempts() if j == job_id]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.parametrize("kind", ["postgres", "redis"])
async def test_fenced_effects_apply_once_per_job_through_kills_a_stop_and_a_redis_restart(
        kind: str, aof_redis: RedisServer, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    store = (PostgresStore(request.getfixturevalue("pg_dsn")) if kind == "postgres"
             else RedisStore(request.getfixturevalue("fresh_redis").url))
    (tmp_path / "fxapp.py").write_text(APP.format(kill=KILL_AFTER_COMMIT, stop=STOP_BEFORE, accounts=ACCOUNTS,
                                                  store=textwrap.dedent(store.app)))
    url = aof_redis.url
    env = store.env
    procs: list[ZschedProc] = []

    def spawn() -> ZschedProc:
        p = ZschedProc(["worker", "fxapp:worker", "--redis", url], env=env, cwd=str(tmp_path)).start()
        procs.append(p)
        return p

    def keep_two_running() -> None:
        for p in [p for p in procs if not p.alive and p not in dead]:
            dead.append(p)
            spawn()

    dead: list[ZschedProc] = []
    client = Client.from_url(url)
    try:
        async with TierStandIn(url) as tier:
            spawn()
            spawn()
            ids = client.schedule_many([(timedelta(0), {"n": n}) for n in range(JOBS)], queue="pay", lease=LEASE,
                                       max_attempts=100, backoff=(0.05, 0.5))
            assert len(set(ids)) == JOBS

            def stopped() -> ZschedProc | None:
                keep_two_running()
                return next((p for p in procs if p.alive and _state(p.pid) == "T"), None)

            frozen = await wait_for(stopped, 60, what="a worker to stop itself before job 600's fenced block")
            # The job runs again elsewhere once its lease is reaped; then the frozen attempt resumes,
            # and one of the two commits its block while the other is skipped.
            stop_id = ids[STOP_BEFORE]

            def rerun_elsewhere() -> bool:
                keep_two_running()
                return any(p != frozen.pid for p in store.attempt_pids(stop_id))

            def why_not() -> str:  # what the timeout reports: where job 600 and the workers are
                info = client.get(stop_id)
                workers = ", ".join(f"{p.pid}:{_state(p.pid)}" for p in procs)
                tails = "\n".join(f"--- worker {p.pid}\n" + "\n".join(p.output().splitlines()[-15:]) for p in procs)
                return (f"job 600 to run again on another worker: job {info!r}; queue {client.stats().get('pay')}; "
                        f"reaped {tier.reaped}; workers {workers}; frozen {frozen.pid}\n{tails}")
            await wait_for(rerun_elsewhere, 60, interval=0.1, what=why_not)
            os.kill(frozen.pid, signal.SIGCONT)

            def progressed() -> bool:
                keep_two_running()
                return len(store.ledger()) >= JOBS // 2
            await wait_for(progressed, 60, what="half the jobs to commit")
            aof_redis.restart()

            def finished() -> bool:
                keep_two_running()
                s = client.stats().get("pay", {})
                return sum(s.get(k, 0) for k in ("scheduled", "ready", "running")) == 0 and \
                    len(store.ledger()) >= JOBS
            await wait_for(finished, 120, what="every job to finish")
            assert tier.reaped >= 2
    finally:
        for p in procs:
            if p.alive:
                os.kill(p.pid, signal.SIGCONT)
                p.stop(10)
        client.close()

    ledger = Counter(store.ledger())
    assert set(ledger) == set(ids) and set(ledger.values()) == {1}, "one ledger row per job"
    assert store.balances() == {a: sum(n for n in range(JOBS) if n % ACCOUNTS == a) for a in range(ACCOUNTS)}
    attempts = Counter(j for j, _ in store.attempts())
    # the duplicates happened: every killed job and the stopped one ran at least twice
    for n in (*KILL_AFTER_COMMIT, STOP_BEFORE):
        assert attempts[ids[n]] >= 2, n
    assert sum(attempts.values()) > JOBS
    # the stopped attempt and the one run meanwhile elsewhere overlapped: one block committed, the
    # other was skipped (which one depends on who reached its block first after the SIGCONT)
    pids = {p for j, p in store.attempts() if j == ids[STOP_BEFORE]}
    assert frozen.pid in pids and len(pids) >= 2
    skipped = [line for p in procs for line in p.output().splitlines() if "effects already recorded" in line]
    assert any(ids[STOP_BEFORE] in line for line in skipped), "the overlapping attempt's skip was logged"
    assert len(dead) == len(KILL_AFTER_COMMIT)
