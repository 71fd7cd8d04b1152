"""The shell examples of docs/operations.md, docs/cron.md and docs/workers.md match the program.

The operations.md "Examples" block runs under ``bash -e`` against a real redis-server and etcd
(on loopback instead of the example addresses); the ``zsched worker`` example of workers.md parses;
cron.md's synopsis names every option of ``cron add``. The README's snippets have their own test.
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


def test_the_worker_example_of_the_docs_parses() -> None:
    block = next(b for b in shell_blocks("docs/workers.md") if "zsched worker" in b)
    args = build_parser().parse_args(shlex.split(block.replace("\\\n", " "))[1:])
    assert args.app == "myapp.tasks:worker" and args.concurrency == 32 and args.metrics_port == 9108


def test_the_cron_synopsis_names_every_option_of_cron_add() -> None:
    synopsis = re.search(r"`(zsched cron add [^`]*)`", (ROOT / "docs/cron.md").read_text()).group(1)
    documented = set(re.findall(r"--[a-z-]+", synopsis))
    cron_add = build_parser()._subparsers._group_actions[0].choices["cron"]  # type: ignore[union-attr]
    add = cron_add._subparsers._group_actions[0].choices["add"]  # type: ignore[union-attr]
    options = {o for a in add._actions for o in a.option_strings if o.startswith("--")}
    shared = {"--help", "--redis", "--namespace", "--json"}  # the common options, documented once
    assert documented == options - shared, synopsis


def test_the_operations_examples_run(redis_url: str, etcd_endpoint: str, tmp_path: Path) -> None:
    block = next(b for b in shell_blocks("docs/operations.md") if "export ZSCHED_REDIS_URL" in b)
    script = (block.replace("redis://127.0.0.1:6379/0", redis_url)
              .replace("ZSCHED_NAMESPACE=zsched", "ZSCHED_NAMESPACE=docs-examples")
              .replace("10.0.0.5:2379", etcd_endpoint))
    assert "10.0.0." not in script and "6379" not in script.replace(redis_url, ""), "only loopback servers"
    (tmp_path / "report.json").write_text('{"month": "2026-12"}')
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    out = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PATH": path}, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "zsched: error" not in out.stderr, out.stderr
    assert re.search(r"^QUEUE", out.stdout, re.M), out.stdout


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
    assert "redis://127.0.0.1:6379/0" in module
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "tasks.py").write_text(module.replace("redis://127.0.0.1:6379/0", redis_url))
    block = next(b for b in shell_blocks("docs/workers.md") if "zsched worker" in b)
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
                                                env=_zsched_env(tmp_path)), log)
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
