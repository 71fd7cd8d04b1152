"""A malformed etcd endpoint list is bad input on every command that accepts one: one
``zsched: error:`` line and exit 2, before anything connects or starts, whether it comes from
``--etcd`` or from ZSCHED_ETCD_ENDPOINTS. The commands are found by walking the parser and run
in-process (``scheduler.shell.cli.main``); the Redis URL they are given refuses the password, so a
command that connected before checking the list would end with exit 3, not 2."""
from __future__ import annotations

import argparse
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.redisio.connection import sync_redis
from scheduler.shell.cli import build_parser, main
from scheduler.shell.cli_ui import missing_ui_packages

MALFORMED = ["garbage://", "http://", ":2379", "host:notaport", "http://h:99999", "", "http://root:Pw-9q2x@h:x"]
USER = "zsched-endpoints"


def etcd_commands() -> list[str]:
    """Every ``zsched`` command with an ``--etcd`` option."""
    out: list[str] = []

    def walk(p: argparse.ArgumentParser, path: list[str]) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs and any("--etcd" in a.option_strings for a in p._actions):
            out.append(" ".join(path))
        for sub in subs:
            for name, child in sub.choices.items():
                walk(child, [*path, name])

    walk(build_parser(), [])
    return out


@pytest.fixture
def refused_redis(redis_url: str) -> Iterator[str]:
    """A URL of the live redis-server whose password it refuses."""
    r = sync_redis(redis_url)
    r.acl_setuser(USER, enabled=True, passwords=["+right-pw"], keys=["*"], commands=["+@all"])
    r.close()
    yield redis_url.replace("redis://", f"redis://{USER}:wrong-pw@")


def run(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        env: dict[str, str]) -> tuple[int, str, str]:
    """``zsched ARGV`` in-process with ``env`` set; the exit code, stdout and stderr. The signal
    handlers are put back (``zsched dev`` installs its own before it checks its arguments)."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    capsys.readouterr()
    with monkeypatch.context() as m:
        for k, v in env.items():
            m.setenv(k, v)
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = int(exc.code or 0)
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
    out, err = capsys.readouterr()
    return rc, out, err


def test_every_command_with_etcd_is_covered() -> None:
    assert set(etcd_commands()) == {"scheduler", "dev", "stats", "epochs show", "ui"}


@pytest.mark.parametrize("command", etcd_commands())
def test_a_malformed_etcd_endpoint_is_bad_input(command: str, refused_redis: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if command == "ui" and missing_ui_packages():
        pytest.skip("the ui extra is not installed")
    base = [*command.split(), "--redis", refused_redis, "--namespace", "endpoints"]
    if command == "dev":
        base += ["--no-demo", "--home", str(tmp_path / "dev")]
    if command == "ui":
        base += ["--port", "0"]  # the default port may be taken on this machine: refused for the etcd list, not that
    runs = [(base + ["--etcd", value], {"ZSCHED_ETCD_ENDPOINTS": "127.0.0.1:2379"}) for value in MALFORMED]
    if command != "dev":  # dev starts its own etcd unless --etcd names one: it does not read the variable
        runs.append((base, {"ZSCHED_ETCD_ENDPOINTS": "garbage://"}))
    problems = []
    for argv, env in runs:
        rc, out, err = run(argv, capsys, monkeypatch, env)
        lines = err.strip().splitlines()
        if rc != 2 or out or len(lines) != 1 or not lines[0].startswith("zsched: error:") or "etcd" not in lines[0]:
            problems.append(f"zsched {' '.join(argv)} (env {env}): exit {rc}, expected 2 and one error line:\n"
                            f"{out[-1000:]}{err[-2000:]}")
        elif "9q2x" in err:
            problems.append(f"zsched {' '.join(argv)}: the password is shown:\n{err}")
    assert not problems, "\n\n".join(problems)
