"""What the huey and Celery runs share: their redis-servers, worker processes we start and stop by
pid, the handlers' records, and the summaries (lateness, drain) in the same shape as zsched's."""
from __future__ import annotations

import datetime
import os
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import REPO, cpu_seconds, percentiles
from bench.peers.records import READY_FILE_ENV, RECORD_DIR_ENV, REDIS_URL_ENV
from scheduler.shell.servers import RedisServer, ServerProcess

# zsched's redis options per workload, so each side runs on the same server set-up: W1/W2 as the
# `core` suite (bench.common.redis_server: hz 10, no persistence), W3/W4 as the end-to-end stack
# (hz 10, AOF appendfsync everysec)
REDIS_PLAIN = ["--hz", "10"]
REDIS_AOF = ["--hz", "10", "--appendonly", "yes", "--appendfsync", "everysec"]


def redis(aof: bool) -> RedisServer:
    """A started redis-server of our own on loopback (stop it with ``.stop()``)."""
    return RedisServer(extra_args=REDIS_AOF if aof else REDIS_PLAIN).start()


def used_memory(srv: RedisServer) -> int:
    """Redis ``used_memory`` in bytes."""
    return int(srv.info("memory")["used_memory"])


def redis_cpu(srv: RedisServer) -> float:
    """CPU seconds of the redis-server (INFO cpu, user + sys)."""
    info = srv.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def utc(ts: float) -> datetime.datetime:
    """An aware UTC datetime for an epoch time: what both peers' ``eta=`` takes."""
    return datetime.datetime.fromtimestamp(ts, datetime.UTC)


def lateness_times(jobs: int, span: float, start: float, seed: int = 7) -> list[float]:
    """W4's run_at times: ``jobs`` uniform in [start, start + span), sorted (zsched's W4 draws them
    the same way, seed 7)."""
    rnd = random.Random(seed)
    return sorted(start + rnd.random() * span for _ in range(jobs))


def wait_until(pred: Callable[[], bool], timeout: float, what: str, poll: float = 0.02) -> float:
    """Poll ``pred`` until true and return the time it was seen true; RuntimeError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return time.time()
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll)


def descendants(pid: int) -> list[int]:
    """Pids of the live descendants of ``pid`` (``/proc/PID/task/*/children``), children first."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(x) for x in Path(f"/proc/{p}/task/{t}/children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


class PeerWorker(ServerProcess):
    """A peer's worker (``huey_consumer`` or ``celery worker``) as a child process of ours: its own
    temp dir holding its log (``worker.log``) and the handlers' records (``rec/``), ready once a
    startup hook in the worker created the ready file. Stopped with SIGTERM, then SIGKILL after the
    grace to it and to the processes it started (Celery's pool children), by pid."""

    kind = "peer"
    start_timeout = 60.0

    def __init__(self, name: str, command: list[str], redis_url: str) -> None:
        super().__init__(log=None)
        self.name = name
        self.command = command
        self.redis_url = redis_url
        self.records_dir = self.dir / "rec"
        self.records_dir.mkdir()
        self.ready_file = self.dir / "ready"
        self.counted: dict[Path, tuple[int, int]] = {}  # record file -> (bytes read, lines in them)

    def argv(self) -> list[str]:
        """``env VAR=... python -m ...``: env execs, so the pid we hold is the worker's."""
        env = {"PYTHONPATH": str(REPO), REDIS_URL_ENV: self.redis_url, RECORD_DIR_ENV: str(self.records_dir),
               READY_FILE_ENV: str(self.ready_file), "PYTHONUNBUFFERED": "1"}
        return ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", *self.command]

    def ready(self) -> bool:
        """True once the worker's startup hook wrote the ready file."""
        return self.ready_file.exists()

    def cpu(self) -> float:
        """CPU seconds of the worker and its live children."""
        total = 0.0
        if self.pid is None or not self.running:
            return total
        for p in [self.pid, *descendants(self.pid)]:
            try:
                total += cpu_seconds(p)
            except OSError:
                pass
        return total

    def rss_bytes(self) -> int:
        """Resident memory of the worker's main process (the one holding Celery's ETA timers)."""
        if self.pid is None or not self.running:
            return 0
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def record_count(self) -> int:
        """Handler starts recorded so far (lines in the record files; reads only what was added
        since the last call, so polling it stays cheap beside the worker)."""
        for f in self.records_dir.glob("*.rec"):
            offset, lines = self.counted.get(f, (0, 0))
            with open(f, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
            end = chunk.rfind(b"\n") + 1  # a line being written counts once it is whole
            self.counted[f] = (offset + end, lines + chunk.count(b"\n", 0, end))
        return sum(lines for _, lines in self.counted.values())

    def records(self) -> list[tuple[str, float, float]]:
        """(task id, run_at, handler start) per handler start, every process's."""
        out = []
        for f in self.records_dir.glob("*.rec"):
            for line in f.read_text().splitlines():
                jid, due, start = line.split()
                out.append((jid, float(due), float(start)))
        return out

    def finish(self, grace: float = 15.0) -> list[tuple[str, float, float]]:
        """Stop the worker (and any process of its own still up after it), return its records and
        remove its temp dir."""
        kids = descendants(self.pid) if self.pid is not None and self.running else []
        self.stop(keep=True, grace=grace)
        for k in kids:
            try:
                os.kill(k, signal.SIGKILL)
            except OSError:
                pass
        recs = self.records()
        self.remove_dir()
        return recs


def records_summary(records: list[tuple[str, float, float]], expected: set[str]) -> dict[str, Any]:
    """Duplicates, missing, early starts and handler start - run_at (ms), as zsched's W3/W4 report
    them (``bench.workloads.records_summary``), with run_at as the eta the producer gave."""
    counts = Counter(jid for jid, _, _ in records)
    lat = [(start - due) * 1000 for _, due, start in records]
    return {"duplicates": sum(c - 1 for c in counts.values() if c > 1), "missing": len(expected - set(counts)),
            "unexpected": len(set(counts) - expected),
            "started_before_run_at": sum(1 for v in lat if v < 0),
            "earliest_start_ms": round(min(lat), 3) if lat else None,
            "handler_lateness_ms": {k: round(v, 2) if isinstance(v, float) else v for k, v in percentiles(lat).items()}}


def drain_result(worker: PeerWorker, srv: RedisServer, ids: set[str], t0: float, timeout: float) -> dict[str, Any]:
    """W3's measurement once ``ids`` are pending, all due at ``t0``: wait (bounded) until every
    handler started, then jobs/s from t0 to the last handler start, CPU s per 1000 jobs."""
    jobs = len(ids)
    time.sleep(max(0.0, t0 - time.time() - 0.5))
    cpu0 = {"redis": redis_cpu(srv), "worker": worker.cpu()}
    wait_until(lambda: worker.record_count() >= jobs, timeout, f"{jobs} handler starts ({worker.name})", poll=0.05)
    cpu1 = {"redis": redis_cpu(srv), "worker": worker.cpu()}
    records = worker.finish()
    last = max(start for _, _, start in records)
    out = {"jobs": jobs, "jobs_per_s": round(jobs / (last - t0)), "seconds_from_t0": round(last - t0, 3),
           "cpu_s_per_1000_jobs": {k: round((cpu1[k] - cpu0[k]) / jobs * 1000, 3) for k in cpu0}}
    out.update({k: v for k, v in records_summary(records, ids).items() if k != "handler_lateness_ms"})
    return out


Pending = Callable[[str, Callable[[float], list[float]]], tuple[PeerWorker, set[str], Any, float, float]]
"""A peer's set-up: start its worker on a Redis URL, enqueue one job per run_at in ``due(now)``,
wait until the peer holds them all; returns (worker, ids, redis client, setup s, first run_at)."""


def lateness_run(pending: Pending, setup_rate: float, peer: str, n: int, span: float) -> dict[str, Any]:
    """W4 for one peer: ``n`` jobs uniform over ``span`` s, 1 worker; handler start - run_at."""
    srv = redis(aof=True)
    try:
        w, ids, r, setup, _ = pending(srv.url, lambda now: lateness_times(n, span, now + 2 + n / setup_rate))
        wait_until(lambda: w.record_count() >= n, span + 60 + n / setup_rate, f"{n} handler starts ({peer})",
                   poll=0.1)
        out = {"jobs": n, "rate_per_s": round(n / span), "worker_processes": 1, "setup_s": round(setup, 2)}
        out.update(records_summary(w.finish(), ids))
        r.close()
        return out
    finally:
        srv.stop()


def enqueue_rounds(one_round: Callable[[str, int], dict[str, Any]], n: int, rounds: int) -> list[dict[str, Any]]:
    """W1 for one peer alone, ``rounds`` times on one Redis without persistence
    (``bench.peers.run`` interleaves the sides' rounds instead)."""
    srv = redis(aof=False)
    try:
        return [one_round(srv.url, n) for _ in range(rounds)]
    finally:
        srv.stop()
