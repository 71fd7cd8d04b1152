"""The nemesis: a seeded thread that injects one fault at a time into the chaos stack, heals it, waits
a moment and picks the next, until its time is up; then everything is healed. Every fault is written
to ``nemesis.jsonl`` (:class:`~tests.chaos.history.Fault`) once healed. A watcher thread records any
Redis master change the nemesis did not ask for (``observed-master-change``).

The first faults (:data:`FIRST`, in a seeded order) are every kind once, and the worker freeze twice:
once brief, once past the job lease. After them each fault is drawn by weight. A run goes on past
its time until it has injected all of the first ones, so a run of any length covers every kind
(drawn by weight alone, a rare kind is often left out: 18 faults miss ``restart-master`` one time in
three).

Faults (weights in :data:`WEIGHTS`):

* ``kill-sched``: kill -9 a scheduler replica; restart it (same replica id) 0.2-3 s later.
* ``stop-sched``: SIGSTOP a replica for TTL + 0.5-2 s (past its etcd lease), then SIGCONT.
* ``kill-worker``: kill -9 a worker; start a new one 0.2-2 s later.
* ``stop-worker``: SIGSTOP a worker briefly (0.2-1.2 s, well inside a job lease) or long (lease +
  1-3 s: its jobs are reaped and run elsewhere, its late acks are refused), then SIGCONT.
* ``kill-etcd``: kill -9 an etcd member (the leader half of the time); restart it 0.5-4 s later.
* ``redis-stall``: a busy script on the master for 100-600 ms (below Sentinel's down-after).
* ``kill-replica``: kill -9 the Redis replica; restart it 0.5-3 s later and wait until it is in sync
  and acknowledges writes promptly (:func:`wait_replicating`).
* ``failover``: kill -9 the master, wait for Sentinel to promote the replica, restart the old master
  as a replica (usually with ``replicaof`` in its config, as an operator would; sometimes without,
  so Sentinel has to convert it, ~20 s) and wait until every sentinel sees the pair healthy.
* ``restart-master``: kill -9 the master and start it again at once on the same port (AOF
  everysec): Redis restarts under its clients. Sentinel often promotes the replica anyway (its
  down-after, 1 s, counts from the last PING the master answered); the fault is then recorded with
  ``became_failover``, and the restarted old master keeps taking writes on the connections clients
  opened to it until Sentinel converts it to a replica (~10 s later), which drops them.
"""
from __future__ import annotations

import random
import socket
import threading
import time
import traceback

from scheduler.shell.servers import HOST, ServerError, encode_command, read_reply
from tests.chaos.history import Fault, JsonlWriter
from tests.chaos.stack import Stack
from tests.support.servers import RedisServer


def replicating(port: int, timeout_ms: int = 200) -> bool:
    """A write on the master at ``port`` reaches the replica within ``timeout_ms`` (``WAIT`` on the
    writing connection: it waits for that connection's writes)."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout_ms / 1000 + 2.0) as so, so.makefile("rb") as f:
            so.sendall(encode_command("SET", "chaos-nemesis-probe", str(time.time())))
            read_reply(f)
            so.sendall(encode_command("WAIT", 1, timeout_ms))
            return bool(read_reply(f) == 1)
    except (OSError, ServerError):
        return False


def wait_replicating(port: int, timeout: float = 30.0) -> None:
    """Until writes reach the replica promptly. A replica that has just finished a full resync is
    "online" (INFO, Sentinel) about a second before it acknowledges the stream: a master lost then
    takes that second of writes with it (measured: the first WAIT after the sync takes ~1 s)."""
    deadline = time.monotonic() + timeout
    while not replicating(port):
        if time.monotonic() > deadline:
            raise ServerError(f"writes on the master {port} did not reach the replica within {timeout} s")
        time.sleep(0.05)


WEIGHTS: dict[str, float] = {
    "kill-sched": 2.0,
    "stop-sched": 1.5,
    "kill-worker": 2.0,
    "stop-worker": 2.0,
    "kill-etcd": 1.5,
    "redis-stall": 1.5,
    "kill-replica": 1.0,
    "failover": 1.2,
    "restart-master": 0.8,
}
# Every kind once, the worker freeze twice: its two variants guard different things (a brief freeze
# must not cause a second run, a freeze past the lease must have its late acks refused).
FIRST = [*WEIGHTS, "stop-worker"]


class Nemesis(threading.Thread):
    def __init__(self, stack: Stack, seed: int, seconds: float, gap: tuple[float, float] = (0.5, 2.0)) -> None:
        super().__init__(name="nemesis", daemon=True)
        self.s = stack
        self.rng = random.Random(seed)
        self.seconds = seconds
        self.gap = gap
        self.writer = JsonlWriter(stack.hist / "nemesis.jsonl")
        self.faults: list[Fault] = []
        self.error: str | None = None
        self.current: str | None = None
        self._halt = threading.Event()
        self._wlock = threading.Lock()
        self._watch_stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch_master, name="master-watcher", daemon=True)
        self._expect_master_change = threading.Event()
        self.lease = stack.params.lease
        self._long_stops = self.rng.sample([True, False], 2)  # a worker freeze of each length first

    # -- bookkeeping
    def record(self, f: Fault) -> None:
        with self._wlock:
            self.faults.append(f)
            self.writer.write(f)

    def halt(self) -> None:
        self._halt.set()

    # -- main loop
    def run(self) -> None:
        self._watcher.start()
        end = time.time() + self.seconds
        kinds = list(WEIGHTS)
        weights = [WEIGHTS[k] for k in kinds]
        first = self.rng.sample(FIRST, len(FIRST))
        try:
            while not self._halt.is_set():
                kind = first.pop(0) if first else self.rng.choices(kinds, weights)[0]
                self.current = kind
                t = time.time()
                try:
                    getattr(self, "f_" + kind.replace("-", "_"))()
                except BaseException as exc:
                    self.record(Fault("nemesis-error", kind, None, t, time.time(), {"error": repr(exc)}))
                    raise
                self.current = None
                gap = self.rng.uniform(*self.gap)
                if not first and time.time() + gap >= end:
                    break  # the next fault would begin after the end: this was the last, no gap to wait
                self._halt.wait(gap)
        except BaseException:  # noqa: BLE001 - reported by the test, with the fault that failed
            self.error = f"fault {self.current!r} failed:\n{traceback.format_exc()}"
        finally:
            try:
                self.heal()
            except BaseException:  # noqa: BLE001
                self.error = (self.error or "") + f"\nheal failed:\n{traceback.format_exc()}"
            self._watch_stop.set()
            self._watcher.join(5)
            self.writer.close()

    def sleep(self, lo: float, hi: float) -> float:
        d = self.rng.uniform(lo, hi)
        time.sleep(d)
        return d

    # -- schedulers and workers
    def f_kill_sched(self) -> None:
        with self.s.lock:
            i = self.rng.randrange(len(self.s.scheds))
            p = self.s.scheds[i]
            t = time.time()
            pid = p.pid
            p.kill()
        self.sleep(0.2, 3.0)
        with self.s.lock:
            self.s.scheds[i] = self.s.sched_proc(i).start()
        self.record(Fault("kill-sched", f"s{i}", pid, t, time.time(), {"new_pid": self.s.scheds[i].pid}))

    def f_stop_sched(self) -> None:
        i = self.rng.randrange(len(self.s.scheds))
        p = self.s.scheds[i]
        secs = self.s.ttl + self.rng.uniform(0.5, 2.0)
        t = time.time()
        p.pause()
        time.sleep(secs)
        p.resume()
        self.record(Fault("stop-sched", f"s{i}", p.pid, t, time.time(), {"seconds": round(secs, 3)}))

    def f_kill_worker(self) -> None:
        with self.s.lock:
            i = self.rng.randrange(len(self.s.workers))
            p = self.s.workers[i]
            t = time.time()
            pid = p.pid
            p.kill()
        self.sleep(0.2, 2.0)
        with self.s.lock:
            self.s.workers[i] = self.s.worker_proc(i).start()
        self.record(Fault("kill-worker", f"w{i}", pid, t, time.time(), {"new_pid": self.s.workers[i].pid}))

    def f_stop_worker(self) -> None:
        i = self.rng.randrange(len(self.s.workers))
        p = self.s.workers[i]
        long = self._long_stops.pop() if self._long_stops else self.rng.random() < 0.5
        secs = self.lease + self.rng.uniform(1.0, 3.0) if long else self.rng.uniform(0.2, 1.2)
        t = time.time()
        p.pause()
        time.sleep(secs)
        p.resume()
        self.record(Fault("stop-worker", f"w{i}", p.pid, t, time.time(), {"seconds": round(secs, 3), "long": long}))

    # -- etcd
    def f_kill_etcd(self) -> None:
        e = self.s.etcd
        m = None
        if self.rng.random() < 0.5:
            try:
                m = e.leader(timeout=2.0)
            except ServerError:
                m = None
        if m is None:
            m = self.rng.choice(e.members)
        t = time.time()
        pid = m.pid
        m.kill()
        self.sleep(0.5, 4.0)
        m.start()
        e.wait_healthy(30)
        self.record(Fault("kill-etcd", m.name, pid, t, time.time(), {"new_pid": m.pid}))

    # -- redis
    def ensure_redis(self) -> None:
        """Make the SentinelSet's idea of the roles true and the pair healthy (after an unexpected
        failover, or a fault that did not finish)."""
        s = self.s.sentinel
        t = time.time()
        did = []
        port = s.master_port(timeout=30)
        if port != s.master.port:
            s.wait_failover(s.master.port, timeout=30)
            did.append(f"roles swapped to master {s.master.port}")
        if not s.replica.running:
            did.append("replica started")
        if not s._settled(s.master) or did:
            s.restart_old_master_as_replica(timeout=90)
            did.append("settled")
        if not replicating(s.master.port):
            wait_replicating(s.master.port)
            did.append("replicating")
        if did:
            self.record(Fault("heal-redis", "redis", None, t, time.time(), {"did": did}))

    def f_redis_stall(self) -> None:
        self.ensure_redis()
        ms = self.rng.uniform(100, 600)
        m = self.s.sentinel.master
        st = m.stall(ms)
        t = time.time() - (time.monotonic() - st.sent_at)
        took = st.join()
        self.record(Fault("redis-stall", f"redis:{m.port}", m.pid, t, time.time(), {"ms": round(took, 1)}))

    def f_kill_replica(self) -> None:
        self.ensure_redis()
        s = self.s.sentinel
        r = s.replica
        t = time.time()
        pid = r.pid
        r.kill()
        self.sleep(0.5, 3.0)
        r.start()
        up = time.time()
        s.wait_settled(90)
        wait_replicating(s.master.port)
        self.record(Fault("kill-replica", f"redis:{r.port}", pid, t, time.time(), {"up_at": up, "new_pid": r.pid}))

    def f_failover(self) -> None:
        self.ensure_redis()
        s = self.s.sentinel
        self._expect_master_change.set()
        try:
            old = s.master
            pid = old.pid
            t = time.time()
            s.kill_master()
            new_port = s.wait_failover(old.port, timeout=60)
            promoted = time.time()
            self.sleep(0.0, 2.0)
            in_config = self.rng.random() < 0.75
            s.restart_old_master_as_replica(timeout=90, replicaof_in_config=in_config)
            wait_replicating(s.master.port)
        finally:
            self._expect_master_change.clear()
        self.record(Fault("failover", f"redis:{old.port}", pid, t, time.time(),
                          {"promoted_at": promoted, "old_port": old.port, "new_port": new_port,
                           "replicaof_in_config": in_config, "new_pid": old.pid}))

    def f_restart_master(self) -> None:
        self.ensure_redis()
        s = self.s.sentinel
        self._expect_master_change.set()
        try:
            m = s.master
            pid = m.pid
            t = time.time()
            m.kill()
            m.start()
            up = time.time()
            became = self._failed_over_anyway(m, up)
            promoted = None
            if became:
                s.wait_failover(m.port, timeout=60)
                promoted = time.time()
            s.restart_old_master_as_replica(timeout=90)
            wait_replicating(s.master.port)
        finally:
            self._expect_master_change.clear()
        self.record(Fault("restart-master", f"redis:{m.port}", pid, t, time.time(),
                          {"up_at": up, "became_failover": became, "promoted_at": promoted, "new_pid": m.pid}))

    def _failed_over_anyway(self, m: RedisServer, up: float, timeout: float = 60.0) -> bool:
        """After a quick restart of the master ``m``: True once a sentinel names another master
        (Sentinel saw it down for down-after-milliseconds: the restart is often slower than
        that, counted from the last PING it answered); False once every sentinel has seen ``m``
        up, without a down flag, with its replica in sync, for 3 s (and 3 s after the restart)."""
        s = self.s.sentinel
        deadline = time.monotonic() + timeout
        calm_since: float | None = None
        while time.monotonic() < deadline:
            if any(p not in (None, m.port) for p in s.master_ports(timeout=0.5).values()):
                return True
            try:
                flags = [x.master_info(0.5).get("flags", "") for x in s.sentinels if x.running]
            except (OSError, ServerError):
                flags = ["?"]
            calm = all(f == "master" for f in flags) and s._settled(m)
            now = time.time()
            calm_since = (calm_since or now) if calm else None
            if calm_since is not None and now - calm_since >= 3.0 and now - up >= 3.0:
                return False
            time.sleep(0.1)
        raise ServerError(f"sentinels neither kept nor replaced the restarted master {m!r} within {timeout} s: "
                          f"{s.sentinel_views()}")

    def _watch_master(self) -> None:
        s = self.s.sentinel
        last: int | None = None
        while not self._watch_stop.wait(0.25):
            try:
                views = [p for p in s.master_ports(timeout=0.3).values() if p is not None]
            except Exception:  # noqa: BLE001, S112
                continue
            if not views:
                continue
            port = max(set(views), key=views.count)
            if views.count(port) < 2:
                continue
            if last is not None and port != last and not self._expect_master_change.is_set():
                self.record(Fault("observed-master-change", "redis", None, time.time(), time.time(),
                                  {"old_port": last, "new_port": port}))
            last = port

    # -- the end
    def heal(self) -> None:
        """Everything up, unpaused and healthy."""
        with self.s.lock:
            for i, p in enumerate(self.s.scheds):
                p.resume()
                if not p.alive:
                    self.s.scheds[i] = self.s.sched_proc(i).start()
            for i, p in enumerate(self.s.workers):
                p.resume()
                if not p.alive:
                    self.s.workers[i] = self.s.worker_proc(i).start()
        for m in self.s.etcd.members:
            if m.paused:
                m.resume()
            if not m.running:
                m.start()
        self.s.etcd.wait_healthy(30)
        self.ensure_redis()
        self.s.wait_up(60)
