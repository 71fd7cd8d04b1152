"""bench/RESULTS.md from the suite's JSON: targets, zsched's figures, and the PostgreSQL baseline."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any


def _get(d: Any, *path: Any) -> Any:
    for k in path:
        if d is None:
            return None
        try:
            d = d[k]
        except (KeyError, IndexError, TypeError):
            return None
    return d


def _fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        v = round(v, 2) if abs(v) < 10 else round(v, 1) if abs(v) < 100 else round(v)
    if isinstance(v, int) and abs(v) >= 10_000:
        v = f"{v:,}".replace(",", " ")
    return f"{v}{unit}"


def rows(r: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(workload, measure, zsched, PostgreSQL baseline, target)"""
    out = []
    core, pg = r.get("core") or {}, r.get("pg") or {}
    pg_insert = _fmt(_get(pg, "enqueue", "batched_insert_jobs_per_s"))
    pg_copy = _fmt(_get(pg, "enqueue", "batched_copy_jobs_per_s"))
    out.append(("W1 enqueue", "schedule_many, jobs/s", _fmt(_get(core, "enqueue", "schedule_many_jobs_per_s")),
                f"{pg_insert} (INSERT), {pg_copy} (COPY)", ">= 100 000"))
    out.append(("W1 enqueue", "schedule one by one, jobs/s", _fmt(_get(core, "enqueue", "schedule_one_jobs_per_s")),
                _fmt(_get(pg, "enqueue", "one_jobs_per_s")), ">= 8 000"))
    for m in core.get("memory", []) or []:
        pgm = next((d for d in (pg.get("disk") or []) if d.get("pending_jobs") == m["pending_jobs"]), None)
        out.append(("W2 memory", f"bytes per pending job at {m['pending_jobs']:_}".replace("_", " "),
                    _fmt(m["bytes_per_job"]), _fmt(_get(pgm, "bytes_per_job")) + (" (disk)" if pgm else ""), "<= 256"))
    for t in core.get("tombstone", []) or []:
        key = f", {t['key_bytes']}-byte key" if t.get("key_bytes") else ""
        out.append(("W2 memory", f"bytes per finished job (tombstone summary{key})",
                    _fmt(t["bytes_per_finished_job"]), "-", "< 120" if not t.get("key_bytes") else ""))
    for d in r.get("drain") or []:
        pgd = [x for x in (pg.get("drain") or []) if x.get("workers") == d["worker_processes"]]
        best = max((x["jobs_per_s"] for x in pgd), default=None)
        target = ">= 15 000" if d["worker_processes"] == 1 else ">= 25 000"
        measure = (f"{d['worker_processes']} worker process(es), concurrency {d.get('concurrency', 16)}, "
                   f"jobs/s (dup {d['duplicates']}, missing {d['missing']})")
        out.append(("W3 drain", measure, _fmt(d["jobs_per_s"]), _fmt(best), target))
    for lt in r.get("lateness") or []:
        rate = lt["rate_per_s"]
        pgl = [x for x in (pg.get("lateness") or []) if x.get("rate_per_s") == rate]
        pg_txt = ", ".join(f"{_fmt(_get(x, 'lateness_ms', 'p99'))} ms ({x['poll_ms']} ms poll)" for x in pgl) or "n/a"
        h = lt["handler_lateness_ms"]
        target = "p99 <= 5 ms" if rate <= 100 else "p99 <= 10 ms"
        measure = f"{rate}/s: handler start - run_at p50 / p99 / max (ms); early starts {lt['started_before_run_at']}"
        out.append(("W4 lateness", measure, f"{_fmt(h.get('p50'))} / {_fmt(h.get('p99'))} / {_fmt(h.get('max'))}",
                    pg_txt, target))
        fl = lt.get("firing_lateness") or {}
        out.append(("W4 lateness", f"{rate}/s: firing lateness p50 / p99 (est. from histogram), share <= 5 ms",
                    f"{_fmt(fl.get('p50_ms_est'))} / {_fmt(fl.get('p99_ms_est'))} ms, {_fmt(fl.get('share_le_5ms'))}",
                    "-", ""))
    for h in r.get("herd") or []:
        if h["rate_limit"]:
            out.append(("W5 herd",
                        f"{h['jobs']:_} due at once, limit {h['rate_limit']:g}/s: fire rate".replace("_", " "),
                        _fmt(h["fire_rate_10_90_per_s"]), "-", "within 10 % of the limit"))
        else:
            out.append(("W5 herd",
                        f"{h['jobs']:_} due at once, no limit: drain jobs/s (all fired after)".replace("_", " "),
                        f"{_fmt(h['drain_rate_per_s'])} ({h['all_fired_after_s']} s)", "-", "the W3 rate"))
    sc = r.get("scale") or {}
    if sc:
        ratio = sc.get("p99_lateness_ratio")
        if ratio is None and _get(sc, "small", "handler_lateness_ms", "p99"):
            ratio = round(sc["large"]["handler_lateness_ms"]["p99"] / sc["small"]["handler_lateness_ms"]["p99"], 2)
        large, small = sc["large"], sc["small"]
        backlogs = f"{large['backlog']:_} vs {small['backlog']:_}".replace("_", " ")
        p99s = f"{large['handler_lateness_ms']['p99']} vs {small['handler_lateness_ms']['p99']} ms"
        firing = (f"{large['firing_lateness'].get('share_le_5ms')} vs "
                  f"{small['firing_lateness'].get('share_le_5ms')}")
        measure = f"W4 at 1000/s, p99 lateness ratio, {backlogs} pending ({p99s}; firing <= 5 ms: {firing})"
        out.append(("W6 scale", measure, _fmt(ratio), "-", "<= 1.2"))
        ticks = (f"{_fmt(small.get('tick_jobs_per_redis_cpu_s'))} vs "
                 f"{_fmt(large.get('tick_jobs_per_redis_cpu_s'))}")
        out.append(("W6 scale", f"tick throughput ratio, jobs moved per Redis CPU-second ({ticks})",
                    _fmt(sc.get("tick_throughput_ratio")), "-", "<= 1.2"))
    fo = r.get("failover") or {}
    if fo:
        out.append(("W7 failover", f"kill -9 (lease TTL {fo['lease_ttl_s']} s): worst lateness, s",
                    _fmt(fo["kill9_max_lateness_s"]), "-", f"<= {fo['kill9_target_s']} s"))
        out.append(("W7 failover", "SIGTERM hand-over: worst lateness, ms", _fmt(fo["sigterm_max_lateness_ms"]), "-",
                    "< 1 000 ms"))
    return out


def write_markdown(r: dict[str, Any], path: Path) -> None:
    m = r["machine"]
    lines = ["# Benchmark results", "",
             f"Measured {m['date']} on {m['cpus']} cores, {m['platform']}; Python {m['python']}; {m['redis']}; "
             f"{m['etcd']}. Everything on loopback, in one run (`.venv/bin/python -m bench all`). zsched's Redis "
             "runs with AOF (appendfsync everysec) in W3-W5 and W7; the PostgreSQL baseline commits with fsync on.", "",
             "| workload | measure | zsched | PostgreSQL baseline (seed design) | target |", "|---|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in rows(r)]
    lines += ["", "Seconds per suite: " + ", ".join(f"{k} {v}" for k, v in (r.get("seconds") or {}).items()), ""]
    kept = _sections(path.read_text()) if path.exists() else {}
    path.write_text("\n".join(lines) + "".join(f"\n{block}\n" for block in kept.values()))


_SECTION = re.compile(r"<!-- section:(\w+) -->.*?<!-- /section:\1 -->", re.S)


def _sections(text: str) -> dict[str, str]:
    return {m.group(1): m.group(0) for m in _SECTION.finditer(text)}


def update_section(path: Path, name: str, markdown: str) -> None:
    """Write (or replace) a named section of RESULTS.md: suites that are not part of ``all``
    (soak, transport) keep their latest figures there, and ``all`` keeps them when it rewrites."""
    block = f"<!-- section:{name} -->\n{markdown.rstrip()}\n<!-- /section:{name} -->"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    if f"<!-- section:{name} -->" in text:
        text = _SECTION.sub(lambda m: block if m.group(1) == name else m.group(0), text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
