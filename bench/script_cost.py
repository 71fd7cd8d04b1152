"""Redis instructions per one-job ``schedule`` call, counted by callgrind: the shipped script (fast
path first), the same script without its fast path (general path only), and an empty script with
the same keys and arguments (the cost of any EVALSHA of this shape).

``python -m bench.script_cost [--calls N]`` (needs valgrind; about a minute). Instruction counts do
not depend on what else the machine is doing, unlike times: the figures repeat to within a fraction
of a percent. Each side runs on its own redis-server under ``valgrind --tool=callgrind`` with
instrumentation off while it starts and while 200 warm-up calls create the queue and fill the cache,
on for the ``N`` measured calls (one job due in an hour each, one by one, as a producer sends them).
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

import redis

from bench.common import PAYLOAD, emit, machine
from scheduler.protocol.calls import Calls
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.options import JobOptions
from scheduler.protocol.scripts import LIBRARY_MARKER, library_source, load_scripts, make_script, script_source

WARM_UP = 200


def general_only() -> str:
    """schedule.lua without its fast path's block (the ``if`` that ends at ``--@library``); also the
    general path of tests/integration/test_schedule_fast_path.py."""
    lines = script_source("schedule").splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("if ARGV[6] == '1'"))
    mark = next(i for i, line in enumerate(lines) if line.strip() == LIBRARY_MARKER)
    return make_script("schedule", library_source(), "".join(lines[:start] + lines[mark + 1:])).source


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def instructions_per_call(source: str, calls: int) -> float:
    """Instructions redis-server executes per one-job schedule call of ``source``."""
    tmp = tempfile.mkdtemp(prefix="zsched-cg-")
    port = free_port()
    out = os.path.join(tmp, "callgrind.out")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--instr-atstart=no",
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", tmp], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        r = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 60
        while True:
            try:
                r.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        sha = r.script_load(source)
        ks = Keyspace("bench", 16)
        builder = Calls(ks, max_payload_bytes=65536, tombstone_ttl=3600, declare_all_keys=False)  # not a cluster
        opts = JobOptions()
        at = time.time() + 3600

        def one() -> None:
            _, keys, args = builder.prepare_one(at, PAYLOAD, None, opts)
            r.evalsha(sha, len(keys), *keys, *args)

        for _ in range(WARM_UP):
            one()
        control = ["callgrind_control", "-i"]
        subprocess.run([*control, "on", str(proc.pid)], check=True, capture_output=True)
        for _ in range(calls):
            one()
        subprocess.run([*control, "off", str(proc.pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
        r.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    total = 0
    for path in glob.glob(out + "*"):
        with open(path) as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
    shutil.rmtree(tmp, ignore_errors=True)
    return total / calls


def run(calls: int) -> dict[str, Any]:
    sides = {"shipped": load_scripts()["schedule"].source, "general_path_only": general_only(),
             "empty_script": "return 1"}
    out: dict[str, Any] = {"calls": calls, "machine": machine()}
    for name, src in sides.items():
        out[f"{name}_instructions_per_call"] = round(instructions_per_call(src, calls))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400, help="measured calls per side (default 400)")
    emit(run(ap.parse_args().calls))


if __name__ == "__main__":
    main()
