"""Background work of the console: a rate-limited (or large) dead-letter requeue runs on its own
thread in the console process, never inside the HTTP request that started it. The request returns
at once with a redirect to the task's progress page; the audit log records its start and its end.

Bounded: one task at a time per queue (a task over every queue excludes all others), at most
MAX_RUNNING at once, at most MAX_JOBS jobs per task (the CLI, ``zsched dead requeue --rate``, has
no such limit), and the last KEEP finished tasks are remembered for their progress pages.
"""
from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ...client import Client
from ...protocol.errors import ZschedError
from .. import admin
from .security import audit

MAX_RUNNING = 4
MAX_JOBS = 100_000
KEEP = 20
ALL_QUEUES = "*"


def pace_wait(stop: threading.Event, seconds: float) -> bool:
    """The pacer's sleep: wait ``seconds`` unless the task is stopped; True to go on."""
    return not stop.wait(seconds)


@dataclass
class RequeueTask:
    """One background requeue, as its progress page shows it."""

    id: str
    scope: str                      # the queue, or ALL_QUEUES
    who: str
    total: int
    rate: float | None
    started: datetime
    requeued: int = 0
    not_dead: int = 0               # were requeued or purged by someone else meanwhile
    state: str = "running"          # running, done, failed
    error: str = ""
    finished: datetime | None = None
    stop: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def handled(self) -> int:
        """Jobs dealt with so far (requeued or found not dead any more)."""
        return self.requeued + self.not_dead


class Busy(ZschedError):
    """A task may not start now (another one runs on the same queue, or too many run)."""


class RequeueTasks:
    """The console's background requeues (thread-safe)."""

    def __init__(self, client: Client, sleep: Callable[[threading.Event, float], bool] | None = None) -> None:
        self.client = client
        self.sleep = sleep or pace_wait
        self._lock = threading.Lock()
        self._tasks: dict[str, RequeueTask] = {}
        self._threads: list[threading.Thread] = []

    def get(self, task_id: str) -> RequeueTask | None:
        """The task with that id (running or among the last KEEP finished ones), or None."""
        with self._lock:
            return self._tasks.get(task_id)

    def recent(self) -> list[RequeueTask]:
        """The remembered tasks, newest first."""
        with self._lock:
            return sorted(self._tasks.values(), key=lambda t: t.started, reverse=True)

    def start(self, who: str, scope: str, jobs: list[Any], rate: float | None) -> RequeueTask:
        """Start requeueing ``jobs`` (JobInfo of dead jobs) at ``rate`` jobs/s (None: as fast as
        batches go) on a new thread; Busy when the bounds do not allow it now."""
        if len(jobs) > MAX_JOBS:
            raise Busy(f"{len(jobs)} jobs match, more than the console requeues in one task ({MAX_JOBS}); "
                       "narrow the filter or use: zsched dead requeue --rate")
        with self._lock:
            running = [t for t in self._tasks.values() if t.state == "running"]
            clash = next((t for t in running if ALL_QUEUES in (t.scope, scope) or t.scope == scope), None)
            if clash is not None:
                where = "every queue" if clash.scope == ALL_QUEUES else f"queue {clash.scope}"
                raise Busy(f"a requeue of {where} is still running (task {clash.id}, started by {clash.who}): "
                           "wait for it to finish")
            if len(running) >= MAX_RUNNING:
                raise Busy(f"{len(running)} requeues are running already (at most {MAX_RUNNING}): wait for one")
            task = RequeueTask(secrets.token_hex(6), scope, who, len(jobs), rate, datetime.now(UTC))
            self._tasks[task.id] = task
            done = [t for t in self._tasks.values() if t.state != "running"]
            for old in sorted(done, key=lambda t: t.started)[:max(0, len(done) - KEEP)]:
                del self._tasks[old.id]
        audit.info("%s: dead requeue started (task %s): %d jobs of %s%s", who, task.id, task.total,
                   "every queue" if scope == ALL_QUEUES else f"queue {scope}", f" at {rate:g}/s" if rate else "")
        thread = threading.Thread(target=self._run, args=(task, jobs), name=f"zsched-ui-requeue-{task.id}",
                                  daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return task

    def _run(self, task: RequeueTask, jobs: list[Any]) -> None:
        t0 = time.monotonic()

        def nap(seconds: float) -> None:  # the pacer's wait before a batch: a stop ends the task there
            if not self.sleep(task.stop, seconds):
                raise RuntimeError("stopped: the console is shutting down")

        pacer = admin.Pacer(task.rate, sleep=nap)
        try:
            for outcome in admin.requeue_stream(self.client, jobs, rate=task.rate, pacer=pacer):
                if outcome.status == "requeued":
                    task.requeued += 1
                else:
                    task.not_dead += 1
                if task.stop.is_set():
                    raise RuntimeError("stopped: the console is shutting down")
            task.state = "done"
        except Exception as exc:  # noqa: BLE001 - any failure ends the task and is shown on its page
            task.state, task.error = "failed", f"{type(exc).__name__}: {exc}"
        task.finished = datetime.now(UTC)
        audit.info("%s: dead requeue %s (task %s): requeued %d of %d, %d not dead any more, in %.1f s%s",
                   task.who, task.state, task.id, task.requeued, task.total, task.not_dead,
                   time.monotonic() - t0, f": {task.error}" if task.error else "")

    def stop_all(self, timeout: float = 5.0) -> None:
        """Stop every running task between batches and wait for their threads (console shutdown)."""
        with self._lock:
            for t in self._tasks.values():
                t.stop.set()
        for thread in self._threads:
            thread.join(timeout)
