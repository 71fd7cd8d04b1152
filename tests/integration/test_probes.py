"""/livez judges the event loop, not the HTTP thread: a replica whose loop is blocked still serves
/metrics, but /livez fails once the loop has not turned for ``live_stale_after``, and passes again
when it turns. Run in-process so the test can block the replica's loop itself (a stopped process
answers nothing at all, which says nothing about the judgement)."""
from __future__ import annotations

import asyncio
import threading
import time
import uuid

from scheduler.shell.servers import free_port
from scheduler.tier.process import SchedulerConfig, SchedulerProcess
from tests.support.helpers import ahttp_get, http_get
from tests.support.waits import wait_for, wait_until

STALE_S = 0.5


async def status(port: int, path: str, code: int) -> bool:
    return (await ahttp_get(port, path))[0] == code


def test_livez_fails_while_the_event_loop_is_blocked_and_metrics_still_answer(redis_url: str,
                                                                               etcd_endpoint: str) -> None:
    port = free_port()
    cfg = SchedulerConfig(redis_url=redis_url, etcd_endpoints=etcd_endpoint, namespace=f"l{uuid.uuid4().hex[:8]}",
                          lease_ttl=5.0, metrics_port=port, live_stale_after=STALE_S)
    seen: dict[str, tuple[int, str]] = {}
    frozen = threading.Event()

    def watch_while_frozen() -> None:
        frozen.wait(10)
        seen["livez"] = wait_until(lambda: (r := http_get(port, "/livez"))[0] == 503 and r, 10, 0.02,
                                   "/livez to fail while the loop is blocked")
        seen["readyz"] = http_get(port, "/readyz")
        seen["metrics"] = http_get(port, "/metrics")
        seen["still blocked"] = (int(frozen.is_set()), "")

    async def main() -> None:
        proc = SchedulerProcess(cfg)
        task = asyncio.create_task(proc.run())
        try:
            await wait_for(lambda: status(port, "/readyz", 200), 15, 0.05, "the replica to be ready")
            assert (await ahttp_get(port, "/livez"))[0] == 200
            watcher = threading.Thread(target=watch_while_frozen)
            watcher.start()
            frozen.set()
            # blocks the loop, as a handler or a bug that never awaits would; ends as soon as the
            # watcher has seen the failure (bounded: it never outlasts the watcher's timeout)
            deadline = time.monotonic() + 12
            while "still blocked" not in seen and time.monotonic() < deadline:
                time.sleep(0.01)
            frozen.clear()
            watcher.join()
            await wait_for(lambda: status(port, "/livez", 200), 5, 0.05, "/livez to pass once the loop turns")
            await wait_for(lambda: status(port, "/readyz", 200), 5, 0.05, "/readyz to pass again")
        finally:
            proc.stop()
            await asyncio.wait_for(task, 15)

    asyncio.run(main())
    assert http_get(port, "/livez")[0] == 0, "the probes stop with the replica"
    code, body = seen["livez"]
    assert body.startswith("fail: the event loop has not turned for") and f"(limit {STALE_S:g}s)" in body
    assert seen["readyz"][0] == 503 and "event loop has not turned" in seen["readyz"][1]
    assert seen["metrics"][0] == 200 and "zsched_partitions_owned" in seen["metrics"][1]
    assert seen["still blocked"] == (1, "")
