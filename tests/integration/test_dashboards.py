"""The Grafana dashboards and alert rules in deploy/, checked against a real Prometheus (Debian
package ``prometheus``, installed by scripts/bootstrap) scraping a running ``zsched dev`` stack.

Grafana cannot be installed on these machines, so the dashboard files are checked structurally
(datasource uid = the provisioned one, unique panel ids, targets, variables, layout), and every
panel query of every dashboard is evaluated through Prometheus's HTTP API: each must parse, return
at least one series, and name only metrics Prometheus actually scraped from zsched. The alert rules
are loaded into the same Prometheus and must evaluate without error; the expression of
``ZschedReadyJobsWithoutWorker`` must name a queue given ready jobs that no worker serves, and none
of the queues the stack's workers serve.

Processes: the ``zsched dev`` stack (stopped by its PID with SIGTERM; it stops its own children)
and Prometheus (stopped by its PID). Nothing else is signalled.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduler import Client
from scheduler.client import outbox
from scheduler.shell.servers import ZschedProc, die_with_parent, free_port
from scheduler.shell.servers.postgres import PostgresServer
from tests.integration.test_compose import load_yaml
from tests.support.waits import wait_until

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROM_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"

# Grafana's built-in interval variables, replaced by fixed windows (scrape interval here: 1 s).
BUILTINS = {"__rate_interval": "15s", "__interval": "15s", "__range": "1m", "__range_s": "60",
            "__interval_ms": "15000"}
JOBS = {"scheduler": "zsched-scheduler", "worker": "zsched-worker"}  # job names of deploy/prometheus/prometheus.yml
RELAY_JOB = "zsched-relay"  # the outbox relays' job (no relay in the dev stack: the relay fixture runs one)
SETTLE_TIMEOUT_S = 45.0  # after every target is up: time for every query to return data


# --------------------------------------------------------------------------- dashboard files


def provisioned_uid() -> str:
    sources = load_yaml(DATASOURCES)["datasources"]
    assert len(sources) == 1 and sources[0]["type"] == "prometheus" and sources[0].get("uid"), sources
    return str(sources[0]["uid"])


def load_dashboard(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def all_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in board.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))  # panels inside collapsed rows
    return out


def variables(board: dict[str, Any]) -> list[dict[str, Any]]:
    return board.get("templating", {}).get("list", [])


def variable_query(var: dict[str, Any]) -> str:
    q = var.get("query")
    return str(q.get("query", "") if isinstance(q, dict) else q or var.get("definition", ""))


LABEL_VALUES = re.compile(r"^\s*label_values\(\s*([a-zA-Z_:][\w:]*(?:\{[^}]*\})?)\s*,\s*([a-zA-Z_]\w*)\s*\)\s*$")
VAR_REF = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")


def substitute(expr: str, values: dict[str, str]) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name in values:
            return values[name]
        if name in BUILTINS:
            return BUILTINS[name]
        raise KeyError(name)
    return VAR_REF.sub(repl, expr)


def panel_queries() -> list[tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """(dashboard file name, dashboard, panel, target) for every target of every panel."""
    out = []
    for path in DASHBOARDS:
        board = load_dashboard(path)
        for panel in all_panels(board):
            for target in panel.get("targets", []):
                out.append((path.name, board, panel, target))
    return out


# PromQL words that are not metric names (identifiers followed by "(" are functions; aggregations
# may be followed by "by (...)" first).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
            "unless", "atan2", "inf", "nan", "start", "end",
            "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
            "quantile", "limitk", "limit_ratio"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (strings, label matchers, ranges and label lists
    removed first)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][\w:]*)\s*(\()?", s):
        word, call = m.group(1), m.group(2)
        if not call and word.lower() not in KEYWORDS:
            names.add(word)
    return names


def test_metric_name_extraction() -> None:
    e = ('sum by (queue, le) (rate(zsched_x_bucket{queue=~"$queue"}[5m])) / on (instance) group_left (replica) '
         'group by (instance, replica) (zsched_y) > bool 0.5 and up{job="a"} offset 1m')
    assert metric_names(e) == {"zsched_x_bucket", "zsched_y", "up"}
    assert metric_names("histogram_quantile(0.99, sum by (le) (rate(a_bucket[1m]))) > 1e3") == {"a_bucket"}


def datasource_problems(node: Any, where: str, name: str, uid: str) -> list[str]:
    """Every datasource reference below ``node`` that is not the provisioned Prometheus (or
    Grafana's built-in annotations)."""
    out: list[str] = []
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "datasource":
                ok = isinstance(v, dict) and (v.get("uid") == uid and v.get("type") == "prometheus"
                                              or v.get("uid") == "-- Grafana --")
                if not ok:
                    out.append(f"{name}: {where}: datasource {v!r} is not {{type: prometheus, uid: {uid}}}")
            else:
                out += datasource_problems(v, f"{where}.{k}", name, uid)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += datasource_problems(v, f"{where}[{i}]", name, uid)
    return out


def target_problems(title: str, targets: list[dict[str, Any]], defined: set[str]) -> list[str]:
    """A panel's targets: unique refIds, an expression each, only defined variables."""
    out: list[str] = []
    refs = [t.get("refId") for t in targets]
    if len(set(refs)) != len(refs) or None in refs:
        out.append(f"{title}: refIds not unique: {refs}")
    for t in targets:
        if not str(t.get("expr", "")).strip():
            out.append(f"{title}: target {t.get('refId')} has no expr")
        for m in VAR_REF.finditer(str(t.get("expr", ""))):
            v = m.group(1) or m.group(2) or m.group(3)
            if v not in defined and v not in BUILTINS:
                out.append(f"{title}: uses undefined variable ${v}")
    return out


def overlaps(g: dict[str, int], o: dict[str, int]) -> bool:
    """Whether two grid positions share a cell."""
    return (g["x"] < o["x"] + o["w"] and o["x"] < g["x"] + g["w"]
            and g["y"] < o["y"] + o["h"] and o["y"] < g["y"] + g["h"])


def panel_problems(name: str, board: dict[str, Any], uid: str) -> list[str]:
    """The panels of one dashboard: unique integer ids, no rows, targets naming the datasource,
    a valid grid position that overlaps no other panel."""
    out: list[str] = []
    panels = all_panels(board)
    if not panels:
        out.append(f"{name}: no panels")
    ids = [p.get("id") for p in panels]
    dupes = sorted({i for i in ids if ids.count(i) > 1 or not isinstance(i, int)}, key=str)
    if dupes:
        out.append(f"{name}: panel ids not unique integers: {dupes}")
    defined = {v["name"] for v in variables(board)}
    placed: list[tuple[str, dict[str, int]]] = []
    for p in panels:
        title = f"{name}: panel {p.get('id')} {p.get('title')!r}"
        if p.get("type") == "row":
            out.append(f"{title}: rows carry no query; this repo's dashboards use none")
            continue
        targets = p.get("targets") or []
        if not targets:
            out.append(f"{title}: no targets")
        if p.get("datasource") is None or any(t.get("datasource") is None for t in targets):
            out.append(f"{title}: panel and targets must name the datasource (uid {uid})")
        out += target_problems(title, targets, defined)
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in ("x", "y", "w", "h")) or g["x"] + g["w"] > 24:
            out.append(f"{title}: bad gridPos {g}")
            continue
        out += [f"{title}: overlaps {other}" for other, o in placed if overlaps(g, o)]
        placed.append((f"panel {p.get('id')}", g))
    return out


def variable_problems(name: str, board: dict[str, Any], uid: str) -> list[str]:
    """The query variables of one dashboard: they name the datasource and are label_values()."""
    out: list[str] = []
    for v in variables(board):
        if v.get("type") == "query" and v.get("datasource") is None:
            out.append(f"{name}: variable {v.get('name')} must name the datasource (uid {uid})")
        if v.get("type") == "query" and not LABEL_VALUES.match(variable_query(v)):
            out.append(f"{name}: variable {v.get('name')}: expected label_values(metric, label), "
                       f"got {variable_query(v)!r}")
    return out


def test_dashboard_files_are_well_formed() -> None:
    uid = provisioned_uid()
    assert [p.name for p in DASHBOARDS] == ["zsched-overview.json", "zsched-scheduler.json", "zsched-workers.json"]
    problems: list[str] = []
    uids = set()
    for path in DASHBOARDS:
        board = load_dashboard(path)
        name = path.name
        if board.get("uid") in uids or not board.get("uid") or not board.get("title"):
            problems.append(f"{name}: missing or duplicate dashboard uid/title")
        uids.add(board.get("uid"))
        if "__inputs" in board or "${DS_" in path.read_text():
            problems.append(f"{name}: export-for-sharing placeholders (__inputs/${{DS_...}}) do not provision")
        problems += datasource_problems(board, "$", name, uid)
        problems += panel_problems(name, board, uid)
        problems += variable_problems(name, board, uid)
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- live stack + Prometheus


def _proc_start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _children(pid: int) -> dict[int, str]:
    """Direct children of ``pid`` with their start times (to tell them from a reused pid later)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(rest[1]) == pid:
            out[int(entry)] = rest[19]
    return out


@dataclass
class DevStack:
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    children: dict[int, str] = field(default_factory=dict)
    targets: dict[str, str] = field(default_factory=dict)  # name -> host:port
    env: dict[str, str] = field(default_factory=dict)  # ZSCHED_REDIS_URL, ... from its "stack up:" line

    def output(self) -> str:
        return "".join(self.lines[-80:])


@pytest.fixture(scope="module")
def dev_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevStack]:
    """``zsched dev`` (redis, etcd, 3 replicas, 2 demo workers, demo producer), stopped at the end.
    --duration is a safety net: the stack stops by itself even if this process dies."""
    home = tmp_path_factory.mktemp("dashstack")
    proc = subprocess.Popen([sys.executable, "-m", "scheduler", "dev", "--plain", "--home", str(home / "zs"),
                             "--namespace", "dashtest", "--duration", "150"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=home)
    stack = DevStack(proc)
    got_metrics = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            stack.lines.append(line)
            if line.startswith("stack up: export "):
                stack.env = dict(item.split("=", 1) for item in line.split()[3:])
            if line.startswith("metrics: "):
                stack.targets = dict(item.split("=", 1) for item in line.split()[1:])
                got_metrics.set()
    reader = threading.Thread(target=pump, daemon=True, name="dev-stack-output")
    reader.start()
    try:
        if not got_metrics.wait(60):
            pytest.fail(f"zsched dev printed no 'metrics:' line:\n{stack.output()}")
        stack.children = _children(proc.pid)
        yield stack
    finally:
        if proc.poll() is None:
            stack.children.update(_children(proc.pid))
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        # children of a stack that could not stop them: by pid, only if it is still the same process
        for pid, started in stack.children.items():
            if _proc_start_time(pid) == started:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        reader.join(5)


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path
    up_at: float = 0.0  # monotonic time every target was first scraped

    def time_left(self, seconds: float) -> float:
        """How long to wait for data: until ``seconds`` after the targets came up."""
        return max(0.0, self.up_at + seconds - time.monotonic())

    def get(self, path: str, **params: str | list[str]) -> Any:
        q = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as exc:  # 400/422: bad query, the body says why
            return json.loads(exc.read() or b"{}") or {"status": "error", "error": str(exc)}

    def query(self, expr: str) -> Any:
        return self.get("/api/v1/query", query=expr)

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


@pytest.fixture(scope="module")
def relay(dev_stack: DevStack, pg_server: PostgresServer) -> Iterator[ZschedProc]:
    """A ``zsched relay`` on the dev stack's namespace with an outbox in a database of its own, a
    few rows moved (so the outbox panels and alert have series), serving /metrics."""
    import psycopg
    db = f"relay{os.getpid()}"
    with psycopg.connect(pg_server.conninfo, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.execute(f"CREATE DATABASE {db}")
    dsn = f"host=127.0.0.1 port={pg_server.port} user=postgres dbname={db}"
    ns = dev_stack.env.get("ZSCHED_NAMESPACE", "zsched")
    with psycopg.connect(dsn) as conn:
        conn.execute(outbox.ddl())
        with conn.transaction():
            for n in range(3):
                outbox.schedule(conn, timedelta(hours=1), {"n": n}, namespace=ns, queue="outboxed")
    proc = ZschedProc(["relay", "--postgres", dsn, "--redis", dev_stack.env["ZSCHED_REDIS_URL"],
                       "--namespace", ns, "--poll", "1s"]).start()
    try:
        wait_until(lambda: proc.try_metric("zsched_outbox_rows_moved_total") == 3, 60, 0.1, proc.tail)
        yield proc
    finally:
        proc.stop()
        with psycopg.connect(pg_server.conninfo, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


@pytest.fixture(scope="module")
def prometheus(dev_stack: DevStack, relay: ZschedProc,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    exe = shutil.which("prometheus")
    assert exe, ("prometheus not found: it comes from the Debian package 'prometheus' (scripts/bootstrap "
                 "installs it; or: sudo apt-get install prometheus)")
    deploy_jobs = {sc["job_name"] for sc in load_yaml(PROM_CONFIG)["scrape_configs"]}
    assert {*JOBS.values(), RELAY_JOB} <= deploy_jobs, f"deploy/prometheus/prometheus.yml jobs {deploy_jobs}"
    d = tmp_path_factory.mktemp("prometheus")
    scrape = []
    for kind, job in JOBS.items():
        targets = sorted(addr for name, addr in dev_stack.targets.items() if name.startswith(kind))
        assert targets, f"no {kind} metrics endpoint in: {dev_stack.targets}"
        scrape.append({"job_name": job, "static_configs": [{"targets": targets}]})
    scrape.append({"job_name": RELAY_JOB, "static_configs": [{"targets": [f"127.0.0.1:{relay.metrics_port}"]}]})
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
              "rule_files": [str(ALERTS)], "scrape_configs": scrape}
    (d / "prometheus.yml").write_text(json.dumps(config, indent=2))  # JSON is YAML
    port = free_port()
    log = d / "prometheus.log"
    with open(log, "wb") as fh:
        # Prometheus dies with this test process, whatever happens to it. Not through preexec_fn:
        # Python code between fork and exec in a process with threads (gRPC's, of the etcd client)
        # once aborted the child before the exec ("epoll_wait error: Bad file descriptor", SIGABRT).
        argv = [exe, f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h", "--log.level=warn"]
        proc = subprocess.Popen(die_with_parent(argv, signal.SIGTERM), stdout=fh, stderr=subprocess.STDOUT, cwd=d)
    prom = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, f"prometheus exited:\n{prom.log_tail()}"
            assert time.monotonic() < deadline, f"prometheus not ready:\n{prom.log_tail()}"
            time.sleep(0.2)
        # every target scraped successfully
        down: list[Any] = []

        def targets_up() -> bool:
            active = prom.get("/api/v1/targets")["data"]["activeTargets"]
            down[:] = [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in active if t["health"] != "up"]
            return bool(active) and not down

        wait_until(targets_up, 30, 0.2, what=lambda: f"every target to be up: {down}\n{dev_stack.output()}")
        prom.up_at = time.monotonic()
        yield prom
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def label_values(prom: Prometheus, query: str) -> list[str]:
    m = LABEL_VALUES.match(query)
    assert m, query
    res = prom.get(f"/api/v1/label/{m.group(2)}/values", **{"match[]": m.group(1)})
    assert res.get("status") == "success", res
    return sorted(res["data"])


def variable_sets(prom: Prometheus, board: dict[str, Any]) -> list[dict[str, str]]:
    """The values each panel query is evaluated with: every variable at 'All' (its allValue), then
    every variable at its first real value."""
    all_, first = {}, {}
    for v in variables(board):
        values = label_values(prom, variable_query(v))
        all_[v["name"]] = v.get("allValue") or "|".join(map(re.escape, values))
        first[v["name"]] = values[0] if values else "__no_value__"
    return [all_, first]


def _known_metrics(prom: Prometheus) -> set[str]:
    return set(prom.get("/api/v1/label/__name__/values")["data"])


def _evaluate_all(prom: Prometheus) -> list[str]:
    """Every panel query with every variable set: the problems found (empty = all good)."""
    problems = []
    sets_by_board: dict[str, list[dict[str, str]]] = {}
    for fname, board, panel, target in panel_queries():
        if fname not in sets_by_board:
            sets_by_board[fname] = variable_sets(prom, board)
        for values in sets_by_board[fname]:
            expr = substitute(target["expr"], values)
            res = prom.query(expr)
            where = f"{fname} panel {panel['id']} {panel['title']!r} {target['refId']} [{values}]"
            if res.get("status") != "success":
                problems.append(f"{where}: {res.get('errorType')}: {res.get('error')}\n    {expr}")
            elif not res["data"]["result"]:
                problems.append(f"{where}: no series\n    {expr}")
    return problems


def test_every_panel_query_returns_data(prometheus: Prometheus, dev_stack: DevStack) -> None:
    """Retried until every query returns series (rates need two scrapes, histograms their first
    observations), at most SETTLE_TIMEOUT_S; then the remaining problems fail the test."""
    problems: list[str] = []

    def all_answer() -> bool:
        problems[:] = _evaluate_all(prometheus)
        return not problems

    wait_until(all_answer, prometheus.time_left(SETTLE_TIMEOUT_S), 1, what=lambda: (
        f"every panel query to return data: {len(problems)} failed or returned nothing:\n" + "\n".join(problems)))


def test_variables_resolve(prometheus: Prometheus) -> None:
    problems: list[str] = []

    def resolved() -> bool:
        problems[:] = [f"{path.name}: ${v['name']} = {variable_query(v)} has no values"
                       for path in DASHBOARDS for v in variables(load_dashboard(path))
                       if not label_values(prometheus, variable_query(v))]
        return not problems

    wait_until(resolved, prometheus.time_left(20), 0.5,
               what=lambda: "every variable to resolve:\n" + "\n".join(problems))


def test_queries_and_alerts_name_only_exported_metrics(prometheus: Prometheus) -> None:
    """A dashboard or alert naming a metric zsched does not export must fail, even inside an
    expression that would still return data (``a or b``)."""
    used: dict[str, set[str]] = {}
    for fname, _, panel, target in panel_queries():
        for n in metric_names(target["expr"]):
            used.setdefault(n, set()).add(f"{fname} panel {panel['id']} {panel['title']!r}")
    for group in load_yaml(ALERTS)["groups"]:
        for rule in group["rules"]:
            for n in metric_names(str(rule["expr"])):
                used.setdefault(n, set()).add(f"alerts.yml {rule.get('alert') or rule.get('record')}")
    unknown: dict[str, list[str]] = {}

    def all_exported() -> bool:
        known = _known_metrics(prometheus)
        unknown.clear()
        unknown.update({n: sorted(w) for n, w in used.items() if n not in known})
        return not unknown

    wait_until(all_exported, prometheus.time_left(20), 0.5, what=lambda: (
        "every metric named to be exported; not exported by the running stack:\n"
        + "\n".join(f"  {n}: {', '.join(w)}" for n, w in sorted(unknown.items()))))


def test_alert_rules_evaluate(prometheus: Prometheus) -> None:
    expected = {r["alert"] for g in load_yaml(ALERTS)["groups"] for r in g["rules"] if "alert" in r}
    rules: dict[str, Any] = {}

    def evaluated() -> bool:
        rules.clear()
        rules.update({r["name"]: r for g in prometheus.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]})
        return set(rules) >= expected and not any(r.get("health") == "unknown" for r in rules.values())

    wait_until(evaluated, 15, 0.2,
               what=lambda: f"every rule to be loaded and evaluated: missing {expected - set(rules)}")
    bad = {n: (r.get("health"), r.get("lastError")) for n, r in rules.items() if r.get("health") != "ok"}
    assert not bad, f"alert rules that do not evaluate: {bad}"


def test_promtool_accepts_the_deploy_config_and_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: it comes with the Debian package 'prometheus'"
    for args in (["check", "config", str(PROM_CONFIG)], ["check", "rules", str(ALERTS)]):
        out = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}\n{out.stderr}"


def test_the_no_worker_alert_names_a_queue_with_ready_jobs_and_no_live_worker(
        prometheus: Prometheus, dev_stack: DevStack) -> None:
    """ZschedReadyJobsWithoutWorker's expression (its ``for:`` aside) against the running stack:
    jobs made ready in a queue no worker serves show up in it; the demo queues, which the stack's
    two workers serve (the registry says so), never do."""
    rule = next(r for g in load_yaml(ALERTS)["groups"] for r in g["rules"]
                if r.get("alert") == "ZschedReadyJobsWithoutWorker")

    def by_queue(expr: str) -> dict[str, float]:
        res = prometheus.query(expr)
        assert res.get("status") == "success", res
        return {v["metric"]["queue"]: float(v["value"][1]) for v in res["data"]["result"]}

    def both_workers(served: dict[str, float]) -> bool:  # zsched dev runs 2 demo workers: both registered
        return bool(served) and all(n == 2 for n in served.values())

    served: dict[str, float] = {}

    def registered() -> bool:
        served.clear()
        served.update(by_queue("max by (queue) (zsched_workers)"))
        return both_workers(served)

    wait_until(registered, prometheus.time_left(30), 0.5, what=lambda: f"both demo workers in zsched_workers: {served}")
    client = Client.from_url(dev_stack.env["ZSCHED_REDIS_URL"], namespace=dev_stack.env["ZSCHED_NAMESPACE"]).connect()
    try:
        # due now: ready at once
        client.schedule_many([(timedelta(0), {"n": i}) for i in range(3)], queue="zz-unserved")
    finally:
        client.close()
    # all 3 once every replica owning one of their partitions has refreshed its depths (every 2 s)
    firing: dict[str, float] = {}

    def fires() -> bool:
        firing.clear()
        firing.update(by_queue(str(rule["expr"])))
        return firing.get("zz-unserved") == 3

    wait_until(fires, 30, 0.5, what=lambda: f"the alert to name zz-unserved with 3 ready jobs: {firing}")
    assert not set(firing) & set(served), firing
