"""``python -m bench fanout``: what every added worker process costs each job (issue 26).

For each number W of worker processes (default 1, 2, 4, 8, 16; concurrency 4 each, the no-op
handler of ``bench/handlers.py``, or one that waits ``--handler-ms``), each traffic shape and each
backend, on the project's stack (``bench.stack.Stack``: redis-server with AOF everysec and hz 10,
etcd, 2 scheduler replicas, 16 partitions, or ``--partitions N``; only a run with 16 partitions
and the no-op handler replaces the figures in RESULTS.md):

* **spread**: N jobs (3 000) due at random moments over D s (10 s: 300 jobs/s);
* **batched**: the same N jobs due at B instants (10), D/B s apart;
* backends **single** (one redis-server) and **cluster** (3 masters, no replicas, the partitions'
  slots moved so the masters hold 6/5/5: ``bench.cluster_measure.side_redis``).

The jobs are scheduled ahead, by a child process running the side's own client, before the
measurement window opens; the window runs from the first due time until the last job is acked.
Per job over the window: worker CPU (the worker processes' run time, every thread's, from
/proc/PID/task/*/schedstat in nanoseconds, summed; 10 ms ticks until 2026-12-04), Redis CPU
(INFO cpu of every master), the replicas' CPU (as the workers'), script calls (INFO
commandstats EVALSHA/EVAL/FCALL of every master), ready messages published (PUBLISH/SPUBLISH,
counted from inside the scripts too) and, scraped from each worker's /metrics, notifications
received, claims answered and claims that found nothing (None when the side's workers do not
export those counters). Lateness: the **handler lateness** (each handler's start minus its job's
due time, exact, from the records ``bench/handlers.py`` writes: p50/p99/max) and the firing
lateness (landed in ready minus due time, estimated from the replicas' histograms). Before the
loads of each W an idle window (no job due) gives what W idle workers cost per second.

Rounds (3) are interleaved: the W values run in another order every round (ascending,
descending, then shuffled), the shapes and the backends alternate; one stack per round and
backend, its workers restarted per W (with ``--compare``, one stack per round, side, backend and
W: ``blocks``). Each figure is reported as the median over rounds with min
and max. Other processes' CPU during each window is measured (``foreign_cpu_s_per_s``) and the
load average recorded: the machine is shared, read medians.

``--compare OTHER`` runs every round once with this checkout's code and once with the code at
OTHER (another checkout of zsched: its replicas and workers run from OTHER with
``PYTHONPATH=OTHER`` and its jobs are scheduled by its own client; redis-server, etcd and this
driver are shared), the two sides of each W back to back, which of them goes first alternating
(ABBA, ``blocks``), and gives per figure the ratio this / other of the medians and the median of
the per-round ratios.

Each side's processes run from a copy of its checkout's code made when the run starts
(``snapshot``), removed when it ends: editing the checkout during a run does not change what the
rounds still to come measure.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from bench.cluster_measure import Window, side_redis
from bench.common import PAYLOAD, compile_checkout, copy_code, emit, machine
from bench.fanout_summary import compare, print_table, summarize, targets
from bench.stack import NS, ROOT, Stack, bucket_summary
from bench.workloads import records_summary
from scheduler.protocol.keys import MAX_PARTITIONS

WORKERS = (1, 2, 4, 8, 16)
SHAPES = ("spread", "batched")
BACKENDS = ("single", "cluster")
JOBS, SECONDS, BURSTS = 3000, 10.0, 10  # 300 jobs/s; batched: 10 instants 1 s apart
QUICK = {"workers": (1, 4), "jobs": 600, "seconds": 4.0, "bursts": 4, "rounds": 1, "backends": ("single",)}
CONCURRENCY = 4  # per worker process, as in the measurements
ROUNDS = 3
PARTITIONS = 16  # bench.stack's default, as in the measurements
REPLICAS = 2
QUEUE = "bench"  # bench/handlers.py's queue
LEAD_S = 2.0  # the first job is due this long after the scheduling child starts scheduling
IDLE_S = 2.0  # the idle window per W
POLL_S = 0.02  # the acked counter is read this often once a load's last job is due (poll_acked)
COUNTERS = ("notified", "claims", "claims_empty")  # zsched_worker_<name>_total, summed over workers
OUT = ROOT / "bench" / "out"
RESULTS = ROOT / "bench" / "RESULTS.md"
IMG = ROOT / "docs" / "img"


class UsageError(Exception):
    """Bad input the user can fix (one line, exit 2)."""


@dataclass(frozen=True)
class Side:
    """Whose code runs the replicas, the workers and the producer: ``this`` checkout or the ``other``."""

    name: str
    code: Path  # where its processes import from: a copy of the checkout while a run measures (snapshot())
    scheduler_args: tuple[str, ...] = ()  # extra `zsched scheduler` arguments (--scheduler-args, --other-...)
    worker_args: tuple[str, ...] = ()     # extra `zsched worker` arguments (--worker-args, --other-...)
    checkout: Path | None = None  # the checkout ``code`` was copied from (None: ``code`` is the checkout)

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.code)}

    def describe(self) -> dict[str, Any]:
        checkout = self.checkout or self.code

        def git(*args: str) -> str:
            p = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=10)
            return p.stdout.strip() if p.returncode == 0 else "unknown"

        commit = git("rev-parse", "--short", "HEAD")  # "unknown": not a git checkout
        # the code only: a run leaves RESULTS.md and the curves changed, the next run's code is the same
        dirty = None if commit == "unknown" else bool(git("status", "--porcelain", "--untracked-files=no", "--",
                                                          ".", ":!bench/RESULTS.md", ":!docs"))
        return {"path": str(checkout), "commit": commit, "dirty": dirty, "imports": verify(self),
                "scheduler_args": list(self.scheduler_args), "worker_args": list(self.worker_args)}


_IMPORTS = """
import json, importlib, importlib.resources
out = {m: importlib.import_module(m).__file__ for m in ("scheduler", "workers", "bench.handlers")}
out["scheduler.lua"] = str(importlib.resources.files("scheduler.lua").joinpath("tick.lua"))
print(json.dumps(out))
"""


def snapshot(side: Side, cleanup: ExitStack) -> Side:
    """``side`` running from a copy of its checkout's code, made now and removed by ``cleanup``. A
    run starts its replicas and workers afresh for every W and round, for up to a quarter of an
    hour: from the checkout itself, a change saved meanwhile (the next edit of whoever waits for
    the figures) reached the rounds that started after it, and one run measured two versions."""
    copy = Path(tempfile.mkdtemp(prefix=f"zsched-bench-code-{side.name}-"))
    cleanup.callback(shutil.rmtree, copy, True)
    copy_code(side.code, copy)
    return replace(side, code=copy, checkout=side.code)


def verify(side: Side) -> dict[str, str]:
    """Where the side's processes import zsched from; every module must come from its own tree
    (without, the venv's editable install would hand one side the other's code or Lua)."""
    p = subprocess.run([sys.executable, "-c", _IMPORTS], capture_output=True, text=True, env=side.env(),
                       cwd=side.code, timeout=60)
    if p.returncode:
        tail = p.stderr.strip().splitlines()[-1:] or ["no output"]
        raise UsageError(f"the {side.name} side's code at {side.code} does not import ({tail[0]}; give the "
                         "root of a zsched checkout)")
    found: dict[str, str] = json.loads(p.stdout)
    root = side.code.resolve()
    for module, path in found.items():
        if not Path(path).resolve().is_relative_to(root):
            raise UsageError(f"the {side.name} side imports {module} from {path}, not from {side.code} (its "
                             "scheduler/lua must be a link to ../lua, as in every checkout set up for tests)")
    return found


def offsets_for(shape: str, jobs: int, seconds: float, bursts: int, seed: int) -> list[float]:
    """Due times of one load, in seconds after its first instant."""
    if shape == "spread":
        rnd = random.Random(seed)
        return sorted(rnd.random() * seconds for _ in range(jobs))
    return sorted((i % bursts) * seconds / bursts for i in range(jobs))


_SCHEDULE = """
import json, sys, time
from scheduler import Client
a = json.load(sys.stdin)
c = Client.from_url(a["url"], namespace=a["ns"])
t0 = time.time() + a["lead"]
jobs = [(t0 + o, a["payload"]) for o in a["offsets"]]
ids = []
for i in range(0, len(jobs), 5000):
    ids += c.schedule_many(jobs[i:i + 5000], queue=a["queue"])
c.close()
json.dump({"t0": t0, "ids": [str(x) for x in ids]}, sys.stdout)
"""


def schedule(st: Stack, side: Side, offsets: Sequence[float]) -> tuple[float, set[str]]:
    """The load's jobs, scheduled by the side's own client in a child process: (first due time, ids)."""
    args = {"url": st.url, "ns": NS, "lead": LEAD_S, "offsets": list(offsets), "payload": PAYLOAD, "queue": QUEUE}
    p = subprocess.run([sys.executable, "-c", _SCHEDULE], input=json.dumps(args), capture_output=True, text=True,
                       env=side.env(), cwd=side.code, timeout=120)
    if p.returncode:
        raise RuntimeError(f"scheduling with the {side.name} side's client failed:\n{p.stderr[-3000:]}")
    out = json.loads(p.stdout)
    return float(out["t0"]), set(out["ids"])


def worker_counters(st: Stack) -> dict[str, float | None]:
    """The fan-out counters summed over the running workers (None: the side does not export it)."""
    total = dict.fromkeys(COUNTERS, 0.0)
    seen: set[str] = set()
    for proc, _ in st.workers:
        for fam in text_string_to_metric_families(proc.scrape()):
            for s in fam.samples:
                name = s.name.removeprefix("zsched_worker_").removesuffix("_total")
                if s.name.startswith("zsched_worker_") and name in total:
                    total[name] += s.value
                    seen.add(name)
    return {k: (v if k in seen else None) for k, v in total.items()}


def delta(a: dict[str, float | None], b: dict[str, float | None], k: str, per: float) -> float | None:
    x, y = a.get(k), b.get(k)
    return None if x is None or y is None else round((y - x) / per, 4)


def window_figures(win: dict[str, Any], c0: dict[str, float | None], c1: dict[str, float | None],
                   per: float, scale: float) -> dict[str, Any]:
    """A window's costs divided by ``per`` (jobs, or seconds), CPU in seconds times ``scale``."""
    return {"worker_cpu": round(win["workers_cpu_s"] / per * scale, 2),
            "redis_cpu": round(sum(win["redis_cpu_s"].values()) / per * scale, 2),
            "replica_cpu": round(win["schedulers_cpu_s"] / per * scale, 2),
            "script_calls": round(win["script_calls"] / per, 4), "publishes": round(win["publishes"] / per, 4),
            "round_trips": round(win["reads"] / per, 4),
            # per command: calls and µs inside it (times ``scale`` / 1e6), the busiest first
            "commands": {c: [round(n / per, 4), round(us / per * scale / 1e6, 2)]
                         for c, (n, us) in sorted(win["commands"].items(), key=lambda kv: -kv[1][1])},
            **{k: delta(c0, c1, k, per) for k in COUNTERS},
            "foreign_cpu_s_per_s": round(win["foreign_cpu_s"] / win["seconds"], 3)}


def poll_acked(st: Stack, target: int, timeout: float, not_before: float = 0.0) -> None:
    """Read the acked counter every POLL_S until it reaches ``target``, starting at ``not_before``
    (``time.time()``): a load cannot be done before its last job is due, and each read is a round
    trip to every master (16 ``HGET``s), which counted into the window as the product's cost: 50
    round trips a second, 150 on a 3-master cluster (until 2026-12-06 they ran all through every
    window, idle ones included)."""
    deadline = time.monotonic() + timeout
    time.sleep(max(0.0, not_before - time.time()))
    while True:
        n = st.counter("acked", QUEUE)
        if n >= target:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {n} of {target} jobs acked after {timeout:.0f} s")
        time.sleep(POLL_S)


def idle(st: Stack, seconds: float = IDLE_S) -> dict[str, Any]:
    """``seconds`` with the workers up and nothing due: their cost per second (CPU in ms per s)."""
    c0 = worker_counters(st)
    w = Window(st)
    time.sleep(seconds)  # nothing to wait for but the time: no read of the bench's own
    win = w.close()
    figs = window_figures(win, c0, worker_counters(st), win["seconds"], 1000)
    return {f"{k}_ms_per_s" if k.endswith("_cpu") else (k if k.endswith("_per_s") else f"{k}_per_s"): v
            for k, v in figs.items()} | {"seconds": round(win["seconds"], 2)}


def load(st: Stack, side: Side, offsets: Sequence[float]) -> tuple[dict[str, Any], set[str]]:
    """Schedule one load, measure from its first due time until its last job is acked."""
    jobs = len(offsets)
    base = st.counter("acked", QUEUE)
    t0, ids = schedule(st, side, offsets)
    if time.time() > t0 - 0.5:
        raise RuntimeError(f"the load was scheduled too late for its first due time: raise LEAD_S ({LEAD_S} s)")
    time.sleep(t0 - 0.3 - time.time())  # the counters are read just before the window opens (16 scrapes: ~0.1 s)
    load1 = os.getloadavg()[0]
    c0, f0 = worker_counters(st), st.firing_buckets()
    w = Window(st)
    try:
        poll_acked(st, base + jobs, offsets[-1] + 60, not_before=t0 + offsets[-1])
    except RuntimeError as e:
        raise RuntimeError(f"{e}; what the stack held then: {stall_report(st, ids)}") from None
    win = w.close()
    figs = window_figures(win, c0, worker_counters(st), jobs, 1e6)
    out = {f"{k}_us_per_job" if k.endswith("_cpu") else (k if k.endswith("_per_s") else f"{k}_per_job"): v
           for k, v in figs.items()}
    fl = bucket_summary(f0, st.firing_buckets())
    out.update({"jobs": jobs, "seconds": round(win["seconds"], 2), "loadavg_1m": round(load1, 2),
                "firing_lateness_p50_ms": fl.get("p50_ms_est"), "firing_lateness_p99_ms": fl.get("p99_ms_est")})
    return out, ids


def stall_report(st: Stack, ids: set[str]) -> Path:
    """A load that did not finish: write where its jobs were (state counts, every unfinished job's
    record) and every replica's and worker's log to a file under bench/out; its path."""
    infos = st.client.get_many(sorted(ids))
    states: dict[str, int] = {}
    for info in infos.values():
        key = "missing" if info is None else str(info.state)
        states[key] = states.get(key, 0) + 1
    stuck = [f"{jid} {info!r}" for jid, info in infos.items() if info is None or str(info.state) != "done"]
    parts = [f"at {time.time():.3f}: {json.dumps(states)}", *stuck[:200], f"stats: {st.client.stats()}"]
    procs = [("replica", p) for p in st.schedulers] + [("worker", p) for p, _ in st.workers]
    parts += [f"=== {kind} {p.pid}\n{p.log_tail(400)}" for kind, p in procs]
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"fanout-stall-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    path.write_text("\n".join(parts) + "\n")
    return path


def wait_up(st: Stack, timeout: float = 120.0) -> None:
    """Until every worker's /metrics answers (imported, connected, its loops starting)."""
    deadline = time.monotonic() + timeout
    for proc, _ in st.workers:
        while proc.try_metric("zsched_worker_concurrency") is None:
            if not proc.alive:
                raise RuntimeError(f"a worker exited at start:\n{proc.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"a worker's /metrics did not answer within {timeout:.0f} s:\n{proc.tail()}")
            time.sleep(0.1)
    time.sleep(1.0)  # subscribed, its first sweep answered


def with_workers(st: Stack, side: Side, n: int, loads: dict[str, list[float]], concurrency: int,
                 idle_seconds: float = IDLE_S, handler_ms: float = 0.0) -> dict[str, Any]:
    """Start ``n`` workers (their handlers take ``handler_ms``), measure them idle (``idle_seconds``),
    then each load in ``loads``' order; stop them."""
    st.start_workers(n, concurrency=concurrency, settle=0, extra=side.worker_args,  # wait_up() waits for them
                     handler_ms=handler_ms)
    try:
        wait_up(st)
        out: dict[str, Any] = {"idle": idle(st, idle_seconds)}
        ids: dict[str, set[str]] = {}
        for shape, offsets in loads.items():
            out[shape], ids[shape] = load(st, side, offsets)
    finally:
        records = st.stop_workers()
    for shape, want in ids.items():
        summary = records_summary([r for r in records if r[0] in want], want)
        lat = summary.pop("handler_lateness_ms")
        out[shape].update(summary)
        out[shape].update({f"handler_lateness_{k}_ms": lat.get(k) for k in ("p50", "p99", "max")})
    return out


@contextmanager
def stack(backend: str, side: Side, partitions: int = PARTITIONS) -> Iterator[Stack]:
    """A fresh stack on one redis-server or a balanced 3-master cluster, replicas running ``side``'s
    code, the namespace in ``partitions`` partitions."""
    if backend == "single":
        with Stack(partitions=partitions, code=side.code) as st:
            st.start_schedulers(REPLICAS, side.scheduler_args)
            yield st
        return
    with side_redis("cluster", NS, partitions) as (srv, _), Stack(partitions=partitions, redis=srv,
                                                                   code=side.code) as st:
        st.start_schedulers(REPLICAS, side.scheduler_args)
        yield st


def orders(rnd: int, items: Sequence[Any]) -> list[Any]:
    """Round 0 as given, round 1 reversed, later rounds shuffled (seeded by the round)."""
    if rnd == 0:
        return list(items)
    if rnd == 1:
        return list(items)[::-1]
    out = list(items)
    random.Random(rnd).shuffle(out)
    return out


def blocks(rnd: int, sides: Sequence[Side], backends: Sequence[str],
           workers: Sequence[int]) -> list[tuple[Side, str, list[int]]]:
    """Round ``rnd``'s order: (side, backend, the W values it runs on one stack), in turn. One side:
    one stack per backend. Two sides: one stack per side, backend and W, the sides of each W
    back to back, the first of each pair alternating (ABBA), so that the two runs of a pair are a
    minute apart: the machine's speed drifts over a run (a fan-out run on 2026-12-06 saw the same
    commands take 1.3x longer in its later rounds), and sides run a whole round apart read that
    drift as a difference between them."""
    if len(sides) == 1:
        return [(sides[0], backend, orders(rnd, workers)) for backend in orders(rnd % 2, backends)]
    out: list[tuple[Side, str, list[int]]] = []
    for backend in orders(rnd % 2, backends):
        for n in orders(rnd, workers):
            out += [(side, backend, [n]) for side in orders((len(out) // 2 + rnd) % 2, sides)]
    return out


def run(quick: bool = False, workers: Sequence[int] | None = None, shapes: Sequence[str] = SHAPES,
        backends: Sequence[str] | None = None, rounds: int | None = None, jobs: int | None = None,
        seconds: float | None = None, bursts: int | None = None, concurrency: int = CONCURRENCY,
        other: Path | None = None, scheduler_args: Sequence[str] = (),
        worker_args: Sequence[str] = (), other_scheduler_args: Sequence[str] = (),
        other_worker_args: Sequence[str] = (), idle_seconds: float = IDLE_S,
        partitions: int = PARTITIONS, handler_ms: float = 0.0) -> dict[str, Any]:
    """The suite; its JSON result (``runs``: one entry per round, side, backend, W and shape;
    ``idle``: one per round, side, backend and W, ``idle_seconds`` long)."""
    q: dict[str, Any] = QUICK if quick else {}
    workers = tuple(workers or q.get("workers", WORKERS))
    backends = tuple(backends or q.get("backends", BACKENDS))
    rounds = rounds or q.get("rounds", ROUNDS)
    jobs = jobs or q.get("jobs", JOBS)
    seconds = seconds or q.get("seconds", SECONDS)
    bursts = bursts or q.get("bursts", BURSTS)
    sides = [Side("this", ROOT, tuple(scheduler_args), tuple(worker_args))] + (
        [Side("other", other.resolve(), tuple(other_scheduler_args), tuple(other_worker_args))] if other else [])
    with ExitStack() as cleanup:  # the copies of the code go when the run ends, however it ends
        sides = [snapshot(side, cleanup) for side in sides]
        for side in sides:
            compile_checkout(side.code)
        t_start = time.time()
        m = machine()
        m["loadavg_start"] = os.getloadavg()
        result: dict[str, Any] = {
            "machine": m, "quick": quick, "workers": list(workers), "shapes": list(shapes), "backends": list(backends),
            "rounds": rounds, "jobs": jobs, "seconds": seconds, "bursts": bursts, "concurrency": concurrency,
            "idle_seconds": idle_seconds, "partitions": partitions, "handler_ms": handler_ms,
            "replicas": REPLICAS, "sides": {s.name: s.describe() for s in sides},
            "lateness": "handler: each handler's start minus its job's due time (exact, from the bench handler's "
                        "records); firing: landed in ready minus due time (replicas' histograms, bucket estimate)",
            "runs": [], "idle": [], "order": []}
        for rnd in range(rounds):
            loads_of = {s: offsets_for(s, jobs, seconds, bursts, 1000 * rnd + i) for i, s in enumerate(SHAPES)}
            for side, backend, ws in blocks(rnd, sides, backends, workers):
                with stack(backend, side, partitions) as st:
                    for n in ws:
                        loads = {s: loads_of[s] for s in orders(rnd % 2, shapes)}
                        got = with_workers(st, side, n, loads, concurrency, idle_seconds, handler_ms)
                        key = {"round": rnd, "side": side.name, "backend": backend, "workers": n}
                        result["order"].append(f"{rnd}:{side.name}:{backend}:{n}")
                        result["idle"].append({**key, **got.pop("idle")})
                        for shape, fig in got.items():
                            result["runs"].append({**key, "shape": shape, **fig})
                            print(f"  round {rnd} {side.name} {backend} W={n} {shape}: per job worker "
                                  f"{fig['worker_cpu_us_per_job']:.0f} µs, Redis {fig['redis_cpu_us_per_job']:.0f} "
                                  f"µs, replicas {fig['replica_cpu_us_per_job']:.0f} µs, "
                                  f"{fig['script_calls_per_job']:.2f} script calls, notified "
                                  f"{fig['notified_per_job']}, p99 {fig['handler_lateness_p99_ms']} ms, load "
                                  f"{fig['loadavg_1m']}", file=sys.stderr, flush=True)
        m["loadavg_end"] = os.getloadavg()
        result["summary"] = summarize(result["runs"])
        result["idle_summary"] = summarize(result["idle"])
        result["targets"] = targets(result["summary"])
        if other:
            result["compare"] = compare(result["runs"])
        result["seconds_total"] = round(time.time() - t_start, 1)
        return result


def handlers_source(checkout: Path) -> str:
    """The text of ``checkout``'s bench handler ("" when it has none)."""
    try:
        return (checkout / "bench" / "handlers.py").read_text()
    except OSError:
        return ""


def is_full(r: dict[str, Any]) -> bool:
    """A run with the default sizes: its figures may replace those in RESULTS.md and docs/img."""
    return (not r["quick"] and tuple(r["workers"]) == WORKERS and tuple(r["shapes"]) == SHAPES
            and tuple(r["backends"]) == BACKENDS and r["jobs"] == JOBS and r["seconds"] == SECONDS
            and r["bursts"] == BURSTS and r["concurrency"] == CONCURRENCY and r["rounds"] >= ROUNDS
            and r.get("partitions", PARTITIONS) == PARTITIONS and not r.get("handler_ms"))


def finish(r: dict[str, Any], out: Path | None = None, plots: Path | None = None) -> None:
    """Keep the JSON, draw the plots, and (a full run) write the RESULTS.md section."""
    from bench.fanout_plot import draw
    from bench.report import fanout_markdown, update_section

    compared = "compare" in r
    name = "fanout-compare" if compared else "fanout"
    full = is_full(r)
    out = out or OUT / f"{name}{'' if full else '-partial'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(r, indent=2, default=str))
    drawn = draw(r, plots or (IMG if full else OUT), name)
    print_table(r)
    print(f"  JSON: {out}; plots: {', '.join(str(p) for p in drawn)}", file=sys.stderr)
    if full:
        update_section(RESULTS, name.replace("-", "_"), fanout_markdown(r, [p.name for p in drawn]))


def run_suite(quick: bool) -> dict[str, Any]:
    """``python -m bench fanout`` / ``all``: the default run, kept and reported."""
    r = run(quick)
    finish(r)
    return r


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench fanout", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)

    def ints(s: str) -> list[int]:
        return [int(x) for x in s.split(",")]

    p.add_argument("--quick", action="store_true",
                   help="W 1 and 4, 600 jobs over 4 s, 1 round, one redis-server: about a minute")
    p.add_argument("--compare", metavar="OTHER_CHECKOUT", type=Path,
                   help="also run every round with the code of this other checkout of zsched, alternating")
    p.add_argument("--workers", type=ints, help=f"worker process counts (default {','.join(map(str, WORKERS))})")
    p.add_argument("--shapes", default=",".join(SHAPES), help="spread, batched or both (default %(default)s)")
    p.add_argument("--backends", help=f"single, cluster or both (default {','.join(BACKENDS)})")
    p.add_argument("--rounds", type=int, help=f"rounds (default {ROUNDS})")
    p.add_argument("--jobs", type=int, help=f"jobs per load (default {JOBS})")
    p.add_argument("--seconds", type=float, help=f"span of a load's due times (default {SECONDS:g})")
    p.add_argument("--bursts", type=int, help=f"instants of the batched shape (default {BURSTS})")
    p.add_argument("--concurrency", type=int, default=CONCURRENCY, help="per worker process (default %(default)s)")
    p.add_argument("--partitions", type=int, default=PARTITIONS,
                   help=f"the namespace's partitions (default %(default)s; 1-{MAX_PARTITIONS})")
    p.add_argument("--handler-ms", type=float, default=0.0, metavar="MS",
                   help="each handler sleeps this long (asyncio.sleep: waiting on I/O) after recording its "
                        "start (default 0: returns at once; 0-60000)")
    p.add_argument("--idle-seconds", type=float, default=IDLE_S,
                   help="the idle window before each W's loads, seconds (default %(default)s)")
    p.add_argument("--scheduler-args", default="", metavar="ARGS",
                   help="extra arguments of this side's replicas, e.g. '--coalesce-lead 160'")
    p.add_argument("--worker-args", default="", metavar="ARGS",
                   help="extra arguments of this side's workers, e.g. '--prefetch 64'")
    p.add_argument("--other-scheduler-args", default="", metavar="ARGS",
                   help="extra arguments of the other side's replicas (with --compare)")
    p.add_argument("--other-worker-args", default="", metavar="ARGS",
                   help="extra arguments of the other side's workers (with --compare)")
    p.add_argument("--out", type=Path, help="where to keep the JSON (default bench/out/fanout*.json)")
    p.add_argument("--plots", type=Path, help="where to draw the PNGs (default docs/img for a full run, else "
                                              "bench/out)")
    p.add_argument("--report", type=Path, metavar="JSON", help="only redraw the plots and rewrite the RESULTS.md "
                                                                "section from a saved run")
    a = p.parse_args(argv)
    try:
        if a.report:
            finish(json.loads(a.report.read_text()), a.report, a.plots)
            return
        shapes = a.shapes.split(",")
        backends = a.backends.split(",") if a.backends else None
        bad = [x for x in shapes if x not in SHAPES] + [x for x in backends or () if x not in BACKENDS]
        if bad:
            raise UsageError(f"unknown shape or backend {bad[0]!r} (shapes: {', '.join(SHAPES)}; backends: "
                             f"{', '.join(BACKENDS)})")
        if not 1 <= a.partitions <= MAX_PARTITIONS:
            raise UsageError(f"--partitions {a.partitions}: give a count from 1 to {MAX_PARTITIONS}")
        if not 0 <= a.handler_ms <= 60000:  # refuses nan too
            raise UsageError(f"--handler-ms {a.handler_ms:g}: give a run time from 0 to 60000 ms")
        if a.handler_ms and a.compare and "BENCH_HANDLER_MS" not in handlers_source(a.compare):
            raise UsageError(f"--handler-ms with --compare {a.compare}: that checkout's bench/handlers.py does not "
                             "sleep (it would compare slow handlers with no-op ones); use a checkout from "
                             "2026-12-04 or later")
        if not 0 < a.idle_seconds <= 3600:
            raise UsageError(f"--idle-seconds {a.idle_seconds:g}: give a window from more than 0 to 3600 seconds")
        if a.compare and not (a.compare / "scheduler").is_dir():
            raise UsageError(f"--compare {a.compare}: no zsched checkout there (give the root of another "
                             "worktree, the folder holding scheduler/ and workers/)")
        r = run(a.quick, a.workers, shapes, backends, a.rounds, a.jobs, a.seconds, a.bursts, a.concurrency,
                a.compare, shlex.split(a.scheduler_args), shlex.split(a.worker_args),
                shlex.split(a.other_scheduler_args), shlex.split(a.other_worker_args), a.idle_seconds,
                a.partitions, a.handler_ms)
    except UsageError as exc:
        print(f"bench fanout: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    emit({"fanout": r})
    finish(r, a.out, a.plots)


if __name__ == "__main__":
    main()
