"""``./scripts/dev`` installs zsched with its console alone (``scripts/bootstrap --stack``: the
runtime dependencies and the ``ui`` extra); ``./scripts/test`` the test, benchmark and PostgreSQL
extras too. So what the stack runs (``zsched dev``, ``scheduler``, ``worker``, ``ui``, the demo)
must import nothing that only those extras bring, and the scripts must ask for the right extras."""
from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
STACK_EXTRAS = ("ui",)
TEST_EXTRAS = ("test", "bench", "postgres", "ui")
# modules for applications with an extra of their own ('testing', 'postgres'), which no process of the stack loads
OPTIONAL = ("scheduler.testing", "workers.effects.postgres")

# imports every module the processes of `zsched dev` load, with the extras' modules refused
PROBE = """
import importlib.abc, sys
FORBIDDEN = set(sys.argv[1].split(","))
SKIP = tuple(sys.argv[2].split(","))
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in FORBIDDEN:
            raise ImportError(f"{name} comes only with the test/bench/postgres extras")
        return None
sys.meta_path.insert(0, Refuse())
from scheduler.shell.cli import build_parser
build_parser()
import importlib, pkgutil, scheduler, workers
for pkg in (scheduler, workers):
    for mod in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if not mod.name.startswith(SKIP) and not mod.name.endswith(".__main__"):
            importlib.import_module(mod.name)
import uvicorn
from scheduler.shell.cli_ui import missing_ui_packages
assert missing_ui_packages() == [], missing_ui_packages()
print("ok")
"""


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-").replace(".", "-")


def _distributions(*extras: str) -> set[str]:
    names = {_name(r) for r in PYPROJECT["dependencies"]}
    for extra in extras:
        names |= {_name(r) for r in PYPROJECT["optional-dependencies"][extra]}
    return names


def test_the_stack_imports_nothing_that_only_the_test_and_bench_extras_install() -> None:
    only_tests = _distributions(*TEST_EXTRAS) - _distributions(*STACK_EXTRAS)
    assert {"pytest", "psycopg", "playwright", "celery", "mypy"} <= only_tests
    modules = {m for m, dists in packages_distributions().items()
               if {_name(d) for d in dists} & only_tests and not m.startswith("_")}
    assert {"pytest", "psycopg", "yaml", "hypothesis"} <= modules  # the venv has them: the probe means something
    done = subprocess.run([sys.executable, "-c", PROBE, ",".join(sorted(modules)), ",".join(OPTIONAL)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_scripts_dev_installs_the_stack_profile_and_scripts_test_everything() -> None:
    bootstrap = (ROOT / "scripts/bootstrap").read_text()
    assert re.search(r"^if \[ \"\$PROFILE\" = stack \]; then EXTRAS=(\S+); else EXTRAS=(\S+); fi$", bootstrap, re.M)
    stack, full = re.search(r"then EXTRAS=(\S+); else EXTRAS=(\S+); fi", bootstrap).groups()
    assert tuple(stack.split(",")) == STACK_EXTRAS and tuple(full.split(",")) == TEST_EXTRAS
    assert "./scripts/bootstrap --stack\n" in (ROOT / "scripts/dev").read_text()
    assert re.search(r"^\./scripts/bootstrap$", (ROOT / "scripts/test").read_text(), re.M)
    assert "exec ./scripts/test\n" in (ROOT / ".ci/run").read_text()  # CI runs the README's test command
