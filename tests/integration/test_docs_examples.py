"""The shell examples of docs/operations.md, docs/cron.md and docs/workers.md match the program.

The operations.md "Examples" block runs under ``bash -e`` as written against a real ``zsched dev``;
every other shell block of the docs is run or listed with why it is not (production set-ups); the
``zsched worker`` example of workers.md parses; cron.md's synopsis names every option of ``cron add``.
The README's snippets have their own test.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from scheduler import Client
from scheduler.shell.cli import build_parser
from scheduler.shell.servers import free_port
from tests.support.waits import wait_until

ROOT = Path(__file__).resolve().parents[2]


def shell_blocks(doc: str) -> list[str]:
    """The fenced blocks of ``doc`` marked ``sh`` or not marked at all."""
    blocks, current, kind = [], [], None
    for line in (ROOT / doc).read_text().splitlines():
        if line.startswith("```"):
            if kind is None:
                kind = line[3:].strip()
                current = []
            else:
                if kind in ("", "sh", "bash"):
                    blocks.append("\n".join(current))
                kind = None
        elif kind is not None:
            current.append(line)
    return blocks


def commands(block: str) -> str:
    """``block`` without its comment lines."""
    return "\n".join(line for line in block.splitlines() if not line.startswith("#"))


def test_the_worker_example_of_the_docs_parses() -> None:
    block = commands(next(b for b in shell_blocks("docs/workers.md") if "zsched worker" in b))
    args = build_parser().parse_args(shlex.split(block.replace("\\\n", " "))[1:])
    assert args.app == "myapp.tasks:worker" and args.concurrency == 32 and args.metrics_port == 9108


def test_the_cron_synopsis_names_every_option_of_cron_add() -> None:
    synopsis = re.search(r"`(zsched cron add [^`]*)`", (ROOT / "docs/cron.md").read_text()).group(1)
    documented = set(re.findall(r"--[a-z-]+", synopsis))
    cron_add = build_parser()._subparsers._group_actions[0].choices["cron"]  # type: ignore[union-attr]
    add = cron_add._subparsers._group_actions[0].choices["add"]  # type: ignore[union-attr]
    options = {o for a in add._actions for o in a.option_strings if o.startswith("--")}
    # the common options, documented once
    shared = {"--help", "--redis", "--namespace", "--json", "--log-level", "--debug"}
    assert documented == options - shared, synopsis


def test_the_operations_examples_run_as_written_against_zsched_dev(tmp_path: Path) -> None:
    """docs/operations.md's "Examples" block under ``bash -e`` against a real ``zsched dev`` (what
    ``./scripts/dev`` runs): the block's ``export`` line is replaced by the one ``zsched dev`` printed,
    as the block tells the reader to do (its ports differ when 16379 or 12379 are taken); nothing else
    is changed: no file prepared, no address rewritten."""
    block = next(b for b in shell_blocks("docs/operations.md") if "export ZSCHED_REDIS_URL" in b)
    written = re.search(r"^export ZSCHED_REDIS_URL=.*$", block, re.M).group(0)
    assert written == ("export ZSCHED_REDIS_URL=redis://127.0.0.1:16379/0 ZSCHED_ETCD_ENDPOINTS=127.0.0.1:12379 "
                       "ZSCHED_NAMESPACE=zsched"), "the example's export line is no longer the one zsched dev prints"
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZSCHED_")} | {"PATH": path}
    dev = subprocess.Popen([sys.executable, "-m", "scheduler", "dev", "--no-demo", "--replicas", "1", "--workers", "0",
                            "--home", str(tmp_path / "zs")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, cwd=tmp_path, env=env)
    try:
        assert dev.stdout is not None
        printed = ""
        while not printed.startswith("stack up: export "):
            line = dev.stdout.readline()
            assert line, f"zsched dev exited {dev.wait()} before its export line"
            printed = line.strip()
        exported = printed.removeprefix("stack up: ")
        script = block.replace(written, exported)
        assert "10.0.0." not in script and "6379/" not in script.replace(exported, ""), "only the dev stack's servers"
        work = tmp_path / "work"
        work.mkdir()
        out = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], capture_output=True, text=True,
                             cwd=work, env=env, timeout=120)
    finally:
        dev.send_signal(signal.SIGINT)
        rest, _ = dev.communicate(timeout=60)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "zsched: error" not in out.stderr, out.stderr
    assert "in the past" not in out.stderr and "did not answer" not in out.stderr, out.stderr  # etcd answered
    assert re.search(r"^QUEUE", out.stdout, re.M) and re.search(r"scheduler-1", out.stdout), out.stdout
    assert dev.returncode == 0 and "no process left behind" in rest, rest[-2000:]


# Every shell block of the docs is run above or against the test servers below, or is here with why it is not:
# production set-ups (they say so in the block, and name addresses that are not this machine's) and
# what is not a command.
NOT_RUN = {
    ("docs/operations.md", "namespace zsched: 2 live worker(s)"): "sample output of zsched workers",
    ("docs/operations.md", "ZSCHED_UI_TOKEN=... zsched ui"): "production set-up: the console behind a TLS proxy",
    ("docs/operations.md", "console.example.com {"): "production set-up: a Caddyfile",
    ("docs/operations.md", "docker compose up --build"): "tests/integration/test_compose.py checks the compose file",
    ("docs/scaling.md", "zsched migrate-partitions --redis redis+cluster://10.0.0.5"): "production set-up: a Cluster",
    ("docs/scaling.md", "redis-cli -p 7000 CLUSTER KEYSLOT"): "production set-up: a Cluster",
    ("docs/workers.md", "zsched worker myapp.tasks:worker --redis redis://10.0.0.5"):
        "production set-up; parsed and run against a loopback Redis below",
    ("docs/architecture.md", "             schedule (due later)"): "a diagram",
    ("docs/tracing.md", "OTEL_SERVICE_NAME=zsched-scheduler"):
        "production set-up: an OpenTelemetry collector; tests/integration/test_tracing.py runs the firing spans",
    ("docs/effects.md", "zsched relay --postgres URL"): "a synopsis; tests/integration/test_outbox.py runs relays",
    ("docs/operations.md", "kubectl create namespace zsched"):
        "production set-up: Kubernetes (tests/unit/test_kubernetes_manifests.py validates the manifests)",
    ("docs/operations.md", "kubectl -n zsched port-forward"):
        "production set-up: Kubernetes (tests/unit/test_kubernetes_manifests.py validates the manifests)",
    ("README.md", "./scripts/dev"): "the quick start itself",
    ("README.md", "./scripts/test"): "the quick start itself",
    ("README.md", "pip install -e"): "test_readme_snippets.py checks the install lines",
    ("README.md", "pip install 'zsched["): "test_readme_snippets.py checks the install lines",
}


def test_every_shell_block_of_the_docs_runs_or_says_why_not() -> None:
    docs = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
    left = []
    for doc in docs:
        for block in shell_blocks(doc):
            if "export ZSCHED_REDIS_URL" in block:
                continue  # run against zsched dev above
            why = [w for (d, start), w in NOT_RUN.items() if d == doc and start in block]
            if not why:
                left.append(f"{doc}: {block[:80]!r}")
            elif why[0].startswith("production") and "10.0.0." in block + why[0]:
                assert "production" in block, f"{doc}: a production example must say so: {block[:80]!r}"
    assert not left, "shell blocks neither run nor listed in NOT_RUN:\n" + "\n".join(left)


def python_blocks(doc: str) -> list[str]:
    """The fenced ``python`` blocks of ``doc``."""
    text = (ROOT / doc).read_text()
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def _zsched_env(tmp_path: Path) -> dict[str, str]:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    return {**os.environ, "PATH": path, "PYTHONPATH": str(tmp_path), "PYTHONUNBUFFERED": "1"}


def _logged_or_ended(proc: subprocess.Popen[bytes], log: Path, pattern: str) -> Callable[[], bool]:
    return lambda: re.search(pattern, log.read_text()) is not None or proc.poll() is not None


def test_the_worker_examples_of_the_docs_start_and_stop_on_sigterm(redis_url: str, tmp_path: Path) -> None:
    """docs/workers.md: the module (run with ``python -m``, so ``worker.run()``) and the ``zsched
    worker`` command line, against a real Redis; both log that they serve and stop on SIGTERM."""
    module = next(b for b in python_blocks("docs/workers.md") if "worker.run()" in b)
    assert 'os.environ.get("ZSCHED_REDIS_URL"' in module, "the example runs as written against ./scripts/dev"
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "tasks.py").write_text(module)
    block = commands(next(b for b in shell_blocks("docs/workers.md") if "zsched worker" in b))
    cli = shlex.split(block.replace("\\\n", " ").replace("redis://10.0.0.5:6379/0", redis_url)
                      .replace("9108", str(free_port())))
    assert "10.0.0." not in " ".join(cli), "only loopback servers"
    # the line the doc says a worker logs once it serves
    serving = re.search(r"`(INFO zsched\.worker: worker serving namespace[^`]*)`", (ROOT / "docs/workers.md")
                        .read_text().replace("\n", " ")).group(1)
    # the values differ per run (queues, partitions, concurrency): the form must be the doc's
    pattern = re.sub(r"'zsched'|emails|\d+", lambda m: {"'zsched'": "'zsched'", "emails": r"[\w,]+"}.get(
        m.group(0), r"\d+"), re.escape(serving))
    runs = {"python -m myapp.tasks": [sys.executable, "-m", "myapp.tasks"],
            "zsched worker": [sys.executable, "-m", "scheduler", *cli[1:]]}
    procs = {}
    try:
        for name, argv in runs.items():
            log = tmp_path / f"{len(procs)}.log"
            with open(log, "w") as out:
                procs[name] = (subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
                                                env={**_zsched_env(tmp_path), "ZSCHED_REDIS_URL": redis_url}), log)
        for name, (proc, log) in procs.items():
            wait_until(_logged_or_ended(proc, log, pattern), 30, what=f"{name} to log {serving!r}")
            assert re.search(pattern, log.read_text()), f"{name}: no {serving!r} in:\n{log.read_text()[-2000:]}"
        for proc, _log in procs.values():
            proc.send_signal(signal.SIGTERM)
        for name, (proc, log) in procs.items():
            assert proc.wait(30) == 0, f"{name}:\n{log.read_text()[-2000:]}"
            text = log.read_text()
            assert "worker stopped" in text and "Traceback" not in text, f"{name}:\n{text[-2000:]}"
    finally:
        for proc, _log in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


CRON_VALUES = {"NAME": "digest", "EXPR": "'0 9 * * *'", "Q": "emails", "--payload": """'{"digest": true}'""",
               "--tz": "America/New_York", "--misfire": "skip", "--grace": "600", "--jitter": "60",
               "--max-attempts": "3"}


def test_the_cron_cli_examples_run(redis_url: str, tmp_path: Path) -> None:
    """docs/cron.md's CLI line with every option filled in, then ``cron list`` and ``cron remove``."""
    text = (ROOT / "docs/cron.md").read_text()
    add = re.search(r"`(zsched cron add [^`]*)`", text).group(1)
    add = re.sub(r"\[(--[a-z-]+) [^\]]+\]", lambda m: f"{m.group(1)} {CRON_VALUES[m.group(1)]}", add)
    add = re.sub(r"\b(NAME|EXPR|Q)\b", lambda m: CRON_VALUES[m.group(1)], add)
    rest = re.search(r"`(zsched cron list)`, `(zsched cron remove NAME)`", text)
    assert rest is not None, "cron.md no longer names cron list and cron remove"
    script = "\n".join([add, rest.group(1), rest.group(2).replace("NAME", CRON_VALUES["NAME"]),
                        rest.group(1) + " --json"])
    env = {**_zsched_env(tmp_path), "ZSCHED_REDIS_URL": redis_url, "ZSCHED_NAMESPACE": "docs-cron"}
    with Client.from_url(redis_url, namespace="docs-cron").connect() as c:
        c.schedule(time.time() + 3600, {}, queue="emails")  # the namespace exists
    out = subprocess.run(["bash", "-e", "-x", "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "zsched: error" not in out.stderr, out.stderr
    assert re.search(r"^digest\s+0 9 \* \* \*\s+America/New_York\s+emails\s+skip", out.stdout, re.M), out.stdout
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [], "cron remove did not remove it"
