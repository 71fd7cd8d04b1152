"""``python -m bench fanout`` (bench/fanout.py) end to end on a tiny load: the JSON it gives, the
RESULTS.md section and the curves it draws. Shape only: benchmark figures are never asserted."""
from __future__ import annotations

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
    # LEAD_S stays the bench's own (2 s): the scheduling child must be done 0.5 s before the first
    # due time, and with 1 s a loaded machine (the suite's parallel workers) missed that
    r = fanout.run(workers=[1], backends=["single"], rounds=1, jobs=60, seconds=0.6, bursts=2)
    assert {(x["shape"], x["workers"]) for x in r["runs"]} == {("spread", 1), ("batched", 1)}
    for run in r["runs"]:
        assert run["jobs"] == 60 and run["missing"] == 0 and run["duplicates"] == 0
        assert all(run[k] is not None for k in PER_JOB), run  # this checkout's workers export the counters
    assert [e["shape"] for e in r["summary"]] == ["spread", "batched"]
    assert set(r["summary"][0][PER_JOB[0]]) == {"median", "min", "max", "runs"}
    assert r["idle"][0]["worker_cpu_ms_per_s"] >= 0
    assert [t["shape"] for t in r["targets"]] == ["spread", "batched"]
    assert r["sides"]["this"]["imports"]["workers"].startswith(str(fanout.ROOT))

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
