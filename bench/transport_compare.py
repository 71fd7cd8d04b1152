"""``python -m bench transport [--quick]``: the old Redis script transport (commit b19477a: a
thread-owned connection outside the pool, hiredis-packed worker commands) against the new one
(the working tree: pool connections, retries, idempotent re-sends), side by side in one run.

The old tree is extracted with ``git archive OLD_COMMIT`` into a temp dir (its ``lua/`` folder
copied to ``scheduler/lua/``, where setuptools' package-dir mapping would have put it). The working
tree's code is copied the same way into another temp dir when the suite starts (other engineers
edit the working tree meanwhile: every run of the new side must run the same code; the copy's
digest is in the output). Every measurement of either side runs in a child process with
``PYTHONPATH`` set to that side's tree only; the child checks that ``scheduler``, ``scheduler.lua``
and ``workers`` were imported from there (the venv's editable install of the working tree must not
win), and after every run Redis's script cache is checked: the side's own Lua scripts ran, the
other side's did not.

* W1: ``Client.schedule(now + 1 h, PAYLOAD)`` one by one, N = 20 000 times per side and round on
  a fresh namespace, and ``schedule_many`` of N (3 times); one redis-server (no persistence),
  FLUSHALL + SCRIPT FLUSH before each of the 5 rounds. The two sides' clients live in two child
  processes (each warmed up with 500 calls) that take turns in slices of 1 000 calls, the side
  going first alternating (old, new, new, old, ...), so drift in the machine's load hits both
  alike; a side's rate in a round is N / its summed slice time.
* W3: ``bench.workloads.w3_drain``'s drain (N jobs due at T0, no-op handler, 2 scheduler replicas,
  1 worker process, Redis with AOF everysec) at worker concurrency 64 and 16; each run a fresh
  Stack (redis, etcd, processes) whose scheduler and worker processes, and the client that
  schedules the jobs, are the side's code; 5 runs per side, alternating like W1. Also per run: CPU
  per component, and EVALSHA calls and Redis script time per job (INFO commandstats).

Output: per side the runs and their medians, and the ratios new / old of the medians (> 1: the new
transport is faster). Not part of ``python -m bench all`` (it needs git and takes minutes).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from bench.common import PAYLOAD, REPO, machine, redis_server
from bench.stack import LIFELINE, NS, Stack
from bench.workloads import records_summary, wait_acked
from scheduler.shell.servers import ZschedProc

OLD_COMMIT = "b19477a"
CHILD = Path(__file__).resolve().parent / "transport_child.py"


@dataclass
class Side:
    name: str
    root: Path
    shas: dict[str, str] | None = None

    @property
    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.root)}

    def child(self, mode: str, *args: str, timeout: float = 600) -> dict[str, Any]:
        env = {**os.environ, **self.env}
        proc = subprocess.run([sys.executable, str(CHILD), mode, "--root", str(self.root), *args],
                              capture_output=True, text=True, env=env, cwd=str(self.root), timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"{self.name} child {mode} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def extract_old(commit: str = OLD_COMMIT, repo: Path = REPO) -> Path:
    """The old tree, importable on its own: ``git archive`` + ``lua/`` -> ``scheduler/lua/``."""
    tmp = Path(tempfile.mkdtemp(prefix="zsched-old-transport-"))
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(tmp)], stdin=archive.stdout, check=True)
    assert archive.stdout is not None
    archive.stdout.close()
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    if not (tmp / "lua" / "__init__.py").exists() or (tmp / "scheduler" / "lua").exists():
        raise RuntimeError(f"unexpected layout of {commit}: no lua/__init__.py or scheduler/lua exists")
    shutil.copytree(tmp / "lua", tmp / "scheduler" / "lua")
    return tmp


def _tree_digest(root: Path, lua: str = "lua") -> str:
    """sha1 over the code that runs (scheduler/ and workers/ Python, the Lua scripts): identifies
    the measured tree."""
    h = hashlib.sha1()
    for sub, pat in (("scheduler", "**/*.py"), ("workers", "**/*.py"), (lua, "*.lua")):
        for f in sorted((root / sub).glob(pat)):
            if "__pycache__" not in f.parts and not (sub == "scheduler" and f.parent.name == "lua"):
                h.update(str(f.relative_to(root / sub)).encode() if sub == lua else str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:12]


def snapshot_new(repo: Path = REPO) -> tuple[Path, str]:
    """A frozen copy of the working tree's code (scheduler/, workers/, lua/ -> scheduler/lua/,
    bench/handlers.py), laid out like the old tree: other engineers edit the working tree while
    the suite runs, and every run of the new side must run the same code. Retried until the
    working tree did not change during the copy. Returns (dir, digest)."""
    ignore = shutil.ignore_patterns("__pycache__")
    for _ in range(10):
        before = _tree_digest(repo)
        tmp = Path(tempfile.mkdtemp(prefix="zsched-new-transport-"))
        shutil.copytree(repo / "scheduler", tmp / "scheduler", ignore=ignore)
        shutil.copytree(repo / "workers", tmp / "workers", ignore=ignore)
        shutil.copytree(repo / "lua", tmp / "scheduler" / "lua", ignore=ignore)
        (tmp / "bench").mkdir()
        for f in ("__init__.py", "handlers.py"):
            shutil.copy2(repo / "bench" / f, tmp / "bench" / f)
        if before == _tree_digest(repo) == _tree_digest(tmp, lua="scheduler/lua"):
            return tmp, before
        shutil.rmtree(tmp, ignore_errors=True)
        time.sleep(1.0)
    raise RuntimeError("the working tree kept changing while it was copied")


@contextlib.contextmanager
def trees(old_commit: str = OLD_COMMIT, keep: bool = False) -> Iterator[tuple[Path, Path, str]]:
    """(old tree, snapshot of the working tree, its digest), both removed afterwards unless ``keep``."""
    roots: list[Path] = []
    try:
        roots.append(extract_old(old_commit))
        new_root, digest = snapshot_new()
        roots.append(new_root)
        yield roots[0], new_root, digest
    finally:
        if keep:
            print(f"trees kept: {' '.join(map(str, roots))}", file=sys.stderr)
        else:
            for r in roots:
                shutil.rmtree(r, ignore_errors=True)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()


def _order(rounds: int) -> list[tuple[int, str]]:
    """old, new, new, old, old, new, ...: each side goes first in every other round."""
    out = []
    for i in range(rounds):
        pair = ("old", "new") if i % 2 == 0 else ("new", "old")
        out += [(i, s) for s in pair]
    return out


def _check_scripts(r: redis.Redis, side: Side, other: Side, names: list[str],
                   other_may_run: bool = False) -> dict[str, Any]:
    """Which of the scripts that differ between the trees Redis has cached: the side's own must be
    there (those its run used), the other side's never (unless it already ran on this Redis)."""
    assert side.shas and other.shas
    differing = [n for n in names if side.shas[n] != other.shas[n]]
    own = dict(zip(differing, r.script_exists(*[side.shas[n] for n in differing]))) if differing else {}
    foreign = dict(zip(differing, r.script_exists(*[other.shas[n] for n in differing]))) if differing else {}
    if any(foreign.values()) and not other_may_run:
        raise RuntimeError(f"{side.name} run: the other tree's scripts ran: {foreign}")
    return {"differing": differing, "own_cached": [n for n, v in own.items() if v]}


def _summary(runs: list[float], digits: int | None = None) -> dict[str, Any]:
    return {"runs": [round(x, digits) for x in runs],
            "median": round(statistics.median(runs), digits) if runs else None}


def _ratio(new: float | None, old: float | None) -> float | None:
    return round(new / old, 3) if new and old else None


# -- W1 ------------------------------------------------------------------------------------------

class Server:
    """A ``serve`` child: one side's client, driven a slice at a time over stdin/stdout."""

    def __init__(self, side: Side, url: str) -> None:
        self.side = side
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), "serve", "--root", str(side.root), "--url", url,
             "--payload", json.dumps(PAYLOAD)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, **side.env},
            cwd=str(side.root))
        self.hello = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.side.name} serve child exited ({self.proc.wait()})")
        return json.loads(line)

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask(cmd="quit")
            except (RuntimeError, OSError, ValueError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _evalsha(r: redis.Redis) -> tuple[int, int]:
    st = r.info("commandstats").get("cmdstat_evalsha", {})
    return int(st.get("calls", 0)), int(st.get("usec", 0))


def w1(sides: dict[str, Side], n: int, rounds: int, slice_n: int = 1000, many_reps: int = 3) -> dict[str, Any]:
    """Both sides' clients live in two child processes that take turns: each round, each side makes
    ``n`` sequential ``schedule`` calls in slices of ``slice_n``, old and new slices alternating
    (o n n o o n ...), then ``many_reps`` ``schedule_many(n)`` each, alternating too. Per round and
    side: jobs/s = n / the side's summed slice time. Redis time per call from INFO commandstats
    around each slice (only one side runs at a time)."""
    slices = max(1, n // slice_n)
    out: dict[str, Any] = {"jobs": slices * slice_n, "rounds": rounds, "slice": slice_n,
                           "schedule_many_reps_per_round": many_reps}
    per = {s: {"one": [], "many": [], "cpu_us": [], "redis_us": []} for s in sides}
    pair_ratios: list[float] = []
    with redis_server() as srv:
        r = redis.Redis.from_url(srv.url)
        servers = {}
        try:
            for name, side in sides.items():
                servers[name] = Server(side, srv.url)
            for rnd in range(rounds):
                r.flushall()
                r.script_flush()  # each side's first call loads its own script: checked below
                for name, sv in servers.items():
                    sv.ask(cmd="reset", ns=f"bench-{name}")
                first, second = ("old", "new") if rnd % 2 == 0 else ("new", "old")
                acc = {s: {"wall": 0.0, "cpu": 0.0, "calls": 0, "usec": 0} for s in sides}
                for j in range(slices):
                    rates = {}
                    for name in ((first, second) if j % 2 == 0 else (second, first)):
                        c0, u0 = _evalsha(r)
                        res = servers[name].ask(cmd="one", n=slice_n)
                        c1, u1 = _evalsha(r)
                        a = acc[name]
                        a["wall"] += res["wall"]
                        a["cpu"] += res["cpu"]
                        a["calls"] += c1 - c0
                        a["usec"] += u1 - u0
                        rates[name] = slice_n / res["wall"]
                        if j == 0:
                            other = sides[second if name == first else first]
                            check = _check_scripts(r, sides[name], other, ["schedule"], other_may_run=name == second)
                            if "schedule" in check["differing"] and "schedule" not in check["own_cached"]:
                                raise RuntimeError(f"{name} W1: its schedule script is not in Redis's cache")
                    pair_ratios.append(rates["new"] / rates["old"])
                many: dict[str, list[float]] = {s: [] for s in sides}
                for k in range(many_reps):
                    for name in ((first, second) if k % 2 == 0 else (second, first)):
                        many[name].append(n / servers[name].ask(cmd="many", n=n)["wall"])
                for name in sides:
                    a = acc[name]
                    per[name]["one"].append(slices * slice_n / a["wall"])
                    per[name]["cpu_us"].append(a["cpu"] / (slices * slice_n) * 1e6)
                    per[name]["redis_us"].append(a["usec"] / max(1, a["calls"]))
                    per[name]["many"].append(statistics.median(many[name]))
                print("  W1 round %d: " % rnd + "; ".join(
                    f"{s} one {per[s]['one'][-1]:.0f}/s (client CPU {per[s]['cpu_us'][-1]:.1f} us/job, "
                    f"redis {per[s]['redis_us'][-1]:.1f} us/call) many {per[s]['many'][-1]:.0f}/s" for s in sides),
                    file=sys.stderr, flush=True)
        finally:
            for sv in servers.values():
                sv.close()
            r.close()
    for name in sides:
        p = per[name]
        out[name] = {"schedule_one_jobs_per_s": _summary(p["one"]), "schedule_many_jobs_per_s": _summary(p["many"]),
                     "one_client_cpu_us_per_job": _summary(p["cpu_us"], 1),
                     "one_redis_us_per_call": _summary(p["redis_us"], 1)}
    pr = sorted(pair_ratios)
    out["ratio_new_over_old"] = {
        "schedule_one": _ratio(out["new"]["schedule_one_jobs_per_s"]["median"],
                               out["old"]["schedule_one_jobs_per_s"]["median"]),
        "schedule_one_paired_slices_median": round(statistics.median(pr), 3),
        "schedule_one_paired_slices_p25_p75": [round(pr[len(pr) // 4], 3), round(pr[(3 * len(pr)) // 4], 3)],
        "schedule_many": _ratio(out["new"]["schedule_many_jobs_per_s"]["median"],
                                out["old"]["schedule_many_jobs_per_s"]["median"]),
        "client_cpu_us_per_job": _ratio(out["new"]["one_client_cpu_us_per_job"]["median"],
                                        out["old"]["one_client_cpu_us_per_job"]["median"]),
        "redis_us_per_call": _ratio(out["new"]["one_redis_us_per_call"]["median"],
                                    out["old"]["one_redis_us_per_call"]["median"]),
    }
    return out


# -- W3 ------------------------------------------------------------------------------------------

class SideStack(Stack):
    """bench.stack.Stack whose scheduler and worker processes run one side's tree (PYTHONPATH and
    working directory set to it, ``python -m scheduler`` as everywhere in the bench)."""

    def __init__(self, side: Side, **kw: Any) -> None:
        super().__init__(**kw)
        self.side = side

    def start_schedulers(self, n: int) -> None:
        for _ in range(n):
            rid = f"s{len(self.schedulers)}"
            self.schedulers.append(ZschedProc(
                ["scheduler", "--redis", self.url, "--etcd", self.etcd.endpoint, "--namespace", NS,
                 "--replica-id", rid, "--lease-ttl", str(self.lease_ttl)],
                env=self.side.env, cwd=str(self.side.root), lifeline=LIFELINE).start())
        self.wait_owned()

    def start_workers(self, n: int, concurrency: int = 16) -> None:
        # bench.handlers comes from the side's tree too (bench/ is the same in both)
        for _ in range(n):
            rec = self.tmp / f"worker-{len(self.workers)}.txt"
            p = ZschedProc(["worker", "bench.handlers:worker", "--redis", self.url, "--namespace", NS],
                           env={**self.side.env, "BENCH_RECORD": str(rec), "BENCH_CONCURRENCY": str(concurrency)},
                           cwd=str(self.side.root), lifeline=LIFELINE).start()
            self.workers.append((p, rec))
        time.sleep(1.5)  # imported, connected, subscribed


def w3_drain_once(st: SideStack, jobs: int, acked_before: int,
                  reset_stats: bool = True) -> tuple[dict[str, Any], set[str]]:
    """One drain on a running stack, as bench.workloads.w3_drain measures it: ``jobs`` jobs due at
    T0 (scheduled by the side's own client in a child process), jobs/s from T0 until all acked."""
    t0 = time.time() + 4  # the feeding child starts a Python and schedules the jobs first
    ids_file = st.tmp / "ids.txt"
    feed = st.side.child("feed", "--url", st.url, "--payload", json.dumps(PAYLOAD), "--namespace", NS,
                         "--partitions", str(st.partitions), "--jobs", str(jobs), "--t0", repr(t0),
                         "--ids-file", str(ids_file))
    if feed["finished_before_t0_s"] < 0.5:
        raise RuntimeError(f"{st.side.name}: scheduling the jobs ended {feed['finished_before_t0_s']:.2f}s before T0")
    ids = set(ids_file.read_text().split())
    time.sleep(max(0.0, t0 - time.time() - 0.5))
    if reset_stats:
        st.r.config_resetstat()
    cpu0 = st.cpu()
    done = wait_acked(st, acked_before + jobs, 120)
    cpu1 = st.cpu()
    elapsed = done - t0
    ev = st.r.info("commandstats").get("cmdstat_evalsha", {}) if reset_stats else {}
    dead = [p.tail(20) for p in st.schedulers if not p.alive] + [p.tail(20) for p, _ in st.workers if not p.alive]
    if dead:
        raise RuntimeError(f"{st.side.name}: processes exited during the drain:\n" + "\n".join(dead))
    out = {"jobs_per_s": jobs / elapsed, "seconds_from_t0": elapsed,
           "cpu_s_per_1000_jobs": {k: (cpu1[k] - cpu0[k]) / jobs * 1000 for k in cpu0}}
    if ev:  # scripts run during the drain (tick, claim, ack, reap, ...): round trips and Redis time
        out["evalsha_calls_per_1000_jobs"] = ev["calls"] / jobs * 1000
        out["evalsha_us_per_job"] = ev["usec"] / jobs
    return out, ids


def w3_run(side: Side, other: Side, jobs: int, concurrency: int, replicas: int = 2) -> dict[str, Any]:
    """One W3 drain on a fresh stack of ``side`` (as bench.workloads.w3_drain: redis with AOF
    everysec, etcd, ``replicas`` scheduler replicas, 1 worker process), checked for duplicates,
    missing jobs and which tree's scripts ran."""
    with SideStack(side) as st:
        st.start_schedulers(replicas)
        st.start_workers(1, concurrency=concurrency)
        res, ids = w3_drain_once(st, jobs, 0)
        scripts = _check_scripts(st.r, side, other, ["schedule", "tick", "claim", "ack"])
        if scripts["differing"] and set(scripts["own_cached"]) != set(scripts["differing"]):
            raise RuntimeError(f"{side.name} W3: not all of its own scripts {scripts['differing']} ran: {scripts}")
        summary = records_summary(st.stop_workers(), ids)
    res.update({k: summary[k] for k in ("duplicates", "missing", "started_before_run_at")})
    res["scripts_checked"] = scripts
    return res


def w3(sides: dict[str, Side], jobs: int, rounds: int, concurrencies: tuple[int, ...]) -> dict[str, Any]:
    """Per concurrency, ``rounds`` drains per side, each on a fresh stack, alternating
    o n n o o n ..."""
    out: dict[str, Any] = {"jobs": jobs, "rounds": rounds, "worker_processes": 1, "replicas": 2}
    for conc in concurrencies:
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in sides}
        order = []
        for rnd, name in _order(rounds):
            other = sides["new" if name == "old" else "old"]
            res = w3_run(sides[name], other, jobs, conc)
            runs[name].append(res)
            order.append(f"{rnd}:{name}")
            print(f"  W3 c={conc} round {rnd} {name}: {res['jobs_per_s']:.0f} jobs/s, cpu s/1000 jobs "
                  + ", ".join(f"{k} {v:.3f}" for k, v in res["cpu_s_per_1000_jobs"].items())
                  + f"; evalsha {res['evalsha_calls_per_1000_jobs']:.0f} calls and "
                  f"{res['evalsha_us_per_job']:.1f} us per job; dup {res['duplicates']} missing {res['missing']}",
                  file=sys.stderr, flush=True)
        block: dict[str, Any] = {"concurrency": conc, "order": order}
        for name in sides:
            rs = runs[name]
            block[name] = {
                "jobs_per_s": _summary([x["jobs_per_s"] for x in rs]),
                "cpu_s_per_1000_jobs_median": {
                    k: round(statistics.median(x["cpu_s_per_1000_jobs"][k] for x in rs), 4)
                    for k in rs[0]["cpu_s_per_1000_jobs"]},
                "evalsha_calls_per_1000_jobs_median": round(statistics.median(
                    x["evalsha_calls_per_1000_jobs"] for x in rs), 1),
                "evalsha_us_per_job_median": round(statistics.median(x["evalsha_us_per_job"] for x in rs), 2),
                "duplicates": sum(x["duplicates"] for x in rs), "missing": sum(x["missing"] for x in rs),
                "started_before_run_at": sum(x["started_before_run_at"] for x in rs),
                "scripts_checked": rs[0]["scripts_checked"],
            }
        block["ratio_new_over_old"] = {
            "jobs_per_s": _ratio(block["new"]["jobs_per_s"]["median"], block["old"]["jobs_per_s"]["median"]),
            "worker_cpu_per_1000_jobs": _ratio(block["new"]["cpu_s_per_1000_jobs_median"]["workers"],
                                               block["old"]["cpu_s_per_1000_jobs_median"]["workers"]),
            "redis_cpu_per_1000_jobs": _ratio(block["new"]["cpu_s_per_1000_jobs_median"]["redis"],
                                              block["old"]["cpu_s_per_1000_jobs_median"]["redis"]),
        }
        out[f"concurrency_{conc}"] = block
    return out


# -- suite ---------------------------------------------------------------------------------------

def run(quick: bool = False, old_commit: str = OLD_COMMIT, keep: bool = False) -> dict[str, Any]:
    t_start = time.time()
    with trees(old_commit, keep) as (old_root, new_root, digest):
        sides = {"old": Side("old", old_root), "new": Side("new", new_root)}
        info = {}
        for s in sides.values():
            i = s.child("info")
            s.shas = i["shas"]
            info[s.name] = {"root": i["root"], "imported_from": i["imported_from"]}
        info["old"]["commit"] = _git("rev-parse", old_commit)
        info["new"].update({"head": _git("rev-parse", "HEAD"),
                            "uncommitted_files": len(_git("status", "--porcelain").splitlines()),
                            "code_digest": digest, "copied_from": str(REPO)})
        info["differing_scripts"] = sorted(n for n in sides["new"].shas
                                           if sides["old"].shas.get(n) != sides["new"].shas[n])
        m = machine()
        m["loadavg_start"] = os.getloadavg()
        n1 = 2000 if quick else 20_000
        n3 = 5000 if quick else 20_000
        result: dict[str, Any] = {"machine": m, "trees": info}
        result["w1_enqueue"] = w1(sides, n1, 2 if quick else 5)
        result["w3_drain"] = w3(sides, n3, 1 if quick else 5, (64, 16))
        m["loadavg_end"] = os.getloadavg()
        result["seconds"] = round(time.time() - t_start, 1)
        result["target"] = "new >= 0.85 x old (ratio_new_over_old >= 0.85) for schedule one by one and W3"
        result["within_15_percent"] = {
            "w1_schedule_one": (result["w1_enqueue"]["ratio_new_over_old"]["schedule_one"] or 0) >= 0.85,
            "w1_schedule_one_paired_slices": result["w1_enqueue"]["ratio_new_over_old"][
                "schedule_one_paired_slices_median"] >= 0.85,
            **{f"w3_concurrency_{c}": (result["w3_drain"][f"concurrency_{c}"]["ratio_new_over_old"]["jobs_per_s"] or 0)
               >= 0.85 for c in (64, 16)},
        }
        return result


def profile(n: int = 20_000, top: int = 25) -> dict[str, Any]:
    """cProfile of the one-by-one ``schedule`` loop, old and new (``python -m bench.transport_compare
    profile``): the top functions by own time and by cumulative time, in microseconds per job."""
    import pstats

    with trees() as (old_root, new_root, digest):
        out: dict[str, Any] = {"new_code_digest": digest}
        sides = {"old": Side("old", old_root), "new": Side("new", new_root)}
        with redis_server() as srv:
            r = redis.Redis.from_url(srv.url)
            for name, side in sides.items():
                r.flushall()
                sv = Server(side, srv.url)
                try:
                    sv.ask(cmd="reset", ns="bench")
                    plain = sv.ask(cmd="one", n=n)
                    r.flushall()
                    sv.ask(cmd="reset", ns="bench")
                    prof = Path(tempfile.mkstemp(prefix=f"zsched-prof-{name}-", suffix=".prof")[1])
                    res = sv.ask(cmd="one", n=n, profile=str(prof))
                finally:
                    sv.close()
                st = pstats.Stats(str(prof))
                rows = []
                for (fn, line, func), (_cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
                    rows.append({"function": f"{Path(fn).name}:{line}({func})", "calls_per_job": round(nc / n, 2),
                                 "own_us_per_job": round(tt / n * 1e6, 2), "cum_us_per_job": round(ct / n * 1e6, 2)})
                out[name] = {"jobs_per_s": round(n / plain["wall"]),
                             "client_cpu_us_per_job": round(plain["cpu"] / n * 1e6, 1),
                             "jobs_per_s_under_profiler": round(n / res["wall"]),
                             "profiled_us_per_job": round(st.total_tt / n * 1e6, 2),  # type: ignore[attr-defined]
                             "function_calls_per_job": round(sum(x["calls_per_job"] for x in rows), 1),
                             "top_own_time": sorted(rows, key=lambda x: -x["own_us_per_job"])[:top],
                             "top_cumulative": sorted(rows, key=lambda x: -x["cum_us_per_job"])[:top]}
                prof.unlink()
            r.close()
    return out


class _ProfiledWorker(ZschedProc):
    """``zsched worker`` of a side's tree under cProfile (transport_child.py profile-worker)."""

    def __init__(self, side: Side, out: Path, args: list[str], env: dict[str, str]) -> None:
        super().__init__(args, env=env, cwd=str(side.root))
        self.side, self.out = side, out

    def argv(self) -> list[str]:
        return [sys.executable, str(CHILD), "profile-worker", "--root", str(self.side.root), "--out", str(self.out),
                "--", *self.args]


def _by_file(stats: Any, per: float) -> list[dict[str, Any]]:
    """Own time summed per source file (package/module), in us per ``per`` unit."""
    acc: dict[str, float] = {}
    for (fn, _line, func), (_cc, _nc, tt, _ct, _) in stats.stats.items():
        if fn == "~":
            key = "builtins: " + func.split(" of ")[0].replace("<method '", "").replace("<built-in method ", "")
        else:
            parts = Path(fn).parts
            key = "/".join(parts[-2:]) if len(parts) >= 2 else fn
        acc[key] = acc.get(key, 0.0) + tt
    return [{"file": k, "own_us_per_job": round(v / per * 1e6, 2)} for k, v in sorted(acc.items(), key=lambda x: -x[1])]


def w3_profile(jobs: int = 20_000, concurrency: int = 64, top: int = 30) -> dict[str, Any]:
    """Where a W3 drain's time goes, old and new (``python -m bench.transport_compare w3-profile``):
    Redis time per script from SLOWLOG (every command logged: slowlog-log-slower-than 0; commands
    run inside a script are logged too and included in its EVALSHA time) and the worker under
    cProfile timed by process CPU time (own CPU time per job by file and by function). Both sides
    pay the same profiling overhead; absolute figures are inflated, compare old with new."""
    import pstats

    with trees() as (old_root, new_root, digest):
        out: dict[str, Any] = {"jobs": jobs, "concurrency": concurrency, "new_code_digest": digest}
        sides = {"old": Side("old", old_root), "new": Side("new", new_root)}
        for s in sides.values():
            s.shas = s.child("info")["shas"]
        for name, side in sides.items():
            by_sha = {sha: n for n, sha in side.shas.items()}  # type: ignore[union-attr]
            with SideStack(side) as st:
                st.start_schedulers(2)
                prof = st.tmp / "worker.prof"
                rec = st.tmp / "worker-0.txt"
                w = _ProfiledWorker(side, prof, ["worker", "bench.handlers:worker", "--redis", st.url,
                                                 "--namespace", NS],
                                    env={**side.env, "BENCH_RECORD": str(rec), "BENCH_CONCURRENCY": str(concurrency)})
                st.workers.append((w.start(), rec))
                time.sleep(2.0)
                st.r.config_set("slowlog-max-len", 1_000_000)
                st.r.config_set("slowlog-log-slower-than", 0)
                st.r.slowlog_reset()
                st.r.config_resetstat()
                res, ids = w3_drain_once(st, jobs, 0, reset_stats=False)
                st.r.config_set("slowlog-log-slower-than", 10_000)
                log = st.r.execute_command("SLOWLOG", "GET", "-1")
                cmdstats = st.r.info("commandstats")
                records = st.stop_workers()
            summary = records_summary(records, ids)
            scripts: dict[str, dict[str, float]] = {}
            for entry in log:
                args = entry[3]
                cmd = args[0].decode().lower() if args else "?"
                if cmd == "evalsha" and len(args) > 1:
                    cmd = "evalsha " + by_sha.get(args[1].decode(), args[1].decode()[:8])
                d = scripts.setdefault(cmd, {"calls": 0, "usec": 0})
                d["calls"] += 1
                d["usec"] += entry[2]
            st_ = pstats.Stats(str(prof))
            rows = []
            for (fn, line, func), (_cc, nc, tt, ct, _) in st_.stats.items():  # type: ignore[attr-defined]
                rows.append({"function": f"{Path(fn).name}:{line}({func})", "calls_per_job": round(nc / jobs, 3),
                             "own_us_per_job": round(tt / jobs * 1e6, 2), "cum_us_per_job": round(ct / jobs * 1e6, 2)})
            out[name] = {
                "jobs_per_s_profiled": round(res["jobs_per_s"]),
                "cpu_s_per_1000_jobs": {k: round(v, 4) for k, v in res["cpu_s_per_1000_jobs"].items()},
                "duplicates": summary["duplicates"], "missing": summary["missing"],
                "redis_by_command": {k: {"calls_per_1000_jobs": round(v["calls"] / jobs * 1000, 1),
                                         "usec_per_call": round(v["usec"] / v["calls"], 2),
                                         "usec_per_job": round(v["usec"] / jobs, 2)}
                                     for k, v in sorted(scripts.items(), key=lambda x: -x[1]["usec"])},
                "redis_evalsha_commandstats": cmdstats.get("cmdstat_evalsha"),
                "worker_profiled_us_per_job": round(st_.total_tt / jobs * 1e6, 2),  # type: ignore[attr-defined]
                "worker_by_file": _by_file(st_, jobs)[:top],
                "worker_top_own_time": sorted(rows, key=lambda x: -x["own_us_per_job"])[:top],
                "worker_top_cumulative": sorted(rows, key=lambda x: -x["cum_us_per_job"])[:top],
            }
            print(f"  w3-profile {name}: {res['jobs_per_s']:.0f} jobs/s", file=sys.stderr, flush=True)
    return out


def micro(n: int = 5000, reps: int = 3) -> dict[str, Any]:
    """Worker-side client CPU of one round trip, in this process (``python -m bench.transport_compare
    micro``): a flush-sized batch (an ``ack`` of 16 jobs + a ``claim`` of 16, the working tree's
    argument shapes) of a trivial script (``return 1``: Redis does nothing), sent ``n`` times by

    * ``old``: b19477a's ``Worker._exec`` (copied here): hiredis packs, one write on a dedicated
      connection made outside the pool;
    * ``new``: the working tree's ``AsyncScriptTransport.call_many`` as the worker calls it (pool
      checkout and release per round trip, redis.asyncio's packing);
    * ``new_hiredis_pack``: the same with redis.asyncio's ``pack_commands`` swapped for hiredis
      (an experiment: how much of the difference is packing).

    Best of ``reps`` runs each; process CPU µs per round trip and per job."""
    import asyncio
    import hashlib

    import redis.asyncio.connection as rac
    from hiredis import pack_command
    from redis.exceptions import ResponseError

    from scheduler.protocol.scripts import Script
    from scheduler.redisio.connection import async_redis
    from scheduler.redisio.transport import AsyncScriptTransport, RedisRetry

    src = "return 1"
    sha = hashlib.sha1(src.encode()).hexdigest()
    keys = [f"{{bench:3}}:{k}" for k in "t m j i l d e k x q g c meta f".split()]
    common: list[Any] = ["{bench:3}:", "bench:", 3]
    ack_args = common + [3_600_000] + [x for i in range(16) for x in (os.urandom(15), 1_700_000_000_000_000 + i)]
    calls = [("ack", keys, ack_args), ("claim", keys, common + ["bench", 16, "abcdef0123451f", 30_000, "abcdef01234"])]
    per_jobs = 16

    async def old_exec(conn: Any) -> list[Any]:  # b19477a workers/worker.py Worker._exec, NOSCRIPT path left out
        results: list[Any] = [None] * len(calls)
        data = b"".join([pack_command(("EVALSHA", sha, len(c[1]), *c[1], *c[2])) for c in calls])
        await conn.send_packed_command(data, check_health=False)
        for i in range(len(calls)):
            try:
                results[i] = await conn.read_response()
            except ResponseError as exc:
                results[i] = exc
        return results

    def hiredis_pack_commands(self: Any, cmds: Any) -> list[bytes]:
        return [b"".join([pack_command(tuple(c)) for c in cmds])]

    async def main(url: str) -> dict[str, Any]:
        r = async_redis(url, socket_timeout=10.0)
        await r.script_load(src)
        tr = AsyncScriptTransport(r, RedisRetry(budget=0.5, attempts=4))
        tr.scripts = {"ack": Script("ack", src, sha), "claim": Script("claim", src, sha)}
        conn = r.connection_pool.make_connection()
        await conn.connect()
        orig = rac.AbstractConnection.pack_commands
        best: dict[str, tuple[float, float]] = {}
        try:
            for _ in range(reps):
                for name in ("old", "new", "new_hiredis_pack"):
                    rac.AbstractConnection.pack_commands = (  # type: ignore[method-assign]
                        hiredis_pack_commands if name == "new_hiredis_pack" else orig)
                    cpu, wall = time.process_time(), time.perf_counter()
                    for _ in range(n):
                        if name == "old":
                            await old_exec(conn)
                        else:
                            await tr.call_many(calls, resend=False, raise_on_error=False)
                    res = ((time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6)
                    best[name] = min(best.get(name, res), res)
        finally:
            rac.AbstractConnection.pack_commands = orig  # type: ignore[method-assign]
            await conn.disconnect()
            await r.aclose()
        return {name: {"client_cpu_us_per_round_trip": round(c, 1), "client_cpu_us_per_job": round(c / per_jobs, 2),
                       "wall_us_per_round_trip": round(w, 1)} for name, (c, w) in best.items()}

    with redis_server() as srv:
        out = asyncio.run(main(srv.url))
    out["batch"] = "ack of 16 jobs + claim of 16, one round trip"
    return out


if __name__ == "__main__":
    import argparse

    from bench.common import emit

    ap = argparse.ArgumentParser(prog="python -m bench.transport_compare")
    ap.add_argument("what", nargs="?", default="run", choices=("run", "profile", "w3-profile", "micro"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the extracted old tree")
    ap.add_argument("--old", default=OLD_COMMIT, metavar="REV",
                    help=f"the commit to compare the working tree with (default {OLD_COMMIT})")
    ap.add_argument("-n", type=int, default=20_000, help="profile: calls to profile; w3-profile: jobs")
    ap.add_argument("--concurrency", type=int, default=64, help="w3-profile: worker concurrency")
    a = ap.parse_args()
    if a.what == "run":
        emit({"transport": run(a.quick, old_commit=a.old, keep=a.keep)})
    elif a.what == "profile":
        emit({"transport_profile": profile(a.n)})
    elif a.what == "micro":
        emit({"transport_micro": micro()})
    else:
        emit({"transport_w3_profile": w3_profile(a.n, a.concurrency)})
