"""Operator output of payloads: :func:`admin.jsonable` and :func:`admin.to_json` write what
``json.dumps`` would for ordinary payloads, and payloads nested as deep as msgpack decodes (1 024
levels, past Python's recursion limit) without a RecursionError."""
from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.shell import admin

ORDINARY: list[Any] = [
    None, True, 0, -7, 2**70, 1.5, "", "é \u2028 \" \\ \n", [], {}, [[]], {"a": {}},
    {"to": "x@example.com", "n": [1, 2, {"deep": [None, False, 3.25]}], "s": "ü"},
    [{"k": [1, [2, [3, {"z": []}]]]}, "tail"],
]


@pytest.mark.parametrize("value", ORDINARY, ids=range(len(ORDINARY)))
@pytest.mark.parametrize("indent", [None, 2])
def test_to_json_writes_what_json_dumps_writes(value: Any, indent: int | None) -> None:
    assert admin.to_json(value, indent=indent) == json.dumps(value, ensure_ascii=False, indent=indent)


def test_jsonable_converts_what_json_cannot_say_and_keeps_map_order() -> None:
    when = datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    doc = admin.jsonable({"z": b"\x00\x01", 3: (1, 2), None: when, b"k": float("inf"), "a": 1})
    assert list(doc) == ["z", "3", "null", '{"$base64": "aw=="}', "a"]
    assert doc == {"z": {"$base64": "AAE="}, "3": [1, 2], "null": "2026-12-01T08:00:00.000Z",
                   '{"$base64": "aw=="}': "inf", "a": 1}


def nested(depth: int) -> Any:
    value: Any = "the bottom"
    for i in range(depth):
        value = [value] if i % 2 else {f"k{i}": value}
    return value


@pytest.mark.parametrize("indent", [None, 2])
def test_a_payload_nested_1024_levels_is_written_without_recursion(indent: int | None) -> None:
    deep = nested(1024)
    with pytest.raises(RecursionError):
        json.dumps(deep)  # why to_json exists
    text = admin.to_json(admin.jsonable(deep), indent=indent)
    assert text.count("[") == 512 and text.count("{") == 512
    assert '[{"k0": "the bottom"}]' in text, "the deep end is compact"
    if indent is not None:  # the first PRETTY_DEPTH levels are indented, the rest on one line
        lines = text.splitlines()
        assert len(lines) == 2 * admin.output.PRETTY_DEPTH + 1
        assert lines[:3] == ["[", "  {", '    "k1022": ['] and lines[-1] == "]"
