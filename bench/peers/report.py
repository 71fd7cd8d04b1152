"""RESULTS.md rows for zsched beside huey and Celery, with the ratio zsched / peer per workload.

``rows(peers, zsched)`` takes ``bench.peers.run``'s result and zsched's results in the shape of
``python -m bench all`` (``{"core": ..., "drain": [...], "lateness": [...]}``; None: the ``zsched``
part of ``peers``). Where both hold a figure: W1 comes from ``peers["zsched"]`` (its rounds ran
interleaved with the peers' on the same server), W2-W4 from ``zsched`` (the suites' own runs), W2 at
20 000 from ``peers["zsched"]`` unless ``zsched``'s core measured that size.

Ratios are zsched / peer of the figure in the row: above 1 is zsched ahead for jobs/s, below 1 is
zsched ahead for bytes and milliseconds; the last column says who is ahead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

Row = tuple[str, str, str, str, str, str, str, str]
HEADER = ("| workload | measure | zsched | huey | Celery | zsched / huey | zsched / Celery | zsched ahead of |\n"
          "|---|---|---|---|---|---|---|---|")


def get(d: Any, *path: Any) -> Any:
    """``d[p0][p1]...``, None where any step is missing."""
    for k in path:
        try:
            d = d[k]
        except (KeyError, IndexError, TypeError):
            return None
    return d


def fmt(v: Any) -> str:
    """A figure as RESULTS.md writes it: 3 significant-ish digits, thousands split by a space."""
    if v is None:
        return "n/a"
    if isinstance(v, float) and abs(v) >= 100:
        v = round(v)
    if isinstance(v, float):
        return f"{round(v, 2) if abs(v) < 10 else round(v, 1)}"
    return f"{v:,}".replace(",", " ") if isinstance(v, int) and abs(v) >= 10_000 else str(v)


def ratio(z: float | None, p: float | None) -> float | None:
    return round(z / p, 2) if z is not None and p else None


def ahead(z: float | None, peers: dict[str, float | None], higher_is_better: bool) -> str:
    """The peers zsched beats on this figure (``-`` for none, ``n/a`` without zsched's figure)."""
    if z is None:
        return "n/a"
    names = [n for n, p in peers.items() if p is not None and (z > p if higher_is_better else z < p)]
    return ", ".join(names) or "-"


def by(items: list[dict[str, Any]] | None, key: str, value: Any) -> dict[str, Any] | None:
    return next((x for x in items or [] if x.get(key) == value), None)


def zsched_sources(peers: dict[str, Any], zsched: dict[str, Any] | None) -> dict[str, Any]:
    """zsched's figures per workload, picked as the module docstring says."""
    same_run = peers.get("zsched") or {}
    suites = zsched if zsched is not None else same_run
    mem = list(get(suites, "core", "memory") or [])
    for m in get(same_run, "core", "memory") or []:
        if by(mem, "pending_jobs", m["pending_jobs"]) is None:
            mem.append(m)
    return {"enqueue": get(same_run, "core", "enqueue") or get(suites, "core", "enqueue") or {},
            "memory": mem, "drain": suites.get("drain") or same_run.get("drain"),
            "lateness": suites.get("lateness") or same_run.get("lateness")}


def row(workload: str, measure: str, z: float | None, h: float | None, c: float | None, higher: bool,
        texts: tuple[str, str, str] | None = None) -> Row:
    zt, ht, ct = texts or (fmt(z), fmt(h), fmt(c))
    return (workload, measure, zt, ht, ct, fmt(ratio(z, h)), fmt(ratio(z, c)),
            ahead(z, {"huey": h, "Celery": c}, higher))


def drain_text(d: dict[str, Any] | None) -> str:
    return f"{fmt(d['jobs_per_s'])} (dup {d['duplicates']}, missing {d['missing']})" if d else "n/a"


def late_text(d: dict[str, Any] | None) -> str:
    if not d:
        return "n/a"
    h = d["handler_lateness_ms"]
    return f"{fmt(h.get('p50'))} / {fmt(h.get('p99'))} / {fmt(h.get('max'))}; early {d['started_before_run_at']}"


def rows(peers: dict[str, Any], zsched: dict[str, Any] | None = None) -> list[Row]:
    """(workload, measure, zsched, huey, Celery, zsched/huey, zsched/Celery, zsched ahead of)."""
    z = zsched_sources(peers, zsched)
    hu, ce = peers.get("huey") or {}, peers.get("celery") or {}
    out: list[Row] = []
    out.append(row("W1 enqueue", "one by one, jobs/s (huey schedule, Celery apply_async; median of 3)",
                   get(z, "enqueue", "schedule_one_jobs_per_s"), get(hu, "enqueue", "schedule_one_jobs_per_s"),
                   get(ce, "enqueue", "schedule_one_jobs_per_s"), True))
    sl = get(z, "enqueue", "one_by_one_slices")
    if sl:
        zr, hr, cr = (get(sl, "jobs_per_s", k) for k in ("zsched", "huey", "celery"))
        mh, mc = get(sl, "slice_ratio_median", "huey"), get(sl, "slice_ratio_median", "celery")
        out.append((
            "W1 enqueue", f"one by one in interleaved slices of {sl['slice_calls']} calls, jobs/s; ratio: median of "
            f"the per-slice ratios ({fmt(sl['calls_per_side'])} calls per side)", fmt(zr), fmt(hr), fmt(cr), fmt(mh),
            fmt(mc), ahead(1.0, {"huey": mh, "Celery": mc}, False)))
        pc = get(sl, "per_call_us")
        if pc:
            def cost(side: str) -> str:
                d = pc.get(side)
                return f"{fmt(d['wall'])} ({fmt(d['producer_cpu'])} + {fmt(d['redis_cpu'])})" if d else "n/a"
            measure = "the same slices, µs per call: wall (producer CPU + Redis CPU)"
            if pc.get("ping_floor"):
                measure += f"; a redis-py PING taking the same turns: {cost('ping_floor')}"
            if pc.get("empty_script"):
                measure += f"; an empty script with zsched's arguments: {cost('empty_script')}"
            out.append(("W1 enqueue", measure, cost("zsched"), cost("huey"), cost("celery"), "", "", ""))
    out.append(row("W1 enqueue", "batched, jobs/s (zsched schedule_many; huey has none; Celery group)",
                   get(z, "enqueue", "schedule_many_jobs_per_s"), None, get(ce, "enqueue", "batched_jobs_per_s"),
                   True))
    sizes = {m["pending_jobs"] for m in (hu.get("memory") or []) + (ce.get("memory") or []) + z["memory"]}
    for n in sorted(sizes):
        zm, hm = by(z["memory"], "pending_jobs", n), by(hu.get("memory"), "pending_jobs", n)
        cm = by(ce.get("memory"), "pending_jobs", n)
        zb, hb, cb = get(zm, "bytes_per_job"), get(hm, "bytes_per_job"), get(cm, "bytes_per_job")
        ctext = (f"{fmt(cb)} in Redis + {fmt(get(cm, 'worker_rss_bytes_per_job'))} worker RSS "
                 f"({fmt(get(ce, 'enqueue', 'queue_list_bytes_per_job'))} queued, no worker)" if cm else "n/a")
        queued = get(hm, "queue_list_bytes_per_job")
        htext = fmt(hb) + (f" ({fmt(queued)} before the consumer ran)" if queued else "")
        fixed = get(zm, "namespace_fixed_bytes")
        ztext = fmt(zb) + (f" (+ {fmt(round(fixed / 1000))} KB once per namespace)" if fixed else "")
        out.append(row("W2 memory", f"Redis bytes per pending job at {n:,}".replace(",", " "), zb, hb, cb, False,
                       (ztext, htext, ctext)))
    zd = by(z["drain"], "worker_processes", 1)
    hd, cd = get(hu, "drain", 0), get(ce, "drain", 0)

    out.append(row("W3 drain", f"{fmt(get(hd, 'jobs'))} due at once, 1 worker process, jobs/s from T0",
                   get(zd, "jobs_per_s"), get(hd, "jobs_per_s"), get(cd, "jobs_per_s"), True,
                   (drain_text(zd), drain_text(hd), drain_text(cd))))
    for lt in hu.get("lateness") or []:
        rate = lt["rate_per_s"]
        zl, hl, cl = by(z["lateness"], "rate_per_s", rate), lt, by(ce.get("lateness"), "rate_per_s", rate)

        p99 = [get(d, "handler_lateness_ms", "p99") for d in (zl, hl, cl)]
        out.append(row("W4 lateness", f"{rate}/s: handler start - run_at p50 / p99 / max ms; early starts "
                       "(ratio of p99)", p99[0], p99[1], p99[2], False, (late_text(zl), late_text(hl), late_text(cl))))
    return out


def markdown(peers: dict[str, Any], zsched: dict[str, Any] | None = None) -> str:
    """The section's text: a heading, what ran, the table."""
    hv, cv = get(peers, "huey", "version"), get(peers, "celery", "version")
    m = peers.get("machine") or {}
    lines = ["## Peers: huey and Celery (`python -m bench.peers`)", "",
             f"Measured {m.get('date', '?')}, huey {hv}, Celery {cv}, each with its documented default worker set-up "
             "(huey_consumer with no options: 1 worker thread, scheduler every 1 s; celery worker with no options: "
             "prefork, concurrency = CPU count) on a redis-server of its own with zsched's options; same payload. "
             "W1 rounds interleaved with zsched's on one server. Celery holds ETA jobs in its worker's memory "
             "(a copy in Redis's unacked hash, re-delivered after the 1 h visibility timeout). Clocks: this host's "
             "CLOCK_REALTIME on both ends.", "", HEADER]
    lines += ["| " + " | ".join(r) + " |" for r in rows(peers, zsched)]
    return "\n".join(lines) + "\n"


def write_section(peers: dict[str, Any], zsched: dict[str, Any] | None = None, path: Path | None = None) -> None:
    """Write (or replace) the ``peers`` section of bench/RESULTS.md."""
    from bench.report import update_section

    update_section(path or Path(__file__).resolve().parent.parent / "RESULTS.md", "peers", markdown(peers, zsched))
