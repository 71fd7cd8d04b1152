"""Fenced PostgreSQL effects under forced duplicates: 2 000 jobs append to a ledger and add to
per-account balances inside ``fenced`` while workers kill -9 themselves after the commit and before
the ack, a worker is stopped (SIGSTOP) past its lease so another attempt runs, then continued, and
Redis restarts once. Afterwards the ledger has one row per job and every balance is exact, and the
attempts recorded outside the fenced block prove the duplicates happened."""
from __future__ import annotations

import os
import signal
import textwrap
from collections import Counter
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

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

APP = '''
import os, signal, threading
import psycopg
from workers import Worker
from workers.effects import fenced

DSN = os.environ["FX_DSN"]
KILL = {kill}
STOP = {stop}
worker = Worker.from_url(None, concurrency=8)
_local = threading.local()


def _conn():
    c = getattr(_local, "conn", None)
    if c is None or c.closed:
        # lock_timeout: a stopped worker's open transactions hold their rows' locks until it is
        # continued; without it this worker's threads would all wait on them (docs/effects.md)
        c = _local.conn = psycopg.connect(DSN, options="-c lock_timeout=200")
    return c


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
    c = _conn()
    # outside the fence, committed at once: the proof that duplicates happened
    c.execute("INSERT INTO attempts VALUES (%s, %s, %s, %s)", (job.id, job.attempt, job.fence, os.getpid()))
    c.commit()
    if n == STOP and _first("stop", n):
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen past the lease: the job runs again elsewhere
    with fenced(c, job):
        c.execute("INSERT INTO ledger VALUES (%s, %s)", (job.id, n))
        c.execute("UPDATE balances SET amount = amount + %s WHERE account = %s", (n, n % {accounts}))
    if n in KILL and _first("kill", n):
        os.kill(os.getpid(), signal.SIGKILL)  # committed, not acked
'''


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _rows(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as c:
        return c.execute(sql).fetchall()


async def test_fenced_effects_apply_once_per_job_through_kills_a_stop_and_a_redis_restart(
        aof_redis: RedisServer, pg_dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(pg_dsn) as c:
        c.execute(ddl())
        c.execute("CREATE TABLE ledger (job_id text, n int)")
        c.execute("CREATE TABLE attempts (job_id text, attempt int, fence bigint, pid int)")
        c.execute("CREATE TABLE balances (account int PRIMARY KEY, amount bigint NOT NULL)")
        c.execute("INSERT INTO balances SELECT a, 0 FROM generate_series(0, %s) a", (ACCOUNTS - 1,))
        c.commit()
    (tmp_path / "fxapp.py").write_text(textwrap.dedent(APP.format(kill=KILL_AFTER_COMMIT, stop=STOP_BEFORE,
                                                                accounts=ACCOUNTS)))
    url = aof_redis.url
    env = {"FX_DSN": pg_dsn}
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
            await wait_for(lambda: (keep_two_running() or
                                    _rows(pg_dsn, f"SELECT 1 FROM attempts WHERE job_id = '{stop_id}' "
                                                  f"AND pid <> {frozen.pid}")),
                           60, what="job 600 to run again on another worker")
            os.kill(frozen.pid, signal.SIGCONT)

            def progressed() -> bool:
                keep_two_running()
                return _rows(pg_dsn, "SELECT count(*) FROM ledger")[0][0] >= JOBS // 2
            await wait_for(progressed, 60, what="half the jobs to commit")
            aof_redis.restart()

            def finished() -> bool:
                keep_two_running()
                s = client.stats().get("pay", {})
                return sum(s.get(k, 0) for k in ("scheduled", "ready", "running")) == 0 and \
                    _rows(pg_dsn, "SELECT count(*) FROM ledger")[0][0] >= JOBS
            await wait_for(finished, 120, what="every job to finish")
            assert tier.reaped >= 2
    finally:
        for p in procs:
            if p.alive:
                os.kill(p.pid, signal.SIGCONT)
                p.stop(10)
        client.close()

    ledger = Counter(r[0] for r in _rows(pg_dsn, "SELECT job_id FROM ledger"))
    assert set(ledger) == set(ids) and set(ledger.values()) == {1}, "one ledger row per job"
    balances = dict(_rows(pg_dsn, "SELECT account, amount FROM balances"))
    assert balances == {a: sum(n for n in range(JOBS) if n % ACCOUNTS == a) for a in range(ACCOUNTS)}
    attempts = Counter(r[0] for r in _rows(pg_dsn, "SELECT job_id FROM attempts"))
    # the duplicates happened: every killed job and the stopped one ran at least twice
    for n in (*KILL_AFTER_COMMIT, STOP_BEFORE):
        assert attempts[ids[n]] >= 2, n
    assert sum(attempts.values()) > JOBS
    # the stopped attempt and the one run meanwhile elsewhere overlapped: one block committed, the
    # other was skipped (which one depends on who reached its block first after the SIGCONT)
    pids = {r[0] for r in _rows(pg_dsn, f"SELECT pid FROM attempts WHERE job_id = '{ids[STOP_BEFORE]}'")}
    assert frozen.pid in pids and len(pids) >= 2
    skipped = [line for p in procs for line in p.output().splitlines() if "effects already recorded" in line]
    assert any(ids[STOP_BEFORE] in line for line in skipped), "the overlapping attempt's skip was logged"
    assert len(dead) == len(KILL_AFTER_COMMIT)
