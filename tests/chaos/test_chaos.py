"""Chaos run: the whole stack under a seeded nemesis, judged by the history checker.

Stack (``tests/chaos/stack.py``): Redis under Sentinel (master with AOF everysec, 1 replica,
3 sentinels), a 3-member etcd cluster, 3 ``zsched scheduler`` replicas (lease TTL 2 s) and 3
``zsched worker`` processes on the Sentinel URL; 2 producer threads schedule durable jobs
(``durable="replica"``) at ~80/s, run_at 0-3 s ahead, lease 4 s, max_attempts 200. The nemesis
(``tests/chaos/nemesis.py``) kills and freezes schedulers, workers, etcd members and Redis (stall,
replica kill, master restart, Sentinel failover), one fault at a time (every kind once first, see
``nemesis.FIRST``, then drawn by weight, for at least ``ZSCHED_CHAOS_SECONDS``), then heals
everything; the producers stop, the namespace quiesces, and the checker (``tests/chaos/checker.py``)
judges the history: no lost durable job, every extra run explained, nothing early, nothing left
over, no producer failure while Redis was up.

Short seeded run (CI, about 70 s)::

    .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/chaos/test_chaos.py

Another seed or a longer run (the long run: 30 minutes of faults, about 33 minutes in all)::

    ZSCHED_CHAOS_SEED=11 .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/chaos/test_chaos.py
    ZSCHED_CHAOS_SECONDS=1800 ZSCHED_CHAOS_SEED=1 \\
        .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/chaos/test_chaos.py

The test prints one summary line (``chaos seed=... faults=... jobs=... extra=... lost_durable=0 ...``).
On failure the history directory is kept and named in the message; check it again offline with
``python -m tests.chaos.check DIR``. ``ZSCHED_CHAOS_KEEP=1`` keeps it after a pass too, and
``ZSCHED_CHAOS_DIR`` says where to create it (default: the system temp dir).
``ZSCHED_CHAOS_SCHEDULER_ARGS`` and ``ZSCHED_CHAOS_WORKER_ARGS`` add arguments to every replica's and
every worker's command line, e.g. the spread-traffic settings of docs/scaling.md::

    ZSCHED_CHAOS_SCHEDULER_ARGS="--coalesce-lead 320" ZSCHED_CHAOS_WORKER_ARGS="--prefetch 128 --ack-linger 200" \\
        .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/chaos/test_chaos.py
"""
from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.chaos.checker import check, windows_summary
from tests.chaos.history import Params, load, read_calls, read_runs, write_final
from tests.chaos.nemesis import FIRST, Nemesis
from tests.chaos.stack import Stack
from tests.support.waits import wait_until
from workers.options import DEFAULT_CONCURRENCY
from workers.pace import UNMEASURED_EARLY

pytestmark = pytest.mark.fault

SEED = int(os.environ.get("ZSCHED_CHAOS_SEED", "7"))
# 45 s: the first faults, every kind once (about 40 s, a failover the longest at ~8 s), and one or
# two more by weight; the long run is where faults pile up
SECONDS = float(os.environ.get("ZSCHED_CHAOS_SECONDS", "45"))
KEEP = os.environ.get("ZSCHED_CHAOS_KEEP") == "1"
# extra arguments of every scheduler replica, e.g. "--coalesce-lead 160" (busy partitions hand jobs
# off up to 160 ms ahead: at the producers' ~10 jobs/s per partition they widen to it)
SCHEDULER_ARGS = shlex.split(os.environ.get("ZSCHED_CHAOS_SCHEDULER_ARGS", ""))
# extra arguments of every worker process, e.g. "--prefetch 128 --ack-linger 200" (finished jobs'
# acks wait up to 200 ms for each other: a worker killed meanwhile leaves them to run again)
WORKER_ARGS = shlex.split(os.environ.get("ZSCHED_CHAOS_WORKER_ARGS", ""))
AFTER_HEAL = 150  # jobs scheduled after the heal, all of which the healed stack must run
BURST_JOB_MS = 2_000  # how long each job of the burst after the heal runs (far above claiming it)


@pytest.mark.timeout(int(SECONDS) + 420)
def test_chaos_short(capsys: pytest.CaptureFixture[str]) -> None:
    hist = Path(tempfile.mkdtemp(prefix=f"zsched-chaos-seed{SEED}-", dir=os.environ.get("ZSCHED_CHAOS_DIR")))
    params = Params(lease=4.0, retry_budget=10.0, durable_timeout=1.5)
    stack = Stack(hist, seed=SEED, params=params, scheduler_args=SCHEDULER_ARGS, worker_args=WORKER_ARGS)
    nemesis: Nemesis | None = None
    problems: list[str] = []
    t_start = time.time()
    try:
        stack.start()
        stack.start_producers()
        # a steady state before the first fault: jobs run
        wait_until(lambda: sum(r.end is not None for r in read_runs(hist)) >= 100, 30,
                   what="100 jobs to run before the first fault")
        nemesis = Nemesis(stack, SEED, SECONDS)
        nemesis.start()
        nemesis.join(SECONDS + 300)
        if nemesis.is_alive():
            problems.append(f"the nemesis did not finish within {SECONDS + 300:.0f} s (stuck in {nemesis.current!r})")
            nemesis.halt()
        elif nemesis.error:
            problems.append(f"nemesis: {nemesis.error}")
        # jobs keep coming after the heal: the healed stack must take them. They are counted once the
        # namespace is quiet (below), so that their run_at spread (up to 3 s) overlaps the quiescing
        t_healed = time.time()
        scheduled = stack.calls_made()
        wait_until(lambda: stack.calls_made() - scheduled >= AFTER_HEAL, 60,
                   what=f"{AFTER_HEAL} jobs to be scheduled after the heal")
        # The producers' traffic is spread, and one listener (the workers' default) keeps spread
        # traffic on one worker while it has room: a burst more jobs than all workers but one can
        # hold (handler slots and the early jobs a claim takes before the handlers' pace is
        # measured, workers/pace.py), each running long enough that none frees its slot
        # before the burst is claimed, so that every worker must take part (checked below).
        stack.burst((stack.n_workers - 1) * (DEFAULT_CONCURRENCY + UNMEASURED_EARLY) + 8 * stack.n_workers,
                    BURST_JOB_MS, ahead_s=2.0)
        stack.stop_producers()
        final = stack.quiesce(timeout=60.0 + SECONDS / 20)
        ran = sum(r.start > t_healed and r.end is not None for r in read_runs(hist))
        if ran < AFTER_HEAL:
            problems.append(f"only {ran} jobs ran after the heal, {AFTER_HEAL} were scheduled then")
        ids = sorted({c.id for c in read_calls(hist) if c.id} | {r.id for r in read_runs(hist)})
        try:
            final.states = stack.final_states(ids)
        except Exception as exc:  # noqa: BLE001 - the checker reports what it could not see
            problems.append(f"could not read the final job states: {type(exc).__name__}: {exc}")
        dead = [p.tail(20) for p in stack.scheds + stack.workers if not p.alive]
        if dead:
            problems.append("processes died on their own:\n" + "\n".join(dead))
        missing = set(FIRST) - {f.kind for f in nemesis.faults}
        freezes = {bool(f.info.get("long")) for f in nemesis.faults if f.kind == "stop-worker"}
        if (missing or len(freezes) < 2) and not nemesis.error:
            problems.append(f"the nemesis left out some of its first faults: kinds {sorted(missing)}, "
                            f"worker freezes past the lease {sorted(freezes)} (both wanted)")
        # no component stays broken: every worker ran jobs scheduled after the last fault was healed
        healed = max((f.until for f in nemesis.faults), default=t_start)
        after = {r.pid for r in read_runs(hist) if r.start > healed}
        idle = [w for w in stack.workers if w.pid not in after]
        if idle:
            problems.append(f"worker(s) that ran nothing after the heal at {healed:.3f}:\n"
                            + "\n".join(w.tail(20) for w in idle))
        write_final(hist, final, params, t_start, time.time())
    finally:
        if nemesis is not None:
            nemesis.halt()
        stack.stop()

    verdict = check(load(hist))
    line = verdict.summary(SEED, SECONDS)
    (hist / "summary.txt").write_text(line + "\n")
    with capsys.disabled():
        print("\n" + line)
    ok = verdict.ok and not problems
    if ok and not KEEP:
        shutil.rmtree(hist, ignore_errors=True)
    assert ok, (f"{line}\nhistory kept in {hist}\n" + "\n".join(problems) + "\n" + verdict.report()
                + "\nfaults:\n" + windows_summary(load(hist).faults))
