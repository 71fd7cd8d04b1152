"""Soak: a steady load through the real tier and workers for a long time; Redis memory must be
flat once the tombstone TTL has passed (``python -m bench soak [--minutes 30] [--rate 2000]``).

Load: RATE jobs/s over 5 queues (due 0-5 s ahead; 3 % fail once and retry, 2 % fail for good and
are dead-lettered, bounded by a dead-letter retention of 2 000), 10 per-second crons, tombstone TTL
60 s, 2 scheduler replicas, 2 worker processes, Redis with AOF everysec. ``used_memory`` is sampled
every 10 s; the slope (least squares, bytes per minute) is computed over the samples after the
warm-up (2 x TTL), together with the memory range in that window.
"""
from __future__ import annotations

import argparse
import random
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import PAYLOAD, emit, machine
from bench.stack import LIFELINE, NS, Stack
from scheduler import Client
from scheduler.shell.servers import ZschedProc

TTL = 60.0
QUEUES = ["emails", "webhooks", "reports", "billing"]


def _slope_per_minute(samples: list[tuple[float, int]]) -> float:
    n = len(samples)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    cov = sum((t - mt) * (v - mv) for t, v in samples)
    var = sum((t - mt) ** 2 for t, _ in samples)
    return cov / var * 60.0 if var else 0.0


class Producer(threading.Thread):
    """Schedules ``rate`` jobs/s in batches every 100 ms until stopped."""

    def __init__(self, url: str, rate: int) -> None:
        super().__init__(daemon=True)
        self.client = Client.from_url(url, namespace=NS, tombstone_ttl=TTL)
        self.rate = rate
        self.stop_evt = threading.Event()
        self.sent = 0
        self.errors = 0

    def run(self) -> None:
        rng = random.Random(7)
        per_tick = max(1, self.rate // 10)
        nxt = time.monotonic()
        while not self.stop_evt.is_set():
            now = time.time()
            by_queue: dict[str, list[tuple[float, Any]]] = {q: [] for q in QUEUES}
            for _ in range(per_tick):
                r = rng.random()
                payload: Any = {**PAYLOAD, "fail": "permanent"} if r < 0.02 else \
                    {**PAYLOAD, "fail": "retry"} if r < 0.05 else PAYLOAD
                by_queue[rng.choice(QUEUES)].append((now + rng.uniform(0, 5), payload))
            try:
                for q, jobs in by_queue.items():
                    if jobs:
                        self.client.schedule_many(jobs, queue=q, max_attempts=2, backoff=(0.5, 2.0))
                        self.sent += len(jobs)
            except Exception:  # noqa: BLE001 - counted and reported; the soak goes on
                self.errors += 1
            nxt += 0.1
            self.stop_evt.wait(max(0.0, nxt - time.monotonic()))
        self.client.close()


def run(minutes: float = 30.0, rate: int = 2000) -> dict[str, Any]:
    with Stack() as st:
        st.client.set_dead_retention(max_dead=2000)
        for i in range(10):
            st.client.add_cron(f"soak-{i}", "* * * * * *", {"cron": i}, queue="cron")
        st.start_schedulers(2)
        root = Path(__file__).resolve().parent.parent
        workers = [ZschedProc(["worker", "bench.soak_handlers:worker", "--redis", st.url, "--namespace", NS],
                              env={"PYTHONPATH": str(root), "SOAK_TOMBSTONE_TTL": str(TTL)}, cwd=str(root),
                              lifeline=LIFELINE).start()
                   for _ in range(2)]
        time.sleep(1.5)
        prod = Producer(st.url, rate)
        prod.start()
        t0 = time.monotonic()
        samples: list[tuple[float, int]] = []
        try:
            while time.monotonic() - t0 < minutes * 60:
                time.sleep(10)
                mem = st.r.info("memory")["used_memory"]
                samples.append((time.monotonic() - t0, int(mem)))
                emit({"soak_sample": {"t_s": round(samples[-1][0]), "used_memory": mem, "sent": prod.sent,
                                      "acked": sum(st.counter("acked", q) for q in QUEUES)}})
        finally:
            prod.stop_evt.set()
            prod.join(10)
            stats = st.client.stats()
            for w in workers:
                w.stop()
        warm = 2 * TTL
        window = [(t, v) for t, v in samples if t >= warm]
        slope = _slope_per_minute(window)
        acked = sum(st.counter("acked", q) for q in QUEUES)
        out = {
            "minutes": minutes, "rate_jobs_per_s": rate, "tombstone_ttl_s": TTL, "sent": prod.sent,
            "producer_errors": prod.errors, "acked": acked,
            "dead_dropped_by_retention": sum(st.counter("dropped", q) for q in QUEUES),
            "used_memory_slope_bytes_per_min": round(slope),
            "used_memory_after_warmup": {"min": min(v for _, v in window), "max": max(v for _, v in window),
                                         "first": window[0][1], "last": window[-1][1]} if window else None,
            "slope_over_mean_per_hour": round(slope * 60 / (sum(v for _, v in window) / len(window)), 4)
            if window else None,
            "final_stats": stats, "samples": samples,
        }
        return out


def markdown(r: dict[str, Any], m: dict[str, Any]) -> str:
    def n(x: Any) -> str:
        return f"{x:,}".replace(",", " ")

    w = r["used_memory_after_warmup"] or {}
    return "\n".join([
        "## Soak (`python -m bench soak`)", "",
        f"Measured {m['date']}: {r['minutes']:g} min at {r['rate_jobs_per_s']} jobs/s through 2 scheduler replicas and "
        "2 workers (5 queues, 3 % retried once, 2 % dead-lettered under a 2 000-job retention, 10 per-second "
        f"crons), tombstone TTL {r['tombstone_ttl_s']:g} s, Redis AOF everysec.", "",
        "| measure | value |", "|---|---|",
        f"| jobs scheduled / acked | {n(r['sent'])} / {n(r['acked'])} |",
        f"| Redis used_memory after warm-up (2 x TTL): min / max / first / last | {n(w.get('min', 0))} / "
        f"{n(w.get('max', 0))} / {n(w.get('first', 0))} / {n(w.get('last', 0))} bytes |",
        f"| slope of used_memory after warm-up (least squares) | {n(r['used_memory_slope_bytes_per_min'])} bytes/min "
        f"({r['slope_over_mean_per_hour']:.1%} of the mean per hour) |",
        f"| dead jobs dropped by the retention rule | {n(r['dead_dropped_by_retention'])} |",
        f"| producer errors | {r['producer_errors']} |",
    ])


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--rate", type=int, default=2000)
    p.add_argument("--results", action="store_true", help="also write the figures into bench/RESULTS.md")
    a = p.parse_args()
    m = machine()
    r = run(a.minutes, a.rate)
    emit({"machine": m, "soak": r})
    if a.results:
        from bench.report import update_section
        update_section(Path(__file__).resolve().parent / "RESULTS.md", "soak", markdown(r, m))


if __name__ == "__main__":
    main()
