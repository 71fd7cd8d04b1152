"""The path from the README to a user's own code works as written: README's Python snippets run
against a redis-server (the URL comes from ZSCHED_REDIS_URL, as ./scripts/dev exports it), the
testing guide's snippets run with the in-memory kit, and examples/ runs both ways."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def python_blocks(path: Path) -> list[str]:
    blocks = re.findall(r"^```python\n(.*?)^```", path.read_text("utf-8"), re.S | re.M)
    assert blocks, f"{path} has no python snippet"
    return blocks


def test_readme_snippets_run_in_order_against_a_redis_server(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZSCHED_REDIS_URL", redis_url)
    scope: dict[str, object] = {}
    for n, block in enumerate(python_blocks(ROOT / "README.md")):
        exec(compile(block, f"README.md python block {n + 1}", "exec"), scope)  # noqa: S102
    assert "job_id" in scope and "worker" in scope


def test_readme_snippet_defaults_to_the_dev_stack_url() -> None:
    from scheduler.protocol import config
    from scheduler.shell import dev

    first = python_blocks(ROOT / "README.md")[0]
    assert 'os.environ.get("ZSCHED_REDIS_URL", "redis://127.0.0.1:16379/0")' in first
    assert "pick_port(16379)" in Path(dev.__file__).read_text("utf-8"), "the dev stack's redis port moved"
    assert f'namespace="{config.DEFAULT_NAMESPACE}"' in first


@pytest.mark.parametrize("n", range(len(python_blocks(ROOT / "docs" / "testing.md"))))
def test_testing_guide_snippets_run_with_the_kit(n: int) -> None:
    block = python_blocks(ROOT / "docs" / "testing.md")[n]
    exec(compile(block, f"docs/testing.md python block {n + 1}", "exec"), {})  # noqa: S102


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_the_example_app_schedules_against_a_redis_server(redis_url: str) -> None:
    done = run("examples/reminders.py", env={"ZSCHED_REDIS_URL": redis_url})
    assert done.returncode == 0, done.stderr
    assert "state=<JobState.SCHEDULED" in done.stdout


def test_the_example_tests_pass_with_no_server() -> None:
    done = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "examples",
               env={"ZSCHED_TEST_REDIS_URL": "", "ZSCHED_TEST_POSTGRES_URL": ""})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed, 1 skipped" in done.stdout


def test_the_example_s_postgresql_test_passes_against_a_real_one(pg_dsn: str) -> None:
    done = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "examples", "-k", "exists_only_if",
               env={"ZSCHED_TEST_REDIS_URL": "", "ZSCHED_TEST_POSTGRES_URL": pg_dsn})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_every_install_line_of_the_readme_and_docs_works_before_zsched_is_on_an_index() -> None:
    """zsched is on no package index yet: ``pip install 'zsched[ui]'`` fails. Every ``pip install``
    of zsched the README, the docs and the program's own hints give is from a checkout (``-e PATH[...]``)
    or a built wheel (``zsched[...] @ file://...whl``), with extras that pyproject.toml declares."""
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    paths = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "scheduler").rglob("*.py"),
             *(ROOT / "workers").rglob("*.py")]
    texts = {p: p.read_text("utf-8") for p in paths}
    found = 0
    for path, text in texts.items():
        for line in re.findall(r"pip install [^`\n]*", text):
            if "zsched" not in line and ".[" not in line:
                continue  # another package (pip install 'fakeredis[lua]')
            found += 1
            m = (re.search(r"pip install -e '(?:\.|/path/to/zsched)\[([a-z,]+)\]'", line)
                 or re.search(r"pip install 'zsched\[([a-z,]+)\] @ file:///\S+\.whl'", line))
            assert m, f"{path.relative_to(ROOT)}: {line!r} installs from an index zsched is not on"
            assert set(m.group(1).split(",")) <= extras, f"{path.relative_to(ROOT)}: {line!r}: unknown extra"
    assert found >= 5, found
