"""A job's payload as JSON text for the job page, built without recursion.

The client accepts payloads nested about 1 000 levels deep (msgpack's unpacker stops at 1 024),
deeper than Python's recursion limit allows ``json.dumps`` (and a recursive converter) to go: a
recursive printer turned such a job page into a 500. Here an explicit stack walks the value;
containers up to :data:`PRETTY_DEPTH` levels are indented like ``json.dumps(indent=2)``, deeper
ones are written compactly on one line (indenting 1 000 levels would be megabytes of spaces).

What msgpack can decode but JSON cannot say is shown as text: bytes as ``hex:...``, an extension
type as ``ext(CODE, hex:...)``, a map key that is not a string (int, float, bool, nil, bytes) as
the JSON text of the key, anything else by its ``repr``.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import msgpack

PRETTY_DEPTH = 16  # containers nested deeper than this are printed compactly
INDENT = "  "


def _scalar(value: Any) -> str:
    """The JSON text of a value that is not a list or a map."""
    if value is None or isinstance(value, bool | int | float | str):
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(_as_text(value), ensure_ascii=False)


def _as_text(value: Any) -> str:
    if isinstance(value, bytes | bytearray | memoryview):
        return "hex:" + bytes(value).hex()
    if isinstance(value, msgpack.ExtType):
        return f"ext({value.code}, hex:{value.data.hex()})"
    if isinstance(value, datetime):
        return value.isoformat()
    return repr(value)


def _key(key: Any) -> str:
    """A map key as JSON requires it: a string (1 -> "1", true -> "true", b"k" -> "hex:6b")."""
    if isinstance(key, str):
        return json.dumps(key, ensure_ascii=False)
    if key is None or isinstance(key, bool | int | float):
        return json.dumps(json.dumps(key))
    return json.dumps(_as_text(key), ensure_ascii=False)


def _items(value: Any) -> Iterator[tuple[str | None, Any]]:
    """A container's children as (key text or None for a list item, value)."""
    if isinstance(value, dict):
        return ((_key(k), v) for k, v in value.items())
    return ((None, v) for v in value)


def _is_container(value: Any) -> bool:
    # ExtType is a namedtuple: shown as one value, not as a list of its fields
    return isinstance(value, dict | list) or (isinstance(value, tuple) and not isinstance(value, msgpack.ExtType))


def payload_text(payload: Any, pretty_depth: int = PRETTY_DEPTH) -> str:
    """``payload`` as JSON text: indented by two spaces per level down to ``pretty_depth`` levels,
    compact below; any depth (no recursion), any msgpack value (see the module docstring)."""
    out: list[str] = []
    # one frame per open container: (its children, its depth, whether it is a map, children seen)
    stack: list[tuple[Iterator[tuple[str | None, Any]], int, bool, list[int]]] = []

    def open_value(value: Any, depth: int) -> None:
        if not _is_container(value):
            out.append(_scalar(value))
            return
        is_map = isinstance(value, dict)
        if not value:
            out.append("{}" if is_map else "[]")
            return
        out.append("{" if is_map else "[")
        stack.append((_items(value), depth, is_map, [0]))

    open_value(payload, 0)
    while stack:
        children, depth, is_map, seen = stack[-1]
        pretty = depth < pretty_depth
        child = next(children, None)
        if child is None:
            stack.pop()
            out.append(("\n" + INDENT * depth if pretty else "") + ("}" if is_map else "]"))
            continue
        key, value = child
        if seen[0]:
            out.append("," if pretty else ", ")
        seen[0] += 1
        if pretty:
            out.append("\n" + INDENT * (depth + 1))
        if key is not None:
            out.append(key + ": ")
        open_value(value, depth + 1)
    return "".join(out)
