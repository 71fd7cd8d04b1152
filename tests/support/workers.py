"""Helpers shared by the worker tests.

``TierStandIn`` is a *test stand-in for the scheduler tier*: it calls the ``tick`` and ``reap``
scripts on every partition in a loop (epoch 0 = unfenced), so worker tests can use timers,
retries with delays and lease expiry without etcd or ``zsched scheduler`` processes.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import textwrap
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aredis

from scheduler import AsyncClient
from scheduler.protocol.tick import NO_RETENTION, reap_call, tick_call
from scheduler.redisio.transport import AsyncScriptTransport
from scheduler.shell.servers import ZschedProc
from tests.support.waits import wait_for
from workers import Worker

log = logging.getLogger("tests.worker")

class TierStandIn:
    """Test stand-in for the scheduler tier: ticks timers and reaps expired leases every
    ``interval`` seconds on all partitions (one pipelined round trip each)."""

    def __init__(self, url: str, namespace: str = "zsched", interval: float = 0.01) -> None:
        self.url = url
        self.namespace = namespace
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.reaped = 0
        self.passes = 0  # round trips that went through
        self.errors = 0
        self.last_error: BaseException | None = None

    async def _loop(self) -> None:
        r = aredis.Redis.from_url(self.url)
        try:
            client = await AsyncClient(r, namespace=self.namespace).connect()
            core = client.calls
            assert core is not None
            scripts = AsyncScriptTransport(r)
            parts = range(core.ks.partitions)
            while not self._stopping:
                try:
                    calls = [tick_call(core, p, 0, 1000, {}, NO_RETENTION) for p in parts]
                    calls += [reap_call(core, p, 0, 1000) for p in parts]
                    res = await scripts.call_many(calls)
                    self.reaped += sum(int(x[0]) for x in res[len(parts):])
                    self.passes += 1
                except (OSError, aredis.RedisError) as exc:  # fault tests kill Redis under us
                    if not self.errors or type(exc) is not type(self.last_error):
                        log.warning("tier stand-in: %s: %s", type(exc).__name__, exc)
                    self.errors += 1
                    self.last_error = exc
                await asyncio.sleep(self.interval)
        finally:
            await r.aclose()

    async def passed(self, what: str = "the tier stand-in to tick and reap once more") -> None:
        """Wait until a whole pass (tick and reap of every partition) began and ended after now."""
        n = self.passes
        await wait_for(lambda: self.passes >= n + 2, 5, what=what)

    async def __aenter__(self) -> TierStandIn:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        # a flag as well as cancel(): redis-py may turn a cancellation inside a pipeline into a
        # connection error, which the loop would survive
        self._stopping = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
            await asyncio.wait_for(self._task, 5)


def chore_worker(url: str, namespace: str, every: float = 3.0) -> Worker:
    """An idle worker of queue ``q`` (one slot, a no-op handler) whose registry refreshes come every
    ``every`` seconds (patch ``workers.namespace.SETTINGS_INTERVAL`` for its settings reads): for
    tests of what an idle worker sends."""
    w = Worker.from_url(url, namespace=namespace, queues=["q"], concurrency=1, registry_interval=every,
                        shutdown_grace=2.0)

    async def noop(job: Any) -> None:
        return None

    w.handler("q")(noop)
    return w


def one_listener_workers(url: str, namespace: str, n: int, idle_sweep: float) -> tuple[list[Worker], list[Any]]:
    """``n`` idle workers of queue ``q`` with one listener (a no-op handler), and their doorbell
    fetch strategies (``workers.fetch.DoorbellFetch``) in the order the workers made them."""
    from workers.fetch import DoorbellFetch, FetchContext

    made: list[DoorbellFetch] = []

    def fetch(ctx: FetchContext) -> DoorbellFetch:
        made.append(DoorbellFetch(ctx))
        return made[-1]

    async def noop(job: Any) -> None:
        return None

    ws = [Worker.from_url(url, namespace=namespace, queues=["q"], idle_sweep=idle_sweep, fetch=fetch,
                          shutdown_grace=2.0, one_listener=True) for _ in range(n)]
    for w in ws:
        w.handler("q")(noop)
    return ws, made


@contextlib.asynccontextmanager
async def serving(*workers: Worker, ready: bool = True) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Run in-process workers for the duration of the block; stop them (gracefully) afterwards."""
    tasks = [asyncio.create_task(w.serve()) for w in workers]
    try:
        if ready:
            for w, t in zip(workers, tasks):
                waiter = asyncio.create_task(w.wait_ready(10))
                done, _ = await asyncio.wait([waiter, t], return_when=asyncio.FIRST_COMPLETED)
                if t in done:
                    waiter.cancel()
                    t.result()  # serve() failed: raise its error
                    raise AssertionError("worker stopped before it was ready")
                waiter.result()
        yield tasks
    finally:
        for w in workers:
            await w.stop()
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Recorder:
    """Records handler runs: (job id, attempt, fence, start, end, outcome)."""

    starts: list[tuple[str, int, float]] = field(default_factory=list)
    ends: list[tuple[str, int, float, str]] = field(default_factory=list)

    def start(self, job: Any) -> None:
        self.starts.append((job.id, job.attempt, time.monotonic()))

    def end(self, job: Any, outcome: str = "ok") -> None:
        self.ends.append((job.id, job.attempt, time.monotonic(), outcome))

    def ok_ids(self) -> list[str]:
        return [e[0] for e in self.ends if e[3] == "ok"]


# --------------------------------------------------------------------------- subprocess workers

APP_SOURCE = '''
"""Handler module for subprocess worker tests: logs each run to runs-<pid>.log in RUN_LOG_DIR."""
import os, time
from workers import Worker

LOG_DIR = os.environ["RUN_LOG_DIR"]
SLOW = float(os.environ.get("SLOW_SECONDS", "30"))
FAST = float(os.environ.get("FAST_SECONDS", "0"))
worker = Worker.from_url(None)
_fd = os.open(os.path.join(LOG_DIR, "runs-%d.log" % os.getpid()), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _log(kind, job):
    # One O_APPEND write per line: atomic, unbuffered (survives kill -9), no interleaving.
    os.write(_fd, ("%s %s %d %d %.6f\\n" % (kind, job.id, job.attempt, os.getpid(), time.time())).encode())


@worker.handler("default")
async def default(job):
    import asyncio
    _log("START", job)
    if job.payload and job.payload.get("slow") and job.attempt <= job.payload.get("slow_attempts", 1):
        await asyncio.sleep(SLOW)
    elif FAST:
        await asyncio.sleep(FAST)
    _log("END", job)


@worker.handler("sync")
def sync_handler(job):
    _log("START", job)
    time.sleep(FAST)
    _log("END", job)
'''


def write_app(dirpath: Path, name: str = "wapp") -> str:
    (dirpath / f"{name}.py").write_text(textwrap.dedent(APP_SOURCE))
    return f"{name}:worker"


def spawn_worker(dirpath: Path, url: str, *args: str, env: dict[str, str] | None = None) -> ZschedProc:
    """Start ``zsched worker wapp:worker --redis URL ARGS --metrics-port P`` with cwd ``dirpath``."""
    e = {"RUN_LOG_DIR": str(dirpath), **(env or {})}
    return ZschedProc(["worker", "wapp:worker", "--redis", url, *args], env=e, cwd=str(dirpath)).start()


def read_runs(dirpath: Path) -> list[tuple[str, str, int, int, float]]:
    """All (kind, job id, attempt, pid, time) lines written by subprocess handlers, oldest first."""
    out = []
    for f in dirpath.glob("runs-*.log"):
        text = f.read_text()
        # a handler may be writing its line right now: only complete lines count
        for line in text[: text.rfind("\n") + 1].splitlines():
            kind, jid, attempt, pid, t = line.split()
            out.append((kind, jid, int(attempt), int(pid), float(t)))
    out.sort(key=lambda r: r[4])
    return out


async def wait_worker_ready(proc: ZschedProc, timeout: float = 15.0) -> None:
    """Wait for the subprocess's "worker serving" log line (it subscribes and sweeps right after,
    so jobs scheduled from now on are picked up either way)."""
    await wait_for(lambda: "worker serving" in proc.output() or not proc.alive, timeout,
                   what="worker subprocess to start")
    assert proc.alive, proc.tail()
