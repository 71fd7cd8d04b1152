"""Job transitions without a worker or a scheduler replica: :class:`Ops`.

:class:`Ops` sends the worker-side scripts (``claim``, ``ack``, ``fail``, ``extend``,
``release``) and the scheduler tier's (``tick``, ``reap``) through a client's own transport, so a
test or a benchmark drives a job through every state with the production Lua and nothing else:
no threads, no handlers, no etcd. Each call is one script call (``tick_all``, ``reap_all`` and
``claim``: one per partition), and its reply is the script's own code.
"""
from __future__ import annotations

from typing import Any

from ..client import Client
from ..protocol.calls import error_arg
from ..protocol.codes import EPOCH_REFUSED, AckCode, FailCode, FailKind, ReleaseCode, code_of
from ..protocol.ids import partition_of
from ..protocol.replies import Claimed, parse_claim

__all__ = ["Ops"]


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
        script's ARGV header); returns its raw reply."""
        return self.transport.call(*self.calls.call(name, partition, *args))

    def _fenced(self, name: str, partition: int, epoch: int, *args: Any) -> Any:
        reply = self.run(name, partition, epoch, *args)
        if reply[0] == EPOCH_REFUSED:
            raise AssertionError(f"{name} on partition {partition}: epoch {epoch} refused, the newest is {reply[1]}")
        return reply

    def tick_all(self, epoch: int = 0, limit: int = 1000) -> int:
        """Tick every partition until nothing more is due (``limit`` jobs per call); returns how
        many jobs were moved. ``epoch`` 0 is unfenced; a refused epoch raises AssertionError."""
        moved = 0
        for p in range(self.calls.ks.partitions):
            while True:
                n = int(self._fenced("tick", p, epoch, limit, self.calls.tomb_ms)[0])
                moved += n
                if n < limit:
                    break
        return moved

    def reap_all(self, epoch: int = 0, limit: int = 1000) -> int:
        """Reap the expired leases of every partition (up to ``limit`` per partition); returns
        how many jobs were reaped. A refused epoch raises AssertionError."""
        return sum(int(self._fenced("reap", p, epoch, limit)[0]) for p in range(self.calls.ks.partitions))

    def claim(self, queue: str = "default", n: int = 100) -> list[Claimed]:
        """Claim up to ``n`` ready jobs of ``queue``, partition by partition."""
        out: list[Claimed] = []
        for p in range(self.calls.ks.partitions):
            _, jobs = parse_claim(self.run("claim", p, queue, n - len(out)))
            out.extend(jobs)
            if len(out) >= n:
                break
        return out

    def ack(self, job: Claimed, token: int | None = None) -> AckCode:
        """Acknowledge ``job`` (it finishes as done)."""
        reply = self.run("ack", self.partition(job.raw_id), self.calls.tomb_ms, job.raw_id,
                         job.token if token is None else token)
        return code_of(AckCode, reply[0], "ack")

    def fail(self, job: Claimed, kind: FailKind | str = FailKind.FAILED, delay_ms: int = 0,
             token: int | None = None, msg: str = "boom") -> FailCode:
        """Fail ``job`` as a handler raising ``RuntimeError(msg)`` would; ``kind`` is a
        :class:`~scheduler.protocol.codes.FailKind` or its letter (``"f"``, ``"r"``, ``"p"``);
        ``delay_ms``: the retry delay."""
        kind = FailKind(kind.encode()) if isinstance(kind, str) else kind
        reply = self.run("fail", self.partition(job.raw_id), job.raw_id, job.token if token is None else token,
                         kind.value, delay_ms, error_arg("RuntimeError", msg, "tb"))
        return code_of(FailCode, reply[0], "fail")

    def extend(self, job: Claimed, lease_ms: int = 0, token: int | None = None) -> int:
        """Extend ``job``'s lease by ``lease_ms`` (0: the job's own lease); returns the new
        deadline in ms, 0 when refused."""
        return int(self.run("extend", self.partition(job.raw_id), job.raw_id,
                            job.token if token is None else token, lease_ms)[0])

    def release(self, job: Claimed) -> ReleaseCode:
        """Hand ``job`` back unrun (ready again, its attempt not counted)."""
        return code_of(ReleaseCode, self.run("release", self.partition(job.raw_id), job.raw_id, job.token)[0],
                       "release")
