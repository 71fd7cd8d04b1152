"""The code's shape, checked: layers import one way, no private name crosses a module boundary,
modules stay small, and every declared dependency is used.

The layers (docs/architecture.md, "Code map"), bottom up:

- ``scheduler.protocol``: the wire format, pure (no redis-py, no I/O): key layout, record bytes,
  ids, URLs, scripts and their typed calls/replies;
- ``scheduler.redisio``: the Redis I/O around it: connections, the script transports, routing,
  pub/sub;
- support: ``scheduler.coord`` (etcd), ``scheduler.metrics``, ``scheduler.health``, ``scheduler.runtime``;
- ``scheduler.client``: the producer clients;
- ``scheduler.tier`` and ``workers`` (neither imports the other);
- ``scheduler.testing``: the production transitions run in-process, for tests (may import
  everything above, but not the shell);
- ``scheduler.shell``: CLI, admin, dev stack, demo (may import everything below).

``bench/`` is not a layer of the library, but it never imports ``tests/``: what a benchmark needs
from the test helpers belongs in ``scheduler.testing``.
"""
from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("scheduler", "workers")
MAX_LINES = 500

# layer of a module -> the layers it may import (its own included)
ALLOWED: dict[str, set[str]] = {
    "protocol": {"protocol"},
    "redisio": {"protocol", "redisio"},
    "support": {"protocol", "redisio", "support"},
    "client": {"protocol", "redisio", "client"},
    "tier": {"protocol", "redisio", "support", "client", "tier"},
    "workers": {"protocol", "redisio", "support", "client", "workers"},
    "testing": {"protocol", "redisio", "support", "client", "tier", "workers", "testing"},
    "shell": {"protocol", "redisio", "support", "client", "tier", "workers", "testing", "shell", "package"},
    "package": {"protocol", "redisio", "client", "shell", "package"},  # scheduler/__init__.py, __main__.py
}
# Third-party packages that do I/O, which the pure wire layer never imports (a test below)
IO_PACKAGES = {"redis", "hiredis", "etcd3aio", "grpc", "socket", "asyncio", "psycopg", "prometheus_client"}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "workers":
        return "workers"
    if len(parts) == 1 or parts[1] in ("__main__",):
        return "package"
    sub = parts[1]
    if sub in ("coord", "metrics", "health", "runtime"):
        return "support"
    if sub in ("protocol", "redisio", "client", "tier", "testing", "shell"):
        return sub
    raise AssertionError(f"module {module} is in no layer: add it to tests/unit/test_architecture.py")


def modules() -> list[tuple[str, Path]]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.append((".".join(parts), path))
    return out


def imports_of(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import in the file."""
    tree = ast.parse(path.read_text("utf-8"))
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_pkg else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, [a.name for a in node.names], node.lineno))
    return out


def ours(target: str) -> bool:
    return target.split(".")[0] in PACKAGES


def test_every_layer_imports_only_the_layers_below_it() -> None:
    bad = []
    for module, path in modules():
        mine = layer_of(module)
        for target, names, line in imports_of(module, path):
            if not ours(target):
                continue
            # "from scheduler.protocol import codec" names a module: judge by the full path
            targets = [f"{target}.{n}" for n in names] if names and layer_of(target) == "package" else [target]
            for t in targets:
                theirs = layer_of(t)
                if theirs not in ALLOWED[mine]:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {mine} layer imports {t} ({theirs} layer)")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_the_wire_layer_is_pure() -> None:
    """``scheduler.protocol`` imports no redis-py and nothing else that does I/O (``scheduler.redisio``
    is excluded by the layering above): it can be used, and tested, without a server."""
    bad = []
    for module, path in modules():
        if layer_of(module) != "protocol":
            continue
        for target, _names, line in imports_of(module, path):
            if target.split(".")[0] in IO_PACKAGES:
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    assert not bad, "the wire layer does I/O (move it to scheduler/redisio):\n" + "\n".join(bad)


def test_benchmarks_do_not_import_the_tests() -> None:
    bad = []
    for path in sorted((ROOT / "bench").glob("*.py")):
        for target, _names, line in imports_of("bench." + path.stem, path):
            if target.split(".")[0] == "tests":
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {target}")
    assert not bad, "bench/ imports from tests/ (move what it needs to scheduler.testing):\n" + "\n".join(bad)


def test_tier_and_workers_do_not_import_each_other() -> None:
    # covered by ALLOWED, stated on its own because it is the rule people break first
    assert "workers" not in ALLOWED["tier"] and "tier" not in ALLOWED["workers"]


def test_no_private_name_is_imported_from_another_module() -> None:
    bad = []
    for module, path in modules():
        for target, names, line in imports_of(module, path):
            if not ours(target):
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__"):
                    bad.append(f"{path.relative_to(ROOT)}:{line}: imports {target}.{n}")
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


_PRIVATE_ATTR = re.compile(r"\b(?!self\b|cls\b)([a-z][a-z0-9_]*)\._(?!_)[a-z]\w*")


def test_no_private_attribute_of_another_object_is_read() -> None:
    """``client._core`` and the like: another object's internals are not an interface."""
    bad = []
    for _module, path in modules():
        for i, text in enumerate(path.read_text("utf-8").splitlines(), 1):
            code = text.split("#", 1)[0]
            for m in _PRIVATE_ATTR.finditer(code):
                if m.group(1) in ("os", "sys", "typing"):  # os._exit and friends are stdlib API
                    continue
                bad.append(f"{path.relative_to(ROOT)}:{i}: {m.group(0)}")
    assert not bad, "private attributes of other objects:\n" + "\n".join(bad)


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_module_is_small(module: str, path: Path) -> None:
    n = len(path.read_text("utf-8").splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT)} has {n} lines (limit {MAX_LINES}): split it by concern"


# distribution name -> the import name that proves it is used (plugins: how they are used)
_IMPORT_NAME = {"redis": "redis", "msgpack": "msgpack", "etcd3aio": "etcd3aio",
                "prometheus-client": "prometheus_client", "croniter": "croniter", "pytest": "pytest",
                "hypothesis": "hypothesis", "fakeredis": "fakeredis", "pyyaml": "yaml", "psycopg": "psycopg",
                "huey": "huey", "celery": "celery", "starlette": "starlette", "jinja2": "jinja2",
                "uvicorn": "uvicorn", "playwright": "playwright", "uvloop": "uvloop",
                "matplotlib": "matplotlib", "kubernetes-validate": "kubernetes_validate",
                "opentelemetry-api": "opentelemetry", "opentelemetry-sdk": "opentelemetry.sdk"}
# used without an import: pytest plugins and command-line tools
_USED_OTHERWISE = {
    "pytest-asyncio": lambda: 'asyncio_mode = "auto"' in (ROOT / "pyproject.toml").read_text(),
    "pytest-timeout": lambda: re.search(r"^timeout = \d+", (ROOT / "pyproject.toml").read_text(), re.M) is not None,
    "pytest-xdist": lambda: " -n 2 " in (ROOT / "scripts" / "test").read_text(),
    "ruff": lambda: "ruff check" in (ROOT / "scripts" / "lint").read_text(),
    "mypy": lambda: "mypy" in (ROOT / "scripts" / "lint").read_text(),
    # starlette's form parser and test client import them
    "python-multipart": lambda: "await request.form()" in (ROOT / "scheduler/shell/ui/app.py").read_text(),
    "httpx2": lambda: "starlette.testclient" in (ROOT / "tests/integration/test_ui_routes.py").read_text(),
}


def _declared() -> list[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"]) + [r for extra in meta["optional-dependencies"].values() for r in extra]
    return sorted({re.split(r"[\[<>=!~ ]", r, maxsplit=1)[0].lower() for r in reqs})


def test_every_declared_dependency_is_used() -> None:
    sources = "\n".join(p.read_text("utf-8") for d in ("scheduler", "workers", "tests", "bench")
                        for p in (ROOT / d).rglob("*.py"))
    unused = []
    for dist in _declared():
        if dist in _USED_OTHERWISE:
            if not _USED_OTHERWISE[dist]():
                unused.append(dist)
            continue
        name = _IMPORT_NAME.get(dist)
        assert name is not None, f"new dependency {dist}: say in _IMPORT_NAME how its use shows"
        if not re.search(rf"^\s*(import|from) {name}\b", sources, re.M):
            unused.append(dist)
    assert not unused, f"declared in pyproject.toml but never used: {unused}"


def test_every_script_has_a_header_naming_keys_argv_returns_and_invariants() -> None:
    from scheduler.protocol.scripts import SCRIPT_NAMES

    missing = []
    for name in SCRIPT_NAMES:
        text = (ROOT / "lua" / f"{name}.lua").read_text("utf-8")
        header = "\n".join(line for line in text.splitlines() if line.startswith("--"))
        for part in ("KEYS:", "ARGV:", "Returns:", "Invariants:"):
            if f"-- {part}" not in header:
                missing.append(f"lua/{name}.lua: no '-- {part}' line in its header")
    assert not missing, "\n".join(missing)


def test_every_lua_file_is_a_script_or_part_of_the_library() -> None:
    from scheduler.protocol.scripts import LIBRARY, SCRIPT_NAMES

    files = {p.name for p in (ROOT / "lua").glob("*.lua")}
    assert files == {f"{n}.lua" for n in SCRIPT_NAMES} | set(LIBRARY)
    big = [f"{p.name}: {n}" for p in (ROOT / "lua").glob("*.lua")
           if (n := len(p.read_text("utf-8").splitlines())) > MAX_LINES]
    assert not big, big


# -- script calls are built in the protocol layer ----------------------------------------------------

# ``calls.call("claim", p, ...)`` (or the testing kit's ``ops.run("tick", ...)``): a script's call
# put together by name, its ARGV layout by hand
BY_NAME = re.compile(r"""\.(?:call|call_unfenced|run)\(\s*["'](?P<name>[a-z_]+)["']""")


def test_no_script_call_is_built_by_name_outside_the_protocol_layer() -> None:
    """Every script has its typed builder in ``scheduler.protocol`` (calls.py, tick.py,
    transitions.py, control.py, ...); the clients, tier, workers, testing kit, CLI, benchmarks and
    tests call those, so a script's ARGV layout is written once, next to its reply parser. A test
    that must send what no builder makes (an argument malformed on purpose) says so with
    ``tests.support.helpers.raw_call``."""
    from scheduler.protocol.scripts import SCRIPT_NAMES
    found = []
    for path in sorted(p for d in (*PACKAGES, "bench", "tests") for p in (ROOT / d).rglob("*.py")):
        if (ROOT / "scheduler" / "protocol") in path.parents or path == Path(__file__):
            continue
        for n, line in enumerate(path.read_text("utf-8").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{n}: {m['name']}" for m in BY_NAME.finditer(line)
                      if m["name"] in SCRIPT_NAMES]
    assert found == []


def test_the_by_name_pattern_sees_a_hand_built_call() -> None:
    assert BY_NAME.search('calls.call("claim", p, q, 5)')["name"] == "claim"  # type: ignore[index]
    assert BY_NAME.search("self.calls.call_unfenced('ack', p)")["name"] == "ack"  # type: ignore[index]
    assert BY_NAME.search('self._session.call(op, timeout)') is None
    assert BY_NAME.search('ops.run("tick", p, 0, 100, 0)')["name"] == "tick"  # type: ignore[index]


def test_no_import_circles() -> None:
    """No module imports itself through others, not even for type checking only: a circle means
    two modules are one concern, or a shared part wants its own module."""
    mods = dict(modules())
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for module, path in mods.items():
        for target, names, _line in imports_of(module, path):
            if not ours(target):
                continue
            named = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods]
            graph[module] |= set(named or ([target] if target in mods else [])) - {module}
    circles = []
    for start in graph:  # a depth-first walk from each module, back to it
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert not circles, "import circles:\n" + "\n".join(sorted(circles))


def test_the_zsched_command_loads_grpc_only_for_the_commands_that_talk_to_etcd() -> None:
    """Building the ``zsched`` parser (every one-shot command's start) does not import etcd3aio or
    gRPC (about 80 ms a process): ``scheduler.coord`` gives ``EtcdCoordinator`` lazily."""
    import subprocess
    import sys

    code = ("import sys\nfrom scheduler.shell.cli import build_parser\nbuild_parser()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('etcd3aio', 'grpc')))\n"
            "from scheduler.coord import EtcdCoordinator\nprint('etcd3aio' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout
