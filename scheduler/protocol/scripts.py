"""Lua script loader: reads ``lua/*.lua`` from the installed package and prepends the library
helpers each script uses. Scripts are run by :mod:`scheduler.redisio.transport` (EVALSHA, with
NOSCRIPT recovery and retries).

Linking is explicit: each script's header names the library definitions it uses on a ``-- Uses:``
line (helpers, constants, key names; wrapped onto indented comment lines), and the loader takes
those, with what they use in turn, into the script. The line is checked against the code: a
script that uses a library name its header does not list, or lists one it does not use, fails to
load with a message naming both (:func:`check_uses`), so the header cannot drift. A script that
Python sends again after a lost reply with a flag set says where the flag is on a
``-- Re-send flag: ARGV[N]`` line (:func:`resend_flag_args`), which the transport reads instead of
keeping the offset in a literal."""
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


USES_TAG = "-- Uses:"
RESEND_TAG = re.compile(r"^-- Re-send flag: ARGV\[(\d+)\]")
_CONTINUED = re.compile(r"^--\s{3,}([A-Za-z_][A-Za-z0-9_]*(?:,\s*[A-Za-z_][A-Za-z0-9_]*)*,?)\s*$")


@dataclass(frozen=True)
class Script:
    """One script as sent to Redis: its name, assembled source and SHA1 (the EVALSHA handle)."""

    name: str
    source: str
    sha: str


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFINES = re.compile(r"^local\s+(?:function\s+([A-Za-z_][A-Za-z0-9_]*)|([A-Za-z_][A-Za-z0-9_, ]*?)\s*=)")


@lru_cache(maxsize=4)
def library_definitions(lib: str) -> tuple[tuple[frozenset[str], str], ...]:
    """Split the library into top-level definitions (with the comments above them), each with the
    names it defines (kept: every script's assembly splits the same library)."""
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
    return tuple((frozenset(names), "\n".join(lines)) for names, lines in chunks)


def _code_of(line: str) -> str:
    """``line`` without its comment (``--`` to the end of the line, outside a quoted string)."""
    # Fast paths (most lines): no "--" at all, or none of the quotes before the first one. The
    # character walk below is what made loading the scripts cost 0.2 s of CPU in every process.
    first = line.find("--")
    if first < 0:
        return line
    if "'" not in line[:first] and '"' not in line[:first]:
        return line[:first]
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


def names_used(text: str) -> set[str]:
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


@lru_cache(maxsize=256)
def chunk_names(chunk: str) -> frozenset[str]:
    """:func:`names_used` of one library definition, kept: every script's assembly asks again."""
    return frozenset(names_used(chunk))


def _needed(chunks: tuple[tuple[frozenset[str], str], ...], text: str, roots: set[str] | None = None) -> set[int]:
    """The library chunks ``text`` uses (or the names ``roots``), with what they use, transitively."""
    needed = set(roots) if roots is not None else names_used(text)
    keep: set[int] = set()
    changed = True
    while changed:
        changed = False
        for i, (names, chunk) in enumerate(chunks):
            if i not in keep and names & needed:
                keep.add(i)
                needed |= chunk_names(chunk)
                changed = True
    return keep


def declared_uses(body: str) -> set[str] | None:
    """The names on a script's ``-- Uses:`` line and its indented continuation lines, or None
    when it has none."""
    lines = body.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith(USES_TAG):
            continue
        text = line[len(USES_TAG):]
        for more in lines[i + 1:]:
            m = _CONTINUED.match(more)
            if not m:
                break
            text += "," + m.group(1)
        return {n.strip() for n in text.split(",") if n.strip()}
    return None


def library_names(lib: str) -> set[str]:
    """Every name the library defines at top level."""
    return set().union(*(names for names, _ in library_definitions(lib)))


def check_uses(name: str, lib: str, body: str) -> set[str]:
    """The library names script ``name`` declares on its ``-- Uses:`` line, checked against those
    its code uses (comments left out): a ValueError names the script, what it uses but does not
    declare, and what it declares but does not use (or the library does not define)."""
    declared = declared_uses(body)
    if declared is None:
        raise ValueError(f"lua/{name}.lua has no '{USES_TAG}' line naming the library definitions it uses")
    defined = library_names(lib)
    used = names_used(body) & defined
    missing, extra = used - declared, declared - used
    if missing or extra:
        raise ValueError(f"lua/{name}.lua: its '{USES_TAG}' line does not match its code: used but not listed "
                         f"{sorted(missing)}, listed but not used {sorted(extra)} (the library defines "
                         f"{len(defined)} names in {', '.join(LIBRARY)})")
    return declared


def restate_uses(lib: str, body: str) -> str:
    """``body`` with its ``-- Uses:`` line (and continuation lines) replaced by one naming the
    library names its code uses now: for a variant a tool derives from a script (the general path
    alone of ``bench.script_cost.general_only``), whose code no longer uses all the original's."""
    lines = body.splitlines(keepends=True)
    out: list[str] = []
    skipping = False
    for line in lines:
        if line.startswith(USES_TAG):
            skipping = True
            continue
        if skipping and _CONTINUED.match(line):
            continue
        skipping = False
        out.append(line)
    used = sorted(names_used("".join(out)) & library_names(lib))
    return f"{USES_TAG} {', '.join(used)}\n" + "".join(out)


def resend_flag_args() -> dict[str, int]:
    """Per script with a ``-- Re-send flag: ARGV[N]`` header line: the 0-based index of that flag
    in the call's arguments (``N - 1``), which :func:`~.batch.mark_resend` sets to 1."""
    out: dict[str, int] = {}
    for name in SCRIPT_NAMES:
        for line in script_source(name).splitlines():
            m = RESEND_TAG.match(line)
            if m:
                out[name] = int(m.group(1)) - 1
    return out


def assemble(lib: str, body: str, uses: set[str] | None = None) -> str:
    """The script as sent to Redis: only the library definitions the body needs (``uses``, its
    header's declared names, else those its code names; with what they use in turn), in
    library order, then the body. Redis runs the whole chunk on every call, so unused helpers would
    cost every EVALSHA a few microseconds. A body with a :data:`LIBRARY_MARKER` line gets the
    definitions at that line, except those the lines before it use: those come first."""
    chunks = library_definitions(lib)
    prelude = ""
    lines = body.splitlines(keepends=True)
    marks = [i for i, line in enumerate(lines) if line.strip() == LIBRARY_MARKER]
    if len(marks) > 1:
        raise ValueError(f"a script may have one {LIBRARY_MARKER} line, this one has {len(marks)}")
    if marks:
        prelude, body = "".join(lines[:marks[0]]), "".join(lines[marks[0] + 1:])
    early = _needed(chunks, prelude)
    late = _needed(chunks, prelude + body, uses) - early
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
    """``body`` assembled with ``lib`` (its ``-- Uses:`` line checked), without comments, with its
    SHA1. Its first line names it (``SCRIPT``): the argument checks of lua/_lib.lua say which script refused a call."""
    if not _IDENT.fullmatch(name):
        raise ValueError(f"script name {name!r} is not an identifier")
    src = strip_comments(f"local SCRIPT = '{name}'\n" + assemble(lib, body, check_uses(name, lib, body)))
    return Script(name, src, hashlib.sha1(src.encode("utf-8")).hexdigest())


@lru_cache(maxsize=1)
def load_scripts() -> dict[str, Script]:
    """All scripts, read once from the package data (``scheduler.lua``)."""
    lib = library_source()
    return {name: make_script(name, lib, script_source(name)) for name in SCRIPT_NAMES}
