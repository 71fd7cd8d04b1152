"""The handler runner: turns claimed jobs into handler runs and handler runs into outcomes.

``async def`` handlers run as tasks on the event loop, plain functions in a thread pool of
``concurrency`` threads. What the handler does decides the outcome: returning acks; ``Retry``
retries after its delay; ``PermanentError`` dead-letters now; any other exception, or the
handler's timeout, is a failure retried after backoff. Jobs that cannot reach a handler (an
undecodable record or payload, a queue without a handler) are poison: dead-lettered at once.
Those rules are ``workers/outcome.py``'s, shared with the testing kit.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from scheduler.client import tracing
from scheduler.protocol.calls import error_arg
from scheduler.protocol.codes import FailKind
from scheduler.protocol.errors import ZschedError
from scheduler.protocol.ids import encode_id
from scheduler.protocol.replies import Claimed

from .alarm import make_alarm
from .attempt import DONE, RELEASED, RUNNING, Attempt
from .clock import MAX_RATE_DIFF
from .effects.outcomes import EffectSkipped
from .heartbeat import Heartbeats
from .job import Job
from .lifecycle import Lifecycle
from .outbox import Outbox
from .outcome import Failure, Poison, failure_of, job_for, timeout_failure
from .registry import Handler, HandlerSpec
from .slots import Slots
from .stats import WorkerMetrics, WorkerStats

log = logging.getLogger("zsched.worker")


class CancelledByOther(ZschedError):
    """A handler task was cancelled by something other than the worker's own shutdown."""

    def __str__(self) -> str:
        return "handler task was cancelled"


class ThreadCount:
    """How many sync handlers are running in threads now. A thread cannot be interrupted, so one
    may outlive ``serve()`` (after a timeout or a release at shutdown): ``Worker.run()`` checks."""

    def __init__(self) -> None:
        self.busy = 0
        self._lock = threading.Lock()

    def call(self, fn: Handler, job: Job, span: Any = None) -> Any:
        """Run ``fn(job)`` in the calling (pool) thread, counted, inside ``span`` (the attempt's
        trace span, or None): a pool thread does not inherit the loop's context."""
        with self._lock:
            self.busy += 1
        token = tracing.enter(span) if span is not None else None
        try:
            return fn(job)
        finally:
            if token is not None:
                tracing.leave(token)
            with self._lock:
                self.busy -= 1


class HandlerRunner:
    """Starts handlers for claimed jobs and reports their outcomes to the outbox.

    ``specs``: the handler of each served queue (None: none). ``running``: the attempts whose
    handler runs now (shared with the heartbeats). Every started attempt holds one of ``slots``
    until its handler ends (a timed-out sync handler until its thread returns, so the limit stays
    exact)."""

    def __init__(self, *, loop: asyncio.AbstractEventLoop, specs: Mapping[str, HandlerSpec | None],
                 qstats: Mapping[str, WorkerStats], running: set[Attempt], slots: Slots, outbox: Outbox,
                 heartbeats: Heartbeats, life: Lifecycle, metrics: WorkerMetrics | None,
                 max_payload_bytes: int, threads: ThreadCount, concurrency: int, namespace: str = "") -> None:
        self.loop = loop
        self.namespace = namespace
        self.specs = specs
        self.qstats = qstats
        self.running = running
        self.slots = slots
        self.outbox = outbox
        self.heartbeats = heartbeats
        self.life = life
        self.metrics = metrics
        self.max_payload_bytes = max_payload_bytes
        self.threads = threads
        self.alarm = make_alarm(loop)
        # Jobs handed off ahead of their time that wait on a *handler* slot (a claim had more of
        # them than prefetch slots), with their start instants: a held job that comes due first
        # takes such a slot over (_swap_parked) instead of waiting behind a job due later.
        self.parked: dict[Attempt, float] = {}
        self.executing = 0  # handlers running now (started, not ended): the outbox's quiet()
        self.pool: ThreadPoolExecutor | None = None
        self.trace_all = False  # a tracer provider is installed: every attempt gets a span (dispatch)
        self.trace_check_at = 0.0  # monotonic time of the next look for one
        if any(spec is not None and not spec.is_async for spec in specs.values()):
            self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="zsched-handler")

    def close(self) -> None:
        """Stop the thread pool without waiting for threads still running a handler."""
        self.alarm.close()
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    # -- starting -------------------------------------------------------------------------------
    def dispatch(self, q: str, p: int, jobs: list[Claimed], t0: float, clock: float | None = None,
                 held: list[bool] | None = None) -> None:
        """Start the jobs one claim returned (sent at ``t0``, monotonic); each already holds a slot:
        a handler slot, or a prefetch slot where ``held[i]`` (then it takes a handler slot when it
        is due, waiting for one if none is free; see :class:`~workers.slots.Slots`).

        ``clock``: an upper bound of this host's monotonic time minus Redis's time (seconds) for
        the node that ran the claim (:class:`~workers.clock.RedisClock`), or None. A job handed
        off ahead of its due time (the tier's hand-off lead) then starts when Redis's clock reaches
        its due time, never earlier: the bound can only make the start later. The wait until
        then is lengthened by the clocks' largest rate difference (``MAX_RATE_DIFF``)."""
        stats = self.qstats[q]
        stats.claimed += len(jobs)
        if not self.trace_all and t0 >= self.trace_check_at:
            # the API's look costs about 1 us: at most once a second while no provider is installed
            self.trace_all, self.trace_check_at = tracing.provider_installed(), t0 + 1.0
        spec = self.specs[q]
        limit = self.max_payload_bytes
        create_task = self.loop.create_task
        hb = self.heartbeats
        for i, c in enumerate(jobs):
            r = Attempt(p, q, c, spec, stats, t0)
            r.held = held[i] if held is not None else False
            if self.life.stopping:
                # Claimed while we were stopping: hand it straight back (no attempt spent).
                self._free_slot(r)
                r.state = RELEASED
                self.outbox.release(r)
                continue
            job = job_for(c, q, spec, limit, self.namespace)
            if isinstance(job, Poison):
                self._poison(r, job.etype, job.message)
                continue
            assert spec is not None  # job_for gives a Job only to a queue with a handler
            r.job = job
            self.running.add(r)
            start_at = c.due_ms / 1000.0 + clock if clock is not None else 0.0
            now = time.monotonic()
            if start_at > now:
                start_at += (start_at - now) * MAX_RATE_DIFF
            if r.held or start_at > now:
                r.task = create_task(self._start_when(r, start_at))
            else:
                self._started(r)
                r.task = create_task(self._run_async(r) if spec.is_async else self._run_sync(r))
            if r.next_hb < hb.next_due:
                hb.wake.set()

    def _started(self, r: Attempt) -> None:
        r.executing = True
        self.executing += 1
        job, rec = r.job, r.rec
        if job is not None and rec is not None and (rec.trace is not None or self.trace_all):
            r.span = tracing.start_attempt(r.queue, job.id, job.attempt, job.fence, self.namespace, rec.trace)
        if self.metrics is not None and r.job is not None:
            try:
                self.metrics.job_started(r.job)
            except Exception:
                log.exception("metrics.job_started failed")

    async def _start_when(self, r: Attempt, start_at: float) -> None:
        """Run a job handed off ahead of its due time once this host's monotonic clock reaches
        ``start_at`` (its due time by Redis's clock, see :meth:`dispatch`), on a handler slot. The
        job holds its slot and its lease (kept by the heartbeats) meanwhile; a shutdown hands it
        back unrun."""
        try:
            if start_at > time.monotonic():
                if not r.held:
                    self.parked[r] = start_at
                await self.alarm.at(start_at)
                while (delay := start_at - time.monotonic()) > 0:  # never early, whatever woke us
                    await asyncio.sleep(delay)
            self.parked.pop(r, None)
            if r.held:
                if self.slots.free <= 0 or self.slots.waiting:
                    self._swap_parked(r, start_at)
                if r.held:
                    await self.slots.take_for_held()
                    r.held = False
            r.started = time.monotonic()
        except asyncio.CancelledError:
            self.parked.pop(r, None)
            if r.state == RELEASED:
                return  # shutdown handed the job back before it was due; nothing to report
            self._finish_exc(r, CancelledByOther())
            raise
        spec = r.handler
        assert spec is not None
        self._started(r)
        await (self._run_async(r) if spec.is_async else self._run_sync(r))

    def _swap_parked(self, r: Attempt, start_at: float) -> None:
        """``r`` came due on a prefetch slot and no handler slot is free: if a job due later waits
        on a handler slot, the two trade slots (no count changes). Without this a worker whose
        prefetch allowance was full took its next claim's early jobs onto its handler slots, and
        the held jobs due before them waited until they ran: up to the whole hand-off lead late
        (measured 80-100 ms with a 160 ms lead, one worker at 300 jobs/s). Parked jobs are at most
        ``concurrency``: the scan is bounded by the handler slots, not by the jobs."""
        later = max(self.parked.items(), key=lambda kv: kv[1], default=None)
        if later is None or later[1] <= start_at:
            return
        other = later[0]
        del self.parked[other]
        other.held = True  # it takes a handler slot when it is due (_start_when), like any held job
        r.held = False

    def _free_slot(self, r: Attempt) -> None:
        """The slot of an attempt that ends or never starts comes back, of its kind."""
        if r.held:
            r.held = False
            self.slots.put_back(0, 1)
        else:
            self.slots.give_back()

    def _poison(self, r: Attempt, etype: str, message: str) -> None:
        self._free_slot(r)
        r.stats.poison += 1
        r.state = DONE
        log.error("poison job %s on queue %r (partition %d): %s: %s; dead-lettering it",
                  encode_id(r.raw_id), r.queue, r.p, etype, message)
        self.outbox.fail(r, FailKind.PERMANENT, 0, error_arg(etype, message))

    # -- running --------------------------------------------------------------------------------
    async def _run_async(self, r: Attempt) -> None:
        spec = r.handler
        assert spec is not None and r.job is not None
        token = tracing.enter(r.span) if r.span is not None else None  # the handler's spans nest in it
        try:
            if spec.timeout is None:
                await spec.fn(r.job)
            else:
                try:
                    async with asyncio.timeout(spec.timeout) as cm:
                        await spec.fn(r.job)
                except TimeoutError:
                    if cm.expired():
                        self._finish_timeout(r)
                        return
                    raise
        except asyncio.CancelledError:
            if r.state == RELEASED:
                return  # shutdown handed the job back; nothing to report
            self._finish_exc(r, CancelledByOther())
            raise
        except BaseException as exc:  # noqa: BLE001 - even SystemExit from a handler is just a failure
            self._finish_exc(r, exc)
        else:
            self._finish_ok(r)
        finally:
            if token is not None:
                tracing.leave(token)

    async def _run_sync(self, r: Attempt) -> None:
        spec = r.handler
        assert spec is not None and r.job is not None and self.pool is not None
        fut = self.loop.run_in_executor(self.pool, self.threads.call, spec.fn, r.job, r.span)
        try:
            if spec.timeout is None:
                await fut
            else:
                try:
                    await asyncio.wait_for(asyncio.shield(fut), spec.timeout)
                except TimeoutError:
                    if fut.done():
                        fut.result()  # it finished at the deadline: use its own outcome
                    else:
                        # A thread cannot be interrupted: report the timeout now (so the retry is
                        # scheduled) but keep the slot until the thread returns, so the limit stays exact.
                        self._finish_timeout(r, keep_slot=True)
                        fut.add_done_callback(self._thread_done_late)
                        return
        except asyncio.CancelledError:
            if r.state == RELEASED:
                return
            self._finish_exc(r, CancelledByOther())
            raise
        except BaseException as exc:  # noqa: BLE001
            self._finish_exc(r, exc)
        else:
            self._finish_ok(r)

    def _thread_done_late(self, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled():
            fut.exception()  # retrieve it: the outcome was already reported as a timeout
        self.slots.give_back()

    # -- outcomes -------------------------------------------------------------------------------
    def _end(self, r: Attempt, outcome: str, keep_slot: bool = False, exc: BaseException | None = None,
             f: Failure | None = None) -> None:
        r.state = DONE
        if r.executing:
            r.executing = False
            self.executing -= 1
            self.slots.pace.ran(r.queue, time.monotonic() - r.started)
        if r.span is not None:
            job = r.job
            dead = f is not None and (f.kind is FailKind.PERMANENT or (
                f.kind is not FailKind.RETRY and job is not None and job.attempt >= job.max_attempts))
            tracing.end_attempt(r.span, outcome, exc, f.etype if f else None, dead,
                                {"zsched.retry_delay_ms": f.delay_ms} if f and not dead else None)
            r.span = None
        self.running.discard(r)
        r.task = None  # no reference cycles: finished jobs are freed by refcounting, not the GC
        if not keep_slot:
            self._free_slot(r)
        if self.metrics is not None:
            try:
                self.metrics.job_finished(r.job, outcome, time.monotonic() - r.t0)  # type: ignore[arg-type]
            except Exception:
                log.exception("metrics.job_finished failed")

    def _finish_ok(self, r: Attempt) -> None:
        if r.state != RUNNING:
            return
        self._end(r, "ok")
        if r.lost:
            return  # refused for sure (tokens only grow): already counted and logged
        self.outbox.ack(r)

    def _finish_timeout(self, r: Attempt, keep_slot: bool = False) -> None:
        if r.state != RUNNING:
            return
        spec = r.handler
        assert spec is not None and spec.timeout is not None
        assert r.rec is not None
        f = timeout_failure(r.queue, spec.timeout, r.rec)
        self._end(r, "timeout", keep_slot, f=f)
        r.stats.failed += 1
        self._report_failure(r, f.kind, f.delay_ms, f.error, f.etype, f.message)

    def _finish_exc(self, r: Attempt, exc: BaseException) -> None:
        if r.state != RUNNING:
            return
        assert r.rec is not None
        if isinstance(exc, EffectSkipped):
            # Another attempt recorded the job's effects: its work is done, and a retry could only
            # skip again. Acked (refused, as any outcome, if this attempt's lease is gone).
            log.info("job %s (queue %r, attempt %d): %s; acking it", encode_id(r.raw_id), r.queue, r.rec.attempt, exc)
            r.stats.skipped += 1
            self._end(r, "skipped")
            if not r.lost:
                self.outbox.ack(r)
            return
        f = failure_of(exc, r.rec)
        self._end(r, f.outcome, exc=exc, f=f)
        if f.kind is FailKind.RETRY:
            log.debug("job %s (queue %r, attempt %d) asked for a retry in %.3g s", encode_id(r.raw_id), r.queue,
                      r.rec.attempt, f.delay_ms / 1000)
        else:
            r.stats.failed += 1
        self._report_failure(r, f.kind, f.delay_ms, f.error, f.etype, f.message)
        if f.etype is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("job %s handler traceback", encode_id(r.raw_id), exc_info=exc)

    def _report_failure(self, r: Attempt, kind: FailKind, delay_ms: int, err: bytes, etype: str | None,
                        msg: str | None) -> None:
        job = r.job
        if etype is not None and job is not None:
            last = kind is FailKind.PERMANENT or job.attempt >= job.max_attempts
            log.warning("job %s (queue %r, attempt %d/%d) failed: %s: %s; %s", job.id, r.queue, job.attempt,
                        job.max_attempts, etype, msg,
                        "dead-lettering it" if last else f"retry in {delay_ms / 1000:.3g} s")
        if r.lost:
            return
        self.outbox.fail(r, kind, delay_ms, err)

    def quiet(self, horizon: float) -> bool:
        """No other outcome is likely within ``horizon`` s (no handler runs, no held job starts by
        then): the outbox sends at once, not waiting for others to share a round trip for nothing."""
        return self.executing == 0 and self.alarm.next_at() > time.monotonic() + horizon

    # -- shutdown -------------------------------------------------------------------------------
    def tasks(self) -> list[asyncio.Future[Any]]:
        """The tasks of the handlers running now."""
        return [r.task for r in self.running if r.task is not None]

    def hand_back(self) -> list[asyncio.Future[Any]]:
        """Release every job whose handler is still running (back to ready, no attempt spent) and
        cancel its task; returns the tasks cancelled."""
        left = [r for r in self.running if r.state == RUNNING]
        if not left:
            return []
        log.warning("handing %d unfinished job(s) back to ready (no attempt spent)", len(left))
        cancelled: list[asyncio.Future[Any]] = []
        for r in left:
            r.state = RELEASED
            if r.executing:
                r.executing = False
                self.executing -= 1
            self.running.discard(r)
            if r.span is not None:
                tracing.end_attempt(r.span, "released")
                r.span = None
            if not r.lost:
                self.outbox.release(r)
            if self.metrics is not None and r.job is not None:
                try:
                    self.metrics.job_finished(r.job, "released", time.monotonic() - r.t0)
                except Exception:
                    log.exception("metrics.job_finished failed")
            if r.task is not None:
                r.task.cancel()
                cancelled.append(r.task)
        return cancelled
