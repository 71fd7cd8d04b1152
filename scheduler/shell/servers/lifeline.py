"""Our own child processes stop when the process that started them is gone, however it ended
(SIGKILL included): the parent side, :class:`Lifeline`, and the child side, :func:`watch_lifeline`.

The parent keeps the write end of a pipe and hands the read end to each child (``ZschedProc(...,
lifeline=...)``). Nothing is ever written: the child's read returns only at end of file, which the
kernel signals once no process holds the write end, that is once the parent has exited. The child
then sends itself SIGTERM, so it stops as it does on any SIGTERM (a worker hands its running jobs
back, a replica releases its etcd lease), and SIGKILL if it is still there ``grace`` s later: with
its parent gone nobody else would.

Why a pipe rather than the kernel's parent-death signal (``PR_SET_PDEATHSIG``, which the servers
get through ``die_with_parent()``): that signal fires when the *thread* that forked the child exits,
not the process, so children started from a launcher thread would be stopped early; it must be set
in the child between fork and exec (``preexec_fn`` is unsafe in a process with threads); and a
parent that dies before the child has set it is missed. A pipe has none of these limits: a child
that starts watching after its parent died reads end of file at once.

The write end is not inheritable (PEP 446), so other children never hold it; a process that forks
without exec (``multiprocessing``'s fork start method) would, and would delay the end of file
until it exits too.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import threading
import time
from collections.abc import MutableMapping

ENV = "ZSCHED_LIFELINE"  # "FD GRACE": the read end's descriptor number and the seconds before SIGKILL

log = logging.getLogger("zsched.lifeline")


class Lifeline:
    """The parent side: one pipe for all the children of this process. Children get
    :meth:`env` in their environment and :attr:`fds` in ``pass_fds``."""

    def __init__(self, grace: float) -> None:
        if not grace > 0:
            raise ValueError(f"grace must be > 0 seconds, got {grace!r}")
        self.grace = grace
        self._read, self._write = os.pipe()  # neither inheritable: pass_fds makes the read end so in the child

    @property
    def fds(self) -> tuple[int]:
        """The descriptor a child must inherit (``Popen(pass_fds=...)``)."""
        return (self._read,)

    def env(self) -> dict[str, str]:
        """What a child needs in its environment to watch the lifeline."""
        return {ENV: f"{self._read} {self.grace:g}"}

    def close(self) -> None:
        """Close both ends: children started with it stop (as if this process had exited)."""
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass


def watch_lifeline(environ: MutableMapping[str, str] = os.environ) -> bool:
    """In a child started with a :class:`Lifeline`: watch it from a daemon thread; True if so.

    Takes the variable out of ``environ``, so this process's own children do not watch a
    descriptor number that means nothing to them. A malformed value is logged and ignored."""
    spec = environ.pop(ENV, None)
    if spec is None:
        return False
    try:
        fd_text, grace_text = spec.split()
        fd, grace = int(fd_text), float(grace_text)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode) or not grace > 0:
            raise ValueError("not a pipe and a grace > 0")
        os.set_inheritable(fd, False)
    except (ValueError, OSError) as exc:
        log.warning("ignoring %s=%r (%s): this process will not stop by itself when its parent exits", ENV, spec, exc)
        return False
    threading.Thread(target=_watch, args=(fd, grace), name="lifeline", daemon=True).start()
    return True


def _watch(fd: int, grace: float) -> None:
    try:
        while os.read(fd, 4096):
            pass  # nobody writes; end of file is the only news
    except OSError as exc:  # the descriptor was closed under us: no longer a lifeline
        log.warning("lifeline unreadable (%s); no longer watching the parent", exc)
        return
    log.warning("the process that started this one is gone; stopping (SIGTERM, SIGKILL in %g s)", grace)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace)  # a daemon thread: a process that stops in time never gets here
    log.error("still running %g s after its parent exited; SIGKILL", grace)
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)
