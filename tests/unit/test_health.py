"""The liveness and readiness judgement of scheduler/health.py, on a clock the test moves."""
from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from scheduler.health import Health, Verdict, wsgi_app


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_live_only_while_the_heartbeat_is_fresher_than_the_limit() -> None:
    clock = Clock()
    h = Health(stale_after=10.0, clock=clock)
    assert not h.live().ok and "not started" in h.live().reason
    h.beat()
    clock.now += 10.0
    assert h.live().ok
    clock.now += 0.1
    v = h.live()
    assert not v.ok and "has not turned for 10.1s (limit 10s)" in v.reason
    h.beat()
    assert h.live().ok


def test_ready_needs_a_live_loop_and_a_recent_passing_check() -> None:
    clock = Clock()
    h = Health(stale_after=5.0, clock=clock)
    h.beat()
    assert h.ready() == Verdict(False, "starting")
    h.set_ready(Verdict(True, "Redis answers"))
    assert h.ready() == Verdict(True, "Redis answers")
    clock.now += 5.5  # the loop froze: its last verdict no longer counts
    assert not h.ready().ok and "has not turned" in h.ready().reason
    h.beat()  # the loop turns again, but the check has not finished since
    assert not h.ready().ok and "readiness check has not finished for 5.5s" in h.ready().reason
    h.set_ready(Verdict(False, "ConnectionError: refused"))
    assert h.ready() == Verdict(False, "ConnectionError: refused")


def test_run_beats_and_judges_with_a_timeout_and_masks_secrets() -> None:
    async def main() -> list[Verdict]:
        h = Health()
        seen: list[Verdict] = []
        checks = iter(["ok", "raise", "hang"])

        async def check() -> Verdict:
            what = next(checks, "hang")
            if what == "raise":
                raise ConnectionError("cannot reach redis://user:hunter2@127.0.0.1:1/0")
            if what == "hang":
                await asyncio.sleep(3600)
            return Verdict(True, "fine")

        task = asyncio.create_task(h.run(check, interval=0.01, timeout=0.05))
        for _ in range(300):
            await asyncio.sleep(0.01)
            v = h.ready()
            if not seen or seen[-1] != v:
                seen.append(v)
            if "did not answer" in v.reason:
                break
        task.cancel()
        assert h.live().ok
        return seen

    seen = asyncio.run(main())
    reasons = [v.reason for v in seen]
    assert Verdict(True, "fine") in seen
    failed = next(r for r in reasons if r.startswith("ConnectionError"))
    assert "hunter2" not in failed
    assert reasons[-1] == "the readiness check did not answer within 0.05s"


def call(app: Any, path: str, method: str = "GET") -> tuple[str, bytes]:
    got: dict[str, str] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        got["status"] = status

    body = b"".join(app({"PATH_INFO": path, "REQUEST_METHOD": method, "wsgi.input": io.BytesIO()}, start_response))
    return got["status"], body


@pytest.mark.parametrize("path", ["/livez", "/readyz"])
def test_the_probes_answer_200_or_503_with_the_reason_and_leave_other_paths_to_metrics(path: str) -> None:
    clock = Clock()
    h = Health(stale_after=1.0, clock=clock)

    def metrics(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"metrics"]

    app = wsgi_app(h, metrics)
    assert call(app, "/metrics") == ("200 OK", b"metrics")
    h.beat()
    h.set_ready(Verdict(True, "Redis answers"))
    status, body = call(app, path)
    assert status == "200 OK" and body.startswith(b"ok: ")
    clock.now += 2
    status, body = call(app, path)
    assert status == "503 Service Unavailable" and body.startswith(b"fail: the event loop has not turned")
    assert call(app, path, "HEAD")[1] == b""
