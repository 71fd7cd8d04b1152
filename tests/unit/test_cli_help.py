"""``zsched --help`` everywhere, the exit-code mapping of known conditions, and what first-run output
looks like (the worker's logging set-up, the dev view off a terminal, requeue spacing). No servers."""
from __future__ import annotations

import argparse
import contextlib
import logging
import math
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from scheduler.coord import CoordinationError, CoordinatorUnavailable
from scheduler.metrics import PortInUse
from scheduler.protocol.errors import ConfigError
from scheduler.protocol.models import JobInfo, JobState
from scheduler.runtime import LOG_FORMAT, entry_point_logging
from scheduler.shell import admin
from scheduler.shell.admin import NotFound
from scheduler.shell.cli import build_parser, main
from scheduler.shell.cli_errors import EXIT_BAD_INPUT, EXIT_LOCAL, EXIT_UNAVAILABLE, explain
from scheduler.shell.dev_view import Sample, View, compact_line, unowned_note


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser, str | None]]:
    """Every (sub)command in the argparse tree: its words, its parser, its line in the parent's list."""
    for action in parser._actions:  # argparse keeps the tree only here
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*prefix, name), sub, helps.get(name)
                yield from commands(sub, (*prefix, name))


ALL = list(commands(build_parser()))


def test_the_walk_finds_the_commands_docs_name() -> None:
    names = {" ".join(words) for words, _p, _h in ALL}
    assert {"scheduler", "worker", "dev", "job show", "dead requeue", "cron add", "cron list",
            "migrate-partitions"} <= names


@pytest.mark.parametrize("words", [w for w, _p, _h in ALL], ids=[" ".join(w) for w, _p, _h in ALL])
def test_every_subcommand_has_a_description_and_a_help_line(words: tuple[str, ...],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    parser, line = next((p, h) for w, p, h in ALL if w == words)
    assert line, f"zsched {' '.join(words)} has no line in its parent's --help"
    assert parser.description, f"zsched {' '.join(words)} --help has no description"
    with pytest.raises(SystemExit) as exit_:
        main([*words, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: zsched " + " ".join(words))
    assert parser.description.split()[0] in out
    undocumented = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
    assert not undocumented, f"zsched {' '.join(words)}: options without help: {undocumented}"


# --------------------------------------------------------------------------- known conditions


def ns(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"redis": None, **kw})


def test_known_conditions_map_to_documented_exit_codes() -> None:
    unreadable = ValueError("cannot read etcd ca_cert from /x: [Errno 2] No such file or directory")
    unreadable.__cause__ = FileNotFoundError(2, "No such file or directory")
    cases = [
        (NotFound("no job"), 1),
        (ConfigError("Redis URL 'http://x' is invalid"), EXIT_BAD_INPUT),
        (CoordinatorUnavailable("etcd unavailable: ..."), EXIT_UNAVAILABLE),
        (CoordinationError("etcd rejected user 'u'"), EXIT_UNAVAILABLE),
        (PortInUse("metrics port 9108 on 127.0.0.1 is already in use"), EXIT_LOCAL),
        (OSError(98, "Address already in use"), EXIT_LOCAL),
        (unreadable, EXIT_LOCAL),
    ]
    for exc, code in cases:
        known = explain(exc, ns())
        assert known is not None and known[1] == code, (exc, known)
    assert explain(RuntimeError("a bug"), ns()) is None, "a bug keeps its traceback"
    assert explain(KeyError("x"), ns()) is None


def test_redis_errors_name_the_url_without_its_password() -> None:
    import redis

    msg, code = explain(redis.AuthenticationError("invalid username-password pair"),
                        ns(redis="redis://alice:hunter2@127.0.0.1:6379/0")) or ("", 0)
    assert code == EXIT_UNAVAILABLE and "hunter2" not in msg and "alice:***@127.0.0.1:6379" in msg
    assert "fix user:password" in msg


# ---------------------------------------------------------------------------- logging set-up


@contextlib.contextmanager
def no_logging_configured() -> Iterator[None]:
    """As in a fresh ``python -m myapp``: no handler anywhere (pytest's capture handlers set aside)."""
    root, ours = logging.getLogger(), logging.getLogger("zsched")
    saved = (root.handlers[:], ours.handlers[:], ours.level)
    root.handlers.clear()
    ours.handlers.clear()
    ours.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        root.handlers[:], ours.handlers[:] = saved[0], saved[1]
        ours.setLevel(saved[2])


def test_worker_entry_point_logs_zsched_lines_and_leaves_the_root_logger_alone() -> None:
    with no_logging_configured():
        _check_entry_point_logging()


def _check_entry_point_logging() -> None:
    entry_point_logging()
    root, ours = logging.getLogger(), logging.getLogger("zsched")
    assert root.handlers == [], "the application's root logger is not ours to configure"
    assert len(ours.handlers) == 1 and ours.level == logging.INFO
    assert ours.handlers[0].formatter is not None and ours.handlers[0].formatter._fmt == LOG_FORMAT
    entry_point_logging()
    assert len(ours.handlers) == 1, "twice is once"


def test_worker_entry_point_changes_nothing_when_the_app_configured_logging() -> None:
    with no_logging_configured():
        logging.getLogger().addHandler(logging.NullHandler())
        entry_point_logging()
        assert logging.getLogger("zsched").handlers == []


# -------------------------------------------------------------------------------- dev view


def test_dev_view_off_a_terminal_is_one_line_per_interval() -> None:
    s = Sample("09:00:01", {"acked": 10}, {"scheduled": 12.0, "fired": 11.0, "acked": 10.4}, 0.0004, 0.0012,
               {"emails": {"scheduled": 5, "ready": 1, "running": 2, "dead": 3}}, {"scheduler-1": [0, 1, 2]}, [])
    line = compact_line(s)
    assert "\n" not in line and "\x1b" not in line
    assert line == ("09:00:01 /s: scheduled 12 fired 11 acked 10; lateness p50 0.4 ms p99 1.2 ms; scheduled 5 "
                    "ready 1 running 2 dead 3; owners: scheduler-1 3")


def test_dev_view_says_when_rate_limits_hold_jobs_so_their_lateness_is_not_read_as_a_late_scheduler() -> None:
    s = Sample("09:00:02", {}, None, 0.0004, 4.9, {"emails": {"scheduled": 800, "ready": 0, "running": 4, "dead": 0}},
               {}, [], held=640)
    assert ("p99 4900.0 ms (rate limits held up to 640 due jobs; their jobs count as late); scheduled 800"
            in compact_line(s))
    view = View.__new__(View)  # render() reads only the stack's names
    view.stack = SimpleNamespace(ns="zsched", redis_url="redis://127.0.0.1:1", etcd="http://127.0.0.1:2", home=".")
    assert "p99 4900.0 ms (rate limits held up to 640 due jobs; their jobs count as late)" in view.render(s)
    assert "count as late" not in compact_line(Sample("09:00:03", {}, None, 0.0, 0.001, {}, {}, []))


def test_dev_view_says_when_partitions_had_no_running_owner_so_their_lateness_is_explained() -> None:
    """At start-up the demo producer schedules before the replicas take their partitions, and a
    killed replica's partitions wait for its lease to run out: the p99 reads seconds, and the line
    says why."""
    s = Sample("09:00:02", {}, None, 0.0175, 2.27, {}, {"scheduler-1": [0, 1]}, [], held=5, unowned=14)
    assert ("p99 2270.0 ms (rate limits held up to 5 due jobs; 14 partitions had no running owner; their "
            "jobs count as late);" in compact_line(s))
    view = View.__new__(View)  # unowned() reads only the client's partition count
    view.client = SimpleNamespace(keyspace=SimpleNamespace(partitions=16))
    assert view.unowned({"scheduler-1": [0, 1, 2], "scheduler-2": [3]}, []) == 12
    assert view.unowned({"scheduler-1": list(range(16))}, []) == 0
    # etcd names an exited replica until its lease runs out: its partitions wait all the same
    assert view.unowned({"scheduler-1": list(range(12)), "scheduler-2": [12, 13, 14, 15]}, ["scheduler-2"]) == 4
    assert view.unowned({"(etcd unreachable: TimeoutError)": []}, []) == 0  # unknown, not "none owned"


def test_dev_view_keeps_naming_ownerless_partitions_while_their_backlog_drains() -> None:
    """Restarted on an earlier run's data, the overdue jobs fire over more than one interval once
    the replicas own their partitions: the lines keep saying why the p99 reads minutes, and stop
    once it is back under a second or a rate limit is what holds jobs."""
    assert unowned_note(16, 0, 0, None, 0) == 16           # start-up: none owned yet
    assert unowned_note(0, 16, 16, 400.0, 0) == 16         # owned now; owned by none at the interval's start
    assert unowned_note(0, 0, 16, math.inf, 0) == 16       # the backlog still drains
    assert unowned_note(0, 0, 16, 0.001, 0) == 0           # drained
    assert unowned_note(0, 0, 16, 4.9, 640) == 0           # a rate limit's herd: its own note says so
    assert unowned_note(0, 0, 0, 4.9, 0) == 0              # late for another reason: no note made up


# ------------------------------------------------------------------------------ requeue spacing


def _dead(i: int) -> JobInfo:
    return JobInfo(id=f"job-{i}", state=JobState.DEAD, queue="q")  # type: ignore[call-arg]


def test_requeue_later_makes_job_n_due_at_when_plus_n_over_rate() -> None:
    now = 1_700_000_000_000
    at = now + 3_600_000
    jobs = [_dead(i) for i in range(12)]
    out = list(admin.requeue_stream(None, jobs, rate=50, at_ms=at, dry_run=True,  # type: ignore[arg-type]
                                    now_ms=lambda: now))
    assert admin.batch_size(50) == 5, "five jobs per round trip..."
    assert [o.due_ms for o in out] == [at + 20 * n for n in range(12)], "...each due at WHEN + n / rate"


def test_ui_without_its_extra_says_which_packages_to_install(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.shell import cli_ui

    assert cli_ui.missing_ui_packages() == []  # bootstrap installs the 'ui' extra
    monkeypatch.setattr(cli_ui, "UI_PACKAGES", ("starlette", "zsched_no_such_package"))
    assert cli_ui.missing_ui_packages() == ["zsched_no_such_package"]
    assert main(["ui", "--redis", "redis://127.0.0.1:1/0", "--port", "0"]) == EXIT_LOCAL
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "zsched_no_such_package" in err[0] and "pip install -e '.[ui]'" in err[0]
