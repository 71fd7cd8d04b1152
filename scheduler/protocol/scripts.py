"""Lua script loader: reads ``lua/*.lua`` from the installed package and prepends the library
helpers each script uses. Scripts are run by :mod:`scheduler.protocol.transport` (EVALSHA, with
NOSCRIPT recovery and retries)."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

SCRIPT_NAMES = (
    "schedule", "tick", "claim", "ack", "fail", "extend", "release", "reap",
    "cancel", "reschedule", "requeue", "purge", "inspect", "stats", "dead_list", "ratelimit",
    "cron_set", "cron_remove", "cron_fill", "epoch_reset", "list", "migrate_out", "migrate_in",
    "pause", "resume", "cron_pause", "cron_resume", "registry_beat", "registry_leave", "registry_read",
)


# The helper library, in definition order (a helper is defined before the helpers that use it).
LIBRARY = ("_lib_args.lua", "_lib.lua", "_lib_finish.lua", "_lib_cron.lua")


@dataclass(frozen=True)
class Script:
    """One script as sent to Redis: its name, assembled source and SHA1 (the EVALSHA handle)."""

    name: str
    source: str
    sha: str


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFINES = re.compile(r"^local\s+(?:function\s+([A-Za-z_][A-Za-z0-9_]*)|([A-Za-z_][A-Za-z0-9_, ]*?)\s*=)")


def _lib_chunks(lib: str) -> list[tuple[set[str], str]]:
    """Split the library into top-level definitions (with the comments above them), each with the
    names it defines."""
    chunks: list[tuple[set[str], list[str]]] = []
    pending: list[str] = []
    for line in lib.splitlines():
        m = _DEFINES.match(line)
        if m:
            names = {m.group(1)} if m.group(1) else {n.strip() for n in m.group(2).split(",")}
            chunks.append((names, pending + [line]))
            pending = []
        elif chunks and (line.startswith((" ", "\t", "end")) or (line.strip() and not line.startswith("--"))):
            chunks[-1][1].append(line)
        else:
            pending.append(line)
    return [(names, "\n".join(lines)) for names, lines in chunks]


def _code_of(line: str) -> str:
    """``line`` without its comment (``--`` to the end of the line, outside a quoted string)."""
    quote = ""
    i = 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif line.startswith("--", i):
            return line[:i]
        i += 1
    return line


def _names_used(text: str) -> set[str]:
    """The identifiers ``text`` uses in code: comments are left out, so a helper named in a comment
    is not pulled in. (Measured: the comments of the tombstone helpers pulled queue retirement and
    a 15-string table into every script that writes tombstones, ``schedule`` among them.)"""
    names: set[str] = set()
    for line in text.splitlines():
        names.update(_IDENT.findall(_code_of(line)))
    return names


def strip_comments(text: str) -> str:
    """``text`` without comments and blank lines: what Redis keeps in its script cache for every
    loaded script (the files' comments are most of their bytes; measured: 284 KB of source for all
    scripts with them). Lua's error messages then cite lines of this text, not of the files; the
    scripts' own errors carry their own words (``zsched: ...``) and need no line."""
    out = []
    for line in text.splitlines():
        code = _code_of(line).rstrip()
        if code.strip():
            out.append(code)
    return "\n".join(out) + "\n"


LIBRARY_MARKER = "--@library"
"""A line of a script's own: the library's definitions go there instead of at the top. What comes
before it (a fast path that returns early, as in lua/schedule.lua) runs before Redis builds the
helper closures it does not use itself: the few it uses (and what they use) go above it."""


def _needed(chunks: list[tuple[set[str], str]], text: str) -> set[int]:
    """The library chunks ``text`` uses, transitively."""
    needed = _names_used(text)
    keep: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, (names, chunk) in enumerate(chunks):
            if i not in keep and names & needed:
                keep.add(i)
                needed |= _names_used(chunk)
                changed = True
    return keep


def assemble(lib: str, body: str) -> str:
    """The script as sent to Redis: only the library definitions the body needs (transitively), in
    library order, then the body. Redis runs the whole chunk on every call, so unused helpers would
    cost every EVALSHA a few microseconds. A body with a :data:`LIBRARY_MARKER` line gets the
    definitions at that line, except those the lines before it use: those come first."""
    chunks = _lib_chunks(lib)
    prelude = ""
    lines = body.splitlines(keepends=True)
    marks = [i for i, line in enumerate(lines) if line.strip() == LIBRARY_MARKER]
    if len(marks) > 1:
        raise ValueError(f"a script may have one {LIBRARY_MARKER} line, this one has {len(marks)}")
    if marks:
        prelude, body = "".join(lines[:marks[0]]), "".join(lines[marks[0] + 1:])
    early = _needed(chunks, prelude)
    late = _needed(chunks, prelude + body) - early
    first = [text for i, (_, text) in enumerate(chunks) if i in early]
    parts = [text for i, (_, text) in enumerate(chunks) if i in late]
    return "".join(t + "\n" for t in first) + prelude + "\n".join(parts) + "\n" + body


def library_source() -> str:
    """The helper library's text: :data:`LIBRARY`'s files, in order, as one."""
    pkg = resources.files("scheduler.lua")
    return "".join(pkg.joinpath(name).read_text("utf-8").rstrip("\n") + "\n" for name in LIBRARY)


def script_source(name: str) -> str:
    """One script's own text (``lua/NAME.lua``), before :func:`assemble`."""
    return resources.files("scheduler.lua").joinpath(f"{name}.lua").read_text("utf-8")


def make_script(name: str, lib: str, body: str) -> Script:
    """``body`` assembled with ``lib``, without comments, with its SHA1. Its first line names it
    (``SCRIPT``): the argument checks of lua/_lib.lua say which script refused a call."""
    if not _IDENT.fullmatch(name):
        raise ValueError(f"script name {name!r} is not an identifier")
    src = strip_comments(f"local SCRIPT = '{name}'\n" + assemble(lib, body))
    return Script(name, src, hashlib.sha1(src.encode("utf-8")).hexdigest())


@lru_cache(maxsize=1)
def load_scripts() -> dict[str, Script]:
    """All scripts, read once from the package data (``scheduler.lua``)."""
    lib = library_source()
    return {name: make_script(name, lib, script_source(name)) for name in SCRIPT_NAMES}
