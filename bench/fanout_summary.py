"""The ``fanout`` suite's figures over rounds (``bench/fanout.py``): medians with min and max per
side, backend, shape and number of worker processes; the issue's targets; old-vs-new ratios."""
from __future__ import annotations

import statistics
import sys
from typing import Any

KEY = ("side", "backend", "shape", "workers")
ORDER = {"this": 0, "other": 1, "single": 0, "cluster": 1, "spread": 0, "batched": 1, "idle": 2}
# the targets: W=16 against W=1, per job, and script calls per job at every W
TARGETS = {"worker_cpu_us_per_job": 1.3, "redis_cpu_us_per_job": 1.2}
MAX_SCRIPT_CALLS = 3.5
# what --compare gives ratios of (this / other)
COMPARED = ("worker_cpu_us_per_job", "redis_cpu_us_per_job", "replica_cpu_us_per_job", "script_calls_per_job",
            "publishes_per_job", "notified_per_job", "handler_lateness_p50_ms", "handler_lateness_p99_ms")


def _numbers(values: list[Any]) -> list[float]:
    return [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per side, backend, shape and W: each figure's median, min, max and per-round runs."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(tuple(r.get(k, "idle") for k in KEY), []).append(r)
    out = []
    for key in sorted(groups, key=lambda k: (ORDER.get(k[0], 9), ORDER.get(k[1], 9), ORDER.get(k[2], 9), k[3])):
        rs = sorted(groups[key], key=lambda r: r["round"])
        entry: dict[str, Any] = dict(zip(KEY, key, strict=True)) | {"rounds": [r["round"] for r in rs]}
        for name in rs[0]:
            if name in KEY or name == "round":
                continue
            values = [r.get(name) for r in rs]
            if all(isinstance(v, dict) for v in values):  # per command: the median of each column
                entry[name] = _table_medians(values)
                continue
            nums = _numbers(values)
            entry[name] = ({"median": round(statistics.median(nums), 4), "min": min(nums), "max": max(nums),
                            "runs": values} if nums else None)
        out.append(entry)
    return out


def _table_medians(tables: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Per row (a command) of per-round tables: each column's median over the rounds (a round
    without the row counts as zeros), the rows by their last column's median, largest first."""
    rows = {k for t in tables for k in t}
    width = max((len(v) for t in tables for v in t.values()), default=0)
    out = {k: [round(statistics.median(t.get(k, [0.0] * width)[i] for t in tables), 4) for i in range(width)]
           for k in rows}
    return dict(sorted(out.items(), key=lambda kv: -kv[1][-1]))


def median(entry: dict[str, Any] | None, name: str) -> float | None:
    """The median of figure ``name`` in a summary entry (None when absent or not measured)."""
    fig = (entry or {}).get(name)
    return fig["median"] if fig else None


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def targets(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per side, backend and shape: the fewest and most workers' per-job costs against the issue's
    targets (worker CPU within 1.3x, Redis CPU within 1.2x), and script calls per job at every W."""
    lines: dict[tuple[str, str, str], dict[int, dict[str, Any]]] = {}
    for e in summary:
        if e["shape"] != "idle":
            lines.setdefault((e["side"], e["backend"], e["shape"]), {})[e["workers"]] = e
    out = []
    for (side, backend, shape), by_w in lines.items():
        lo, hi = by_w[min(by_w)], by_w[max(by_w)]
        t: dict[str, Any] = {"side": side, "backend": backend, "shape": shape, "workers": [min(by_w), max(by_w)]}
        for name, limit in TARGETS.items():
            r = ratio(median(hi, name), median(lo, name))
            t[name] = {"ratio": r, "target": limit, "met": r is not None and r <= limit}
        calls = [median(e, "script_calls_per_job") for e in by_w.values()]
        worst = max((c for c in calls if c is not None), default=None)
        t["script_calls_per_job"] = {"max": worst, "target": MAX_SCRIPT_CALLS,
                                     "met": worst is not None and worst < MAX_SCRIPT_CALLS}
        out.append(t)
    return out


def compare(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per backend, shape and W, for each of COMPARED: this side's and the other's medians, their
    ratio, and the median of the per-round ratios (both sides ran in the same round)."""
    by: dict[tuple[str, str, int], dict[str, dict[int, dict[str, Any]]]] = {}
    for r in runs:
        by.setdefault((r["backend"], r["shape"], r["workers"]), {}).setdefault(r["side"], {})[r["round"]] = r
    out = []
    for (backend, shape, w), sides in sorted(by.items(), key=lambda kv: (ORDER[kv[0][0]], ORDER[kv[0][1]],
                                                                          kv[0][2])):
        this, other = sides.get("this", {}), sides.get("other", {})
        entry: dict[str, Any] = {"backend": backend, "shape": shape, "workers": w}
        for name in COMPARED:
            a = _numbers([r.get(name) for r in this.values()])
            b = _numbers([r.get(name) for r in other.values()])
            per_round = [this[k][name] / other[k][name] for k in this.keys() & other.keys()
                         if _numbers([this[k].get(name)]) and _numbers([other[k].get(name)]) and other[k][name]]
            ma = round(statistics.median(a), 4) if a else None
            mb = round(statistics.median(b), 4) if b else None
            entry[name] = {"this": ma, "other": mb, "ratio": ratio(ma, mb),
                           "paired": round(statistics.median(per_round), 3) if per_round else None}
        out.append(entry)
    return out


def _cell(entry: dict[str, Any], name: str, fmt: str = "{:.0f}") -> str:
    v = median(entry, name)
    return "-" if v is None else fmt.format(v)


def print_table(r: dict[str, Any]) -> None:
    """The medians, the targets and (with --compare) the ratios, as plain text on stderr."""
    err = sys.stderr
    print("\nper job (medians over rounds): side backend shape W | worker µs, Redis µs, replicas µs | script "
          "calls, published, notified, claims (empty) | handler lateness p50/p99 ms", file=err)
    for e in r["summary"]:
        print(f"  {e['side']:5} {e['backend']:7} {e['shape']:7} W={e['workers']:<3}| "
              f"{_cell(e, 'worker_cpu_us_per_job'):>6} {_cell(e, 'redis_cpu_us_per_job'):>6} "
              f"{_cell(e, 'replica_cpu_us_per_job'):>6} | {_cell(e, 'script_calls_per_job', '{:.2f}'):>6} "
              f"{_cell(e, 'publishes_per_job', '{:.2f}'):>5} {_cell(e, 'notified_per_job', '{:.2f}'):>6} "
              f"{_cell(e, 'claims_per_job', '{:.2f}'):>5} ({_cell(e, 'claims_empty_per_job', '{:.2f}')}) | "
              f"{_cell(e, 'handler_lateness_p50_ms', '{:.2f}')}/{_cell(e, 'handler_lateness_p99_ms', '{:.2f}')}",
              file=err)
    print("targets (most workers / fewest, per job):", file=err)
    for t in r["targets"]:
        w, calls = t["worker_cpu_us_per_job"], t["script_calls_per_job"]
        rd = t["redis_cpu_us_per_job"]
        print(f"  {t['side']:5} {t['backend']:7} {t['shape']:7} W={t['workers'][1]}/W={t['workers'][0]}: worker "
              f"CPU {w['ratio']} (<= {w['target']}: {'met' if w['met'] else 'NOT met'}), Redis CPU {rd['ratio']} "
              f"(<= {rd['target']}: {'met' if rd['met'] else 'NOT met'}); script calls per job at most "
              f"{calls['max']} (< {calls['target']}: {'met' if calls['met'] else 'NOT met'})", file=err)
    for c in r.get("compare") or []:
        cells = ", ".join(f"{name.removesuffix('_per_job')} {c[name]['ratio']} ({c[name]['paired']})"
                          for name in COMPARED if c[name]["ratio"] is not None)
        print(f"  this/other {c['backend']:7} {c['shape']:7} W={c['workers']:<3}: {cells}", file=err)
