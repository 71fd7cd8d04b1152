"""The status codes of the scripts (scheduler/protocol/codes.py) against the scripts' own headers,
and what the client makes of them (Outcome)."""
from __future__ import annotations

import re
from enum import IntEnum
from pathlib import Path

import pytest

from scheduler import Outcome
from scheduler.protocol.codes import (
    AckCode,
    CancelCode,
    CronFillCode,
    CronRemoveCode,
    EpochResetCode,
    FailCode,
    FailKind,
    PurgeCode,
    ReleaseCode,
    RequeueCode,
    RescheduleCode,
    cancel_outcome,
    code_of,
    cron_pause_status,
    cron_removed,
    purge_outcome,
    requeue_outcomes,
    reschedule_outcome,
)
from scheduler.protocol.errors import ScriptError
from scheduler.protocol.models import JobState

LUA = Path(__file__).resolve().parents[2] / "lua"


def returns_paragraph(script: str) -> str:
    """The ``Returns:`` part of a script's header (up to the next header field)."""
    lines = (LUA / f"{script}.lua").read_text().splitlines()
    out: list[str] = []
    for line in lines:
        if not line.startswith("--"):
            break
        text = line[2:].strip()
        if text.startswith("Returns:"):
            out.append(text)
        elif out and re.match(r"^[A-Z][a-z ]+:", text):
            break
        elif out:
            out.append(text)
    assert out, f"lua/{script}.lua has no Returns: line"
    return " ".join(out)


@pytest.mark.parametrize("script,enum", [
    ("cancel", CancelCode), ("reschedule", RescheduleCode), ("requeue", RequeueCode),
    ("cron_remove", CronRemoveCode), ("ack", AckCode), ("release", ReleaseCode), ("fail", FailCode),
    ("epoch_reset", EpochResetCode), ("cron_fill", CronFillCode),
])
def test_every_code_a_script_returns_has_a_member_and_no_member_is_made_up(script: str, enum: type[IntEnum]) -> None:
    numbers = {int(n) for n in re.findall(r"(?<![\w.-])-?\d+(?![\w.])", returns_paragraph(script))}
    assert numbers == {m.value for m in enum}, f"lua/{script}.lua returns {numbers}; {enum.__name__} says otherwise"


def test_failure_kinds_are_the_bytes_fail_lua_reads() -> None:
    header = (LUA / "fail.lua").read_text().split("\nlocal", 1)[0]
    described = re.search(r"kind: (.*?) delay_ms:", header, re.S)
    assert described, "lua/fail.lua no longer describes its kinds"
    kinds = set(re.findall(r"'([a-z])' ", described.group(1)))
    assert kinds == {k.value.decode() for k in FailKind}
    assert FailKind.FAILED == b"f" and isinstance(FailKind.RETRY, bytes)
    assert FailKind(b"p") is FailKind.PERMANENT


def test_only_done_is_truthy_and_every_outcome_explains_itself() -> None:
    assert [o for o in Outcome if o] == [Outcome.DONE]
    for o in Outcome:
        assert o.message and isinstance(o.message, str)
    assert Outcome.RUNNING.state is JobState.RUNNING and Outcome.DEAD.state is JobState.DEAD
    assert Outcome.NOT_FOUND.state is None and Outcome.DONE.state is None


@pytest.mark.parametrize("reply,outcome", [
    (1, Outcome.DONE), (0, Outcome.NOT_FOUND), (-1, Outcome.RUNNING), (-2, Outcome.DEAD),
    (-3, Outcome.CRON_OCCURRENCE), (b"1", Outcome.DONE),
])
def test_cancel_replies(reply: object, outcome: Outcome) -> None:
    assert cancel_outcome(reply) is outcome


def test_reschedule_requeue_purge_cron_remove_and_cron_pause_replies() -> None:
    assert [reschedule_outcome(c) for c in (1, 0, -1, -2)] == [
        Outcome.DONE, Outcome.NOT_FOUND, Outcome.RUNNING, Outcome.DEAD]
    assert requeue_outcomes([1, 0, 1]) == [Outcome.DONE, Outcome.NOT_DEAD, Outcome.DONE]
    assert purge_outcome(1) is Outcome.DONE and purge_outcome(0) is Outcome.NOT_DEAD
    assert cron_removed(1) is Outcome.DONE and cron_removed(0) is Outcome.NO_CRON
    assert [cron_pause_status([c]) for c in (1, 0, -1)] == [Outcome.DONE, Outcome.UNCHANGED, Outcome.NO_CRON]
    assert [bool(o) for o in Outcome] == [o is Outcome.DONE for o in Outcome], "truthy only when done"
    assert code_of(PurgeCode, 1, "purge") is PurgeCode.PURGED


@pytest.mark.parametrize("call,reply", [
    (cancel_outcome, -4), (reschedule_outcome, -3), (purge_outcome, 2), (cron_removed, None),
    (reschedule_outcome, b"x"),
])
def test_a_code_no_script_returns_is_a_script_error(call: object, reply: object) -> None:
    with pytest.raises(ScriptError, match="none of its codes"):
        call(reply)  # type: ignore[operator]
