"""The load harness of the Redis Cluster fault tests (tests/fault/test_cluster_faults.py): a stack of
two ``zsched scheduler`` replicas and two ``zsched worker`` processes on a cluster URL, producer
threads, and the evidence.

* **runs**: the workers' handler logs every START/END with the job id, attempt and time
  (``tests.support.workers``), read back as :class:`Runs`;
* **fire times**: *probe* jobs on a queue no worker serves stay in their ready lists, where
  :class:`ProbeWatcher` sees each one appear (each group of partitions read by its own thread, so
  a partition whose node is down does not hide the others). A job's id carries its run_at, so a
  probe fired early or late shows, and a gap in the probe fires of a partition is a gap in its
  firing.
"""
from __future__ import annotations

import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from scheduler import Client
from scheduler.protocol.ids import decode_id, encode_id, partition_of, run_at_of
from scheduler.protocol.keys import Keyspace
from scheduler.redisio.connection import sync_redis
from scheduler.shell.servers import ZschedProc, scheduler_proc, stop_all
from scheduler.tier.runner import RunnerConfig
from tests.fault.test_scheduler_faults import keys_by_partition
from tests.fault.test_sentinel_failover import BURST_JOB_S, CONCURRENCY, Call, metric, tails
from tests.support.servers import ClusterServer, ClusterSet
from tests.support.waits import wait_until
from tests.support.workers import read_runs, spawn_worker, write_app

PARTS = 12
PROBE = "probe"        # a queue no worker serves: its fired jobs stay in ready, for ProbeWatcher
RATE = 100.0           # calls per second of each of the two producers
RUN_EPS = 0.002        # "not before run_at": run_at is rounded to the ms, clocks read in two processes
# a probe may reach ready this early: the tier's hand-off lead, or its burst lead when the probe is
# due just before a burst of its partition and goes with it (docs/architecture.md, "On time")
EARLIEST_READY = max(RunnerConfig.handoff_lead, RunnerConfig.burst_lead)
DURABLE_TIMEOUT = 5.0  # covers the killed master's restart as a replica (WAIT 1 needs one)
LEASE = 3.0            # producers' jobs: a lost ack costs a rerun inside the test (at-least-once)


def run_at(job_id: str) -> float:
    return run_at_of(decode_id(job_id)) / 1000.0


def partition(job_id: str, partitions: int = PARTS) -> int:
    return partition_of(decode_id(job_id), partitions)


def partitions_by_master(cluster: ClusterSet, ks: Keyspace) -> dict[ClusterServer, list[int]]:
    """Which master owns each partition's slot now."""
    out: dict[ClusterServer, list[int]] = defaultdict(list)
    for p in range(ks.partitions):
        out[cluster.node_for_key(ks.prefix(p))].append(p)
    return dict(out)


class ProbeWatcher:
    """Records when each job id first shows up in the ``queue`` ready lists (a queue no worker
    serves, so lists only grow). Each group of partitions is read by its own thread through its
    own cluster client, every partition with its own command every ``interval`` s: a group on a
    failed node (whose reads fail, and whose client re-reads the slot map after each connection
    error) cannot delay what the other groups see. A failed read is counted and tried again on
    the next round."""

    def __init__(self, url: str, ks: Keyspace, groups: list[list[int]], queue: str = PROBE,
                 interval: float = 0.01) -> None:
        self.url = url
        self.groups = [[ks.ready(p, queue) for p in g] for g in groups]
        self.interval = interval
        self.first_seen: dict[str, float] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(keys,), name="probe-watcher", daemon=True)
                         for keys in self.groups]

    def _run(self, keys: list[str]) -> None:
        r = sync_redis(self.url, socket_timeout=1.0, socket_connect_timeout=1.0)
        try:
            while not self._stop.is_set():
                for key in keys:
                    try:
                        items = r.lrange(key, 0, -1)
                    except Exception:  # noqa: BLE001 - any failure of a node: read it again next round
                        self.errors += 1
                        continue
                    now = time.time()
                    for raw in items:
                        self.first_seen.setdefault(encode_id(raw), now)
                self._stop.wait(self.interval)
        finally:
            r.close()

    @contextmanager
    def running(self) -> Iterator[ProbeWatcher]:
        for t in self._threads:
            t.start()
        try:
            yield self
        finally:
            self._stop.set()
            for t in self._threads:
                t.join(5)

    def fired(self, ids: list[str]) -> bool:
        return all(i in self.first_seen for i in ids)

    def max_gap(self, ids: list[str], start: float, end: float) -> tuple[float, float]:
        """The longest time between two consecutive first sightings of ``ids`` within [start, end]
        (``start`` and ``end`` count as sightings), and when it ended."""
        times = sorted([start, end, *(t for i in ids if start <= (t := self.first_seen.get(i, math.inf)) <= end)])
        return max(((b - a, b) for a, b in zip(times, times[1:])), default=(0.0, end))


def probe_stream(client: Client, start: float, seconds: float, step: float, durable: str | None) -> list[str]:
    """Probe jobs due every ``step`` s over ``seconds`` from ``start``, round-robin over the
    partitions (idempotency keys pick them), in one ``schedule_many``."""
    parts = client.keyspace.partitions
    count = int(seconds / step)
    pool = keys_by_partition(parts, math.ceil(count / parts), "probe")
    jobs = [(start + i * step, i, pool[i % parts][i // parts]) for i in range(count)]
    return client.schedule_many(jobs, queue=PROBE, durable=durable)


@dataclass
class Stack:
    """Two scheduler replicas and two workers on ``url`` (handlers log to ``dir``)."""

    url: str
    etcd: str
    ns: str
    dir: Path

    def __post_init__(self) -> None:
        write_app(self.dir)
        self.schedulers = [scheduler_proc(self.url, self.etcd, self.ns, f"s{i}", ttl=2.0).start() for i in range(2)]
        # the workers' defaults (one listener); a {"slow": True} job runs BURST_JOB_S (schedule_burst)
        self.workers = [spawn_worker(self.dir, self.url, "--namespace", self.ns, "--concurrency", str(CONCURRENCY),
                                     env={"SLOW_SECONDS": str(BURST_JOB_S)}) for _ in range(2)]

    @property
    def procs(self) -> list[ZschedProc]:
        return self.schedulers + self.workers

    def wait_up(self) -> None:
        """Workers serving, every partition owned, both replicas owning some."""
        wait_until(lambda: all("worker serving" in w.output() or not w.alive for w in self.workers), 20, 0.05,
                   "the workers to serve")
        assert all(w.alive for w in self.workers), tails(self.workers)
        wait_until(lambda: sum(metric(s, "zsched_partitions_owned") for s in self.schedulers) == PARTS
                   and all(metric(s, "zsched_partitions_owned") > 0 for s in self.schedulers), 20, 0.05,
                   "both scheduler replicas to own partitions")

    def ended(self) -> int:
        return sum(1 for r in read_runs(self.dir) if r[0] == "END")

    def stop(self) -> None:
        stop_all(self.procs)


@dataclass
class Runs:
    """The handler log, by job: first start, starts (attempt, pid, time), ends."""

    starts: dict[str, list[tuple[int, int, float]]]
    ends: Counter[str]

    @classmethod
    def read(cls, dirpath: Path) -> Runs:
        starts: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
        ends: Counter[str] = Counter()
        for kind, jid, attempt, pid, t in read_runs(dirpath):
            if kind == "START":
                starts[jid].append((attempt, pid, t))
            else:
                ends[jid] += 1
        return cls(dict(starts), ends)

    def first(self, jid: str) -> float:
        return min(t for _, _, t in self.starts[jid])

    def early(self) -> list[tuple[str, float]]:
        return [(j, t - run_at(j)) for j, s in self.starts.items() for _, _, t in s if t < run_at(j) - RUN_EPS]

    def lateness(self, ids: list[str]) -> list[float]:
        """First start - run_at of each of ``ids`` that ran."""
        return [self.first(j) - run_at(j) for j in ids if j in self.starts]

    def doubled(self) -> dict[str, list[tuple[int, int, float]]]:
        return {j: s for j, s in self.starts.items() if len(s) > 1}


def drain(stack: Stack, monitor: Client, last_due: float, what: str) -> None:
    """Wait until every job is due and nothing of queue ``default`` is scheduled, ready or
    running, and no handler runs."""
    def quiet() -> bool:
        try:
            q = monitor.stats().get("default", {})
        except Exception:  # noqa: BLE001 - a node briefly unreachable: not quiet yet
            return False
        if time.time() <= last_due or q.get("scheduled", 0) or q.get("ready", 0) or q.get("running", 0):
            return False
        return all(w.try_metric("zsched_worker_running") == 0 for w in stack.workers)

    try:
        wait_until(quiet, max(0.0, last_due - time.time()) + 20, 0.1, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: stats {monitor.stats()}{tails(stack.procs)}") from None


class Producer:
    """Schedules jobs at ``RATE`` per second in a thread (no catch-up burst after a stall), due
    0.2-2.0 s ahead, ``durable="replica"`` on every call or on every other one (``durable``:
    "all", "half", "none"); records every call. Leases are short (``LEASE`` s): a job whose ack
    was lost with the failed master runs again soon, inside the test, instead of after 30 s."""

    def __init__(self, client: Client, durable: str) -> None:
        self.client = client
        self.durable = durable
        self.calls: list[Call] = []
        self.stop = threading.Event()
        self.crashed: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            i, step, nxt = 0, 1.0 / RATE, time.monotonic()
            while not self.stop.is_set():
                durable = self.durable == "all" or (self.durable == "half" and i % 2 == 0)
                ahead = 0.2 + (i * 0.6180339887 % 1.0) * 1.8  # spread evenly over [0.2, 2.0) s
                call = Call(time.time(), 0.0, durable)
                try:
                    call.job_id = self.client.schedule(call.t0 + ahead, {"i": i}, lease=LEASE,
                                                       durable="replica" if durable else None)
                except Exception as exc:  # noqa: BLE001 - every failure is recorded and judged by the test
                    call.error = exc
                call.t1 = time.time()
                self.calls.append(call)
                i += 1
                nxt = max(nxt + step, time.monotonic())
                time.sleep(max(0.0, nxt - time.monotonic()))
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.crashed = exc

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(DURABLE_TIMEOUT + 15)
        assert not self.thread.is_alive(), "a producer thread is stuck in a call"
        assert self.crashed is None, f"a producer loop crashed: {self.crashed!r}"


def acked(prods: list[Producer], *, durable: bool | None = None, after: float = 0.0) -> list[Call]:
    """Calls that returned an id (started at or after ``after``; durable or not, or both)."""
    return [c for p in prods for c in p.calls
            if c.job_id is not None and c.t0 >= after and (durable is None or c.durable == durable)]


def failed(prods: list[Producer], accept: Callable[[Call], bool] = lambda c: False) -> list[tuple[float, str]]:
    """(start, error) of the calls that raised, except those ``accept`` allows."""
    return [(c.t0, repr(c.error)[:200]) for p in prods for c in p.calls if c.error is not None and not accept(c)]
