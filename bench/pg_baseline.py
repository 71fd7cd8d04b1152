"""Baseline: the seed design's own first scheduler, a PostgreSQL table (issue 7), on W1-W4.

The table, partial index and claim query are the design essay's, verbatim
(``/work/shared/seed/000_*.txt``): ``jobs(id, run_at, status, attempts, payload JSONB,
locked_until)``, ``idx_due ON jobs (run_at) WHERE status = 'pending'`` and an
``UPDATE ... WHERE id IN (SELECT ... LIMIT 10 FOR UPDATE SKIP LOCKED) RETURNING *`` claim.
A worker runs the claim; when it returns jobs it runs each handler (a no-op here) and marks
that job done (``UPDATE jobs SET status = 'done' WHERE id = $1``, autocommit: one durable
commit per job, as an at-least-once worker does), then claims again at once; when the claim
returns nothing it sleeps the poll interval (1 s or 10 ms).

PostgreSQL runs from the Debian package, started here on a free loopback port in a temp dir on
disk with its durability defaults (fsync, synchronous_commit, full_page_writes on); see
``scheduler/shell/servers/postgres.py``. Driver: psycopg 3 (sync API, C implementation from ``psycopg[binary]``).

Workloads (the payload is ``bench.common.PAYLOAD`` as JSONB):

* W1 enqueue: jobs due in 1 h from one producer: one autocommit INSERT per job, and batches of
  1000 per transaction (one multi-row INSERT, or one COPY). Median of 3 rounds.
* W2 disk: ``pg_total_relation_size('jobs') / N`` after COPYing N pending jobs (run_at spread
  over an hour, all distinct), split into heap / idx_due / pkey / toast / fsm+vm, after VACUUM.
* W3 drain: N jobs all due at T0 = now + 3 s; 1 and 2 worker processes; jobs/s from T0 until the
  last mark-done committed; duplicates and missing per id; CPU s per 1000 jobs of the postgres
  processes (postmaster + children, /proc) and of the workers.
* W4 lateness: jobs due uniformly over 20 s at 100/s and 1000/s; handler start minus run_at
  (ms); 1 worker, and 2 at 1000/s when 1 did not keep up.

``python -m bench.pg_baseline [--quick]`` prints JSON; ``--quick`` divides every job count (and
the W4 time span, so the rates stay) by 10.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import common  # noqa: E402
from bench.common import PAYLOAD, cpu_seconds, percentiles  # noqa: E402
from scheduler.shell.servers.postgres import PostgresMissing, PostgresServer, filesystem_of  # noqa: E402

# ------------------------------------------------------------------------------ the seed's design

SCHEMA = """
CREATE TABLE jobs (
  id            BIGINT PRIMARY KEY,
  run_at        TIMESTAMPTZ NOT NULL,
  status        TEXT NOT NULL DEFAULT 'pending',   -- pending|running|done|dead
  attempts      INT NOT NULL DEFAULT 0,
  payload       JSONB NOT NULL,
  locked_until  TIMESTAMPTZ
);
CREATE INDEX idx_due ON jobs (run_at) WHERE status = 'pending';
"""

CLAIM = """
UPDATE jobs SET status = 'running',
       locked_until = now() + interval '5 minutes',
       attempts = attempts + 1
WHERE id IN (
  SELECT id FROM jobs
  WHERE status = 'pending' AND run_at <= now()
  ORDER BY run_at
  LIMIT 10
  FOR UPDATE SKIP LOCKED
)
RETURNING *
"""

MARK_DONE = "UPDATE jobs SET status = 'done' WHERE id = %s"
INSERT_ONE = "INSERT INTO jobs (id, run_at, payload) VALUES (%s, %s, %s)"
COPY_IN = "COPY jobs (id, run_at, payload) FROM STDIN"

BATCH = 1000  # W1 batched: jobs per transaction
STATEMENT_TIMEOUT = "-c statement_timeout=120s"
REPORTED_SETTINGS = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_sync_method",
                     "wal_level", "shared_buffers", "checkpoint_timeout", "max_wal_size", "autovacuum",
                     "max_connections")


def _ts(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _connect(conninfo: str) -> Any:
    import psycopg

    return psycopg.connect(conninfo, autocommit=True, options=STATEMENT_TIMEOUT)


def _reset(conn: Any) -> None:
    """A fresh, empty jobs table, and a checkpoint so the previous step's dirty pages are not billed
    to the next one."""
    conn.execute("DROP TABLE IF EXISTS jobs")
    conn.execute(SCHEMA)
    conn.execute("CHECKPOINT")


def _copy(conn: Any, ids: range, run_at: Callable[[int], float]) -> None:
    """COPY the jobs ``ids`` (``run_at(i)`` in epoch seconds) in one transaction."""
    from psycopg.types.json import Jsonb

    with conn.transaction(), conn.cursor() as cur, cur.copy(COPY_IN) as cp:
        for i in ids:
            cp.write_row((i, _ts(run_at(i)), Jsonb(PAYLOAD)))


# ------------------------------------------------------------------------------ W1 enqueue


def enqueue(conn: Any, n: int, rounds: int = 3, budget_s: float = 90.0) -> dict[str, Any]:
    """jobs/s: one autocommit INSERT per job; and 1000 jobs per transaction as one multi-row
    INSERT, or as one COPY. run_at = now + 1 h (+ 1 ms per job, so keys are distinct)."""
    from psycopg.types.json import Jsonb

    deadline = time.monotonic() + budget_s
    runs: dict[str, list[float]] = {"one": [], "batched_insert": [], "batched_copy": []}
    timed_out = False
    multi_sql: dict[int, str] = {}

    def multi(k: int) -> str:
        if k not in multi_sql:
            multi_sql[k] = "INSERT INTO jobs (id, run_at, payload) VALUES " + ",".join(["(%s, %s, %s)"] * k)
        return multi_sql[k]

    for _ in range(rounds):
        if time.monotonic() > deadline:
            timed_out = True
            break
        # one by one: every INSERT is its own (durable) transaction
        _reset(conn)
        at = time.time() + 3600
        done = 0
        with conn.cursor() as cur:
            t = time.perf_counter()
            for i in range(n):
                cur.execute(INSERT_ONE, (i, _ts(at + i * 1e-3), Jsonb(PAYLOAD)))
                if i % 1000 == 999 and time.monotonic() > deadline:
                    timed_out = True
                    break
                done = i + 1
            runs["one"].append(done / (time.perf_counter() - t))
        # batched: one multi-row INSERT per 1000 jobs, one transaction each
        _reset(conn)
        at = time.time() + 3600
        with conn.cursor() as cur:
            t = time.perf_counter()
            for s in range(0, n, BATCH):
                k = min(BATCH, n - s)
                params: list[Any] = []
                for i in range(s, s + k):
                    params += (i, _ts(at + i * 1e-3), Jsonb(PAYLOAD))
                with conn.transaction():
                    cur.execute(multi(k), params)
            runs["batched_insert"].append(n / (time.perf_counter() - t))
        # batched: one COPY per 1000 jobs, one transaction each
        _reset(conn)
        at = time.time() + 3600
        t = time.perf_counter()
        for s in range(0, n, BATCH):
            _copy(conn, range(s, min(n, s + BATCH)), lambda i, at=at: at + i * 1e-3)
        runs["batched_copy"].append(n / (time.perf_counter() - t))
    out: dict[str, Any] = {"jobs": n, "rounds": len(runs["one"]), "batch": BATCH}
    for k, v in runs.items():
        out[f"{k}_jobs_per_s"] = round(statistics.median(v)) if v else None
        out[f"runs_{k}"] = [round(x) for x in v]
    if timed_out:
        out["timed_out"] = True
    return out


# ------------------------------------------------------------------------------ W2 disk per pending job


def disk(conn: Any, n: int, chunk: int = 100_000) -> dict[str, Any]:
    """Bytes per pending job after COPYing ``n`` jobs (run_at spread over 1 h, distinct), and where
    they go. Measured after VACUUM (which adds the free-space and visibility maps a live table has)."""
    _reset(conn)
    at = time.time() + 3600
    step = 3600.0 / n
    t = time.perf_counter()
    for s in range(0, n, chunk):
        _copy(conn, range(s, min(n, s + chunk)), lambda i: at + i * step)
    load_s = time.perf_counter() - t
    total_loaded = conn.execute("SELECT pg_total_relation_size('jobs')").fetchone()[0]
    conn.execute("VACUUM (ANALYZE) jobs")
    row = conn.execute("""
        SELECT pg_total_relation_size('jobs'), pg_relation_size('jobs', 'main'),
               pg_relation_size('jobs', 'fsm') + pg_relation_size('jobs', 'vm'),
               COALESCE(pg_total_relation_size(NULLIF(c.reltoastrelid, 0)), 0),
               pg_indexes_size('jobs'), pg_relation_size('idx_due'), pg_relation_size('jobs_pkey'),
               c.relpages
        FROM pg_class c WHERE c.oid = 'jobs'::regclass""").fetchone()
    total, heap, maps, toast, indexes, idx_due, pkey, pages = row
    tup, pay = conn.execute("SELECT avg(pg_column_size(j.*)), avg(pg_column_size(j.payload)) FROM jobs j").fetchone()

    def per(x: int) -> float:
        return round(x / n, 1)

    return {
        "pending_jobs": n,
        "bytes_per_job": per(total),
        "heap_bytes_per_job": per(heap),
        "idx_due_bytes_per_job": per(idx_due),
        "pkey_bytes_per_job": per(pkey),
        "toast_bytes_per_job": per(toast),
        "fsm_vm_bytes_per_job": per(maps),
        "indexes_bytes_per_job": per(indexes),
        "bytes_per_job_before_vacuum": per(total_loaded),
        "total_bytes": total,
        "heap_rows_per_8k_page": round(n / pages, 1) if pages else None,
        "avg_row_bytes": round(float(tup), 1),
        "avg_payload_jsonb_bytes": round(float(pay), 1),
        "copy_jobs_per_s": round(n / load_s),
    }


# ------------------------------------------------------------------------------ workers (W3, W4)


def _handle(payload: Any) -> None:
    """The no-op handler."""


def _worker(idx: int, conninfo: str, poll_s: float, stop: Any, ready: Any, done_count: Any, last_done: Any,
            out_path: str) -> None:
    """One worker process of the seed design: claim (<= 10), handle + mark done each, claim again
    at once; sleep ``poll_s`` when the claim came back empty. Records (id, run_at, handler start)."""
    conn = _connect(conninfo)
    cur = conn.cursor()
    records: list[tuple[int, float, float]] = []
    claims = empty = 0
    try:
        ready.put((idx, os.getpid()))
        while not stop.is_set():
            rows = cur.execute(CLAIM).fetchall()
            claims += 1
            if not rows:
                empty += 1
                stop.wait(poll_s)
                continue
            for row in rows:  # id, run_at, status, attempts, payload, locked_until
                started = time.time()
                _handle(row[4])
                records.append((row[0], row[1].timestamp(), started))
                cur.execute(MARK_DONE, (row[0],))
            with done_count.get_lock():
                done_count.value += len(rows)
                last_done.value = time.time()
    finally:
        with open(out_path, "w") as f:
            json.dump({"records": records, "claims": claims, "empty_claims": empty}, f)
        conn.close()


def _run_workers(srv: PostgresServer, conn: Any, n: int, offsets: Callable[[int], float], workers: int,
                 poll_s: float, lead_s: float, timeout_s: float) -> dict[str, Any]:
    """Start ``workers`` processes on an empty table, COPY ``n`` jobs due at T0 + offsets(i)
    (T0 = now + lead_s), wait until all are marked done (or ``timeout_s`` after T0), stop them.
    Returns raw data: T0, end, CPU deltas, records, per-worker stats, table state."""
    ctx = mp.get_context("spawn")
    _reset(conn)
    stop, ready = ctx.Event(), ctx.Queue()
    done_count, last_done = ctx.Value("q", 0), ctx.RawValue("d", 0.0)
    tmp = tempfile.mkdtemp(prefix="zsched-pgbench-")
    try:
        paths = [os.path.join(tmp, f"w{i}.json") for i in range(workers)]
        procs = [ctx.Process(target=_worker, daemon=True,
                             args=(i, srv.conninfo, poll_s, stop, ready, done_count, last_done, paths[i]))
                 for i in range(workers)]
        try:
            for p in procs:
                p.start()
            waiting, give_up = len(procs), time.monotonic() + 60
            while waiting:
                try:
                    ready.get(timeout=0.2)
                    waiting -= 1
                except queue.Empty:
                    dead = [p.exitcode for p in procs if not p.is_alive()]
                    if dead or time.monotonic() > give_up:
                        raise RuntimeError(f"pg_baseline: worker(s) not ready (exit codes {dead})") from None
            t0 = time.time() + lead_s
            _copy(conn, range(n), lambda i: t0 + offsets(i))
            loaded_before_t0 = time.time() < t0
            time.sleep(max(0.0, t0 - time.time()))
            pg0, w0 = srv.cpu_seconds(), sum(cpu_seconds(p.pid) for p in procs)
            deadline = t0 + timeout_s
            while done_count.value < n and time.time() < deadline and all(p.is_alive() for p in procs):
                time.sleep(0.002)
            pg1, w1 = srv.cpu_seconds(), sum(cpu_seconds(p.pid) for p in procs)
            finished = done_count.value >= n
            end = last_done.value if finished else time.time()
        finally:
            stop.set()
            for p in procs:
                if p.pid is None:
                    continue  # never started
                p.join(15)
                if p.is_alive():
                    p.terminate()
                    p.join(5)
        data: dict[str, Any] = {"records": [], "claims": 0, "empty_claims": 0, "per_worker_jobs": []}
        for path in paths:
            try:
                with open(path) as f:
                    d = json.load(f)
            except OSError:
                d = {"records": [], "claims": 0, "empty_claims": 0}
            data["records"] += d["records"]
            data["claims"] += d["claims"]
            data["empty_claims"] += d["empty_claims"]
            data["per_worker_jobs"].append(len(d["records"]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    states = dict(conn.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall())
    reclaimed = conn.execute("SELECT count(*) FROM jobs WHERE attempts > 1").fetchone()[0]
    data.update(t0=t0, end=end, finished=finished, loaded_before_t0=loaded_before_t0, pg_cpu=pg1 - pg0,
                worker_cpu=w1 - w0, states=states, attempts_gt_1=reclaimed)
    return data


def _dups_missing(records: list[tuple[int, float, float]], n: int) -> tuple[int, int]:
    runs = Counter(r[0] for r in records)
    return sum(c - 1 for c in runs.values() if c > 1), sum(1 for i in range(n) if i not in runs)


# ------------------------------------------------------------------------------ W3 drain


def drain(srv: PostgresServer, conn: Any, n: int, workers: int, poll_s: float, lead_s: float = 3.0,
          timeout_s: float = 90.0) -> dict[str, Any]:
    d = _run_workers(srv, conn, n, lambda i: 0.0, workers, poll_s, lead_s, timeout_s)
    dups, missing = _dups_missing(d["records"], n)
    wall = d["end"] - d["t0"]
    k = n / 1000
    return {
        "jobs": n, "workers": workers, "poll_ms": round(poll_s * 1000),
        "jobs_per_s": round(n / wall) if d["finished"] else None,
        "seconds_from_t0": round(wall, 3),
        "finished": d["finished"],
        "duplicates": dups, "missing": missing,
        "db_states": d["states"], "db_attempts_gt_1": d["attempts_gt_1"],
        "postgres_cpu_s_per_1000": round(d["pg_cpu"] / k, 4),
        "worker_cpu_s_per_1000": round(d["worker_cpu"] / k, 4),
        "claims": d["claims"], "empty_claims": d["empty_claims"], "per_worker_jobs": d["per_worker_jobs"],
        **({} if d["loaded_before_t0"] else {"warning": "load finished after T0"}),
    }


# ------------------------------------------------------------------------------ W4 lateness


def lateness(srv: PostgresServer, conn: Any, n: int, span_s: float, workers: int, poll_s: float,
             lead_s: float = 3.0, slack_s: float = 60.0) -> dict[str, Any]:
    step = span_s / n
    d = _run_workers(srv, conn, n, lambda i: i * step, workers, poll_s, lead_s, span_s + slack_s)
    dups, missing = _dups_missing(d["records"], n)
    late = [(start - run_at) * 1000 for _, run_at, start in d["records"]]
    pct = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in percentiles(late).items()}
    last_start = max((r[2] for r in d["records"]), default=d["t0"])
    # Kept up: the last job started within one poll interval + 0.5 s of the last run_at (a worker
    # slower than the arrival rate ends the window with a backlog that takes longer than that).
    tail_s = last_start - (d["t0"] + (n - 1) * step)
    return {
        "jobs": n, "rate_per_s": round(n / span_s), "workers": workers, "poll_ms": round(poll_s * 1000),
        "lateness_ms": pct,
        "started_before_run_at": sum(1 for x in late if x < 0),
        "last_start_minus_last_run_at_s": round(tail_s, 3),
        "kept_up": d["finished"] and tail_s <= poll_s + 0.5,
        "duplicates": dups, "missing": missing,
        "claims": d["claims"], "empty_claims": d["empty_claims"], "per_worker_jobs": d["per_worker_jobs"],
        "postgres_cpu_s": round(d["pg_cpu"], 2), "worker_cpu_s": round(d["worker_cpu"], 2),
        **({} if d["loaded_before_t0"] else {"warning": "load finished after T0"}),
    }


# ------------------------------------------------------------------------------ entry points


def _server_info(srv: PostgresServer, conn: Any) -> dict[str, Any]:
    import psycopg

    info: dict[str, Any] = {s: conn.execute(f"SHOW {s}").fetchone()[0] for s in REPORTED_SETTINGS}
    info.update(
        binaries=str(srv.bindir), run_as=srv.run_as, data_dir_filesystem=filesystem_of(srv.data_dir),
        listen=f"127.0.0.1:{srv.port} (TCP loopback)",
        driver=f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__}), autocommit, "
               "statements auto-prepared after 5 runs",
        mark_done="one autocommit UPDATE per job, after its handler",
    )
    return info


def run(args: Any) -> dict[str, Any]:
    quick = bool(getattr(args, "quick", False))
    div = 10 if quick else 1
    started = time.monotonic()
    try:
        srv = PostgresServer()
    except PostgresMissing as e:
        print(f"pg_baseline: {e}", file=sys.stderr)
        return {"skipped": str(e)}
    out: dict[str, Any] = {"quick": quick}
    with srv:
        conn = _connect(srv.conninfo)
        try:
            out["postgres"] = _server_info(srv, conn)
            out["enqueue"] = enqueue(conn, 20_000 // div)
            out["disk"] = [disk(conn, 20_000 // div)]
            drains = []
            for poll in (1.0, 0.01):
                for workers in (1, 2):
                    drains.append(drain(srv, conn, 20_000 // div, workers, poll))
            out["drain"] = drains
            late = []
            span = 20.0 / div
            for n in (2_000 // div, 20_000 // div):
                for poll in (1.0, 0.01):
                    r = lateness(srv, conn, n, span, 1, poll)
                    late.append(r)
                    if n == 20_000 // div and not r["kept_up"]:
                        late.append(lateness(srv, conn, n, span, 2, poll))
            out["lateness"] = late
            out["disk"].append(disk(conn, 1_000_000 // div))
            conn.execute("DROP TABLE IF EXISTS jobs")
        finally:
            conn.close()
    out["elapsed_s"] = round(time.monotonic() - started, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.pg_baseline", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="10x fewer jobs (and a 10x shorter W4 span)")
    args = p.parse_args()
    res = run(args)
    common.emit({"machine": common.machine(), "pg_baseline": res})
    if "skipped" in res:
        sys.exit(2)


if __name__ == "__main__":
    main()
