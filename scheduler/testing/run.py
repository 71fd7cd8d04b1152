"""Running a worker's handlers in-process, as a test stack's ``run_due`` does: :class:`WorkerPass`.

Everything a worker decides comes from the workers package itself: which handler serves a queue
(:meth:`workers.Worker.handler_specs`), the :class:`~workers.Job` a handler receives and the jobs
that cannot reach one (:func:`workers.outcome.job_for`), what an exception means
(:func:`workers.outcome.failure_of`: ``Retry``, ``PermanentError``, full-jitter backoff) and what a
handler timeout means (:func:`workers.outcome.timeout_failure`). Claims, acks and fails are the
production scripts, sent through the stack's client. What differs from a worker process: handlers
run one at a time, in claim order, with no heartbeats (the stack's clock does not move while a
handler runs unless the handler moves it). Timeouts are enforced in real seconds as a worker
does: an async handler is cancelled; a sync handler with a timeout runs in a thread of its own
(:class:`HandlerThread`; sync handlers without one run in the calling thread), and when it runs
past the timeout the attempt fails as a timeout at once while the thread, which cannot be
interrupted, keeps one of the worker's slots until it returns (:class:`TimedOutThreads`).
"""
from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from workers import Worker
from workers.effects.outcomes import EffectSkipped
from workers.job import Job
from workers.outcome import Failure, Poison, failure_of, job_for, timeout_failure
from workers.registry import HandlerSpec

from ..client import Client
from ..protocol.calls import CLAIM_MAX, error_arg, tombstone_ms
from ..protocol.codes import AckCode, FailCode, FailKind
from ..protocol.errors import ZschedError
from ..protocol.ids import encode_id
from ..protocol.replies import Claimed, parse_claim
from ..protocol.transitions import Failure as Fail
from ..protocol.transitions import ack_call, claim_call, fail_call

CALL_BATCH = 100  # jobs per ack or fail call

__all__ = ["Claim", "HandlerThread", "HandlerTimedOut", "Run", "RunReport", "TimedOutThreads", "WorkerPass",
           "call_handler", "call_handler_async"]

_FINISHED = threading.Condition()  # notified whenever a HandlerThread ends


class HandlerThread:
    """A sync handler called in a daemon thread of its own, so it can be waited for with a
    timeout (as a worker calls sync handlers in its thread pool). :attr:`done` is set when it
    returned or raised (:attr:`error`)."""

    def __init__(self, fn: Callable[[Job], Any], job: Job) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None
        threading.Thread(target=self._run, args=(fn, job), name=f"zsched-handler-{job.id}", daemon=True).start()

    def _run(self, fn: Callable[[Job], Any], job: Job) -> None:
        try:
            fn(job)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread by outcome()
            self.error = exc
        finally:
            with _FINISHED:
                self.done.set()
                _FINISHED.notify_all()

    def outcome(self) -> BaseException | None:
        """What the finished handler raised (None: it returned); a BaseException that is not an
        Exception (``KeyboardInterrupt``, pytest's ``fail()``) is raised here, in the test's thread."""
        if self.error is not None and not isinstance(self.error, Exception):
            raise self.error
        return self.error


class HandlerTimedOut(ZschedError):
    """A handler ran past its timeout (``@worker.handler(queue, timeout=...)``). ``thread``: the
    thread of a sync handler, which still runs."""

    def __init__(self, thread: HandlerThread | None = None) -> None:
        super().__init__()
        self.thread = thread


class TimedOutThreads:
    """The threads of one worker's sync handlers that ran past their timeout and still run: each
    holds one of the worker's slots (``concurrency``) until it returns, as on a worker."""

    def __init__(self) -> None:
        self.threads: list[HandlerThread] = []

    def running(self) -> int:
        """How many still run (the slots they hold)."""
        self.threads = [t for t in self.threads if not t.done.is_set()]
        return len(self.threads)

    def wait_for_one(self) -> None:
        """Block until one of them returns (a worker whose slots are all held waits the same way)."""
        with _FINISHED:
            _FINISHED.wait_for(lambda: any(t.done.is_set() for t in self.threads))


@dataclass(frozen=True, slots=True)
class Run:
    """One attempt handled by ``run_due``.

    ``outcome``: what the handler did, as the worker's metrics name it: ``ok``, ``skipped`` (let a
    :class:`~workers.effects.EffectSkipped` escape: acked, as a worker does), ``retry`` (raised
    :class:`~workers.Retry`), ``failed``, ``permanent`` (raised :class:`~workers.PermanentError`),
    ``timeout``, or ``poison`` (no handler for the queue, or an undecodable payload: the handler
    never ran). ``result``: what Redis made of it: ``acked``, ``retry_scheduled``, ``dead`` or
    ``refused`` (the lease was lost meanwhile).
    ``error``: the exception the handler raised (None otherwise). ``job``: what the handler got."""

    job_id: str
    queue: str
    attempt: int
    outcome: str
    result: str
    error: BaseException | None = None
    job: Job | None = None
    delay_ms: int = 0  # the retry delay sent with a failure


@dataclass(slots=True)
class RunReport:
    """Every attempt one ``run_due`` (or ``advance(..., worker=)``) handled, in order."""

    runs: list[Run] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[Run]:
        return iter(self.runs)

    @property
    def outcomes(self) -> list[str]:
        """The outcome of each run, in order (``["failed", "failed", "ok"]``)."""
        return [r.outcome for r in self.runs]

    def count(self, result: str) -> int:
        """How many runs ended with ``result`` (``acked``, ``retry_scheduled``, ``dead``, ``refused``)."""
        return sum(1 for r in self.runs if r.result == result)

    def of(self, job_id: str) -> list[Run]:
        """The runs of one job."""
        return [r for r in self.runs if r.job_id == job_id]

    def extend(self, other: RunReport) -> None:
        """Append another report's runs."""
        self.runs.extend(other.runs)


@dataclass(frozen=True, slots=True)
class Claim:
    """One claimed job waiting for its handler: where it lives, what was claimed, the handler
    (None: none) and the Job it receives (or why it cannot: :class:`~workers.outcome.Poison`)."""

    queue: str
    partition: int
    claimed: Claimed
    spec: HandlerSpec | None
    job: Job | Poison


async def call_handler_async(spec: HandlerSpec, job: Job) -> BaseException | None:
    """Run ``spec``'s handler on ``job`` on the running loop (an async one awaited under its
    timeout; a sync one called inline, or with a timeout in a :class:`HandlerThread` waited for
    without blocking the loop); returns what it raised (:class:`HandlerTimedOut` for a timeout),
    None when it returned. BaseExceptions that are not Exceptions (KeyboardInterrupt, pytest's
    ``fail()``/``skip()``) propagate to the test."""
    if not spec.is_async and spec.timeout is not None:
        thread = HandlerThread(spec.fn, job)
        finished = await asyncio.to_thread(thread.done.wait, spec.timeout)
        return thread.outcome() if finished else HandlerTimedOut(thread)
    try:
        if not spec.is_async:
            spec.fn(job)
        elif spec.timeout is None:
            await spec.fn(job)
        else:
            try:
                async with asyncio.timeout(spec.timeout) as cm:
                    await spec.fn(job)
            except TimeoutError:
                if cm.expired():
                    return HandlerTimedOut()
                raise
    except Exception as exc:  # noqa: BLE001 - a handler's exception is its job's outcome
        return exc
    return None


def call_handler(spec: HandlerSpec, job: Job, loop: Callable[[], asyncio.Runner]) -> BaseException | None:
    """:func:`call_handler_async` from synchronous code: sync handlers are called inline (in a
    :class:`HandlerThread` waited for up to their timeout when they have one), async ones run on
    ``loop()`` (an event loop owned by the caller)."""
    if spec.is_async:
        return loop().run(call_handler_async(spec, job))
    if spec.timeout is not None:
        # a worker abandons the result of a sync handler past its timeout (a thread cannot be
        # interrupted) and reports the timeout at once: so does the kit
        thread = HandlerThread(spec.fn, job)
        return thread.outcome() if thread.done.wait(spec.timeout) else HandlerTimedOut(thread)
    try:
        spec.fn(job)
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


class WorkerPass:
    """One ``run_due`` of ``worker`` on ``client``'s namespace: :meth:`claim_due` fires what is due
    (``fire(reads)``: the stack's tier pass, :meth:`~.tier.TierPass.fire_due`, returning the results
    of the reads it queues on a pipeline) and claims it for every queue the worker serves (up to the
    worker's concurrency per queue and partition), :meth:`settle` reports a handler's outcome.
    ``rng``: the backoff's random source. ``max_runs``: a bound on attempts, so a handler that
    keeps scheduling due work fails the test instead of hanging it. ``timed_out``: the worker's
    sync handlers still running past their timeout, which hold slots (kept across passes)."""

    def __init__(self, client: Client, worker: Worker, fire: Callable[[Callable[[Any], None]], list[Any]],
                 rng: random.Random, max_runs: int, timed_out: TimedOutThreads | None = None) -> None:
        self.client = client
        self.calls = client.calls
        self.specs = worker.handler_specs()
        self.fire = fire
        self.rng = rng
        self.max_runs = max_runs
        # the namespace's tombstone TTL, or the worker's own (deprecated)
        self.tomb_ms = client.calls.tomb_ms if worker.tombstone_ttl is None else tombstone_ms(worker.tombstone_ttl)
        self.max_payload = worker.max_payload_bytes
        self.batch = worker.concurrency
        self.timed_out = timed_out if timed_out is not None else TimedOutThreads()
        self.report = RunReport()
        self.pending: list[_Outcome] = []

    def claim_due(self) -> list[Claim]:
        """Fire what is due now, then claim the ready jobs of every served queue; [] when none.
        Only the ready lists that hold jobs get a ``claim`` call (a read of their lengths first).
        Slots held by timed-out sync handlers are not claimed for; when they hold every slot, this
        waits until one returns."""
        ks = self.calls.ks
        every = [(q, p) for q in self.specs for p in range(ks.partitions)]

        def lengths(pipe: Any) -> None:
            for q, p in every:
                pipe.llen(ks.ready(p, q))

        where = [qp for qp, n in zip(every, self.fire(lengths)) if n]
        if not where:
            return []
        while self.timed_out.running() >= self.batch:
            self.timed_out.wait_for_one()
        free = min(self.batch - self.timed_out.running(), CLAIM_MAX)  # the claim script takes no more
        replies = self.client.transport.call_many([claim_call(self.calls, p, q, free) for q, p in where])
        out: list[Claim] = []
        for (q, p), reply in zip(where, replies):
            spec = self.specs[q]
            for c in parse_claim(reply)[1]:
                out.append(Claim(q, p, c, spec, job_for(c, q, spec, self.max_payload, ks.namespace)))
        if out and len(self.report) + len(out) > self.max_runs:
            raise RuntimeError(
                f"run_due handled {len(self.report)} attempts and {len(out)} more are due: a handler keeps making "
                f"due work (Retry(0), scheduling jobs due now, ...). Pass max_runs= (now {self.max_runs}) to allow "
                "more, or advance the clock between runs")
        return out

    def settle(self, item: Claim, exc: BaseException | None) -> None:
        """Take the outcome of ``item``'s handler (it raised ``exc``, or returned for None); it is
        reported by the next :meth:`flush`, batched per partition as a worker's outbox does."""
        c, job = item.claimed, item.job
        rec = c.record
        if isinstance(job, Poison):
            failure = Failure(FailKind.PERMANENT, 0, error_arg(job.etype, job.message), "poison", job.etype,
                              job.message)
            self.pending.append(_Outcome(item, None, failure, None))
            return
        assert rec is not None  # job_for made a Job from it
        if exc is None or isinstance(exc, EffectSkipped):  # a skipped effect is acked, as a worker does
            self.pending.append(_Outcome(item, job, None, exc))
        elif isinstance(exc, HandlerTimedOut):
            assert item.spec is not None and item.spec.timeout is not None
            if exc.thread is not None:
                self.timed_out.threads.append(exc.thread)
            self.pending.append(_Outcome(item, job, timeout_failure(item.queue, item.spec.timeout, rec, self.rng), exc))
        else:
            self.pending.append(_Outcome(item, job, failure_of(exc, rec, self.rng), exc))

    def flush(self) -> list[Run]:
        """Send the outcomes taken since the last flush with the production ``ack`` and ``fail``
        scripts (one call per partition and kind, up to :data:`CALL_BATCH` jobs); returns the runs."""
        groups: dict[tuple[str, int], list[_Outcome]] = {}
        for o in self.pending:
            groups.setdefault(("fail" if o.failure else "ack", o.item.partition), []).append(o)
        self.pending = []
        calls, parts = [], []
        for (kind, p), outs in groups.items():
            for s in range(0, len(outs), CALL_BATCH):
                chunk = outs[s:s + CALL_BATCH]
                if kind == "ack":
                    attempts = [(o.item.claimed.raw_id, o.item.claimed.token) for o in chunk]
                    calls.append(ack_call(self.calls, p, attempts, self.tomb_ms))
                else:
                    calls.append(fail_call(self.calls, p, [
                        Fail(o.item.claimed.raw_id, o.item.claimed.token, o.failure.kind, max(0, o.failure.delay_ms),
                             o.failure.error) for o in chunk if o.failure is not None]))
                parts.append(chunk)
        runs: list[Run] = []
        for chunk, reply in zip(parts, self.client.transport.call_many(calls) if calls else []):
            for o, code in zip(chunk, reply):
                runs.append(o.run(int(code)))
        self.report.runs += runs
        return runs


@dataclass(frozen=True, slots=True)
class _Outcome:
    """A handler's outcome waiting for :meth:`WorkerPass.flush`: an ack (no failure) or a fail."""

    item: Claim
    job: Job | None
    failure: Failure | None
    error: BaseException | None

    def run(self, code: int) -> Run:
        c = self.item.claimed
        attempt = c.record.attempt if c.record is not None else 0
        if self.failure is None:
            result = "acked" if code == AckCode.ACKED else "refused"
            outcome = "ok" if self.error is None else "skipped"
            return Run(encode_id(c.raw_id), self.item.queue, attempt, outcome, result, self.error, self.job)
        result = {FailCode.RETRY_SCHEDULED: "retry_scheduled", FailCode.DEAD: "dead"}.get(FailCode(code), "refused")
        return Run(encode_id(c.raw_id), self.item.queue, attempt, self.failure.outcome, result, self.error,
                   self.job, self.failure.delay_ms)
