"""Job transitions without a worker or a scheduler replica: :class:`Ops`.

:class:`Ops` sends the worker-side scripts (``claim``, ``ack``, ``fail``, ``extend``,
``release``) and the scheduler tier's (``tick``, ``reap``) through a client's own transport, so a
test or a benchmark drives a job through every state with the production Lua and nothing else:
no threads, no handlers, no etcd. Each call is one script call (``tick_all``, ``reap_all`` and
``claim``: one per partition), and its reply is the script's own code.
"""
from __future__ import annotations

from typing import Any, TypeVar

from ..client import Client
from ..protocol.call import Call
from ..protocol.calls import error_arg
from ..protocol.codes import AckCode, FailCode, FailKind, ReleaseCode, code_of
from ..protocol.ids import partition_of
from ..protocol.replies import Claimed, parse_claim
from ..protocol.tick import NO_RETENTION, EpochRefused, parse_reap, parse_tick, reap_call, tick_call
from ..protocol.transitions import Attempt, Failure, ack_call, claim_call, extend_call, fail_call, release_call

__all__ = ["Ops"]


R = TypeVar("R")


class Ops:
    """Runs the worker- and scheduler-side scripts of ``client``'s namespace directly.

    The constructor connects the client (it reads the namespace's partition count). Tokens
    default to the one the job was claimed with; pass another to act as a worker whose lease was
    lost."""

    def __init__(self, client: Client) -> None:
        self.calls = client.calls
        """The namespace's call builder (``calls.call(name, partition, *args)``)."""
        self.transport = client.transport
        """The client's script transport, which every call here goes through."""

    def partition(self, raw_id: bytes) -> int:
        """The partition of a binary job id in this namespace."""
        return partition_of(raw_id, self.calls.ks.partitions)

    def run(self, name: str, partition: int, *args: Any) -> Any:
        """Run script ``name`` on ``partition`` with ``args`` after the common arguments (see the
        script's ARGV header); returns its raw reply. Its ARGV written by hand: prefer
        ``send(...)`` of the script's builder (``tick_call``, ``claim_call``, ...), which the
        scheduler itself uses."""
        return self.transport.call(*self.calls.call(name, partition, *args))

    def send(self, call: Call) -> Any:
        """Send one call built by a script's builder (:mod:`scheduler.protocol`); its raw reply."""
        return self.transport.call(*call)

    @staticmethod
    def _attempt(job: Claimed, token: int | None) -> Attempt:
        """The attempt to act as: the job's own claim, or ``token`` (a worker whose lease was lost)."""
        return job.raw_id, job.token if token is None else token

    @staticmethod
    def _accepted(name: str, partition: int, epoch: int, reply: R | EpochRefused) -> R:
        if isinstance(reply, EpochRefused):
            raise AssertionError(f"{name} on partition {partition}: epoch {epoch} refused, "
                                 f"the newest is {reply.newest_epoch}")
        return reply

    def tick_all(self, epoch: int = 0, limit: int = 1000) -> int:
        """Tick every partition until nothing more is due (``limit`` jobs per call); returns how
        many jobs were moved. ``epoch`` 0 is unfenced; a refused epoch raises AssertionError."""
        moved = 0
        for p in range(self.calls.ks.partitions):
            while True:
                call = tick_call(self.calls, p, epoch, limit, {}, NO_RETENTION)
                n = self._accepted("tick", p, epoch, parse_tick(self.send(call))).moved
                moved += n
                if n < limit:
                    break
        return moved

    def reap_all(self, epoch: int = 0, limit: int = 1000) -> int:
        """Reap the expired leases of every partition (up to ``limit`` per partition); returns
        how many jobs were reaped. A refused epoch raises AssertionError."""
        reaped = 0
        for p in range(self.calls.ks.partitions):
            reply = parse_reap(self.send(reap_call(self.calls, p, epoch, limit)))
            reaped += self._accepted("reap", p, epoch, reply).reaped
        return reaped

    def claim(self, queue: str = "default", n: int = 100) -> list[Claimed]:
        """Claim up to ``n`` ready jobs of ``queue``, partition by partition."""
        out: list[Claimed] = []
        for p in range(self.calls.ks.partitions):
            _, jobs = parse_claim(self.transport.call(*claim_call(self.calls, p, queue, n - len(out))))
            out.extend(jobs)
            if len(out) >= n:
                break
        return out

    def ack(self, job: Claimed, token: int | None = None) -> AckCode:
        """Acknowledge ``job`` (it finishes as done)."""
        reply = self.send(ack_call(self.calls, self.partition(job.raw_id), [self._attempt(job, token)]))
        return code_of(AckCode, reply[0], "ack")

    def fail(self, job: Claimed, kind: FailKind | str = FailKind.FAILED, delay_ms: int = 0,
             token: int | None = None, msg: str = "boom") -> FailCode:
        """Fail ``job`` as a handler raising ``RuntimeError(msg)`` would; ``kind`` is a
        :class:`~scheduler.protocol.codes.FailKind` or its letter (``"f"``, ``"r"``, ``"p"``);
        ``delay_ms``: the retry delay."""
        kind = FailKind(kind.encode()) if isinstance(kind, str) else kind
        raw_id, tok = self._attempt(job, token)
        failure = Failure(raw_id, tok, kind, delay_ms, error_arg("RuntimeError", msg, "tb"))
        reply = self.send(fail_call(self.calls, self.partition(job.raw_id), [failure]))
        return code_of(FailCode, reply[0], "fail")

    def extend(self, job: Claimed, lease_ms: int = 0, token: int | None = None) -> int:
        """Extend ``job``'s lease by ``lease_ms`` (0: the job's own lease); returns the new
        deadline in ms, 0 when refused."""
        return int(self.send(extend_call(self.calls, self.partition(job.raw_id), [self._attempt(job, token)],
                                          lease_ms))[0])

    def release(self, job: Claimed) -> ReleaseCode:
        """Hand ``job`` back unrun (ready again, its attempt not counted)."""
        reply = self.send(release_call(self.calls, self.partition(job.raw_id), [self._attempt(job, None)]))
        return code_of(ReleaseCode, reply[0], "release")
