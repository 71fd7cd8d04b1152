"""Settings have one home (``scheduler/protocol/config.py``): every ``ZSCHED_*`` variable is read
there and documented in docs/operations.md ("Environment"), and the defaults the clients, the
tier and the workers share are written there once. The servers that the tests and ``zsched dev``
start read a few variables of their own (which binary to run, where temp dirs go), next to them."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from scheduler.protocol import config

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "scheduler" / "protocol" / "config.py"
SERVERS = {ROOT / "scheduler" / "shell" / "servers", ROOT / "scheduler" / "testing"}
READ = re.compile(r"""environ(\.get)?\s*[\[(]\s*["']ZSCHED_|getenv\(\s*["']ZSCHED_"""
                  r"""|["']ZSCHED_\w+["']\s+(not\s+)?in\s+os\.environ""")


def sources() -> list[Path]:
    return sorted(p for pkg in ("scheduler", "workers") for p in (ROOT / pkg).rglob("*.py"))


def test_only_the_settings_module_reads_zsched_variables() -> None:
    readers = []
    for path in sources():
        if path == HOME or any(d in path.parents for d in SERVERS):
            continue
        readers += [f"{path.relative_to(ROOT)}:{n}" for n, line in enumerate(path.read_text().splitlines(), 1)
                    if READ.search(line)]
    assert readers == [], "read ZSCHED_* through scheduler.protocol.config"


def test_the_pattern_sees_each_way_of_reading_a_variable() -> None:
    for line in ('os.environ.get("ZSCHED_X")', "os.environ['ZSCHED_X']", 'os.getenv("ZSCHED_X")',
                 '"ZSCHED_X" not in os.environ'):
        assert READ.search(line), line


def test_every_variable_the_settings_module_reads_is_documented() -> None:
    text = HOME.read_text()
    names = set(re.findall(r'env\("(\w+)"\)', text)) | set(re.findall(r'switched_off\("(\w+)"\)', text))
    names = {f"ZSCHED_{n}" for n in names} | set(re.findall(r'"(ZSCHED_\w+)"', text))
    called = set(re.findall(r'switched_off\("(\w+)"\)', "".join(p.read_text() for p in sources())))
    names |= {f"ZSCHED_{n}" for n in called}
    assert {"ZSCHED_REDIS_URL", "ZSCHED_LOG_LEVEL", "ZSCHED_UVLOOP", "ZSCHED_TIMERFD"} <= names
    ops = (ROOT / "docs" / "operations.md").read_text()
    table = ops[ops.index("### Environment"):ops.index("### Common options")]
    assert sorted(n for n in names if f"`{n}`" not in table) == []
    assert sorted(n for n in names if n not in (config.__doc__ or "")) == []


def constants(path: Path) -> list[object]:
    """The constants of a module's code (docstrings left out: examples may name a default)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and id(n) not in docs]


def test_the_shared_defaults_are_written_once() -> None:
    shared = {config.DEFAULT_REDIS_URL, config.DEFAULT_ETCD_ENDPOINTS}
    again = {f"{p.relative_to(ROOT)}: {c!r}" for p in sources() if p != HOME for c in constants(p)
             if isinstance(c, str) and c in shared}
    assert again == set()
    literal = re.compile(r"tombstone_ttl\w*(\s*:\s*\w+)?\s*=\s*\d")  # a default written as a number
    tomb = [f"{p.relative_to(ROOT)}:{n}" for p in sources() if p != HOME
            for n, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert tomb == [], "the tombstone TTL's default is config.DEFAULT_TOMBSTONE_TTL"


def test_the_connection_options_are_declared_once_and_every_command_takes_them() -> None:
    """``--redis`` and ``--namespace`` are added by ``config.add_connection_options`` alone, and
    every zsched command that talks to Redis has them (and those that do not, do not)."""
    declared = [f"{p.relative_to(ROOT)}:{n}" for p in sources() if p != HOME
                for n, line in enumerate(p.read_text().splitlines(), 1)
                if re.search(r"""add_argument\(\s*["']--(redis|namespace)["']""", line)]
    assert declared == [], "declare them with config.add_connection_options"
    import argparse

    from scheduler.shell.cli import build_parser

    def leaves(parser: argparse.ArgumentParser, path: str) -> list[tuple[str, argparse.ArgumentParser]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # noqa: SLF001
        if not subs:
            return [(path, parser)]
        return [leaf for name, sub in subs[0].choices.items() for leaf in leaves(sub, f"{path} {name}")]

    commands = leaves(build_parser(), "zsched")
    assert len(commands) > 20
    # these talk to the user's PostgreSQL only (their table's DDL): no Redis, so no --redis to ignore
    postgres_only = {"zsched effects ddl", "zsched effects apply", "zsched outbox ddl", "zsched outbox apply"}
    for name, cmd in commands:
        opts = {o for a in cmd._actions for o in a.option_strings}  # noqa: SLF001
        if name in postgres_only:
            assert "--redis" not in opts, name
            continue
        assert {"--redis", "--namespace"} <= opts, name
