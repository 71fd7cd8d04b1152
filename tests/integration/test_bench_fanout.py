"""``python -m bench fanout`` (bench/fanout.py) end to end on a tiny load: the JSON it gives, the
RESULTS.md section and the curves it draws. Shape only: benchmark figures are never asserted."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from bench import fanout
from bench.fanout_plot import PLOTS
from bench.report import fanout_markdown

PER_JOB = ("worker_cpu_us_per_job", "redis_cpu_us_per_job", "replica_cpu_us_per_job", "script_calls_per_job",
           "publishes_per_job", "notified_per_job", "claims_per_job", "claims_empty_per_job",
           "handler_lateness_p50_ms", "handler_lateness_p99_ms")


def test_a_tiny_run_gives_per_job_figures_per_shape_and_worker_count(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fanout, "IDLE_S", 0.3)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where the stack keeps its workers' records
    # LEAD_S stays the bench's own (2 s): the scheduling child must be done 0.5 s before the first
    # due time, and with 1 s a loaded machine (the suite's parallel workers) missed that
    r = fanout.run(workers=[1], backends=["single"], rounds=1, jobs=60, seconds=0.6, bursts=2, partitions=4,
                   handler_ms=5)
    assert {(x["shape"], x["workers"]) for x in r["runs"]} == {("spread", 1), ("batched", 1)}
    assert r["partitions"] == 4 and r["handler_ms"] == 5 and not fanout.is_full(r)
    for run in r["runs"]:
        assert run["jobs"] == 60 and run["missing"] == 0 and run["duplicates"] == 0
        assert all(run[k] is not None for k in PER_JOB), run  # this checkout's workers export the counters
        # where Redis's time went: per command, calls and µs per job; the scripts are among them
        assert run["commands_per_job"]["evalsha"][0] > 0 and run["round_trips_per_job"] > 0
        assert all(len(v) == 2 for v in run["commands_per_job"].values())
    assert [e["shape"] for e in r["summary"]] == ["spread", "batched"]
    commands = r["summary"][0]["commands_per_job"]  # each column's median over rounds, busiest first
    assert commands["evalsha"] == r["runs"][0]["commands_per_job"]["evalsha"]
    assert [v[1] for v in commands.values()] == sorted((v[1] for v in commands.values()), reverse=True)
    assert set(r["summary"][0][PER_JOB[0]]) == {"median", "min", "max", "runs"}
    assert r["idle"][0]["worker_cpu_ms_per_s"] >= 0
    assert [t["shape"] for t in r["targets"]] == ["spread", "batched"]
    # the processes ran from a copy of the checkout's code, made for the run and removed after it
    this = r["sides"]["this"]
    assert this["path"] == str(fanout.ROOT) and this["commit"] != "unknown"
    assert all(Path(p).is_relative_to(tmp) and "zsched-bench-code-this-" in p for p in this["imports"].values())
    assert not list(tmp.glob("zsched-bench-*")), "each stack removes its records' directory, the run its code copy"

    fanout.finish(r, tmp_path / "fanout.json", tmp_path / "img")
    assert sorted(p.name for p in (tmp_path / "img").iterdir()) == sorted(
        f"fanout-{suffix}.png" for suffix, *_ in PLOTS)
    text = fanout_markdown(r, ["fanout-worker-cpu.png"])
    assert "| 1 redis-server | spread | 1 |" in text and "(../docs/img/fanout-worker-cpu.png)" in text


def test_compare_refuses_a_folder_that_is_not_a_checkout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        fanout.main(["--compare", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench fanout: error: --compare") and "worktree" in err[0]


@pytest.mark.parametrize("count", ["0", "4097"])
def test_a_partition_count_out_of_range_is_refused_before_any_server_starts(
        count: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        fanout.main(["--partitions", count])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bench fanout: error: --partitions {count}: give a count from 1 to 4096"]


@pytest.mark.parametrize("ms", ["-1", "60001", "nan"])
def test_a_handler_time_out_of_range_is_refused(ms: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        fanout.main(["--handler-ms", ms])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"bench fanout: error: --handler-ms {ms}: give a run time")


def test_slow_handlers_are_not_compared_with_a_checkout_whose_handler_cannot_wait(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "handlers.py").write_text("async def noop(job): pass\n")  # an older bench handler
    with pytest.raises(SystemExit) as exit_:
        fanout.main(["--handler-ms", "100", "--compare", str(tmp_path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not sleep" in err[0]


def test_the_bench_handler_waits_as_long_as_it_is_told() -> None:
    # in a child process: the handler module reads BENCH_HANDLER_MS when it is imported (the 5 ms:
    # asyncio may run a timer up to its clock resolution early)
    code = ("import asyncio, time\n"
            "from bench import handlers\n"
            "class J: id, due_ms = 'x', 0\n"
            "t = time.monotonic(); asyncio.run(handlers.noop(J())); waited = time.monotonic() - t\n"
            "print(handlers.HANDLER_S, len(handlers._records), waited >= handlers.HANDLER_S - 0.005)\n")
    root = str(Path(fanout.__file__).resolve().parent.parent)
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": root, "BENCH_HANDLER_MS": "30"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0.03", "1", "True"]


_KILLED_BENCH = """
import sys, time
from bench.stack import Stack
st = Stack(partitions=4).__enter__()
st.start_schedulers(1)
st.start_workers(1, concurrency=1, settle=0)
print(st.schedulers[0].pid, st.workers[0][0].pid, flush=True)
time.sleep(600)
"""


def test_a_killed_bench_leaves_no_replica_or_worker_running(tmp_path: Path) -> None:
    # Before, a bench ended by a signal (its stack's cleanup skipped) left its replicas and workers
    # running for as long as nobody noticed, retrying a Redis that was gone and taking CPU from the
    # next measurements. They hold the bench's lifeline now and stop once it is gone.
    from tests.support.devstack import start_time, still_alive, wait_gone

    # its temporary directories in the test's own (killed, the stack cannot remove its records' directory)
    bench = subprocess.Popen([sys.executable, "-c", _KILLED_BENCH], stdout=subprocess.PIPE, text=True,
                             cwd=str(Path(fanout.__file__).resolve().parent.parent),
                             env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        line = bench.stdout.readline() if bench.stdout else ""
        assert line.strip(), f"the bench stack did not start (exit {bench.poll()})"
        names = {int(p): name for p, name in zip(line.split(), ("replica", "worker"))}
        pids = {p: start_time(p) for p in names}
        assert sorted(still_alive(pids)) == sorted(names)
    finally:
        bench.kill()  # SIGKILL: no cleanup of its own at all
        bench.wait(10)
    left = wait_gone(pids, 30.0)
    assert not left, f"still running after the bench was killed: {[names[p] for p in left]}"
