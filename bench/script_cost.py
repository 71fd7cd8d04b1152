"""Redis instructions per one-job call of the hot scripts, counted by callgrind: ``schedule``, a
``tick`` that moves one due job to its ready list, a ``claim`` that takes one ready job (as a
worker sends it: request id, receipt, the previous request id, a due-job limit), an ``ack`` of
one running job and a ``reap`` that finds nothing; each as shipped (its fast path first), the same
script without its fast path (general path only), and an empty script with the same keys and
arguments (what any EVALSHA of that shape costs).

``python -m bench.script_cost [--calls N] [--only NAME]`` (needs valgrind; a few minutes).
Instruction counts do not depend on what else the machine is doing, unlike times: the figures
repeat to within a fraction of a percent. Each side runs on its own redis-server under
``valgrind --tool=callgrind`` with instrumentation off while it starts, while the data is set up
and during 200 warm-up calls (they create the queue and fill the caches), on for the ``N``
measured calls, sent one by one. The servers run with ``hz 1``: their timers (serverCron, about
ten times a second by default) run while the calls are measured, as often as the calls take wall
time under valgrind, and blurred the figures by a percent or two.

- ``schedule``: one job due in an hour per call, as a producer sends them (16 partitions,
  only the timer set declared: not a cluster; so for ``tick``, ``claim`` and ``ack``, as replicas and
  workers send them).
- ``tick``: the timers are set up first, 10 s apart, in the one partition of a 1-partition
  namespace; each measured tick (epoch 1, batch 1000, no rate limit or retention) passes a
  hand-off lead that reaches exactly the next timer, so it moves one job, as the tier's ticks
  with their hand-off lead do.
- ``claim``: the ready jobs are set up first; each measured claim asks for one job. The jobs it
  claims stay running, so the partition's lease hash 'l' holds 200-600 entries, a listpack up to
  512 (Redis's hash-max-listpack-entries), which every write to it scans: about 45 k of a one-job
  claim's instructions (callgrind's lpFind), which a partition with a few running jobs does not pay.
- ``ack``: the running jobs are set up first (scheduled due, claimed in one call); each measured
  ack finishes one, leaving its tombstone.
- ``ack4``: the same with 4 jobs per call, as the acks of one partition that waited together go
  (``zsched worker --ack-linger``; workers/outbox.py); per call, not per job.
- ``reap``: the owner's reap of an idle partition (epoch 1, batch 1000), which finds no expired
  lease: what every partition sends twice a second, idle or busy.
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
from collections.abc import Callable
from typing import Any

import redis

from bench.common import PAYLOAD, emit, machine
from scheduler.protocol.calls import Calls
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.options import JobOptions
from scheduler.protocol.replies import parse_claim
from scheduler.protocol.scripts import (
    LIBRARY_MARKER,
    library_source,
    load_scripts,
    make_script,
    restate_uses,
    script_source,
)
from scheduler.protocol.tick import Retention, reap_call, tick_call
from scheduler.protocol.transitions import ack_call, claim_call

WARM_UP = 200
EMPTY = "return 1"
TIMER_GAP_MS = 10_000  # between the tick side's timers: a tick's horizon reaches one of them, never two
RECEIPT_MS = 30_000    # the claim side's receipt ttl, as workers/fetch.py sends it
PAST = 1_000_000_000.0  # 2001-09-09: due at once, sent as an absolute run_at (smaller epoch seconds are refused)


def general_only(name: str = "schedule") -> str:
    """A script without its fast path's block (from its first ``local A = ARGV``, or in schedule.lua
    older than the argument checks ``if ARGV[6] == '1'``, to ``--@library``); also the general path
    of tests/integration/test_*_fast_path.py (schedule, tick, claim, ack, reap)."""
    lines = script_source(name).splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith(("local A = ARGV", "if ARGV[6] == '1'")))
    mark = next(i for i, line in enumerate(lines) if line.strip() == LIBRARY_MARKER)
    lib = library_source()
    return make_script(name, lib, restate_uses(lib, "".join(lines[:start] + lines[mark + 1:]))).source


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Call = tuple[list[Any], list[Any]]  # (keys, args) of one EVALSHA


class Side:
    """One workload: ``setup`` runs with instrumentation off (a client on the server, the SHA of
    the shipped scripts by name); ``nth(i)`` is the keys and arguments of call ``i`` (warm-up calls
    first, then the measured ones); ``check(r, n)``, after ``n`` calls of the shipped script,
    raises when they did not do what the workload says (e.g. a tick that moved two jobs)."""

    def __init__(self, setup: Callable[[redis.Redis, dict[str, str]], None], nth: Callable[[int], Call],
                 check: Callable[[redis.Redis, int], None]) -> None:
        self.setup, self.nth, self.check = setup, nth, check


def instructions_per_call(source: str, side: Side, calls: int) -> float:
    """Instructions redis-server executes per measured call of ``source``."""
    tmp = tempfile.mkdtemp(prefix="zsched-cg-")
    port = free_port()
    out = os.path.join(tmp, "callgrind.out")
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--instr-atstart=no",
         "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--hz", "1",
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
        shas = {name: r.script_load(s.source) for name, s in load_scripts().items()}
        side.setup(r, shas)
        sha = r.script_load(source)

        def one(i: int) -> None:
            keys, args = side.nth(i)
            r.evalsha(sha, len(keys), *keys, *args)

        for i in range(WARM_UP):
            one(i)
        control = ["callgrind_control", "-i"]
        subprocess.run([*control, "on", str(proc.pid)], check=True, capture_output=True)
        for i in range(WARM_UP, WARM_UP + calls):
            one(i)
        subprocess.run([*control, "off", str(proc.pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
        if source != EMPTY:
            side.check(r, WARM_UP + calls)
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


def nothing(r: redis.Redis, shas: dict[str, str]) -> None:
    """No set-up: the warm-up calls create what the measured ones need."""


def schedule_side() -> Side:
    """One job due in an hour per call, on one of 16 partitions (the producer's hot path)."""
    builder = Calls(Keyspace("bench", 16), max_payload_bytes=65536, tombstone_ttl=3600, declare_all_keys=False)
    opts = JobOptions()
    at = time.time() + 3600

    def nth(i: int) -> Call:
        _, keys, args = builder.prepare_one(at, PAYLOAD, None, opts)
        return list(keys), list(args)

    def check(r: redis.Redis, n: int) -> None:
        timers = sum(int(r.zcard(k)) for k in (Keyspace("bench", 16).partition_keys(p)[0] for p in range(16)))
        if timers != n:
            raise RuntimeError(f"schedule side: {timers} timers after {n} calls")

    return Side(nothing, nth, check)


def send(r: redis.Redis, shas: dict[str, str], calls: list[tuple[str, Any, Any]]) -> None:
    """Shipped script calls in one pipeline (set-up, not measured)."""
    pipe = r.pipeline(transaction=False)
    for name, keys, args in calls:
        pipe.evalsha(shas[name], len(keys), *keys, *args)
    pipe.execute()


def tick_side(calls: int) -> Side:
    """A tick that moves exactly one timer per call: timers 10 s apart, each tick's hand-off lead
    reaching the next one (a horizon half a gap past it: Redis's clock and ours, on one machine,
    agree far better than that). Without housekeeping, as the tier sends all but about one tick per
    second per partition (the fast path's call; the tombstone sweep still goes through the general
    path once a second of Redis's clock, slowed down by callgrind)."""
    builder = Calls(Keyspace("bench", 1), max_payload_bytes=65536, tombstone_ttl=3600, declare_all_keys=False)
    opts = JobOptions()
    base_ms = int(time.time() * 1000) + 3_600_000

    def setup(r: redis.Redis, shas: dict[str, str]) -> None:
        jobs = [(((base_ms + i * TIMER_GAP_MS) / 1000), PAYLOAD) for i in range(WARM_UP + calls)]
        send(r, shas, builder.prepare(jobs, opts)[0])

    def nth(i: int) -> Call:
        lead = base_ms + i * TIMER_GAP_MS + TIMER_GAP_MS // 2 - int(time.time() * 1000)
        _, keys, args = tick_call(builder, 0, 1, 1000, {}, Retention(), lead, housekeeping=False)
        return list(keys), list(args)

    def check(r: redis.Redis, n: int) -> None:
        ready = int(r.llen(builder.ks.ready(0, "default")))
        if ready != n:
            raise RuntimeError(f"tick side: {ready} jobs moved by {n} ticks, expected one each")

    return Side(setup, nth, check)


def claim_side(calls: int) -> Side:
    """A worker's claim of one job (request id, receipt, previous request id, due-job limit) from
    a ready list set up first, as a worker sends it off a cluster (the timer set its one key)."""
    builder = Calls(Keyspace("bench", 1), max_payload_bytes=65536, tombstone_ttl=3600, declare_all_keys=False)
    opts = JobOptions()

    def setup(r: redis.Redis, shas: dict[str, str]) -> None:
        send(r, shas, builder.prepare([(PAST, PAYLOAD)] * (WARM_UP + calls), opts)[0])

    def nth(i: int) -> Call:
        prev = f"bench-{i - 1:x}" if i else ""
        _, keys, args = claim_call(builder, 0, "default", 1, request_id=f"bench-{i:x}", receipt_ms=RECEIPT_MS,
                                   earlier_request_id=prev, max_due=1)
        return list(keys), list(args)

    def check(r: redis.Redis, n: int) -> None:
        running = int(r.zcard(builder.ks.partition_keys(0)[3]))
        if running != n:
            raise RuntimeError(f"claim side: {running} jobs claimed by {n} claims, expected one each")

    return Side(setup, nth, check)


def ack_side(calls: int, per_call: int = 1) -> Side:
    """A worker's ack of ``per_call`` jobs per call (a tombstone kept, as by default; 4: the acks
    of one partition that waited together, workers/outbox.py), the jobs claimed in the set-up,
    one claim for all of them; off a cluster, as the claim side."""
    builder = Calls(Keyspace("bench", 1), max_payload_bytes=65536, tombstone_ttl=3600, declare_all_keys=False)
    opts = JobOptions()
    held: list[tuple[bytes, int]] = []
    jobs_needed = (WARM_UP + calls) * per_call

    def setup(r: redis.Redis, shas: dict[str, str]) -> None:
        send(r, shas, builder.prepare([(PAST, PAYLOAD)] * jobs_needed, opts)[0])
        _, keys, args = claim_call(builder, 0, "default", jobs_needed, request_id="bench-ack",
                                   receipt_ms=RECEIPT_MS, earlier_request_id="", max_due=jobs_needed)
        _, jobs = parse_claim(r.evalsha(shas["claim"], len(keys), *keys, *args))
        held.extend((j.raw_id, j.token) for j in jobs)

    def nth(i: int) -> Call:
        _, keys, args = ack_call(builder, 0, held[i * per_call:(i + 1) * per_call])
        return list(keys), list(args)

    def check(r: redis.Redis, n: int) -> None:
        running = int(r.zcard(builder.ks.partition_keys(0)[3]))
        if running != len(held) - n * per_call:
            raise RuntimeError(f"ack side: {running} jobs still running after {n} acks of {per_call} "
                               f"of {len(held)}")

    return Side(setup, nth, check)


def reap_side() -> Side:
    """The owner's reap of an idle partition: no lease in flight, nothing to reap; off a cluster."""
    builder = Calls(Keyspace("bench", 1), max_payload_bytes=65536, tombstone_ttl=3600, declare_all_keys=False)

    def nth(i: int) -> Call:
        _, keys, args = reap_call(builder, 0, 1, 1000)
        return list(keys), list(args)

    def check(r: redis.Redis, n: int) -> None:
        epoch = r.hget(builder.ks.partition_keys(0)[12], "epoch")
        if epoch != b"1":
            raise RuntimeError(f"reap side: the partition's epoch is {epoch!r} after {n} reaps with epoch 1")

    return Side(nothing, nth, check)


WORKLOADS = ("schedule", "tick", "claim", "ack", "ack4", "reap")
ACK_BATCH = 4  # the ack4 workload's jobs per call


def run(calls: int, only: str | None = None) -> dict[str, Any]:
    shipped = load_scripts()
    sides: dict[str, tuple[Callable[[], Side], dict[str, str]]] = {
        "schedule": (schedule_side, {"shipped": shipped["schedule"].source, "general_path_only": general_only(),
                                     "empty_script": EMPTY}),
        "tick": (lambda: tick_side(calls), {"shipped": shipped["tick"].source,
                                            "general_path_only": general_only("tick"), "empty_script": EMPTY}),
        "claim": (lambda: claim_side(calls), {"shipped": shipped["claim"].source,
                                              "general_path_only": general_only("claim"), "empty_script": EMPTY}),
        "ack": (lambda: ack_side(calls), {"shipped": shipped["ack"].source, "general_path_only": general_only("ack"),
                                          "empty_script": EMPTY}),
        "ack4": (lambda: ack_side(calls, ACK_BATCH), {"shipped": shipped["ack"].source,
                                                      "general_path_only": general_only("ack"),
                                                      "empty_script": EMPTY}),
        "reap": (reap_side, {"shipped": shipped["reap"].source, "general_path_only": general_only("reap"),
                             "empty_script": EMPTY}),
    }
    out: dict[str, Any] = {"calls": calls, "machine": machine()}
    for workload in WORKLOADS:
        if only and workload != only:
            continue
        make, sources = sides[workload]
        out[workload] = {f"{name}_instructions_per_call": round(instructions_per_call(src, make(), calls))
                         for name, src in sources.items()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=400, help="measured calls per side (default 400)")
    ap.add_argument("--only", choices=WORKLOADS, help="measure one workload")
    args = ap.parse_args()
    emit(run(args.calls, args.only))


if __name__ == "__main__":
    main()
