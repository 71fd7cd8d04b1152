"""``zsched dev``'s data directory (``--home``, default ``./.zsched``) from one run to the next.

The servers ``zsched dev`` starts keep their data there (``redis/``, ``etcd/``; its children's
logs in ``logs/``), so a run continues with the jobs of the one before: :func:`has_data` tells the
run to say so, and ``--reset`` (:func:`reset`) removes those three directories first, and nothing
else: not the directory itself, not a file or directory of another name in it, not the target of
a symbolic link. ``zsched dev`` checks first that no process of another run still writes there
(:func:`scheduler.shell.dev_guard.survivors`), so a run in progress is never wiped.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

SERVER_DIRS = ("redis", "etcd")  # the data of the servers zsched dev starts
DATA_DIRS = (*SERVER_DIRS, "logs")  # every name zsched dev writes under --home: what --reset removes


def has_data(home: Path) -> bool:
    """True if a server of an earlier run left files in ``home`` (redis-server's or etcd's)."""
    for name in SERVER_DIRS:
        d = home / name
        try:
            if d.is_dir() and not d.is_symlink() and any(d.iterdir()):
                return True
        except OSError:  # unreadable: the server will say so when it starts
            continue
    return False


def reset(home: Path) -> list[str]:
    """Remove :data:`DATA_DIRS` under ``home`` (a symbolic link by that name is unlinked, its
    target left alone); the names removed, in order."""
    removed = []
    for name in DATA_DIRS:
        d = home / name
        if d.is_symlink() or d.is_file():
            d.unlink()
        elif d.is_dir():
            shutil.rmtree(d)
        else:
            continue
        removed.append(name)
    return removed


def shown(home: Path) -> str:
    """``home`` as the user would write it: ``./.zsched`` under the working directory, else absolute."""
    try:
        rel = home.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return str(home.resolve())
    return "." if rel == Path(".") else f".{os.sep}{rel}"
