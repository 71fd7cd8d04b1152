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
        fixed = m.get("namespace_fixed_bytes")
        once = f" (+ {_fmt(round(fixed / 1000))} KB once per namespace)" if fixed else ""
        out.append(("W2 memory", f"bytes per pending job at {m['pending_jobs']:_}".replace("_", " "),
                    _fmt(m["bytes_per_job"]) + once, _fmt(_get(pgm, "bytes_per_job")) + (" (disk)" if pgm else ""),
                    "<= 256"))
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


def num(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and abs(v) < 100:
        return f"{v:.3g}" if abs(v) < 1 else f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"
    v = round(v)
    return f"{v:,}".replace(",", " ")


def spread_rows(r: dict[str, Any], row: Any, ms: float) -> list[str]:
    """The cluster section's rows of the ``spread`` workload (absent from older runs)."""
    sp = (r.get("spread") or {}).get("summary")
    if not sp:
        return []
    span = r.get("spread_seconds", 6)
    rate = f"{num(r['jobs']['spread'] / span)}/s"
    return [row(f"spread ({rate} due over {span:g} s, no worker): ticks per 1 000 jobs", sp["ticks_per_1000_jobs"]),
            row("spread: messages published per 1 000 jobs", sp["publishes_per_1000_jobs"]),
            row("**spread: per-shard Redis CPU ms per 1 000 of its jobs (net)**",
                sp["per_shard_net_cpu_s_per_1000_jobs"], ms),
            row("spread: scheduler replicas' CPU ms per 1 000 jobs", sp["schedulers_cpu_s_per_1000_jobs"], ms),
            row("spread: scheduler replicas' CPU µs per tick", sp["schedulers_cpu_us_per_tick"]),
            row("spread: firing lateness p99 ms (from the histogram)", sp["firing_lateness_p99_ms"]),
            row("spread: share fired within 5 ms", sp["firing_share_le_5ms"])]


def cluster_markdown(r: dict[str, Any]) -> str:
    """The ``cluster`` section of RESULTS.md from ``bench.cluster.run``'s output."""
    m, sides = r["machine"], r["sides"]
    f, d = r["fire"]["summary"], r["drain"]["summary"]
    others = [s for s in sides if s != "single"]
    foreign = [x for wl in (r[k]["summary"] for k in ("fire", "drain", "spread") if k in r)
               for side in sides for x in wl["foreign_cpu_s_per_s"]["runs"][side]]
    before = r["fire"]["runs"]["cluster"][0]["balance"]["before"] if "cluster" in sides else {}
    ms = 1000.0  # CPU s per 1 000 jobs -> CPU ms per 1 000 jobs
    n = {k: len(r[k]["runs"]["single"]) for k in ("fire", "drain", "spread") if k in r}
    rounds = f"{n['fire']} rounds" + (f" ({r['runs_merged']} runs of the suite pooled)" if r.get("runs_merged") else "")
    if n.get("spread", n["fire"]) != n["fire"]:
        rounds += f", the spread workload in {n['spread']} of them"

    def row(label: str, s: dict[str, Any], scale: float = 1.0) -> str:
        cells = [num(s[side] * scale if s[side] is not None else None) for side in sides]
        cells += [f"{s[f'{o}_over_single']} ({s[f'{o}_over_single_paired']})"
                  if s[f"{o}_over_single"] is not None else "-" for o in others]
        return f"| {label} | " + " | ".join(cells) + " |"

    names = {"single": "1 redis-server", "cluster": "3 masters, 4 partitions each",
             "cluster1": "3 masters, all on 1"}
    head = ["measure", *[names[s] for s in sides], *[f"{o} / single" for o in others]]
    met = {k: "met" if v else "NOT met" for k, v in (r.get("within_10_percent") or {}).items()}
    lines = [
        "## Redis Cluster: 1 node vs 3 masters (`python -m bench cluster`)", "",
        f"Measured {m['date']} on {m['cpus']} cores, {m['redis'].split(' sha=')[0]}: {rounds}, the order of the "
        f"sides reversed every round, a fresh Redis and stack per run; {num(r['jobs']['fire'])} jobs per fire run "
        f"and {num(r['jobs']['drain'])} per drain run, {r['partitions']} partitions, {r['replicas']} scheduler "
        f"replicas, AOF everysec, hz 10. The cluster is {r['masters']} masters (no replicas) on the same 2 "
        f"cores, its partitions' slots moved so each master holds {r['partitions'] // r['masters']} (CRC16 "
        f"alone gave {'/'.join(str(v) for v in sorted(before.values(), reverse=True))}); `cluster1` is the "
        "same cluster with every partition on one master, a control for what cluster mode costs without "
        "the split over nodes. Medians; ratios are of the medians, in brackets the median of the per-round "
        "ratios. *Net* = minus the Redis CPU of an equally long idle window just before T0 (AOF, cluster "
        "gossip, idle ticks, the benchmark's counter polling); *per shard* = one master's CPU per 1 000 of "
        "the jobs of its own partitions (median over the masters that hold partitions). *Script µs* is "
        "Redis's commandstats time, wall clock inside the call: with 3 masters on 2 cores it includes "
        "preemption, CPU is the figure to read.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        row("fire: jobs moved to ready per s (T0 to the last)", f["jobs_per_s"]),
        row("fire: jobs/s between 10 % and 90 % fired", f["jobs_per_s_10_90"]),
        row("**fire: per-shard Redis CPU ms per 1 000 of its jobs (net)**",
            f["per_shard_net_cpu_s_per_1000_jobs"], ms),
        row("fire: Redis CPU ms per 1 000 jobs, all masters (net)", f["redis_net_cpu_s_per_1000_jobs"], ms),
        row("fire: Redis CPU ms per 1 000 jobs, all masters (raw)", f["redis_cpu_s_per_1000_jobs"], ms),
        row("fire: Redis CPU ms per shard per 1 000 namespace jobs (net)",
            f["redis_net_cpu_s_per_shard_per_1000_namespace_jobs"], ms),
        row("fire: EVALSHA calls per 1 000 jobs", f["evalsha_calls_per_1000_jobs"]),
        row("fire: script µs per job", f["script_us_per_job"]),
        *([row("fire: ready/wake messages published per 1 000 jobs", f["publishes_per_1000_jobs"])]
          if "publishes_per_1000_jobs" in f else []),
        row("fire: scheduler replicas' CPU ms per 1 000 jobs", f["schedulers_cpu_s_per_1000_jobs"], ms),
        row("fire: cluster-bus messages per s while firing", f["bus_messages_per_s"]),
        row("fire: cluster-bus messages per s, idle window", f["idle_bus_messages_per_s"]),
        row("pending: used_memory bytes per job", f["bytes_per_pending_job"]),
        row("schedule_many (batches of 20 000, one client), jobs/s", f["schedule_many_jobs_per_s"]),
        row("schedule_many: Redis CPU ms per 1 000 jobs", f["schedule_many_redis_cpu_s_per_1000_jobs"], ms),
        row("drain (W3, 1 worker, concurrency 64): jobs/s", d["jobs_per_s"]),
        row("**drain: per-shard Redis CPU ms per 1 000 of its jobs (net)**",
            d["per_shard_net_cpu_s_per_1000_jobs"], ms),
        row("drain: Redis CPU ms per 1 000 jobs, all masters (net)", d["redis_net_cpu_s_per_1000_jobs"], ms),
        row("drain: EVALSHA calls per 1 000 jobs", d["evalsha_calls_per_1000_jobs"]),
        row("drain: Redis reads (round trips) per 1 000 jobs", d["redis_reads_per_1000_jobs"]),
        row("drain: script µs per job", d["script_us_per_job"]),
        *([row("drain: messages published per 1 000 jobs", d["publishes_per_1000_jobs"])]
          if "publishes_per_1000_jobs" in d else []),
        row("drain: scheduler replicas' CPU ms per 1 000 jobs", d["schedulers_cpu_s_per_1000_jobs"], ms),
        row("drain: worker CPU ms per 1 000 jobs", d["workers_cpu_s_per_1000_jobs"], ms),
        *spread_rows(r, row, ms),
        "",
        "Target (issue 13): per-shard cost in the cluster within 10 % of a single node. Firing: "
        f"{met.get('fire_single', 'n/a')} (medians), {met.get('fire_single_paired', 'n/a')} (per round); "
        f"drain: {met.get('drain_single', 'n/a')} (medians), {met.get('drain_single_paired', 'n/a')} (per round). "
        f"Noise: other processes used {num(min(foreign))}-{num(max(foreign))} CPU s per s of the 2 cores during "
        f"the measured windows (load average {m['loadavg_start'][0]:.2f} at the start, "
        f"{m['loadavg_end'][0]:.2f} at the end); {r['seconds'] / 60:.0f} min of runs.",
    ]
    if {"cluster", "cluster1"} <= set(sides):
        rd, ev = d["redis_reads_per_1000_jobs"], d["evalsha_calls_per_1000_jobs"]
        ps = d["per_shard_net_cpu_s_per_1000_jobs"]
        bus = f["bus_messages_per_s"]
        lines += ["", f"No cross-node chatter per job: the cluster bus carried {num(bus['cluster'])} messages/s while "
                  f"{num(r['jobs']['fire'])} jobs fired and {num(f['idle_bus_messages_per_s']['cluster'])}/s idle "
                  "(gossip). What the drain pays on the cluster follows its round trips: a worker's batch goes to "
                  "every master that has work for it, so the masters processed "
                  f"{num(rd['cluster'])} reads per 1 000 jobs against {num(rd['single'])} on one node, for the same "
                  f"{num(ev['cluster'])} script calls; `cluster1` (cluster mode, one master) costs "
                  f"{ps['cluster1_over_single']} ({ps['cluster1_over_single_paired']}) of a single node."]
    for v in r.get("drain_variants") or []:
        vs = v["summary"]
        ps, rd = vs["per_shard_net_cpu_s_per_1000_jobs"], vs["redis_reads_per_1000_jobs"]
        wk = vs["workers_cpu_s_per_1000_jobs"]
        lines += ["", f"The drain with the worker at concurrency {v['concurrency']} instead ({v['rounds']} rounds, "
                  "`python -m bench.cluster --sides single,cluster --workloads drain --concurrency "
                  f"{v['concurrency']}`): per-shard Redis CPU {num(ps['single'] * 1000)} ms per 1 000 jobs on one "
                  f"node, {num(ps['cluster'] * 1000)} on the cluster, {ps['cluster_over_single']} "
                  f"({ps['cluster_over_single_paired']}); reads per 1 000 jobs {num(rd['single'])} vs "
                  f"{num(rd['cluster'])}; worker CPU {wk['cluster_over_single']} "
                  f"({wk['cluster_over_single_paired']}); jobs/s {num(vs['jobs_per_s']['single'])} vs "
                  f"{num(vs['jobs_per_s']['cluster'])}."]
    tc = r.get("tick_cost")
    if tc:
        lines += ["", f"One `tick` on an otherwise idle redis-server (`tickcost`, median of {num(tc['calls'])} calls, "
                  f"commandstats): {num(float(tc['tick_empty_us']))} µs moving nothing, "
                  f"{num(float(tc['tick_one_job_us']))} µs moving one job, of which the Redis commands it runs take "
                  f"{num(float(tc['tick_one_job_redis_commands_us']))} µs (the rest is the Lua script); a one-job "
                  f"`schedule` {num(float(tc['schedule_one_job_us']))} µs."]
    fo = r.get("fanout")
    if fo:
        idle = {x["workers"]: x for x in fo["runs"]}
        lines += ["", f"Doorbell rings (`fanout`, one redis-server, {num(fo['runs'][0]['messages'])} rings "
                  f"at {num(fo['runs'][0]['rate_per_s'])}/s with 0, 1 and 4 idle worker processes waiting): Redis "
                  f"CPU {num(idle[0]['redis_cpu_us_per_message'])} µs per ring with nobody waiting, "
                  f"+{num(fo['redis_cpu_us_per_delivery'])} µs per ring taken (the hand-over and the empty claim "
                  f"it triggers: {num(fo['claims_per_delivery'])} claims per ring), "
                  f"{num(fo.get('redis_cpu_us_per_added_worker', 0.0))} µs more per ring for each worker added, and "
                  f"{num(fo['worker_cpu_us_per_delivery'])} µs of worker CPU per ring taken."]
    return "\n".join(lines)


def _range(fig: dict[str, Any] | None, digits: str = "") -> str:
    """A figure over rounds: median (min-max), or the median alone for a single round."""
    if not fig:
        return "n/a"

    def f(v: Any) -> str:
        return f"{v:{digits}}" if digits and v is not None else num(v)

    if fig["min"] == fig["max"]:
        return f(fig["median"])
    return f"{f(fig['median'])} ({f(fig['min'])}-{f(fig['max'])})"


def fanout_markdown(r: dict[str, Any], plots: list[str]) -> str:
    """The ``fanout`` (or, with --compare, ``fanout_compare``) section of RESULTS.md from
    ``bench.fanout.run``'s output; ``plots``: the PNG names drawn into docs/img."""
    m = r["machine"]
    sides = r["sides"]
    compared = "compare" in r
    foreign = [x for e in r["summary"] for x in (e.get("foreign_cpu_s_per_s") or {}).get("runs", []) if x is not None]
    who = "; ".join(f"{'this checkout' if k == 'this' else 'other: ' + v['path']} at {v['commit']}"
                    f"{' with uncommitted changes' if v['dirty'] else ''}" for k, v in sides.items())
    lines = [
        f"## Fan-out: cost per job against worker processes (`python -m bench fanout{' --compare' * compared}`)",
        "",
        f"Measured {m['date']} on {m['cpus']} cores, {m['redis'].split(' sha=')[0]}: {r['rounds']} rounds, "
        "interleaved (the worker counts in another order every round, shapes and backends alternating"
        f"{', the two sides of each worker count back to back, which goes first alternating' if compared else ''}"
        f"); per load {num(r['jobs'])} jobs, *spread*: due "
        f"at random moments over {r['seconds']:g} s ({num(r['jobs'] / r['seconds'])}/s), *batched*: due at "
        f"{r['bursts']} instants {r['seconds'] / r['bursts']:g} s apart; W worker processes at concurrency "
        f"{r['concurrency']} with a no-op handler, {r['replicas']} scheduler replicas, {r['partitions']} "
        "partitions, AOF everysec, hz 10; one redis-server, and a 3-master Redis Cluster (no replicas, the "
        "partitions' slots spread 6/5/5). The jobs are scheduled before the window, which runs from the first "
        "due time to the last ack: per job is that window's cost over its jobs, idle work (ticks, sweeps) "
        "included. CPU from /proc (workers, replicas: every thread's run time in ns, schedstat; summed) and INFO "
        "cpu (every master); script calls = "
        "EVALSHA/EVAL/FCALL in commandstats; *published* = ready messages the scripts sent; *notified* = "
        "notifications the workers received (`zsched_worker_notified_total`), *claims* = claim calls answered "
        "(empty ones in brackets). Handler lateness = handler start minus the job's due time, exact, from "
        "every job. Medians over rounds, min-max in brackets. Code: " + who + ". Load average "
        f"{m['loadavg_start'][0]:.2f} at the start, {m['loadavg_end'][0]:.2f} at the end; other processes used "
        f"{num(min(foreign, default=None))}-{num(max(foreign, default=None))} CPU s per s of the "
        f"{m['cpus']} cores during the windows: single runs swing, read the medians.",
        "",
        "| backend | shape | W |" + (" side |" if compared else "") + " worker CPU µs/job | Redis CPU µs/job | "
        "replicas' CPU µs/job | script calls/job | published/job | notified/job | claims/job (empty) | "
        "handler lateness p50 / p99 ms |",
        "|---|---|---|" + ("---|" if compared else "") + "---|---|---|---|---|---|---|---|",
    ]
    names = {"single": "1 redis-server", "cluster": "3 masters"}
    def med(e: dict[str, Any], name: str) -> Any:
        return (e.get(name) or {}).get("median")

    for e in sorted((e for e in r["summary"] if e["shape"] != "idle"),
                    key=lambda e: (e["backend"] != "single", e["shape"] != "spread", e["workers"],
                                   e["side"] != "this")):
        lines.append(
            f"| {names[e['backend']]} | {e['shape']} | {e['workers']} |" + (f" {e['side']} |" if compared else "")
            + f" {_range(e.get('worker_cpu_us_per_job'))} | {_range(e.get('redis_cpu_us_per_job'))} | "
            f"{_range(e.get('replica_cpu_us_per_job'))} | {_range(e.get('script_calls_per_job'), '.2f')} | "
            f"{num(med(e, 'publishes_per_job'))} | {num(med(e, 'notified_per_job'))} | "
            f"{num(med(e, 'claims_per_job'))} ({num(med(e, 'claims_empty_per_job'))}) | "
            f"{num(med(e, 'handler_lateness_p50_ms'))} / "
            f"{_range(e.get('handler_lateness_p99_ms'), '.2f')} |")
    lines += ["", "Targets of issue 26 (per job, the most workers against one; script calls at every W):", ""]
    for t in r["targets"]:
        w, rd, c = t["worker_cpu_us_per_job"], t["redis_cpu_us_per_job"], t["script_calls_per_job"]
        lines.append(f"- {t['side'] + ', ' if compared else ''}{names[t['backend']]}, {t['shape']}: worker CPU "
                     f"W={t['workers'][1]} / W={t['workers'][0]} = {w['ratio']} (target <= {w['target']}: "
                     f"{'met' if w['met'] else 'not met'}); Redis CPU {rd['ratio']} (<= {rd['target']}: "
                     f"{'met' if rd['met'] else 'not met'}); script calls per job at most {num(c['max'])} "
                     f"(< {c['target']}: {'met' if c['met'] else 'not met'})")
    lines += ["", "Idle (the workers up, nothing due, per second; the replicas' idle ticks and the workers' "
              "safety-net sweeps):", "",
              "| backend | W |" + (" side |" if compared else "") + " worker CPU ms/s | Redis CPU ms/s | "
              "replicas' CPU ms/s | script calls/s | notified/s |",
              "|---|---|" + ("---|" if compared else "") + "---|---|---|---|---|"]
    for e in r["idle_summary"]:
        lines.append(f"| {names[e['backend']]} | {e['workers']} |" + (f" {e['side']} |" if compared else "")
                     + f" {_range(e.get('worker_cpu_ms_per_s'))} | {_range(e.get('redis_cpu_ms_per_s'))} | "
                     f"{_range(e.get('replica_cpu_ms_per_s'))} | {_range(e.get('script_calls_per_s'))} | "
                     f"{_range(e.get('notified_per_s'))} |")
    if compared:
        lines += ["", "This / other (ratio of the medians; in brackets the median of the per-round ratios):", "",
                  "| backend | shape | W | worker CPU | Redis CPU | replicas' CPU | script calls | notified | "
                  "lateness p99 |", "|---|---|---|---|---|---|---|---|---|"]
        for c in r["compare"]:
            cells = [f"{c[k]['ratio']} ({c[k]['paired']})" if c[k]["ratio"] is not None else "n/a"
                     for k in ("worker_cpu_us_per_job", "redis_cpu_us_per_job", "replica_cpu_us_per_job",
                               "script_calls_per_job", "notified_per_job", "handler_lateness_p99_ms")]
            lines.append(f"| {names[c['backend']]} | {c['shape']} | {c['workers']} | " + " | ".join(cells) + " |")
    if plots:
        lines += ["", "Curves: " + ", ".join(f"[{p.removesuffix('.png')}](../docs/img/{p})" for p in plots) + "."]
    return "\n".join(lines)
