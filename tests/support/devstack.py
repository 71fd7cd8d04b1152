"""Find processes by their command line, or the children of a process by pid (to prove a stack
left nothing behind)."""
from __future__ import annotations

import os
import time
from pathlib import Path


def processes_mentioning(text: str) -> list[tuple[int, str]]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmd and state != "Z":
            out.append((int(pid), cmd))
    return out


# ------------------------------------------------------------------ the children of a process, by pid


def start_time(pid: int) -> str | None:
    """The start time of ``pid`` (field 22 of /proc/PID/stat, which tells a reused pid apart); None
    if it is gone or a zombie (exited, not reaped yet: it holds nothing any more)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def children_of(pid: int) -> dict[int, str]:
    """The running children of ``pid`` (from /proc/PID/task/*/children), each with its start time."""
    kids: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            kids |= {int(k) for k in Path(f"/proc/{pid}/task/{task}/children").read_text().split()}
        except OSError:  # the thread ended
            continue
    return {k: st for k in kids if (st := start_time(k)) is not None}


def still_alive(procs: dict[int, str]) -> list[int]:
    """The pids of ``procs`` (pid -> start time) that still run as the same process."""
    return [pid for pid, st in procs.items() if start_time(pid) == st]


def wait_gone(procs: dict[int, str], bound: float) -> list[int]:
    """Wait up to ``bound`` s for every process of ``procs`` to be gone; those still running then."""
    deadline = time.monotonic() + bound
    while (left := still_alive(procs)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left
