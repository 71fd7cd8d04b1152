"""The live view of ``zsched dev``: what it reads from the running stack each interval (counters,
depths, firing lateness from the replicas' histograms, partition owners from etcd) and how it
shows it: a redrawn frame on a terminal, one line per interval otherwise (a log file). When the
lateness reads seconds while the tier is on time, the line says why: jobs a rate limit held back,
or due in partitions no replica owned, count from their due time.
"""
from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ..client import Client
from ..client.layout import follows_layout
from ..metrics import LATENESS_BUCKETS, bucket_quantile, past_top, scrape_histogram
from ..protocol.masking import mask_secrets
from ..protocol.replies import merge_stats, parse_stats

ETCD_UNREACHABLE = "(etcd unreachable"
"""How :meth:`View.owners` names its one entry when etcd could not be read (shown as an owner's
name; :meth:`View.unowned` then knows nothing of ownership)."""
BACKLOG_P99_S = 1.0
"""A p99 this high, after partitions were without a running owner, is still their backlog draining."""


class ViewedStack(Protocol):
    """What the view reads of ``zsched dev``'s stack (``scheduler.shell.dev.Stack``)."""

    ns: str
    redis_url: str
    etcd: str
    home: Path
    metrics_ports: dict[str, int]

    def dead_children(self) -> list[str]:
        """The children that exited on their own."""
        ...


class View:
    def __init__(self, stack: ViewedStack) -> None:
        self.stack = stack
        self.client = Client.from_url(stack.redis_url, namespace=stack.ns)
        self.prev_counts: dict[str, int] = {}
        self.prev_buckets: dict[float, float] = {}
        self.prev_t = time.monotonic()
        self.prev_held = 0
        self.prev_unowned = 0  # partitions without a running owner at the last reading
        self.shown_unowned = 0  # ... as the last line named them

    def counts(self) -> dict[str, int]:
        ks = self.client.keyspace
        pipe = self.client.redis.pipeline(transaction=False)
        for p in range(ks.partitions):
            pipe.hgetall(ks.key(p, "c"))
        out: dict[str, int] = {}
        for h in pipe.execute():
            for k, v in h.items():
                ev = k.decode().split(":", 1)[0]
                out[ev] = out.get(ev, 0) + int(v)
        return out

    def lateness(self) -> tuple[float | None, float | None]:
        total: dict[float, float] = {}
        for name, port in self.stack.metrics_ports.items():
            if not name.startswith("scheduler"):
                continue
            try:
                for le, c in scrape_histogram(port, "zsched_firing_lateness_seconds", timeout=0.5).items():
                    total[le] = total.get(le, 0.0) + c
            except OSError:
                continue
        delta = sorted((le, total[le] - self.prev_buckets.get(le, 0.0)) for le in total)
        self.prev_buckets = total

        def quantile(q: float) -> float | None:
            # past the top bucket (jobs overdue since a stop, say) the bound is a floor: inf says so
            return math.inf if past_top(delta, q) else bucket_quantile(delta, q)
        return quantile(0.5), quantile(0.99)

    def owners(self) -> dict[str, list[int]]:
        async def read() -> dict[str, list[int]]:
            from ..coord import EtcdCoordinator  # gRPC loads only once zsched dev runs

            async with EtcdCoordinator.from_endpoints(self.stack.etcd, timeout=0.5) as c:
                kvs, _ = await c.get_prefix(f"/zsched/{self.stack.ns}/owners/")
            out: dict[str, list[int]] = {}
            for kv in kvs:
                out.setdefault(kv.value.decode(), []).append(int(kv.key.rsplit("/", 1)[1]))
            return out
        try:
            return asyncio.run(read())
        except Exception as exc:  # the view must keep going while etcd is down
            return {f"{ETCD_UNREACHABLE}: {type(exc).__name__})": []}

    def sample(self) -> Sample:
        """Read the counters, depths, lateness and owners once (for :meth:`render` or :meth:`line`)."""
        now = time.monotonic()
        dt = max(1e-3, now - self.prev_t)
        self.prev_t = now
        counts = self.counts()
        rates = None
        if self.prev_counts:
            rates = {k: (counts.get(k, 0) - self.prev_counts.get(k, 0)) / dt for k in ("scheduled", "fired", "acked")}
        self.prev_counts = counts
        p50, p99 = self.lateness()
        stats, held = self.queue_counts()
        # the interval's lateness covers jobs held at its start too (released since)
        held_in_interval, self.prev_held = max(held, self.prev_held), held
        owners, exited = self.owners(), self.stack.dead_children()
        unowned = self.unowned(owners, exited)
        unowned_in_interval = unowned_note(unowned, self.prev_unowned, self.shown_unowned, p99, held_in_interval)
        self.prev_unowned, self.shown_unowned = unowned, unowned_in_interval
        return Sample(time.strftime("%H:%M:%S"), counts, rates, p50, p99, stats, owners, exited,
                      held_in_interval, unowned_in_interval)

    def unowned(self, owners: dict[str, list[int]], exited: list[str]) -> int:
        """Partitions no running replica owns now: at start-up, before the replicas take them, and
        after a replica exited, until its lease runs out and another takes its partitions over
        (etcd still names it meanwhile). 0 when etcd could not be read (unknown, not none owned)."""
        if any(rid.startswith(ETCD_UNREACHABLE) for rid in owners):
            return 0
        owned = {p for rid, parts in owners.items() if rid not in exited for p in parts}
        return max(0, self.client.keyspace.partitions - len(owned))

    def reload_layout(self) -> int:
        """Re-read the namespace's partition count (after ``zsched migrate-partitions``)."""
        return self.client.reload_layout()

    @follows_layout
    def queue_counts(self) -> tuple[dict[str, dict[str, int]], int]:
        """Per queue: scheduled, ready, running and dead jobs; and how many of the scheduled ones
        are due and held back by their queue's rate limit (one ``stats`` round trip, following a
        partition migration as ``Client.stats`` does)."""
        replies = [parse_stats(r) for r in self.client.transport.call_many(self.client.calls.stats_calls())]
        held = sum(n for st in replies for f, n in st.gauges.items() if f.startswith("h:"))
        return merge_stats(replies), held

    def render(self, s: Sample) -> str:
        """The full view, redrawn on a terminal every interval."""
        lines = [f"zsched dev - namespace {self.stack.ns} - redis {mask_secrets(self.stack.redis_url)} "
                 f"- etcd {mask_secrets(self.stack.etcd)}",
                 s.clock + "   (Ctrl-C stops everything)", ""]
        if s.rates is not None:
            lines.append("per second:  scheduled {scheduled:8.0f}   fired {fired:8.0f}   "
                         "acked {acked:8.0f}".format(**s.rates))
        counts = s.counts
        lines.append(f"firing lateness (last interval): p50 {_ms(s.p50)}   p99 {_ms(s.p99)}{_lateness_note(s)}")
        lines.append(f"dead-lettered: {s.dead}   "
                     f"totals: scheduled {counts.get('scheduled', 0)}  fired {counts.get('fired', 0)}  "
                     f"acked {counts.get('acked', 0)}  retried {counts.get('retried', 0)}  "
                     f"misfired {counts.get('misfired', 0)}")
        lines += ["", f"{'QUEUE':<12}{'SCHEDULED':>11}{'READY':>9}{'RUNNING':>9}{'DEAD':>7}"]
        for q, st in sorted(s.stats.items()):
            lines.append(f"{q:<12}{st['scheduled']:>11}{st['ready']:>9}{st['running']:>9}{st['dead']:>7}")
        lines += ["", "partition owners:"]
        for rid, parts in sorted(s.owners.items()):
            lines.append(f"  {rid:<16} {len(parts):>2}: {' '.join(str(p) for p in sorted(parts))}")
        if s.exited:
            lines += ["", f"exited: {', '.join(s.exited)} (see {self.stack.home}/logs/)"]
        return "\n".join(lines)


@dataclass
class Sample:
    """One reading of the stack for the view."""

    clock: str
    counts: dict[str, int]
    rates: dict[str, float] | None  # None on the first reading
    p50: float | None
    p99: float | None
    stats: dict[str, dict[str, int]]
    owners: dict[str, list[int]]
    exited: list[str]
    held: int = 0  # due jobs waiting on their queue's rate limit, at most, this interval
    unowned: int = 0  # partitions no running replica owned, at most, this interval (their due jobs wait)

    @property
    def dead(self) -> int:
        return sum(q["dead"] for q in self.stats.values())


def unowned_note(now: int, before: int, shown: int, p99: float | None, held: int) -> int:
    """How many partitions without a running owner an interval's line names: those at its end or
    its start (``now``, ``before``); and, while the jobs they left due keep the p99 at
    :data:`BACKLOG_P99_S` or more and no rate limit holds jobs, the count the last line named
    (``shown``): a backlog after start-up on an earlier run's data, or after a replica's lease ran
    out, drains over more than one interval."""
    n = max(now, before)
    if not n and shown and not held and p99 is not None and p99 >= BACKLOG_P99_S:
        return shown
    return n


def _ms(v: float | None) -> str:
    if v == math.inf:
        return f"over {LATENESS_BUCKETS[-1]:g} s"
    return "-" if v is None else f"{v * 1000:.1f} ms"


def _lateness_note(s: Sample) -> str:
    """Why the lateness may read seconds while the scheduler is on time: a job a rate limit held
    back fires when the limit lets it, and its lateness counts from its due time; a job due in a
    partition no replica owned (the stack starting, a replica's lease running out) fires once one
    takes it over."""
    notes = [f"rate limits held up to {s.held} due jobs"] if s.held else []
    if s.unowned:
        notes.append(f"{s.unowned} partitions had no running owner")
    return f" ({'; '.join(notes)}; their jobs count as late)" if notes else ""


def compact_line(s: Sample) -> str:
    """The view as one line, printed every interval when the output is not a terminal (a log file)."""
    rates = "" if s.rates is None else "/s: scheduled {scheduled:.0f} fired {fired:.0f} acked {acked:.0f}; ".format(
        **s.rates)
    depth = {k: sum(q[k] for q in s.stats.values()) for k in ("scheduled", "ready", "running")}
    owners = ", ".join(f"{rid} {len(parts)}" for rid, parts in sorted(s.owners.items())) or "none"
    exited = f"; exited: {', '.join(s.exited)}" if s.exited else ""
    return (f"{s.clock} {rates}lateness p50 {_ms(s.p50)} p99 {_ms(s.p99)}{_lateness_note(s)}; "
            f"scheduled {depth['scheduled']} ready {depth['ready']} running {depth['running']} dead {s.dead}; "
            f"owners: {owners}{exited}")
