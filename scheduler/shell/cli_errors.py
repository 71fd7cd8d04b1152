"""How ``zsched`` ends: its exit codes, and the one line a known condition prints instead of a traceback.

Every subcommand (the operator commands, ``scheduler``, ``worker``, ``dev`` and whatever is added)
runs under :func:`scheduler.shell.cli.main`, which hands an exception it catches to :func:`explain`.
A known condition (a server unreachable, bad credentials, a bad URL, a TLS file missing, a port in
use, an unknown job...) becomes ``zsched: error: WHAT (HOW TO FIX)`` on stderr and its exit code;
anything else is a bug and keeps its traceback. ``zsched --debug`` prints the traceback of known
conditions too. The table is in docs/operations.md ("Exit codes and errors").
"""
from __future__ import annotations

import argparse
import errno
import signal
from collections.abc import Callable
from types import FrameType

import redis
from redis.asyncio.sentinel import MasterNotFoundError as AsyncMasterNotFoundError
from redis.sentinel import MasterNotFoundError

from ..coord import CoordinationError, CoordinatorUnavailable
from ..metrics import CannotListen, PortInUse
from ..protocol import config
from ..protocol.errors import LayoutChanged
from ..protocol.masking import mask_secrets
from ..redisio.connection import permanent_failure
from ..redisio.connectors import ClusterUnreachable
from .admin import AdminError

EXIT_OK = 0
"""Done; also a long-running command (scheduler, worker, dev) stopped by SIGTERM or SIGINT."""
EXIT_NOT_FOUND = 1
"""Unknown job or namespace, a state that does not allow the operation, or not finished."""
EXIT_BAD_INPUT = 2
"""Bad arguments or configuration: a bad URL, a value out of range, contradictory options."""
EXIT_UNAVAILABLE = 3
"""Redis or etcd cannot be reached, or refuses (bad credentials, missing permissions, paused)."""
EXIT_LOCAL = 4
"""This machine's set-up: a port in use, a TLS certificate or key file that cannot be read."""
EXIT_INTERRUPTED = 128 + signal.SIGINT
"""130: a one-shot command stopped by Ctrl-C (SIGINT)."""
EXIT_TERMINATED = 128 + signal.SIGTERM
"""143: a one-shot command stopped by SIGTERM."""


class Interrupted(KeyboardInterrupt):
    """A one-shot command was stopped by ``signum``; ``message`` (optional) says what was done so
    far and how to continue. A KeyboardInterrupt, so cleanups written for Ctrl-C run for SIGTERM too."""

    def __init__(self, signum: int = signal.SIGINT, message: str = "") -> None:
        super().__init__(message)
        self.signum = signum
        self.message = message

    @property
    def exit_code(self) -> int:
        """128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""
        return 128 + self.signum


def interrupt_on_sigterm() -> Callable[[], None]:
    """Make SIGTERM stop a one-shot command as Ctrl-C does (raise :class:`Interrupted`, so its
    cleanups run); long-running commands install their own handlers over this one. Returns the
    function that puts the previous handler back (tests run ``main()`` in-process)."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: leave signals alone
        return lambda: None

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore


def _redis_url(args: argparse.Namespace) -> str:
    """The Redis URL the command used, credentials masked ("Redis" when it cannot be told)."""
    try:
        return mask_secrets(config.redis_url(getattr(args, "redis", None)))
    except ValueError:
        return "Redis"


def _unreachable_hint(exc: redis.RedisError, url: str) -> str:
    if isinstance(exc, MasterNotFoundError | AsyncMasterNotFoundError):
        what = "are the sentinels running, and do they monitor that master name?"
    elif isinstance(exc, ClusterUnreachable):
        what = "are the cluster's nodes running there?"
    elif url.startswith("rediss"):
        what = "is redis-server running there, with TLS on that port?"
    else:
        what = "is redis-server running there?"
    return f"{what} check --redis / ZSCHED_REDIS_URL"


def _redis_error(exc: redis.RedisError, args: argparse.Namespace) -> tuple[str, int]:
    url = _redis_url(args)
    why = permanent_failure(exc)
    if why == "credentials":
        return (f"Redis at {url} refused the credentials: {exc} (fix user:password in the URL: "
                "--redis / ZSCHED_REDIS_URL, e.g. redis://USER:PASSWORD@host:6379/0)", EXIT_UNAVAILABLE)
    if why == "tls-files":
        return (f"cannot read a TLS file named in the Redis URL {url}: {exc} (check the paths in "
                "ssl_ca_certs=, ssl_certfile=, ssl_keyfile=)", EXIT_LOCAL)
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        return f"cannot reach Redis at {url}: {exc} ({_unreachable_hint(exc, url)})", EXIT_UNAVAILABLE
    # e.g. NOPERM for an ACL user, OOM, READONLY replica
    return f"Redis at {url} refused the command: {type(exc).__name__}: {exc}", EXIT_UNAVAILABLE


def explain(exc: BaseException, args: argparse.Namespace) -> tuple[str, int] | None:
    """The one-line message (without the ``zsched: error:`` prefix) and exit code of a known
    condition; None for anything else (a bug: it keeps its traceback). The message is masked
    (:func:`~scheduler.protocol.masking.mask_secrets`): a library's message may quote a URL."""
    known = _known(exc, args)
    return None if known is None else (mask_secrets(known[0]), known[1])


def _known(exc: BaseException, args: argparse.Namespace) -> tuple[str, int] | None:
    if isinstance(exc, AdminError):
        return str(exc), exc.exit_code
    if isinstance(exc, LayoutChanged):  # zsched migrate-partitions is running on this namespace
        return f"the namespace is paused: {exc}", EXIT_UNAVAILABLE
    if isinstance(exc, redis.RedisError):
        return _redis_error(exc, args)
    if isinstance(exc, CoordinatorUnavailable):  # its message names the endpoints and the fix
        return str(exc), EXIT_UNAVAILABLE
    if isinstance(exc, CoordinationError):  # e.g. etcd rejected the user: the message says which
        return f"etcd refused: {exc}", EXIT_UNAVAILABLE
    if isinstance(exc, PortInUse):
        return str(exc), EXIT_LOCAL
    if isinstance(exc, CannotListen):  # e.g. --metrics-host names an address of another machine
        return str(exc), EXIT_LOCAL
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
        return f"address already in use: {exc} (choose another port, or stop the process that has it)", EXIT_LOCAL
    if isinstance(exc, ValueError):
        # How input that parsing could not check is refused: ConfigError (--redis, --namespace, a
        # MODULE:ATTR that does not import), PayloadError, a cron expression, a file that cannot be
        # read (an etcd CA or client certificate: this machine's set-up, not a typo)
        return str(exc), EXIT_LOCAL if isinstance(exc.__cause__, OSError) else EXIT_BAD_INPUT
    return None


def describe_signal(signum: int) -> str:
    """``SIGTERM`` for 15."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def interrupted_line(exc: KeyboardInterrupt) -> tuple[str, int]:
    """The stderr line and exit code of a one-shot command stopped by a signal."""
    if isinstance(exc, Interrupted):
        what = describe_signal(exc.signum)
        return (f"zsched: interrupted by {what}" + (f": {exc.message}" if exc.message else ""), exc.exit_code)
    return "zsched: interrupted by SIGINT", EXIT_INTERRUPTED
