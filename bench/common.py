"""Shared benchmark helpers: servers, payload, statistics, machine description."""
from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from scheduler.shell.servers import RedisServer

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


PAYLOAD = {"user_id": 12345, "template": "welcome", "to": "someone@example.com", "pad": "x" * 40}


@contextmanager
def redis_server(*extra: str) -> Iterator[RedisServer]:
    """A fresh redis-server (default config: no persistence, hz as Redis ships: 10)."""
    srv = RedisServer(extra_args=["--hz", "10", *extra])
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    v = sorted(values)

    def pct(p: float) -> float:
        return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]

    return {"n": len(v), "p50": pct(50), "p99": pct(99), "max": v[-1], "mean": statistics.fmean(v)}


def median_of(runs: list[float]) -> float:
    return statistics.median(runs)


def machine() -> dict[str, Any]:
    def ver(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout.strip().splitlines()[0]
        except Exception:
            return "unknown"

    return {
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "redis": ver(["redis-server", "--version"]),
        "etcd": ver(["etcd", "--version"]),
    }


def emit(result: dict[str, Any]) -> None:
    print(json.dumps(result, indent=2, default=str))
    sys.stdout.flush()


# pid -> (the process's start time, {thread id: its run time when last read}, run time of threads
# whose ids came back with a new thread): what cpu_ns has seen of each process's threads
_THREADS: dict[int, tuple[str, dict[str, int], int]] = {}


def cpu_ns(pid: int) -> int:
    """Run time of every thread of ``pid`` in nanoseconds, from the scheduler's own account
    (``/proc/PID/task/*/schedstat``), never less than at an earlier call: a thread that ended since
    counts with its run time when last read. (Counted only while alive, a thread that ran before a
    window and ended in it, such as the metrics server's thread answering the scrape just before
    the window, made the window's delta negative: -0.49 ms/s in an idle window.) Its run time
    between that read and its end is not counted."""
    with open(f"/proc/{pid}/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]  # field 22, starttime: a reused pid starts afresh
    seen_start, threads, gone = _THREADS.get(pid, ("", {}, 0))
    if seen_start != start:
        threads, gone = {}, 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (OSError, ValueError):
            continue
        before = threads.get(task, 0)
        if ns < before:  # a new thread with an ended one's id
            gone += before
        threads[task] = ns
    _THREADS[pid] = (start, threads, gone)
    return gone + sum(threads.values())


def run_seconds(pid: int) -> float:
    """CPU seconds of a long-running process's threads, to the nanosecond (:func:`cpu_ns`), where
    :func:`cpu_seconds` counts in 10 ms ticks: a window's delta there is off by up to 20 ms per
    process, which over 16 worker processes and 3 000 jobs is +-100 µs per job. Falls back to
    :func:`cpu_seconds` where the kernel keeps no schedstat."""
    try:
        return cpu_ns(pid) / 1e9
    except OSError:
        return cpu_seconds(pid)


def cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of a process (Linux /proc), ended threads included; in clock ticks
    (10 ms)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


CODE_DIRS = ("scheduler", "workers", "bench")
"""What a bench's processes import from a checkout: the packages and the bench's own handlers."""


def copy_code(checkout: Path, to: Path) -> None:
    """Copy ``checkout``'s :data:`CODE_DIRS` into ``to``, with its Lua scripts as the package
    ``scheduler.lua`` (pyproject.toml maps it to ``lua/``; a checkout set up for tests links
    ``scheduler/lua`` to ``../lua``, which is followed): without them there, the editable install's
    finder would hand the copy the main checkout's scripts. No bytecode, outputs or peers."""
    skip = shutil.ignore_patterns("__pycache__", "out", "peers")
    for d in CODE_DIRS:
        if (checkout / d).is_dir():
            shutil.copytree(checkout / d, to / d, symlinks=False, ignore=skip)
    if not (to / "scheduler" / "lua").is_dir() and (checkout / "lua").is_dir():
        shutil.copytree(checkout / "lua", to / "scheduler" / "lua", ignore=skip)


def compile_checkout(code: Path) -> None:
    """Write the bytecode of ``code``'s packages first. A fresh worktree has none, and with
    PYTHONDONTWRITEBYTECODE set (as on this VM) every process of that side compiled its imports at
    start: 8 workers came up over a second later, and their first jobs counted as late."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    dirs = [str(code / d) for d in ("scheduler", "workers", "bench") if (code / d).is_dir()]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *dirs], cwd=code, env=env, check=True,
                   stdout=subprocess.DEVNULL, timeout=600)
