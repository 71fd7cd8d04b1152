"""Sentinel failover under load, with every real process on loopback.

One ``SentinelSet`` (a master, a replica and three sentinels: all real redis-server processes), a
fresh etcd, two ``zsched scheduler`` replicas and two ``zsched worker`` processes, all started with
``--redis redis+sentinel://...``. A producer thread schedules jobs at a steady rate through the
same Sentinel URL, alternating ``durable="replica"`` and no durability, each due 0.2-2 s ahead.
During the load the master is killed with SIGKILL; the sentinels promote the replica (~2.5 s), the
killed server is started again as a replica of the new master (``replicaof`` in its config, as an
operator would; only once every sentinel has watched the new master for 1.5 s, see
:func:`wait_sentinels_steady`), and the load goes on.

What must hold (docs/architecture.md, "Redis faults", Sentinel failover row):

* every job acknowledged with ``durable="replica"`` runs, and every job acknowledged after the
  promotion runs; jobs without ``durable=`` may be lost only if their write had not reached the
  replica when the master died (counted and reported, not asserted);
* no job runs before its run_at; a job runs twice only if its first run was claimed on the old
  master before the kill (the claim, or its ack, may not have been replicated);
* the producer rides out the election inside its retry budget: no call fails, except a
  ``DurabilityTimeout`` ("the job may exist") for a call that started before the promotion was
  complete; calls made after the promotion all succeed;
* scheduler replicas and workers stay alive and keep firing/running jobs after the promotion.
  The workers run with their defaults (one listener): at this load the spread jobs stay on the
  listening worker while it has room, so once the producer stops the test schedules a burst
  (:func:`schedule_burst`) that every worker must take part in, and its jobs are judged as the
  producer's acknowledged after the promotion are.

Why the killed master is brought back: with one replica, the promoted master has no replica until
the old one rejoins, so ``WAIT 1`` cannot be satisfied and every ``durable="replica"`` call made in
between would (rightly) raise ``DurabilityTimeout``. With the old master rejoining, such calls wait
(``durable_timeout``) and succeed.

Run with ``-s`` to see the report (lost and duplicate figures, producer stall).
"""
from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scheduler import Client
from scheduler.protocol.errors import DurabilityTimeout
from scheduler.protocol.ids import decode_id, run_at_of
from scheduler.shell.servers import HOST, ServerError, ZschedProc, scheduler_proc, stop_all
from tests.support.servers import EtcdServer, RedisServer, SentinelSet
from tests.support.waits import wait_until
from tests.support.workers import read_runs, spawn_worker, write_app
from workers.pace import UNMEASURED_EARLY

pytestmark = pytest.mark.fault

NS = "sfo"
PARTS = 8
RATE = 150.0            # producer calls per second
PRE_LOAD = 3.0          # seconds of load before the kill
POST_LOAD = 3.0         # seconds of load after the killed master rejoined as a replica, at least
POST_CALLS = int(RATE * POST_LOAD * 0.5)  # acknowledged calls made after the promotion, at least
POST_GRACE = 10.0       # how much longer than POST_LOAD those calls may take (a loaded machine)
DURABLE_TIMEOUT = 8.0   # covers the wait for steady sentinels + the old master's restart and sync
SENTINEL_HOLD = 1.5     # > down-after-milliseconds (1 s) of the SentinelSet: see wait_sentinels_steady
RUN_EPS = 0.001         # clock resolution slack for "not before run_at" (run_at is rounded to ms)
CONCURRENCY = 32        # of each worker
BURST_JOB_S = 2.0       # each job of the post-failover burst runs this long (far above claiming it)


@dataclass
class Call:
    t0: float               # time.time() when the call started
    t1: float               # when it returned or raised
    durable: bool
    job_id: str | None = None
    error: BaseException | None = None


@dataclass
class Producer:
    """Schedules jobs at ``rate`` per second (no catch-up burst after a stall), alternating
    ``durable="replica"`` and none, due 0.2-2.0 s ahead; records every call."""

    client: Client
    rate: float
    calls: list[Call] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    crashed: BaseException | None = None

    def start(self) -> Producer:
        self.thread = threading.Thread(target=self._run, name="producer", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            i = 0
            step = 1.0 / self.rate
            nxt = time.monotonic()
            while not self.stop.is_set():
                durable = i % 2 == 0
                ahead = 0.2 + (i * 0.6180339887 % 1.0) * 1.8  # spread evenly over [0.2, 2.0) s
                t0 = time.time()
                call = Call(t0, t0, durable)
                try:
                    call.job_id = self.client.schedule(t0 + ahead, {"i": i},
                                                       durable="replica" if durable else None)
                except Exception as exc:  # noqa: BLE001 - every failure is recorded and judged below
                    call.error = exc
                call.t1 = time.time()
                self.calls.append(call)
                i += 1
                nxt += step
                now = time.monotonic()
                if nxt > now:
                    time.sleep(nxt - now)
                else:
                    nxt = now  # steady rate: after a stall, go on without a burst
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.crashed = exc

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(DURABLE_TIMEOUT + 15)
        assert not self.thread.is_alive(), "the producer thread is stuck in a call"
        assert self.crashed is None, f"the producer loop crashed: {self.crashed!r}"

    def acked(self, after: float = 0.0) -> list[Call]:
        return [c for c in self.calls if c.job_id is not None and c.t0 >= after]


def burst_size(workers: int, concurrency: int) -> int:
    """Jobs of a burst that every one of ``workers`` must take part in: more than all of them but
    one can hold (handler slots, and the early jobs a claim may take before the handlers'
    pace is measured: workers/pace.py; slow handlers take fewer after), 8 per worker to spare."""
    return (workers - 1) * (concurrency + UNMEASURED_EARLY) + 8 * workers


def schedule_burst(client: Client, jobs: int, after: float, **options: Any) -> list[Call]:
    """``jobs`` slow jobs (``{"slow": True}``: they run the workers' ``SLOW_SECONDS``, started with
    ``BURST_JOB_S``) due at one instant, one recorded ``schedule`` call each. The instant is 0.5 s
    after ``after`` (the last due time of the load, so that the burst does not hold the slots
    the load's last jobs need) and at least 1 s from now. A failed call raises: the burst comes
    after the fault, when every call must succeed."""
    at = max(after + 0.5, time.time() + 1.0)
    calls = []
    for i in range(jobs):
        call = Call(time.time(), 0.0, False)
        call.job_id = client.schedule(at, {"slow": True, "b": i}, **options)
        call.t1 = time.time()
        calls.append(call)
    return calls


def run_at(job_id: str) -> float:
    return run_at_of(decode_id(job_id)) / 1000.0


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def wait_sentinels_steady(ss: SentinelSet, port: int, hold: float, timeout: float = 20.0) -> None:
    """Wait until every sentinel has named ``port`` as a healthy master (flags exactly ``master``)
    continuously for ``hold`` seconds.

    Why: right after ``+switch-master`` a sentinel may flag the new master ``+sdown`` once
    ``down-after-milliseconds`` (1 s here) has passed, and reach ``+odown`` with the other sentinels'
    stale "down" replies from the first failover. Observed with Redis 7.0.15, in about 1 run out of
    8 when the old master rejoined within ~0.1 s of the promotion: that sentinel then started a
    second failover and promoted the freshly synced old master, while the first new master, still
    a master (Sentinel converts it only ~10 s later), kept taking writes on open connections: a
    split brain whose writes were rolled back. With no replica to promote the spurious
    ``+sdown`` is harmless, so the old master rejoins only once the sentinels are past it."""
    since: dict[int, float] = {}

    def steady() -> bool:
        now = time.monotonic()
        for s in ss.sentinels:
            try:
                addr, mi = s.master_addr(0.5), s.master_info(0.5)
                ok = (addr is not None and addr[1] == port and mi.get("port") == str(port)
                      and mi.get("flags") == "master")
            except (OSError, ServerError):
                ok = False
            if not ok:
                since.pop(s.port, None)
            else:
                since.setdefault(s.port, now)
        return len(since) == len(ss.sentinels) and all(now - t >= hold for t in since.values())

    wait_until(steady, timeout, 0.05, f"every sentinel to name :{port} as a healthy master for {hold}s")


def rejoin_as_replica(ss: SentinelSet, new_port: int, timeout: float = 20.0) -> RedisServer:
    """Start the killed master again as a replica of the promoted one (``replicaof`` appended to its
    config file, as an operator would) and wait until the new master reports it online, which is
    what ``WAIT 1`` needs. Unlike ``SentinelSet.restart_old_master_as_replica`` this does not wait
    for every sentinel to list the replica with a healthy link: sentinels play no part in ``WAIT``."""
    old = ss.replica
    assert not old.running and ss.master.port == new_port
    with open(old.conf_path, "a") as f:  # the last replicaof line wins
        f.write(f"replicaof {HOST} {new_port}\n")
    old.start()

    def online() -> bool:
        try:
            mi, ri = ss.master.info("replication", timeout=0.5), old.info("replication", timeout=0.5)
        except (OSError, ServerError):
            return False
        return (ri.get("master_link_status") == "up" and ri.get("master_port") == str(new_port)
                and any(k.startswith("slave") and f"port={old.port}," in v and "state=online" in v
                        for k, v in mi.items()))

    wait_until(online, timeout, 0.02, f"the old master :{old.port} to sync as a replica of :{new_port}")
    return old


def tails(procs: list[ZschedProc], lines: int = 25) -> str:
    return "\n" + "\n".join(p.tail(lines) for p in procs)


def metric(p: ZschedProc, name: str) -> float:
    v = p.try_metric(name)
    return -1.0 if v is None else v


def quiet(monitor: Client, workers: list[ZschedProc]) -> bool:
    """Nothing scheduled, ready or running in Redis, and no handler running in any worker."""
    try:
        q = monitor.stats().get("default", {})
    except Exception:  # noqa: BLE001 - Redis briefly unreachable: not quiet yet
        return False
    if q.get("scheduled", 0) or q.get("ready", 0) or q.get("running", 0):
        return False
    return all(w.try_metric("zsched_worker_running") == 0 for w in workers)


def test_sentinel_failover_under_load_loses_no_durable_job(sentinel_set_launched: SentinelSet,
                                                           fresh_etcd: EtcdServer, tmp_path: Path) -> None:
    t_begin = time.monotonic()
    sentinel_set = sentinel_set_launched
    url = sentinel_set.url
    client = Client.from_url(url, namespace=NS, partitions=PARTS, durable_timeout=DURABLE_TIMEOUT).connect()
    monitor = Client.from_url(url, namespace=NS, partitions=PARTS).connect()
    write_app(tmp_path)
    schedulers = [scheduler_proc(url, fresh_etcd.endpoint, NS, f"s{i}", ttl=2.0).start() for i in range(2)]
    workers = [spawn_worker(tmp_path, url, "--namespace", NS, "--concurrency", str(CONCURRENCY),
                            env={"SLOW_SECONDS": str(BURST_JOB_S)}) for _ in range(2)]
    procs = schedulers + workers
    producer = Producer(client, RATE)
    try:
        # -- everything up: the sentinels know each other and the replica (they found each other
        # while the zsched processes started), workers subscribed, every partition owned
        sentinel_set.wait_settled()
        wait_until(lambda: all("worker serving" in w.output() or not w.alive for w in workers), 20, 0.05,
                   "the workers to serve")
        assert all(w.alive for w in workers), tails(workers)
        wait_until(lambda: sum(metric(s, "zsched_partitions_owned") for s in schedulers) == PARTS
                   and all(metric(s, "zsched_partitions_owned") > 0 for s in schedulers), 20, 0.05,
                   "both scheduler replicas to own partitions")

        # -- load, then kill -9 the master once jobs are flowing end to end
        producer.start()
        t_load = time.time()
        wait_until(lambda: time.time() - t_load >= PRE_LOAD
                   and sum(1 for r in read_runs(tmp_path) if r[0] == "END") >= 50, PRE_LOAD + 10, 0.05,
                   "jobs to run before the fault")
        assert producer.thread is not None and producer.thread.is_alive()
        fired_before = [metric(s, "zsched_scheduler_fired_total") for s in schedulers]
        old = sentinel_set.kill_master()
        t_kill = time.time()
        new_port = sentinel_set.wait_failover(old.port, timeout=20)
        t_promoted = time.time()
        fired_at_promotion = [metric(s, "zsched_scheduler_fired_total") for s in schedulers]
        acked_at_promotion = [metric(w, "zsched_worker_acked_total") for w in workers]
        # the killed master comes back as a replica of the new one (durable="replica" needs one),
        # once the sentinels have watched the new master longer than down-after-milliseconds
        wait_sentinels_steady(sentinel_set, new_port, hold=SENTINEL_HOLD)
        t_steady = time.time()
        rejoin_as_replica(sentinel_set, new_port)
        t_rejoined = time.time()
        # post-failover load: POST_LOAD seconds after the rejoin, and as many acknowledged calls made
        # after the promotion as half the rate gives in that time. The call that started before the
        # kill returns only after the rejoined replica's first ack (its replication cron, up to 1 s
        # later) and a loaded machine makes fewer calls a second, so a fixed time window judged the
        # machine, not the client; a client that cannot keep up still runs out of POST_GRACE.
        try:
            wait_until(lambda: time.time() - t_rejoined >= POST_LOAD
                       and len(producer.acked(after=t_promoted)) >= POST_CALLS,
                       POST_LOAD + POST_GRACE, 0.05, "post-failover load")
        except AssertionError:
            pass  # judged below, with the report
        producer.finish()
        t_stop = time.time()
        # one listener keeps the spread load on one worker while it has room: a burst every worker
        # must take part in (checked below with the producer's jobs after the promotion)
        burst = schedule_burst(client, burst_size(len(workers), CONCURRENCY),
                               max((run_at(c.job_id) for c in producer.acked() if c.job_id), default=t_stop))
        burst_ids = [c.job_id for c in burst if c.job_id]

        # -- drain: every acknowledged job due, fired, run and acked
        last_due = max((run_at(c.job_id) for c in producer.acked() + burst if c.job_id), default=t_stop)
        try:
            wait_until(lambda: time.time() > last_due and quiet(monitor, workers),
                       max(0.0, last_due - time.time()) + 15, 0.1, "the workers to go idle")
        except AssertionError as exc:
            raise AssertionError(f"{exc} with nothing scheduled/ready/running: stats {monitor.stats()}, "
                                 f"handlers running {[w.try_metric('zsched_worker_running') for w in workers]}"
                                 f"{tails(procs)}") from None
        t_idle = time.time()
        stats = monitor.stats().get("default", {})
        runs = read_runs(tmp_path)

        # -- evidence
        starts: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
        for kind, jid, attempt, pid, t in runs:
            if kind == "START":
                starts[jid].append((attempt, pid, t))
        ends = Counter(r[1] for r in runs if r[0] == "END")
        calls = producer.calls
        acked = producer.acked()
        durable_ids = [c.job_id for c in acked if c.durable]
        plain_ids = [c.job_id for c in acked if not c.durable]
        assert len(set(durable_ids + plain_ids)) == len(acked), "an id was returned twice"
        lost_durable = [j for j in durable_ids if j not in starts]
        lost_plain = [j for j in plain_ids if j not in starts]
        acked_at = {c.job_id: c.t1 for c in acked}
        lost_plain_before_kill = [j for j in lost_plain if acked_at[j] <= t_kill]
        after_promo = producer.acked(after=t_promoted)
        lost_after_promo = [c.job_id for c in after_promo if c.job_id not in starts]
        early = [(j, s[2] - run_at(j)) for j in starts for s in starts[j] if s[2] < run_at(j) - RUN_EPS]
        dups = {j: s for j, s in starts.items() if len(s) > 1}
        unexplained_dups = {j: s for j, s in dups.items() if min(x[2] for x in s) >= t_kill}
        not_ended = [j for j in starts if ends[j] < 1]
        lost_burst = [j for j in burst_ids if j not in starts]
        known = {c.job_id for c in acked} | set(burst_ids)
        maybe_ids = [i for c in calls if isinstance(c.error, DurabilityTimeout) for i in c.error.ids]
        unknown_runs = sorted(set(starts) - known - set(maybe_ids))
        dto_before = [c for c in calls if isinstance(c.error, DurabilityTimeout) and c.t0 < t_promoted]
        dto_before_ids = [i for c in dto_before if isinstance(c.error, DurabilityTimeout) for i in c.error.ids]
        dto_after = [c for c in calls if isinstance(c.error, DurabilityTimeout) and c.t0 >= t_promoted]
        other_failures = [c for c in calls if c.error is not None and not isinstance(c.error, DurabilityTimeout)]
        # producer stall: the longest call, and the longest gap between two acknowledgments
        longest = max(calls, key=lambda c: c.t1 - c.t0)
        ack_ends = sorted(c.t1 for c in acked)
        gap, gap_at = max(((b - a, a) for a, b in zip(ack_ends, ack_ends[1:])), default=(0.0, 0.0))
        post_durable_wait = max((c.t1 - c.t0 for c in calls if c.durable and t_promoted <= c.t0 <= t_rejoined),
                                default=0.0)
        # lateness (first start - run_at) by when the job was due: before the kill, during the outage
        # (kill .. promotion + 1 s), after it
        phases: dict[str, list[float]] = {"before the kill": [], "during the failover": [], "after it": []}
        for j, s in starts.items():
            due = run_at(j)
            name = ("before the kill" if due < t_kill else
                    "during the failover" if due < t_promoted + 1.0 else "after it")
            phases[name].append(min(x[2] for x in s) - due)
        lateness = ", ".join(f"{k}: n={len(v)} p50={pct(v, 0.5):.3f}s max={pct(v, 1.0):.3f}s"
                             for k, v in phases.items())
        fired_end = [metric(s, "zsched_scheduler_fired_total") for s in schedulers]
        lease_lost = [metric(w, "zsched_worker_lease_lost_total") for w in workers]
        tracebacks = [p for p in procs if "Traceback" in p.output()]
        acked_end = [metric(w, "zsched_worker_acked_total") for w in workers]
        post_pids = {pid for s in starts.values() for (_, pid, t) in s if t > t_promoted}

        report = (
            f"\nSentinel failover under load (master :{old.port} -> :{new_port}):\n"
            f"  timeline (s after the kill): promoted +{t_promoted - t_kill:.2f}, sentinels steady "
            f"+{t_steady - t_kill:.2f}, old master rejoined "
            f"+{t_rejoined - t_kill:.2f}, load stopped +{t_stop - t_kill:.2f}, idle +{t_idle - t_kill:.2f}; "
            f"test wall time {time.monotonic() - t_begin:.1f}s\n"
            f"  producer: {len(calls)} calls ({sum(1 for c in calls if c.t0 < t_kill)} before "
            f"the kill), {len(acked)} acknowledged ({len(durable_ids)} durable, {len(plain_ids)} not), "
            f"{len(after_promo)} acknowledged after the promotion\n"
            f"  producer stall: longest call {longest.t1 - longest.t0:.2f}s (started at kill"
            f"{longest.t0 - t_kill:+.2f}s, durable={longest.durable}); longest gap between acknowledgments "
            f"{gap:.2f}s (from kill{gap_at - t_kill:+.2f}s); longest durable call between promotion and rejoin "
            f"{post_durable_wait:.2f}s\n"
            f"  failures: {len(dto_before)} DurabilityTimeout started before the promotion "
            f"({sum(1 for i in dto_before_ids if i in starts)} of their jobs ran), "
            f"{len(dto_after)} DurabilityTimeout after it, {len(other_failures)} other "
            f"{[(round(c.t0 - t_kill, 2), repr(c.error)[:160]) for c in other_failures[:5]]}\n"
            f"  lost: durable {len(lost_durable)}/{len(durable_ids)}, non-durable {len(lost_plain)}/"
            f"{len(plain_ids)} ({len(lost_plain_before_kill)} acknowledged before the kill), acknowledged after "
            f"the promotion {len(lost_after_promo)}/{len(after_promo)}\n"
            f"  ran more than once: {len(dups)} "
            f"{[(j[:12], [(a, round(t - t_kill, 3)) for a, _, t in s]) for j, s in list(dups.items())[:8]]} "
            f"(attempt, start s after the kill); first run after the kill: {len(unexplained_dups)}\n"
            f"  ran before run_at: {len(early)}; runs of unknown ids: {len(unknown_runs)}; final stats {stats}\n"
            f"  lateness by due time: {lateness}\n"
            f"  scheduler fired: before kill {fired_before}, at promotion {fired_at_promotion}, end {fired_end}; "
            f"worker acks: at promotion {acked_at_promotion}, end {acked_end}; worker lease_lost {lease_lost}; "
            f"producer calls re-sent after a connection failure: {client.transport.resends}\n"
            f"  burst after the load: {len(burst_ids)} jobs of {BURST_JOB_S:g} s, {len(lost_burst)} never ran, "
            f"started by worker pid {dict(Counter(s[0][1] for j, s in starts.items() if j in set(burst_ids)))}"
        )
        print(report)

        assert not other_failures, f"producer calls failed through the Sentinel URL: {report}"
        assert not dto_after, f"DurabilityTimeout for calls started after the promotion: {report}"
        rode_out = [c for c in calls if c.t0 < t_promoted and c.t1 > t_kill + 1.0 and c.job_id is not None]
        assert rode_out, f"no producer call waited through the election and succeeded{report}"
        assert not lost_durable, f"durable='replica' jobs lost: {lost_durable[:10]}{report}"
        assert not lost_after_promo, f"jobs acknowledged after the promotion never ran: {lost_after_promo[:10]}{report}"
        assert not lost_burst, f"jobs of the burst after the load never ran: {lost_burst[:10]}{report}"
        assert not early, f"jobs ran before their run_at: {early[:10]}{report}"
        assert not unexplained_dups, f"jobs first run after the kill ran more than once: " \
                                     f"{list(unexplained_dups.items())[:5]}{report}"
        assert not not_ended, f"runs that never finished: {not_ended[:10]}{report}"
        assert stats.get("dead", 0) == 0, f"jobs dead-lettered: {report}"
        assert all(p.alive for p in procs), f"a zsched process died{report}{tails(procs)}"
        assert len(after_promo) >= POST_CALLS, \
            f"the producer did not keep its rate after the failover{report}"
        for s, a, b in zip(schedulers, fired_at_promotion, fired_end):
            assert b > a >= 0, f"scheduler {s.args[8]} fired nothing after the promotion{report}{tails([s])}"
        for w, a, b in zip(workers, acked_at_promotion, acked_end):
            assert b > a >= 0, f"worker pid {w.pid} acked nothing after the promotion{report}{tails([w])}"
        assert {w.pid for w in workers} <= post_pids, f"a worker ran nothing after the promotion{report}"
        assert not tracebacks, f"unhandled exception logged{report}{tails(tracebacks, 80)}"
    finally:
        producer.stop.set()
        stop_all(procs)
        client.close()
        monitor.close()
