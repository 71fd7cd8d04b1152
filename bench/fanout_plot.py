"""The ``fanout`` suite's curves (``bench/fanout.py``): per-job costs against the number of worker
processes, one line per traffic shape and backend (and side, with --compare), log-2 x axis,
medians over rounds with min-max bars. PNGs drawn with matplotlib's Agg backend (no display)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

# file suffix, figure, title, y-axis label
PLOTS = (
    ("worker-cpu", "worker_cpu_us_per_job", "Worker CPU per job (all worker processes)", "CPU µs per job"),
    ("redis-cpu", "redis_cpu_us_per_job", "Redis CPU per job (all masters)", "CPU µs per job"),
    ("replica-cpu", "replica_cpu_us_per_job", "Scheduler replicas' CPU per job", "CPU µs per job"),
    ("script-calls", "script_calls_per_job", "Script calls per job (EVALSHA/EVAL/FCALL)", "calls per job"),
    ("notified", "notified_per_job", "Ready notifications received by workers, per job", "messages per job"),
    ("lateness", "handler_lateness_p99_ms", "Handler lateness p99 (handler start - due time)", "ms"),
)
COLORS = {"single": "tab:blue", "cluster": "tab:orange"}
STYLES = {"spread": "-", "batched": "--"}
MARKERS = {"this": "o", "other": "s"}


def draw(r: dict[str, Any], outdir: Path, prefix: str) -> list[Path]:
    """One PNG per figure of PLOTS, ``outdir/PREFIX-SUFFIX.png``; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    series: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for e in r["summary"]:
        series.setdefault((e["side"], e["backend"], e["shape"]), []).append(e)
    compared = len({side for side, _, _ in series}) > 1
    ws = sorted({e["workers"] for e in r["summary"]})
    sides = r.get("sides") or {}
    rounds = r["rounds"]
    jobs = f"{r['jobs']:,}".replace(",", " ")
    note = (f"{jobs} jobs over {r['seconds']:g} s per load (batched: {r['bursts']} instants), concurrency "
            f"{r['concurrency']} per worker; median of {rounds} round{'s' if rounds > 1 else ''}, bars min-max; "
            f"{r['machine']['date']}")
    paths = []
    for suffix, name, title, unit in PLOTS:
        fig, ax = plt.subplots(figsize=(7.2, 4.4), dpi=100)
        drew = False
        for (side, backend, shape), entries in series.items():
            pts = [(e["workers"], e[name]) for e in sorted(entries, key=lambda e: e["workers"]) if e.get(name)]
            if not pts:
                continue
            x = [w for w, _ in pts]
            y = [f["median"] for _, f in pts]
            err = [[m - f["min"] for m, (_, f) in zip(y, pts, strict=True)],
                   [f["max"] - m for m, (_, f) in zip(y, pts, strict=True)]]
            label = f"{shape}, {'1 redis-server' if backend == 'single' else '3-master cluster'}"
            if compared:
                label += f", {side} ({sides.get(side, {}).get('commit', '?')})"
            ax.errorbar(x, y, yerr=err, label=label, color=COLORS.get(backend), linestyle=STYLES.get(shape, "-"),
                        marker=MARKERS.get(side, "o"), markersize=4, capsize=3,
                        alpha=1.0 if side == "this" else 0.55)
            drew = True
        ax.set_xscale("log", base=2)
        ax.set_xticks(ws, [str(w) for w in ws])
        ax.set_xlabel("worker processes")
        ax.set_ylabel(unit)
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=11)
        fig.text(0.01, 0.01, note, fontsize=7, color="0.35")
        ax.grid(True, alpha=0.3)
        if drew:
            ax.legend(fontsize=8)
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        path = outdir / f"{prefix}-{suffix}.png"
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return paths
