"""Parsing and pure logic of the operator CLI (no Redis): WHEN/DURATION, selections, pacing,
argparse wiring and error format."""
from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.protocol import config
from scheduler.protocol.models import JobError, JobInfo, JobState
from scheduler.shell import admin
from scheduler.shell.admin import BadInput, DeadFilter, Pacer
from scheduler.shell.cli import build_parser, main

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z


# ------------------------------------------------------------------------------------ WHEN


@pytest.mark.parametrize("text, expected_ms", [
    ("now", NOW * 1000),
    (" NOW ", NOW * 1000),
    ("+90s", (NOW + 90) * 1000),
    ("+4h", (NOW + 4 * 3600) * 1000),
    ("+1d2h30m", (NOW + 86400 + 7200 + 1800) * 1000),
    ("+2w", (NOW + 14 * 86400) * 1000),
    ("+250ms", NOW * 1000 + 250),
    ("+1.5h", (NOW + 5400) * 1000),
    ("+0s", NOW * 1000),
    ("1767225600", 1767225600 * 1000),
    ("1767225600.25", 1767225600250),
    ("2026-12-01T09:00:00+01:00", datetime(2026, 12, 1, 8, tzinfo=UTC).timestamp() * 1000),
    ("2026-12-01T08:00:00Z", datetime(2026, 12, 1, 8, tzinfo=UTC).timestamp() * 1000),
    ("2026-12-01T08:00:00z", datetime(2026, 12, 1, 8, tzinfo=UTC).timestamp() * 1000),
    ("2026-12-01T03:00:00.5-05:00", datetime(2026, 12, 1, 8, tzinfo=UTC).timestamp() * 1000 + 500),
    ("2026-12-01 08:00+00:00", datetime(2026, 12, 1, 8, tzinfo=UTC).timestamp() * 1000),
])
def test_parse_when_forms(text: str, expected_ms: float) -> None:
    assert admin.parse_when(text, now=NOW) == int(expected_ms)


@pytest.mark.parametrize("text, needle", [
    ("2026-12-01T09:00:00", "has no time zone"),
    ("2026-12-01", "has no time zone"),
    ("", "expected ISO-8601 with a zone"),
    ("tomorrow", "expected ISO-8601 with a zone"),
    ("+", "expected a number with a unit"),
    ("+4x", "expected a number with a unit"),
    ("+4", "a unit is required"),
    ("+1h1h", "expected a number with a unit"),
    ("-5m", "expected ISO-8601"),
    ("1767225600000", "looks like epoch milliseconds"),
    ("2026-13-01T00:00:00Z", "expected ISO-8601"),
    ("+3000000d", "out of range"),
    ("+100000000d", "too large"),
])
def test_parse_when_refusals(text: str, needle: str) -> None:
    with pytest.raises(BadInput) as ei:
        admin.parse_when(text, now=NOW)
    assert needle in str(ei.value)
    assert ei.value.exit_code == 2


def test_naive_time_message_suggests_a_fix() -> None:
    with pytest.raises(BadInput) as ei:
        admin.parse_when("2026-12-01T09:00:00")
    msg = str(ei.value)
    assert "2026-12-01T09:00:00Z" in msg and "2026-12-01T09:00:00+01:00" in msg


@pytest.mark.parametrize("text, seconds", [
    ("7d", 7 * 86400), ("12h", 43200), ("90s", 90), ("30m", 1800), ("500ms", 0.5), ("1w", 604800),
    ("1d12h", 129600), ("1D12H", 129600), ("0s", 0), (" 2h ", 7200), ("1.5d", 129600),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert admin.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "7", "d", "7 d", "7days", "1h1h", "-1d", "1h-2m", "1e3s"])
def test_parse_duration_refusals(text: str) -> None:
    with pytest.raises(BadInput) as ei:
        admin.parse_duration(text, name="--older-than")
    assert "--older-than" in str(ei.value) and "ms, s, m, h, d, w" in str(ei.value)


def test_parse_payload_and_job_id(tmp_path: Any) -> None:
    assert admin.parse_payload('{"a": [1, 2]}') == {"a": [1, 2]}
    assert admin.parse_payload("null") is None
    with pytest.raises(BadInput, match="not valid JSON .* line 1 column 2"):
        admin.parse_payload("{x")
    with pytest.raises(BadInput, match="cannot read"):
        admin.parse_payload(f"@{tmp_path}/missing.json")
    assert admin.parse_job_id("0123456789ABCDEF0123456789abcd") == "0123456789abcdef0123456789abcd"
    with pytest.raises(BadInput, match="30-character"):
        admin.parse_job_id("abc")
    with pytest.raises(BadInput, match="not hex"):
        admin.parse_job_id("z" * 30)


# -------------------------------------------------------------------------------- selection


def _dead(queue: str = "q", err: str = "boom", tb: str = "") -> JobInfo:
    return JobInfo(id="0" * 30, state=JobState.DEAD, queue=queue,
                   last_error=JobError(None, "RuntimeError", err, tb))


def test_dead_filter_matches_queue_and_error_text() -> None:
    assert DeadFilter().matches(_dead())
    assert DeadFilter(queue="q").matches(_dead()) and not DeadFilter(queue="x").matches(_dead())
    f = DeadFilter(error_contains="550")
    assert f.matches(_dead(err="SMTP 550 no")) and not f.matches(_dead(err="timeout"))
    assert DeadFilter(error_contains="gaierror").matches(_dead(tb="socket.gaierror: x"))
    assert DeadFilter(error_contains="RuntimeError").matches(_dead())
    assert not DeadFilter(error_contains="smtp").matches(_dead(err="SMTP 550"))
    assert DeadFilter(error_contains="smtp", ignore_case=True).matches(_dead(err="SMTP 550"))
    both = DeadFilter(queue="q", error_contains="550")
    assert both.matches(_dead(err="550")) and not both.matches(_dead(queue="x", err="550"))
    assert not f.matches(JobInfo(id="0" * 30, state=JobState.DEAD, queue="q"))
    assert both.describe() == "queue 'q' and last error containing '550'"


def test_dead_selection_rules() -> None:
    jid = "0" * 30
    assert admin.dead_selection(jid, None, None, False) == (jid, None)
    _, f = admin.dead_selection(None, "q", "x", False, ignore_case=True)
    assert f == DeadFilter("q", "x", True)
    assert admin.dead_selection(None, None, None, True) == (None, DeadFilter())
    for args, needle in (((None, None, None, False), "nothing selected"),
                         ((jid, "q", None, False), "not both"), ((jid, None, None, True), "not both"),
                         ((None, "q", None, True), "cannot be combined"),
                         ((None, None, "", False), "non-empty")):
        with pytest.raises(BadInput, match=needle):
            admin.dead_selection(*args)


# ----------------------------------------------------------------------------------- pacing


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, d: float) -> None:
        self.sleeps.append(d)
        self.t += d


def test_pacer_spaces_batches_at_the_rate() -> None:
    clk = FakeClock()
    p = Pacer(40, clock=clk, sleep=clk.sleep)
    for sent in range(0, 20, 4):  # 20 jobs in batches of 4 at 40/s
        p.wait(sent)
        clk.t += 0.01  # the round trip itself
    assert clk.t - 100.0 == pytest.approx(16 / 40 + 0.01)
    assert len(clk.sleeps) == 4


def test_pacer_does_not_sleep_when_behind_or_unlimited() -> None:
    clk = FakeClock()
    p = Pacer(10, clock=clk, sleep=clk.sleep)
    p.wait(0)
    clk.t += 5  # slow round trips: already behind schedule
    assert p.wait(10) == 0 and clk.sleeps == []
    for rate in (None, 0):
        q = Pacer(rate, clock=clk, sleep=clk.sleep)
        assert q.wait(0) == 0 and q.wait(1000) == 0
    assert clk.sleeps == []


@pytest.mark.parametrize("rate, size", [(None, 500), (0, 500), (1, 1), (10, 1), (40, 4), (200, 20),
                                        (100_000, 500), (0.5, 1)])
def test_batch_size(rate: float | None, size: int) -> None:
    assert admin.batch_size(rate) == size


def test_dry_run_with_future_at_spreads_due_times_without_touching_redis() -> None:
    jobs = [_dead() for _ in range(5)]
    at = int(NOW * 1000) + 3_600_000
    out = list(admin.requeue_stream(None, jobs, rate=2, at_ms=at, dry_run=True,  # type: ignore[arg-type]
                                    now_ms=lambda: NOW * 1000))
    assert [o.status for o in out] == ["would requeue"] * 5
    assert [o.due_ms for o in out] == [at, at + 500, at + 1000, at + 1500, at + 2000]
    out = list(admin.requeue_stream(None, jobs, rate=2, at_ms=None, dry_run=True))  # type: ignore[arg-type]
    assert {o.due_ms for o in out} == {None}


# ------------------------------------------------------------------------------- formatting


def test_table_alignment() -> None:
    text = admin.table(("NAME", "N", "NOTE"), [("a", 1, "x"), ("long-name", 12345, None)], right=(1,))
    lines = text.splitlines()
    assert lines[0] == "NAME           N  NOTE"
    assert lines[1] == "a              1  x"
    assert lines[2] == "long-name  12345  -"


def test_formatting_helpers() -> None:
    assert admin.iso(1767225600123) == "2026-01-01T00:00:00.123Z"
    assert admin.iso(None) is None
    assert admin.human_delta(3 * 3600 + 59 * 60 + 5) == "in 3h59m"
    assert admin.human_delta(-130) == "2m10s ago" and admin.human_delta(0.2) == "now"
    assert admin.first_line("a: b\nc", 10) == "a: b" and admin.first_line("x" * 20, 10) == "xxxxxxx..."
    assert admin.jsonable({"b": b"\x00", 1: (1, 2), "f": float("nan")}) == \
        {"b": {"$base64": "AA=="}, "1": [1, 2], "f": "nan"}


# ---------------------------------------------------------------------------------- argparse


def _parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_the_coalescing_lead_reaches_the_partition_runners() -> None:
    from scheduler.tier.cli import config_from_args

    base = ("scheduler", "--redis", "redis://127.0.0.1:1", "--etcd", "127.0.0.1:1")
    cfg = config_from_args(_parse(*base, "--coalesce-lead", "160"))
    assert cfg.runner.coalesce_lead == 0.160 and cfg.runner.handoff_lead == 0.020
    assert config_from_args(_parse(*base)).runner.coalesce_lead == 0.0  # off unless asked for


def test_the_burst_lead_reaches_the_partition_runners() -> None:
    from scheduler.tier.cli import config_from_args

    base = ("scheduler", "--redis", "redis://127.0.0.1:1", "--etcd", "127.0.0.1:1")
    assert config_from_args(_parse(*base, "--burst-lead", "80")).runner.burst_lead == 0.080
    assert config_from_args(_parse(*base, "--burst-lead", "0")).runner.burst_lead == 0.0
    assert config_from_args(_parse(*base)).runner.burst_lead == 0.050  # on by default


def test_parser_wiring() -> None:
    a = _parse("schedule", "--at", "+1h", "--queue", "q", "--payload", '{"a": 1}', "--json")
    assert a.queue == "q" and a.payload == {"a": 1} and a.json and a.max_attempts == 5 and a.misfire == "run_late"
    assert callable(a.func)
    a = _parse("job", "reschedule", "0" * 30, "--at", "now", "--namespace", "ns", "--redis", "redis://h/1")
    assert a.id == "0" * 30 and a.namespace == "ns" and a.redis == "redis://h/1"
    a = _parse("dead", "requeue", "--queue", "q", "--error-contains", "550", "--dry-run", "--rate", "50")
    assert a.id is None and a.queue == "q" and a.error_contains == "550" and a.dry_run and a.rate == 50
    assert _parse("dead", "requeue", "--all").rate is None  # the default is applied for mass requeues only
    a = _parse("dead", "purge", "--older-than", "7d")
    assert a.older_than == 7 * 86400 and a.id is None
    assert _parse("dead", "list").limit == 50
    assert _parse("stats", "--etcd", "h:2379").etcd == "h:2379"


def test_worker_ack_linger_is_given_in_milliseconds_and_kept_in_seconds() -> None:
    assert _parse("worker", "app:worker", "--ack-linger", "250").ack_linger == 0.25
    assert _parse("worker", "app:worker", "--ack-linger", "0").ack_linger == 0.0
    assert _parse("worker", "app:worker").ack_linger is None  # the Worker's own setting stays


@pytest.mark.parametrize("argv", [["dev"], ["scheduler"], ["worker", "app:worker"], ["stats"], ["ui"],
                                  ["job", "show", "0" * 30], ["dead", "purge", "--older-than", "7d"]])
def test_log_level_and_debug_are_accepted_after_the_subcommand_too(argv: list[str]) -> None:
    after = _parse(*argv, "--log-level", "DEBUG", "--debug")
    assert (after.log_level, after.debug) == ("DEBUG", True)
    before = _parse("--log-level", "WARNING", "--debug", *argv)
    assert (before.log_level, before.debug) == ("WARNING", True)
    assert _parse("--log-level", "WARNING", *argv, "--log-level", "ERROR").log_level == "ERROR"  # the later wins
    plain = _parse(*argv)
    assert (plain.log_level, plain.debug) == (config.log_level(), config.debug())  # the defaults stay in place


@pytest.mark.parametrize("argv, needle", [
    (["schedule", "--queue", "q", "--payload", "1"], "the following arguments are required: --at"),
    (["schedule", "--at", "2026-12-01T09:00:00", "--queue", "q", "--payload", "1"], "has no time zone"),
    (["job"], "required: ACTION"),
    (["job", "cancel"], "required: ID"),
    (["job", "show"], "one of the arguments ID --key is required"),
    (["dead", "purge"], "one of the arguments"),
    (["dead", "purge", "--older-than", "7"], "a unit is required"),
    (["dead", "list", "--limit", "0"], "from 1 to 10000"),
    (["stats", "--etcd-timeout", "nan"], "expected seconds"),
])
def test_argparse_errors_exit_2_with_zsched_prefix(argv: list[str], needle: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main(argv)
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "zsched: error:" in err and needle in err, err
