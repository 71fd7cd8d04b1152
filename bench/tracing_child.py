"""Child process of ``python -m bench tracing`` (bench/tracing.py). Run as a script,
``python bench/tracing_child.py MODE --root ROOT --variant VARIANT ...`` with ``PYTHONPATH=ROOT``:
it imports ``scheduler`` and ``workers`` from ROOT only (checked) and nothing from ``bench``.

Variants: ``absent`` (OpenTelemetry cannot be imported: ``sys.modules["opentelemetry"] = None``
before zsched is), ``idle`` (installed, no span active, no tracer provider), ``span`` (the
producer schedules inside an active span, so each job stores its context; the worker has the
SDK's tracer provider, without exporter, so every attempt records a span), ``base`` (the other
checkout, as it is).

Modes: ``w1`` reads lines ``N`` on stdin and answers each with the seconds ``N`` one-by-one
``Client.schedule`` calls took (the parent interleaves the variants slice by slice); ``w3``
``--repeat`` times schedules N jobs due now with ``schedule_many``, then drains them with an
in-process ``Worker``
(a no-op async handler) and prints the seconds from ``serve()`` to the last ack and the CPU
seconds the process used meanwhile (less disturbed by other load on the machine than the wall
time), the best of the drains.
"""
from __future__ import annotations

import sys
from pathlib import Path

# run as a script, sys.path[0] is bench/: nothing may be imported from there
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from datetime import timedelta  # noqa: E402
from typing import Any  # noqa: E402

PAYLOAD = {"user_id": 12345, "template": "welcome", "to": "someone@example.com", "pad": "x" * 40}


def load(root: Path, variant: str) -> None:
    """Import zsched from ``root`` (and fail if it came from elsewhere), OpenTelemetry blocked for ``absent``."""
    if variant == "absent":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    import scheduler
    import workers
    for mod in (scheduler, workers):
        where = Path(mod.__file__ or "").resolve()
        if not where.is_relative_to(root.resolve()):
            raise SystemExit(f"tracing_child: {mod.__name__} imported from {where}, not {root}")


def producer_span(variant: str) -> contextlib.AbstractContextManager[Any]:
    """An active span for the ``span`` variant (a recording one: the SDK's provider is installed)."""
    if variant != "span":
        return contextlib.nullcontext()
    from opentelemetry import trace
    return trace.get_tracer("bench").start_as_current_span("producer")


def install_sdk(variant: str) -> None:
    if variant == "span":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        trace.set_tracer_provider(TracerProvider())  # spans recorded, exported nowhere


def w1(url: str, ns: str, variant: str) -> None:
    from scheduler import Client
    client = Client.from_url(url, namespace=ns).connect()
    with producer_span(variant):
        for _ in range(500):  # warm up: connections, scripts loaded, caches
            client.schedule(time.time() + 3600, PAYLOAD)
        print("ready", flush=True)
        for line in sys.stdin:
            n = int(line)
            t0 = time.perf_counter()
            for _ in range(n):
                client.schedule(time.time() + 3600, PAYLOAD)
            print(time.perf_counter() - t0, flush=True)


async def drain(url: str, ns: str, n: int) -> tuple[float, float]:
    from workers import Job, Worker
    worker = Worker.from_url(url, namespace=ns, concurrency=64)

    ran, done = [0], asyncio.Event()

    @worker.handler("default")
    async def noop(job: Job) -> None:
        ran[0] += 1
        if ran[0] == n:
            done.set()

    # an event, not a polling loop: the count of instructions per job (callgrind) must not depend
    # on how long the drain took
    t0, c0 = time.perf_counter(), time.process_time()
    task = asyncio.create_task(worker.serve())
    waiter = asyncio.create_task(done.wait())
    await asyncio.wait([waiter, task], return_when=asyncio.FIRST_COMPLETED)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    if not done.is_set():
        task.result()
        raise SystemExit("tracing_child: the worker stopped")
    await worker.stop()  # acks what is left, gracefully
    await task
    if worker.stats.acked != n:
        raise SystemExit(f"tracing_child: {worker.stats.acked} of {n} jobs acked")
    return elapsed, cpu


def w3(url: str, ns: str, variant: str, n: int, repeat: int, fed: bool = False) -> None:
    from scheduler import Client
    install_sdk(variant)
    best = (float("inf"), float("inf"))
    for i in range(repeat):  # the best of a few drains: other load on the machine only slows one down
        if not fed:
            with Client.from_url(url, namespace=f"{ns}{i}").connect() as client, producer_span(variant):
                for s in range(0, n, 1000):
                    client.schedule_many([(timedelta(0), PAYLOAD)] * min(1000, n - s))
        seconds, cpu = asyncio.run(drain(url, f"{ns}{i}", n))
        best = (min(best[0], seconds), min(best[1], cpu))
    print(json.dumps({"seconds": best[0], "cpu_seconds": best[1]}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("w1", "w3"))
    p.add_argument("--root", type=Path, required=True)
    p.add_argument("--variant", choices=("base", "absent", "idle", "span"), required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--ns", required=True)
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3, help="w3: drains in this process, the best one counts")
    p.add_argument("--fed", action="store_true", help="w3: the jobs are there already (namespaces NS0, NS1, ...)")
    a = p.parse_args()
    load(a.root, a.variant)
    if a.mode == "w1":
        w1(a.url, a.ns, a.variant)
    else:
        w3(a.url, a.ns, a.variant, a.jobs, a.repeat, a.fed)


if __name__ == "__main__":
    main()
