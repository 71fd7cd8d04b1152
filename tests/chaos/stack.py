"""The chaos stack: Redis under Sentinel (AOF everysec, 1 replica, 3 sentinels), a 3-member etcd
cluster, ``zsched scheduler`` replicas and ``zsched worker`` processes, all on the Sentinel URL, and
in-process producer threads. Every process is started here and signalled only by its own pid.
"""
from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scheduler import Client
from scheduler.protocol.errors import DurabilityTimeout
from scheduler.protocol.ids import decode_id, run_at_of
from scheduler.shell.servers import ZschedProc, stop_all
from tests.chaos.history import Call, Final, JsonlWriter, Params
from tests.support.servers import EtcdCluster, SentinelSet

QUEUE = "chaos"

# The worker app: one O_APPEND write() per line (atomic and unbuffered: a kill -9 loses no line
# that was written), START before and END after the handler's work; see history.py for the format.
APP_SOURCE = '''
import asyncio, os, time
from workers import Worker

worker = Worker.from_url(None)
_fd = os.open(os.path.join(os.environ["CHAOS_RUN_DIR"], "runs-%d.log" % os.getpid()),
              os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _log(kind, job, seq):
    os.write(_fd, ("%s %s %d %d %d %.6f %.3f %d\\n" % (kind, job.id, job.attempt, job.fence, os.getpid(),
                                                       time.time(), job.run_at.timestamp(), seq)).encode())


@worker.handler("chaos")
async def run(job):
    p = job.payload or {}
    seq = int(p.get("s", -1))
    _log("START", job, seq)
    if p.get("d"):
        await asyncio.sleep(p["d"] / 1000.0)
    _log("END", job, seq)
'''


class Proc(ZschedProc):
    """A ``zsched`` process whose log is ``DIR/KIND-NAME-PID.log`` (renamed once the pid is known)."""

    def __init__(self, args: list[str], log_dir: Path, kind: str, name: str, *, env: dict[str, str] | None = None,
                 cwd: str | None = None) -> None:
        super().__init__(args, env=env, cwd=cwd, metrics=False, log=log_dir / f"{kind}-{name}-starting.log")
        self.kind, self.name, self.log_dir = kind, name, log_dir
        self.stopped_at: float | None = None

    def start(self) -> Proc:
        self.log = self.log_dir / f"{self.kind}-{self.name}-starting-{time.monotonic_ns()}.log"
        super().start()
        final = self.log_dir / f"{self.kind}-{self.name}-{self.pid}.log"
        os.rename(self.log, final)  # the child keeps writing to the same open file
        self.log = final
        return self

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)


class Producer(threading.Thread):
    """Schedules durable jobs at a steady rate, run_at 0-3 s ahead; records every call."""

    def __init__(self, idx: int, client: Client, rate: float, seqs: itertools.count[int], out: Path,
                 seed: int, lease: float, max_attempts: int, stop: threading.Event) -> None:
        super().__init__(name=f"producer-{idx}", daemon=True)
        self.idx, self.client, self.period = idx, client, 1.0 / rate
        self.seqs, self.rng, self.lease, self.max_attempts = seqs, random.Random(seed * 1000 + idx), lease, max_attempts
        self.writer = JsonlWriter(out)
        self.stop_evt = stop
        self.calls = 0
        self.crash: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.crash = exc
        finally:
            self.writer.close()

    def _run(self) -> None:
        nxt = time.monotonic()
        while not self.stop_evt.is_set():
            seq = next(self.seqs)
            run_at = round(time.time() + self.rng.uniform(0.0, 3.0), 3)
            self.schedule(seq, run_at, {"s": seq, "d": self.rng.randint(0, 250)})
            nxt = max(nxt + self.period, time.monotonic())
            self.stop_evt.wait(max(0.0, nxt - time.monotonic()))

    def schedule(self, seq: int, run_at: float, payload: dict[str, int]) -> None:
        """One ``schedule`` call, recorded whatever it returns or raises."""
        t0 = time.time()
        try:
            jid = self.client.schedule(run_at, payload, queue=QUEUE, lease=self.lease, max_attempts=self.max_attempts)
            call = Call(seq, self.idx, t0, time.time(), "ok", run_at_of(decode_id(jid)) / 1000.0, jid)
        except DurabilityTimeout as exc:
            call = Call(seq, self.idx, t0, time.time(), "durability_timeout", run_at,
                        exc.job_id, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - every failure is history
            call = Call(seq, self.idx, t0, time.time(), "error", run_at, None, f"{type(exc).__name__}: {exc}")
        self.writer.write(call)
        self.calls += 1


class Stack:
    """Everything the chaos run needs, started in ``start()`` and stopped in ``stop()``."""

    def __init__(self, hist: Path, *, seed: int, namespace: str = "chaos", partitions: int = 8,
                 schedulers: int = 3, workers: int = 3, ttl: float = 2.0, params: Params | None = None,
                 rate: float = 80.0, producers: int = 2, max_attempts: int = 200,
                 scheduler_args: Sequence[str] = (), worker_args: Sequence[str] = ()) -> None:
        self.hist, self.seed, self.ns, self.partitions = hist, seed, namespace, partitions
        self.scheduler_args = list(scheduler_args)  # extra `zsched scheduler` arguments (ZSCHED_CHAOS_SCHEDULER_ARGS)
        self.worker_args = list(worker_args)  # extra `zsched worker` arguments (ZSCHED_CHAOS_WORKER_ARGS)
        self.n_sched, self.n_workers, self.ttl = schedulers, workers, ttl
        self.params = params or Params()
        self.rate, self.n_producers, self.max_attempts = rate, producers, max_attempts
        # 2 s down-after: on a loaded 2-core machine 1 s let Sentinel flag a busy new master down
        self.sentinel = SentinelSet(aof=True, down_after_ms=2000)
        self.etcd = EtcdCluster(3)
        self.scheds: list[Proc] = []
        self.workers: list[Proc] = []
        self.producers: list[Producer] = []
        self.seqs = itertools.count()  # payload sequence numbers, unique over every producer and burst
        self.bursts = 0
        self.clients: list[Client] = []
        self.produce_stop = threading.Event()
        self.lock = threading.RLock()  # the nemesis and the test both replace processes

    # -- processes
    def sched_proc(self, i: int) -> Proc:
        return Proc(["scheduler", "--redis", self.sentinel.url, "--etcd", self.etcd.endpoints, "--namespace", self.ns,
                     "--replica-id", f"s{i}", "--lease-ttl", str(self.ttl), *self.scheduler_args], self.hist,
                    "sched", f"s{i}")

    def worker_proc(self, i: int) -> Proc:
        return Proc(["worker", "chaosapp:worker", "--redis", self.sentinel.url, "--namespace", self.ns,
                     "--shutdown-grace", "10", *self.worker_args], self.hist, "worker", f"w{i}",
                    env={"CHAOS_RUN_DIR": str(self.hist)}, cwd=str(self.hist))

    def start(self) -> Stack:
        """Everything up, each part as soon as what it needs is: the etcd members elect a leader
        (~1 s) and the sentinels find each other (~2 s, their hello period) while the zsched
        processes import and connect (the longest part on a busy 2-core machine)."""
        (self.hist / "chaosapp.py").write_text(APP_SOURCE)
        self.etcd.launch()
        self.sentinel.launch()  # the sentinels name the master at once: clients and workers can start
        url = self.sentinel.url
        p = self.params
        # the clients first: the first to connect creates the namespace, and only they say how many
        # partitions it has (a worker would create it with the default count)
        for _ in range(self.n_producers):
            self.clients.append(Client.from_url(url, namespace=self.ns, partitions=self.partitions,
                                                durable="replica", durable_timeout=p.durable_timeout).connect())
        self.workers = [self.worker_proc(i).start() for i in range(self.n_workers)]
        self.etcd.wait_started()
        self.scheds = [self.sched_proc(i).start() for i in range(self.n_sched)]
        self.sentinel.wait_settled(30)  # before any fault: a failover needs sentinels that know each other
        self.wait_up(30)
        return self

    def wait_up(self, timeout: float) -> None:
        """Until every worker serves and every scheduler replica is up (their log lines say so)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            procs = [(w, "worker serving") for w in self.workers] + [(s, " up: namespace ") for s in self.scheds]
        for p, line in procs:
            while line not in p.output():
                assert p.alive and time.monotonic() < deadline, p.tail()
                time.sleep(0.05)

    def start_producers(self) -> None:
        for i, c in enumerate(self.clients):
            pr = Producer(i, c, self.rate / self.n_producers, self.seqs, self.hist / f"producer-{i}.jsonl", self.seed,
                          self.params.lease, self.max_attempts, self.produce_stop)
            self.producers.append(pr)
            pr.start()

    def burst(self, jobs: int, duration_ms: int, ahead_s: float = 1.0) -> None:
        """Schedule ``jobs`` jobs due at one instant ``ahead_s`` from now, each running
        ``duration_ms``, recorded as a producer's calls are (a producer of its own)."""
        idx = len(self.clients) + self.bursts
        self.bursts += 1
        pr = Producer(idx, self.clients[0], 1.0, self.seqs, self.hist / f"producer-{idx}.jsonl", self.seed,
                      self.params.lease, self.max_attempts, self.produce_stop)
        run_at = round(time.time() + ahead_s, 3)
        try:
            for _ in range(jobs):
                seq = next(self.seqs)
                pr.schedule(seq, run_at, {"s": seq, "d": duration_ms})
        finally:
            pr.writer.close()

    def calls_made(self) -> int:
        """``schedule`` calls the producers have made so far (returned or raised)."""
        return sum(pr.calls for pr in self.producers)

    def stop_producers(self) -> None:
        self.produce_stop.set()
        for pr in self.producers:
            pr.join(60)
        for pr in self.producers:
            if pr.crash is not None:
                raise AssertionError(f"producer {pr.idx} crashed: {pr.crash!r}")
            if pr.is_alive():
                raise AssertionError(f"producer {pr.idx} still stuck in a call 60 s after being told to stop")

    # -- end of the run
    def quiesce(self, timeout: float) -> Final:
        """Wait until nothing is scheduled, ready, running or dead (dead counts as left over)."""
        client = self.clients[0]
        deadline = time.monotonic() + timeout
        stats: dict[str, dict[str, int]] = {}
        err = None
        while time.monotonic() < deadline:
            try:
                stats = client.stats()
                err = None
            except Exception as exc:  # noqa: BLE001
                err = f"{type(exc).__name__}: {exc}"
                time.sleep(0.25)
                continue
            q = stats.get(QUEUE, {})
            if not any(q.get(k, 0) for k in ("scheduled", "ready", "running")):
                return Final(stats=stats)
            time.sleep(0.25)
        return Final(stats=stats, quiesced=False,
                     quiesce_error=f"after {timeout:.0f} s still {stats.get(QUEUE)}" + (f" ({err})" if err else ""))

    def final_states(self, ids: list[str]) -> dict[str, str | None]:
        """The state of every job (``get_many``, public API only)."""
        return {jid: info.state.value if info is not None else None
                for jid, info in self.clients[0].get_many(ids).items()}

    def save_server_logs(self) -> None:
        """Copy the Redis, Sentinel and etcd logs into ``servers/`` of the history (their own dirs
        are removed when they stop)."""
        out = self.hist / "servers"
        out.mkdir(exist_ok=True)
        servers = [*self.sentinel.servers, *self.sentinel.sentinels, *self.etcd.members]
        for srv in servers:
            try:
                shutil.copy(srv.log, out / f"{srv.kind}-{getattr(srv, 'port', srv.pid)}.log")
            except OSError:
                pass

    def stop(self) -> None:
        self.produce_stop.set()
        self.save_server_logs()
        try:
            stop_all(self.workers + self.scheds)
        except (OSError, subprocess.SubprocessError):
            for p in self.workers + self.scheds:
                p.kill()
        for c in self.clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001, S110
                pass
        try:
            self.etcd.stop()
        finally:
            self.etcd.kill()
            self.sentinel.stop()
            self.sentinel.kill()

    def describe(self) -> dict[str, Any]:
        return {"sentinel_url": self.sentinel.url, "etcd": self.etcd.endpoints, "namespace": self.ns,
                "partitions": self.partitions, "ttl": self.ttl, "rate": self.rate,
                "scheduler_args": self.scheduler_args}


def dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, default=str))
