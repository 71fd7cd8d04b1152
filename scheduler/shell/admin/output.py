"""How operator output looks: times, durations, JSON-safe payloads, the JSON documents of jobs and
stats, and aligned text tables."""
from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from ...protocol.models import JobError, JobInfo


def error_text(err: JobError | None) -> str:
    """The whole last error as one string: ``type: message`` then the traceback."""
    if err is None:
        return ""
    return f"{err}\n{err.traceback}" if err.traceback else str(err)


ERROR_LINE_WIDTH = 160  # characters of a last error a one-line summary keeps


def error_line(err: JobError | None, width: int = ERROR_LINE_WIDTH) -> str:
    """A last error as one line for a listing: ``type: `` and the message's first line, cut to
    ``width`` characters (the whole error, with its traceback, is on the job's own page)."""
    return "" if err is None else first_line(str(err), width)


def first_line(text: str, width: int | None = None) -> str:
    """The first line of ``text``, cut to ``width`` characters with ``...``."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if width is not None and len(line) > width:
        line = line[: width - 3] + "..."
    return line



def iso(value: datetime | int | float | None) -> str | None:
    """UTC ISO-8601 with milliseconds and ``Z``; accepts a datetime or epoch ms."""
    if value is None:
        return None
    dt = value if isinstance(value, datetime) else datetime.fromtimestamp(value / 1000.0, tz=UTC)
    return dt.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def human_span(seconds: float) -> str:
    """A length of time in its two largest units: ``3h59m``, ``2m10s``, ``0s``."""
    s = abs(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            n = int(s // size)
            parts.append(f"{n}{unit}")
            s -= n * size
        if len(parts) == 2:
            break
    return "".join(parts) or "0s"


def human_delta(seconds: float) -> str:
    """``in 3h59m`` / ``2m10s ago`` / ``now``."""
    if abs(seconds) < 1:
        return "now"
    text = human_span(seconds)
    return f"in {text}" if seconds > 0 else f"{text} ago"


def _json_key(key: Any) -> str:
    """A map key as JSON wants it: a string (ints, floats and bools by ``str``, other keys as the
    JSON text of their :func:`jsonable` form)."""
    if isinstance(key, str):
        return key
    if isinstance(key, int | float | bool):
        return str(key)
    return to_json(jsonable(key))


def _json_scalar(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$base64": base64.b64encode(bytes(value)).decode()}
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def jsonable(value: Any) -> Any:
    """Make a payload JSON-safe: bytes become ``{"$base64": ...}``, datetimes ISO strings, map keys
    strings, tuples lists. Iterative: a payload may nest as deep as msgpack decodes (1 024 levels),
    past Python's recursion limit."""
    root: list[Any] = [None]
    todo: list[tuple[Any, Any, Any]] = [(value, root, 0)]  # (value, container, slot to fill)
    while todo:
        item, parent, slot = todo.pop()
        if isinstance(item, dict):
            out: dict[str, Any] = {}
            for k, v in item.items():
                key = _json_key(k)
                out[key] = None  # the slot keeps the map's order; filled below
                todo.append((v, out, key))
            parent[slot] = out
        elif isinstance(item, list | tuple):
            seq: list[Any] = [None] * len(item)
            todo.extend((v, seq, i) for i, v in enumerate(item))
            parent[slot] = seq
        else:
            parent[slot] = _json_scalar(item)
    return root[0]


PRETTY_DEPTH = 16  # to_json(indent=...) writes containers nested deeper than this on one line


def to_json(doc: Any, indent: int | None = None) -> str:
    """``json.dumps(doc, ensure_ascii=False, indent=indent)`` for a :func:`jsonable` document, without
    recursion (``json`` gives up past Python's recursion limit, about 1 000 levels). With ``indent``,
    containers deeper than :data:`PRETTY_DEPTH` are written compactly (indenting 1 000 levels would
    be megabytes of spaces)."""
    out: list[str] = []
    # frames: [iterator over the container's items, closing bracket, depth of its items, items written, is a map]
    stack: list[list[Any]] = []

    def value(v: Any, depth: int) -> None:
        if isinstance(v, dict | list) and not v:
            out.append("{}" if isinstance(v, dict) else "[]")
        elif isinstance(v, dict):
            out.append("{")
            stack.append([iter(v.items()), "}", depth + 1, 0, True])
        elif isinstance(v, list):
            out.append("[")
            stack.append([iter(v), "]", depth + 1, 0, False])
        else:
            out.append(json.dumps(v, ensure_ascii=False))

    value(doc, 0)
    while stack:
        frame = stack[-1]
        items, close, depth, written, is_map = frame
        pretty = indent is not None and depth <= PRETTY_DEPTH
        item: Any = next(items, _END)
        if item is _END:
            stack.pop()
            out.append(("\n" + " " * (indent * (depth - 1)) if pretty and indent is not None else "") + close)
            continue
        if written:
            out.append("," if pretty else ", ")
        frame[3] = written + 1
        if pretty and indent is not None:
            out.append("\n" + " " * (indent * depth))
        if is_map:
            out.append(json.dumps(item[0], ensure_ascii=False) + ": ")
            item = item[1]
        value(item, depth)
    return "".join(out)


_END = object()


def error_doc(err: JobError | None) -> dict[str, Any] | None:
    if err is None:
        return None
    return {"at": iso(err.at), "type": err.type, "message": err.message, "traceback": err.traceback}


def job_doc(info: JobInfo) -> dict[str, Any]:
    """A job as a JSON-ready dict (``zsched job show --json``)."""
    return {
        "id": info.id, "state": info.state.value, "queue": info.queue, "key": info.key,
        "run_at": iso(info.run_at), "attempts": info.attempts, "max_attempts": info.max_attempts,
        "created": iso(info.created), "lease_deadline": iso(info.lease_deadline), "fence": info.fence,
        "died_at": iso(info.died_at), "finished_at": iso(info.finished_at), "expires_at": iso(info.expires_at),
        "last_error": error_doc(info.last_error), "payload": jsonable(info.payload),
    }


def job_row_doc(info: JobInfo) -> dict[str, Any]:
    """A job as one row of ``zsched job list --json``: every field of :func:`job_doc` but the
    payload and the traceback."""
    doc = job_doc(info)
    del doc["payload"]
    if doc["last_error"] is not None:
        del doc["last_error"]["traceback"]
    return doc


def dead_row_doc(info: JobInfo) -> dict[str, Any]:
    """A dead job as one row of a listing (``zsched dead list --json``)."""
    return {"id": info.id, "queue": info.queue, "attempts": info.attempts, "max_attempts": info.max_attempts,
            "died_at": iso(info.died_at), "error_type": info.last_error.type if info.last_error else None,
            "error": first_line(str(info.last_error)) if info.last_error else None}


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], *, right: Iterable[int] = ()) -> str:
    """An aligned text table: columns separated by two spaces, ``right`` columns right-aligned,
    the last column not padded."""
    cells = [[("-" if c is None else str(c)) for c in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], len(c))
    ralign = set(right)

    def fmt(row: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(row):
            if i == len(row) - 1 and i not in ralign:
                out.append(c)
            else:
                out.append(c.rjust(widths[i]) if i in ralign else c.ljust(widths[i]))
        return "  ".join(out).rstrip()

    return "\n".join([fmt(list(headers))] + [fmt(r) for r in cells])
