"""The liveness and readiness judgement of scheduler/health.py: probes from another thread, as the
HTTP server's, against a real event loop that the tests block, and a check they control."""
from __future__ import annotations

import asyncio
import io
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from scheduler.health import Health, Verdict, wsgi_app

Check = Callable[[], Awaitable[Verdict]]


@contextmanager
def serving(health: Health, check: Check) -> Iterator[asyncio.AbstractEventLoop]:
    """``health.run(check)`` on an event loop of its own thread, until the block ends."""
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def main() -> None:
        task = asyncio.create_task(health.run(check))
        loop.call_soon(started.set)
        await asyncio.shield(stop)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    stop: asyncio.Future[None] = loop.create_future()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(5)
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(stop.set_result, None)
        thread.join(5)
        loop.close()


async def fine() -> Verdict:
    return Verdict(True, "fine")


def block(loop: asyncio.AbstractEventLoop, until: threading.Event) -> None:
    """Block ``loop`` (as a handler that never awaits would) until ``until`` is set."""
    entered = threading.Event()

    def stuck() -> None:
        entered.set()
        until.wait(30)

    loop.call_soon_threadsafe(stuck)
    assert entered.wait(5)


def test_live_while_the_loop_answers_and_failing_once_it_left_a_probe_unanswered_past_the_limit() -> None:
    h = Health(stale_after=0.6, answer_wait=0.05)
    assert h.live() == Verdict(False, "the event loop has not started its probes yet")
    with serving(h, fine) as loop:
        v = h.live()
        assert v.ok and v.reason.startswith("the event loop answered in "), v
        thaw = threading.Event()
        block(loop, thaw)
        try:
            v = h.live()  # hands the loop a callback it cannot run yet: not failed before the limit
            assert v.ok and v.reason.startswith("the event loop has not answered for 0."), v
            time.sleep(0.65)
            v = h.live()  # the same callback, still waiting: the loop has not turned for that long
            assert not v.ok and re.fullmatch(r"the event loop has not turned for 0\.[789]s \(limit 0\.6s\): "
                                             r"something blocks it", v.reason), v
            r = h.ready()
            assert not r.ok and r.reason.startswith("the event loop has not turned for "), r
        finally:
            thaw.set()
        assert h.live().reason.startswith("the event loop answered in ")
    assert h.live() == Verdict(False, "the process has stopped serving its probes")


def test_ready_runs_the_check_when_asked_reuses_a_fresh_verdict_and_shares_a_running_check() -> None:
    runs: list[float] = []
    gate = threading.Event()

    async def check() -> Verdict:
        runs.append(time.monotonic())
        while not gate.is_set():
            await asyncio.sleep(0.01)
        return Verdict(True, f"check {len(runs)}")

    h = Health(reuse=0.3, timeout=5.0)
    with serving(h, check):
        got: list[Verdict] = []
        probes = [threading.Thread(target=lambda: got.append(h.ready())) for _ in range(4)]
        for t in probes:
            t.start()
        time.sleep(0.2)
        gate.set()
        for t in probes:
            t.join(5)
        assert got == [Verdict(True, "check 1")] * 4 and len(runs) == 1, "concurrent probes share one check"
        assert h.ready() == Verdict(True, "check 1") and len(runs) == 1, "a verdict younger than reuse answers"
        time.sleep(0.35)
        assert h.ready() == Verdict(True, "check 2") and len(runs) == 2


def test_a_check_that_raises_or_hangs_fails_with_its_reason_and_secrets_masked(caplog: Any) -> None:
    plan = iter(["ok", "raise", "hang"])

    async def check() -> Verdict:
        what = next(plan, "hang")
        if what == "raise":
            raise ConnectionError("cannot reach redis://user:hunter2@127.0.0.1:1/0")
        if what == "hang":
            await asyncio.sleep(3600)
        return Verdict(True, "fine")

    h = Health(reuse=0.0, timeout=0.2)
    with serving(h, check):
        assert h.ready() == Verdict(True, "fine")
        failed = h.ready()
        assert not failed.ok and failed.reason.startswith("ConnectionError: ") and "hunter2" not in failed.reason
        started = time.monotonic()
        assert h.ready() == Verdict(False, "the readiness check did not answer within 0.2s")
        assert time.monotonic() - started < 2
    assert "NOT ready: ConnectionError" in caplog.text and "hunter2" not in caplog.text


def timeslices(tid: int) -> int:
    with open(f"/proc/{os.getpid()}/task/{tid}/schedstat") as f:
        return int(f.read().split()[2])


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc schedstat")
def test_between_probes_the_loop_is_not_woken() -> None:
    h = Health()
    tid: list[int] = []
    with serving(h, fine) as loop:
        loop.call_soon_threadsafe(lambda: tid.append(threading.get_native_id()))
        assert h.live().ok and tid
        time.sleep(0.2)  # the loop back in its selector after answering
        before = timeslices(tid[0])
        time.sleep(1.6)  # the heartbeat this replaces woke the loop every second, twice
        assert timeslices(tid[0]) == before, "the event loop was woken with no probe"
        assert h.ready() == Verdict(True, "fine")


def call(app: Any, path: str, method: str = "GET") -> tuple[str, bytes]:
    got: dict[str, str] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        got["status"] = status

    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": method, "wsgi.input": io.BytesIO()}, start_response))
    return got["status"], body


@pytest.mark.parametrize("path", ["/livez", "/readyz"])
def test_the_probes_answer_200_or_503_with_the_reason_and_leave_other_paths_to_metrics(path: str) -> None:
    h = Health(stale_after=0.3, answer_wait=0.05)

    def metrics(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"metrics"]

    app = wsgi_app(h, metrics)
    assert call(app, "/metrics") == ("200 OK", b"metrics")
    with serving(h, fine) as loop:
        status, body = call(app, path)
        assert status == "200 OK" and body.startswith(b"ok: ")
        thaw = threading.Event()
        block(loop, thaw)
        try:
            call(app, path)
            time.sleep(0.35)
            status, body = call(app, path)
            assert status == "503 Service Unavailable" and body.startswith(b"fail: the event loop has not turned")
            assert call(app, path, "HEAD")[1] == b""
        finally:
            thaw.set()


def test_bad_timings_are_refused() -> None:
    with pytest.raises(ValueError, match="stale_after must be a positive number of seconds, got 0"):
        Health(stale_after=0)
    with pytest.raises(ValueError, match="reuse must be zero or a positive"):
        Health(reuse=-1)
