"""Handler-side recording for the peers' worker processes: one line per handler start,
``<task id> <run_at epoch s> <start epoch s>``, appended to ``$PEER_RECORD_DIR/<pid>.rec``.

Each line is one unbuffered ``os.write`` on an ``O_APPEND`` descriptor (a few µs): Celery's prefork
children and huey's workers may exit without running ``atexit`` hooks, and a line written at start
survives any way the process ends. Both clocks are this host's ``CLOCK_REALTIME`` (``time.time()``
here, the eta the producer computed from ``time.time()`` there)."""
from __future__ import annotations

import os
import time

RECORD_DIR_ENV = "PEER_RECORD_DIR"
READY_FILE_ENV = "PEER_READY_FILE"
REDIS_URL_ENV = "PEER_REDIS_URL"

_fd: int | None = None
_fd_pid = 0


def record(task_id: str, run_at: float) -> None:
    """Append (task id, run_at, now) for this process; a no-op without ``$PEER_RECORD_DIR``."""
    start = time.time()
    global _fd, _fd_pid
    pid = os.getpid()
    if _fd is None or _fd_pid != pid:  # a forked child gets its own file
        folder = os.environ.get(RECORD_DIR_ENV)
        if not folder:
            return
        _fd = os.open(os.path.join(folder, f"{pid}.rec"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _fd_pid = pid
    os.write(_fd, f"{task_id} {run_at:.6f} {start:.6f}\n".encode())


def mark_ready() -> None:
    """Create ``$PEER_READY_FILE``: the worker is consuming."""
    path = os.environ.get(READY_FILE_ENV)
    if path:
        with open(path, "w") as f:
            f.write(str(os.getpid()))
