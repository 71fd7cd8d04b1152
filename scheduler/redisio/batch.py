"""Script calls in flight: what a call is, which calls may be sent twice, how a batch of calls is
tracked across NOSCRIPT reloads, refusals, redirects and re-sends, and how long retries go on.

The transports (:mod:`.transport`) move batches over connections; this module holds the rules
they share, for one server and for a cluster alike.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.exceptions import (
    AskError,
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    MasterDownError,
    MovedError,
    NoScriptError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TimeoutError,
    TryAgainError,
)

from ..protocol.call import Call
from ..protocol.codes import script_error
from ..protocol.errors import ZschedError
from ..protocol.scripts import Script, resend_flag_args

_T = TypeVar("_T")

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:  # redis[hiredis] is a dependency; its C packer is what the hot paths use
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover
    _hiredis_pack = None


def pack(conn: Any, cmds: list[tuple[Any, ...]]) -> Any:
    """Commands as one buffer. hiredis's packer: redis-py's own ``pack_commands`` converts every
    argument in Python first, which measured as most of the worker's CPU per claim/ack round trip."""
    if _hiredis_pack is None:
        return conn.pack_commands(cmds)
    return [b"".join([_hiredis_pack(c) for c in cmds])]


def evalsha(scripts: dict[str, Script], call: Call) -> tuple[Any, ...]:
    """The ``EVALSHA`` command of ``call`` (its script's SHA1 from ``scripts``)."""
    name, keys, args = call
    return ("EVALSHA", scripts[name].sha, len(keys), *keys, *args)


# -- retry safety -------------------------------------------------------------------------------
# What happens when a script call is sent twice (the first reply was lost):
#   "safe": the second run finds the first one's result and changes nothing it should not
#           (fenced by a lease token or an epoch, or naturally idempotent). Its *reply* may differ
#           (e.g. ack returns 0 "refused" for a job the first run acked).
#   "flag": safe when re-sent with the script's re-send flag (an ARGV position, 0-based in args)
#           set to 1; the first send leaves it 0 so the common path pays nothing for the check.
RESEND: dict[str, str] = {
    "schedule": "flag",     # creates a job only if its id is new (the id is made by the client)
    "tick": "safe",         # fenced by the epoch; a second tick finds fewer due timers
    "reap": "safe",         # fenced by the epoch; only expired leases are reaped
    "claim": "safe",        # never hands out a job that is already running; a lost reply strands
                            # its jobs until their lease expires (then they are reaped)
    "ack": "safe", "fail": "safe", "extend": "safe", "release": "safe",  # fenced by the lease token
    "cancel": "safe", "reschedule": "safe", "requeue": "safe", "purge": "safe",
    "inspect": "safe", "stats": "safe", "dead_list": "safe", "list": "safe",  # read-only
    "ratelimit": "safe",    # a lost reply spends tokens nobody uses: the queue runs a bit slow once
    "cron_set": "safe", "cron_remove": "safe",
    "cron_fill": "safe",    # versioned: a second fill of the same version is ignored
    "epoch_reset": "safe",  # compare-and-set
    "migrate_out": "safe",  # a call that moves nothing new returns the outbox it already filled
    "migrate_in": "flag",   # with its check flag, skips entries whose job or cron is already there
    "pause": "safe", "resume": "safe",  # set / delete a flag; a second run finds it done
    "cron_pause": "safe",   # a paused cron is left as it is
    "cron_resume": "safe",  # acts only on a paused cron: a second run finds it resumed
    # the worker registry: a second beat rewrites the record with a later clock, a second leave
    # finds nothing, a second read prunes what the first left
    "registry_beat": "safe", "registry_leave": "safe", "registry_read": "safe",
}
# Per "flag" script, the 0-based index into its args (ARGV[index + 1]) of the flag that
# mark_resend sets: read from the script's own "-- Re-send flag: ARGV[N]" header line.
RESEND_FLAG: dict[str, int] = resend_flag_args()

# Error replies that mean the command was not executed: safe to send again after a pause.
# NOREPLICAS (min-replicas-to-write not met) is raised at a script's first write, before it wrote.
_NOT_RUN = ("LOADING", "BUSY ", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS")
# redis-py turns some of those replies into exception classes and strips the code from the message
_NOT_RUN_TYPES = (BusyLoadingError, MasterDownError, ReadOnlyError, TryAgainError, ClusterDownError)
TRANSIENT = (ConnectionError, TimeoutError, OSError)
# MOVED redirects followed in one call before they count as a failed attempt: a resharding moves a
# slot once; a loop of redirects means the slot map is still settling
MAX_REDIRECTS = 16


@dataclass(frozen=True)
class RedisRetry:
    """How long and how often a round trip to Redis is retried after a transient failure (a
    connection error, a timeout, a reply meaning "not run"). Not a job's retry: a handler asks
    for that with ``workers.Retry``, and a job's own backoff is a :class:`~.options.JobOptions`.

    Delays are full jitter: uniform in [0, min(cap, base * 2**n)], so clients that failed together
    come back spread out. ``budget`` bounds the total time spent retrying (the call then raises
    the last error); ``attempts`` bounds the number of tries (1 = no retry)."""

    budget: float = 10.0
    attempts: int = 30
    base: float = 0.025
    cap: float = 1.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.budget < 0 or self.base <= 0 or self.cap < self.base:
            raise ValueError(f"invalid RedisRetry {self!r}: need attempts >= 1, budget >= 0, 0 < base <= cap")

    def delays(self) -> Iterator[float]:
        """Sleep before each retry; ends when the attempts or the time budget are spent."""
        deadline = time.monotonic() + self.budget
        for n in range(self.attempts - 1):
            d = random.uniform(0, min(self.cap, self.base * 2 ** min(n, 30)))
            left = deadline - time.monotonic()
            if left <= 0:
                return
            yield min(d, left)


DEFAULT_RETRY = RedisRetry()
NO_RETRY = RedisRetry(attempts=1, budget=0)


def not_run(exc: BaseException) -> bool:
    """Whether an error reply means the command was not executed (safe to send again)."""
    return isinstance(exc, _NOT_RUN_TYPES) or (isinstance(exc, ResponseError) and str(exc).startswith(_NOT_RUN))


def send_again(exc: BaseException) -> bool:
    """Whether a round trip of plain commands that failed with ``exc`` is sent again under a
    :class:`RedisRetry`: a connection error or a timeout (for commands that are the same when
    applied twice), or a reply meaning they did not run (``LOADING``, ``READONLY``, ...)."""
    return isinstance(exc, TRANSIENT) or not_run(exc)


def send_retried(send: Callable[[], _T], retry: RedisRetry) -> _T:
    """``send()``, a round trip of plain commands that are the same when applied twice (a read, a
    write of settings), sent again under ``retry`` while it fails as :func:`send_again` says
    (:func:`~scheduler.redisio.transport_async.send_retried_async` for asyncio). A pipeline is
    built inside ``send``: redis-py empties it when it fails."""
    delays = retry.delays()
    while True:
        try:
            return send()
        except (RedisError, OSError) as exc:
            delay = next(delays, None) if send_again(exc) else None
            if delay is None:
                raise
            time.sleep(delay)


def is_noscript(exc: BaseException) -> bool:
    """Whether an error reply is NOSCRIPT (the script is not in that server's cache)."""
    return isinstance(exc, NoScriptError) or (isinstance(exc, ResponseError) and str(exc).startswith("NOSCRIPT"))


def resend_safe(calls: Sequence[Call]) -> bool:
    """Whether every call may be sent again after its reply was lost (see :data:`RESEND`)."""
    return all(RESEND.get(name) in ("safe", "flag") for name, _, _ in calls)


def mark_resend(call: Call) -> Call:
    """The call as it must be re-sent (with its script's re-send flag set, if it has one)."""
    name, keys, args = call
    i = RESEND_FLAG.get(name)
    if i is None:
        return call
    args = list(args)
    args[i] = 1
    return name, keys, args


class NodeFailed(ZschedError, ConnectionError):
    """A call of a batch sent with ``raise_on_error=False`` to a Redis Cluster whose node failed
    (could not be reached, or its connection broke): the call comes back as this error in its
    place, so the replies of the other nodes are neither held back nor lost with it. ``sent``:
    the call had been written before the connection failed, so it may have run; send it again
    only where that is safe (a claim with the same request id, a fenced outcome)."""

    def __init__(self, message: str, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class Batch:
    """Book-keeping of one batch across NOSCRIPT reloads, refusals, redirects and re-sends.

    ``pending``: indices of the calls without a final reply yet. A round trip sends a subset of
    them (all of them on one server; those of one node in a cluster) and hands the replies to
    :meth:`take`. ``ask``: calls a cluster node redirected with ASK (slot being migrated): they go
    to that node once, preceded by ``ASKING``. ``moved``: MOVED redirects seen since the caller
    last looked (the caller updates its slot map, then sends those calls again at once)."""

    __slots__ = ("calls", "results", "pending", "scripts", "resent", "ask", "moved", "written")

    def __init__(self, calls: Sequence[Call], scripts: dict[str, Script]) -> None:
        self.calls = list(calls)
        self.results: list[Any] = [None] * len(calls)
        self.pending = list(range(len(calls)))
        self.scripts = scripts
        self.resent = False
        self.ask: dict[int, AskError] = {}
        self.moved: list[MovedError] = []
        self.written: set[int] = set()  # calls sent on a connection that then failed: they may have run

    def commands(self, idx: Sequence[int]) -> list[tuple[Any, ...]]:
        """The commands for the calls ``idx`` (an ``ASKING`` before each ASK-redirected one)."""
        by = self.scripts
        out: list[tuple[Any, ...]] = []
        for i in idx:
            if i in self.ask:
                out.append(("ASKING",))
            out.append(evalsha(by, self.calls[i]))
        return out

    def take(self, idx: Sequence[int], replies: Sequence[Any]) -> tuple[list[str], bool]:
        """Store the replies of the calls ``idx``; keep pending the calls refused as NOSCRIPT,
        not run or redirected. Returns the scripts to load and whether a not-run refusal asks for
        a pause before sending again."""
        missing: list[str] = []
        wait = False
        done = set()
        for i, r in zip(idx, replies):
            self.ask.pop(i, None)
            if isinstance(r, Exception) and is_noscript(r):
                missing.append(self.calls[i][0])
            elif isinstance(r, MovedError):  # before AskError: redis-py derives MOVED from ASK
                self.moved.append(r)
            elif isinstance(r, AskError):
                self.ask[i] = r
            elif isinstance(r, Exception) and not_run(r):
                self.results[i] = r  # reported if the retries run out
                wait = True
            else:
                self.results[i] = script_error(r) if isinstance(r, Exception) else r
                done.add(i)
        if done:
            self.pending = [i for i in self.pending if i not in done]
        return sorted(set(missing)), wait

    def mark_resent(self, idx: Sequence[int] | None = None) -> None:
        """The connection failed after sending the calls ``idx`` (default: every pending one):
        each of them may have run."""
        self.resent = True
        for i in self.pending if idx is None else idx:
            self.calls[i] = mark_resend(self.calls[i])
            self.written.add(i)

    def give_up(self, idx: Sequence[int], error: BaseException, *, written: bool = False) -> None:
        """Stop trying the calls ``idx`` (their node failed): each gets a :class:`NodeFailed`
        reply saying whether it may have run (``written`` now, or sent on an earlier try)."""
        drop = set(idx)
        for i in drop:
            if written:
                self.written.add(i)
            self.results[i] = NodeFailed(f"the cluster node of this call failed: {error}", i in self.written)
        self.pending = [i for i in self.pending if i not in drop]

    def resend_safe(self, idx: Sequence[int] | None = None) -> bool:
        """Whether the calls ``idx`` (default: every pending one) may be sent again."""
        return resend_safe([self.calls[i] for i in (self.pending if idx is None else idx)])


NO_TAIL: Any = object()
"""What a round trip returns for the command sent after its calls (``then``) when none of its
calls ran (each was redirected, refused as not run, or NOSCRIPT): that ``WAIT``'s reply confirms
no write, and on a node that is no longer the slot's master it is an error ("WAIT cannot be used
with replica instances"), so it must not answer for the batch; the calls' re-send carries its own."""


def any_ran(replies: Sequence[Any]) -> bool:
    """Whether a round trip's replies include one of a call that ran (anything but a redirect,
    a not-run refusal or NOSCRIPT: an error raised by the script itself ran, maybe in part)."""
    return any(not (isinstance(r, Exception) and (isinstance(r, AskError) or is_noscript(r) or not_run(r)))
               for r in replies)


def finish(results: list[Any], raise_on_error: bool) -> list[Any]:
    """The replies in call order; with ``raise_on_error`` the first error reply is raised."""
    if raise_on_error:
        for r in results:
            if isinstance(r, Exception):
                raise r
    return results




def merge_tails(tails: Sequence[Any]) -> Any:
    """One reply for the command sent after a batch (``WAIT``/``WAITAOF``) when the batch went to
    several cluster nodes: the weakest of the nodes' replies (an error first, then the smallest
    count, element by element for WAITAOF's pair), since the promise holds only where every node
    kept it. None when nothing was sent. :data:`NO_TAIL` replies (round trips in which no call
    ran) are left out."""
    tails = [t for t in tails if t is not NO_TAIL]
    if not tails:
        return None
    for t in tails:
        if isinstance(t, Exception):
            return t
    if all(isinstance(t, list | tuple) for t in tails):
        return [min(int(t[k]) for t in tails) for k in range(len(tails[0]))]
    return min(int(t) for t in tails)
