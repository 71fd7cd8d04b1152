"""``python -m bench.script_time``: where a job's Redis time goes, script by script, in a live load.

INFO commandstats counts every ``EVALSHA`` under one name, so ``bench fanout`` can say how much of
Redis's CPU went inside script calls, not which scripts. This bench runs one load of ``bench
fanout``'s shapes on the same stack (``bench.stack.Stack``: one redis-server with AOF everysec,
etcd, 2 scheduler replicas, 16 partitions; W worker processes at concurrency 4 with the no-op
handler) with Redis's slow log set to record every command (``slowlog-log-slower-than 0``), reset
when the window opens (the first due time) and read when the last job is acked. Each entry is one
command and how long it ran, in µs; an ``EVALSHA`` is named by its script (the SHA1 of each
``lua/`` script as this checkout loads it), so per script: calls per job, µs per job and µs per
call. The commands the scripts run are logged too (from the scripts' client, address ``?:0``), and
their time is inside their script's: they are listed apart (``inside_scripts``) from those clients
sent (``sent_by_clients``: bell waits, the bench's own counter reads).

What it is for: a script's µs per call against the jobs it carries. Under spread traffic a tick, a
claim and an ack each cost about the same whatever the number of jobs in them (2026-12-06: a tick
98 µs, a claim 73-77, an ack 50-55, with 1.7 and 3 jobs per tick alike), so Redis's CPU per job
follows the calls per job. The log costs Redis time of its own (an entry per command, its
arguments copied): ``redis_cpu_us_per_job`` of this bench is higher than ``bench fanout``'s, and
only the per-command figures are comparable between runs.

``python -m bench.script_time [--jobs 3000] [--seconds 10] [--shape spread] [--workers 1]
[--scheduler-args ARGS] [--worker-args ARGS]``; prints JSON.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.common import emit, machine
from bench.fanout import QUEUE, Side, UsageError, offsets_for, poll_acked, schedule, stack, wait_up
from bench.stack import ROOT, Stack
from scheduler.protocol.scripts import load_scripts

JOBS = 3000
SECONDS = 10.0
CONCURRENCY = 4
LOG_ENTRIES_PER_JOB = 40  # room in the slow log: a spread job's commands, scripts' own included, are about 30


def script_names() -> dict[str, str]:
    """SHA1 -> script name, for the scripts as this checkout loads them."""
    return {s.sha: name for name, s in load_scripts().items()}


SCRIPTS_CLIENT = "?:0"  # the client address the slow log gives the commands a script runs
INSIDE = "inside: "  # tally()'s prefix of those commands' names


def tally(entries: Sequence[dict[str, Any]], names: dict[str, str]) -> dict[str, list[int]]:
    """Slow log entries -> name -> [calls, µs]: an ``EVALSHA`` by its script's name (``evalsha
    SHA`` when the SHA is not one of ours), any other command by its lower-case name, prefixed with
    :data:`INSIDE` when a script ran it."""
    out: dict[str, list[int]] = {}
    for e in entries:
        argv, client = e["command"], e.get("client_address", b"")
        words = (argv.decode("latin-1") if isinstance(argv, bytes) else str(argv)).split(" ", 2)
        cmd = words[0].lower()
        if cmd == "evalsha" and len(words) > 1:
            cmd = names.get(words[1], f"evalsha {words[1][:12]}")
        elif (client.decode() if isinstance(client, bytes) else str(client)) == SCRIPTS_CLIENT:
            cmd = INSIDE + cmd
        got = out.setdefault(cmd, [0, 0])
        got[0] += 1
        got[1] += int(e["duration"])
    return out


def per_job(counts: dict[str, list[int]], jobs: int, scripts: set[str]) -> dict[str, Any]:
    """Calls and µs per job (and µs per call) of each name, the dearest first: the scripts, the
    commands they ran (their time is inside the scripts') and the commands clients sent."""
    def group(k: str) -> str:
        return "scripts" if k in scripts else "inside_scripts" if k.startswith(INSIDE) else "sent_by_clients"

    def rows(which: str) -> dict[str, dict[str, float]]:
        picked = sorted(((k, v) for k, v in counts.items() if group(k) == which), key=lambda kv: -kv[1][1])
        return {k.removeprefix(INSIDE): {"calls_per_job": round(n / jobs, 4), "us_per_job": round(us / jobs, 2),
                                         "us_per_call": round(us / n, 1)} for k, (n, us) in picked}
    return {g: rows(g) for g in ("scripts", "inside_scripts", "sent_by_clients")} | {
            "scripts_us_per_job": round(sum(us for k, (_, us) in counts.items() if k in scripts) / jobs, 1)}


def measure(st: Stack, side: Side, offsets: Sequence[float]) -> dict[str, Any]:
    """One load on ``st``: schedule, log every command from the first due time to the last ack."""
    r = st.r
    jobs = len(offsets)
    base = st.counter("acked", QUEUE)
    room = jobs * LOG_ENTRIES_PER_JOB + 10_000  # slow log entries kept
    t0, _ = schedule(st, side, offsets)
    r.config_set("slowlog-max-len", room)
    r.config_set("slowlog-log-slower-than", 0)
    time.sleep(max(0.0, t0 - 0.1 - time.time()))
    r.slowlog_reset()
    cpu0, w0 = st.cpu()["redis"], time.monotonic()
    poll_acked(st, base + jobs, offsets[-1] + 60, not_before=t0 + offsets[-1])
    cpu1, seconds = st.cpu()["redis"], time.monotonic() - w0
    r.config_set("slowlog-log-slower-than", 10_000)  # as Redis ships: the read below is not logged
    entries = r.slowlog_get(room)
    if len(entries) >= room:
        raise RuntimeError("the slow log filled up: its oldest entries are lost (raise LOG_ENTRIES_PER_JOB)")
    names = script_names()
    out = per_job(tally(entries, names), jobs, set(names.values()))
    return {"jobs": jobs, "seconds": round(seconds, 2), "log_entries": len(entries),
            "redis_cpu_us_per_job_with_the_log": round((cpu1 - cpu0) / jobs * 1e6, 1), **out}


def run(jobs: int, seconds: float, shape: str, workers: int, scheduler_args: Sequence[str],
        worker_args: Sequence[str]) -> dict[str, Any]:
    side = Side("this", ROOT, tuple(scheduler_args), tuple(worker_args))
    offsets = offsets_for(shape, jobs, seconds, 10, 1)
    with stack("single", side) as st:
        st.start_workers(workers, concurrency=CONCURRENCY, settle=0, extra=side.worker_args)
        try:
            wait_up(st)
            got = measure(st, side, offsets)
        finally:
            st.stop_workers()
    return {"machine": machine(), "shape": shape, "workers": workers, "scheduler_args": list(scheduler_args),
            "worker_args": list(worker_args), **got}


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.script_time", description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=JOBS, help="jobs in the load (default %(default)s)")
    p.add_argument("--seconds", type=float, default=SECONDS, help="span of their due times (default %(default)s)")
    p.add_argument("--shape", choices=("spread", "batched"), default="spread", help="(default %(default)s)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (default %(default)s)")
    p.add_argument("--scheduler-args", default="", metavar="ARGS", help="extra arguments of the replicas")
    p.add_argument("--worker-args", default="", metavar="ARGS", help="extra arguments of the workers")
    a = p.parse_args(argv)
    try:
        if not 1 <= a.jobs <= 100_000:
            raise UsageError(f"--jobs {a.jobs}: give 1 to 100000 jobs")
        if not 0 < a.seconds <= 600:
            raise UsageError(f"--seconds {a.seconds:g}: give a span from more than 0 to 600 seconds")
        if not 1 <= a.workers <= 64:
            raise UsageError(f"--workers {a.workers}: give 1 to 64 worker processes")
        emit(run(a.jobs, a.seconds, a.shape, a.workers, shlex.split(a.scheduler_args), shlex.split(a.worker_args)))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
