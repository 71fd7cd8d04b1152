"""``zsched dev``: the whole stack on this machine, with a live view.

A real redis-server and etcd as child processes (data under ``./.zsched/``), 3 scheduler replicas,
2 workers running the demo handlers (``scheduler.shell.demo``), a demo producer, and a terminal view
refreshed every second. Ctrl-C stops everything, children first, and leaves no process behind;
so do SIGTERM, a closed terminal or output pipe, and (through the children's lifeline and the
servers' parent-death signal) a SIGKILL of ``zsched dev`` itself (:mod:`.dev_guard`).
"""
from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from functools import partial
from pathlib import Path

from ..client import Client
from ..protocol import config
from ..protocol.etcd_endpoints import check_etcd_endpoints
from ..protocol.masking import mask_secrets
from ..redisio.errors import REDIS_ERRORS
from .admin import AdminError, BadInput
from .cli_common import SubParsers
from .cli_errors import EXIT_LOCAL
from .cli_ui import missing_ui_packages
from .dev_guard import Output, Stopping, survivors
from .dev_home import has_data, reset, shown
from .dev_producer import Producer
from .dev_view import View, compact_line
from .servers import (
    ChildProcess,
    EtcdServer,
    Lifeline,
    RedisServer,
    ServerError,
    ServerProcess,
    StopFlag,
    ZschedProc,
    pick_port,
    ui_proc,
)
from .ui.security import new_token

STOP_TIMEOUT_S = 35.0  # per child: longer than a worker's default shutdown grace (30 s) for its running jobs
# what redis-server and etcd get when zsched dev dies (even by SIGKILL): both stop cleanly on it
# (Redis flushes its AOF), and there is no one left to send a SIGKILL later
SERVER_DEATH_SIGNAL = signal.SIGTERM
EXIT_POLL_S = 0.05  # how often the clean-up looks whether the children it signalled have exited
# how long a stopping worker retries outcomes Redis did not take: here Redis is our own child, stopped
# after the workers on every ordered stop, so it is gone for good when they cannot reach it (zsched
# dev was SIGKILLed, taking redis-server with it); a worker's default 10 s would only delay its exit
DEV_DRAIN_TIMEOUT = 2.0


def add_parser(sub: SubParsers) -> None:
    p = sub.add_parser("dev", help="run the whole stack locally with a live view (Ctrl-C stops it)",
                       description="Start redis-server and etcd (data in ./.zsched/), 3 scheduler replicas, 2 "
                                   "workers with demo handlers and a demo producer, and show a live view.")
    p.add_argument("--no-demo", action="store_true",
                   help="no demo producer or demo workers: the stack for your own producer and workers")
    p.add_argument("--worker", metavar="MODULE:ATTR", action="append", default=[],
                   help="run 2 workers of this Worker too (repeatable); with the demo, replaces the demo workers")
    config.add_connection_options(p, redis_help="use this Redis instead of starting one",
                                  namespace_help=f"namespace (default {config.DEFAULT_NAMESPACE})")
    p.add_argument("--etcd", metavar="ENDPOINTS", help="use this etcd instead of starting one")
    p.add_argument("--replicas", type=int, default=3, help="scheduler replicas (default 3)")
    p.add_argument("--workers", type=int, default=2, help="worker processes per worker app (default 2)")
    p.add_argument("--home", default=".zsched", help="data and logs directory (default ./.zsched)")
    p.add_argument("--reset", action="store_true",
                   help="start fresh: remove the data and logs of the earlier run (redis/, etcd/ and logs/ under "
                        "--home, nothing else) first; refused while processes of another run still use them")
    p.add_argument("--duration", type=float, default=None, help="stop by itself after this many seconds")
    p.add_argument("--plain", action="store_true",
                   help="print the whole view as a text block every second instead of redrawing the screen "
                        "(when the output is not a terminal the default is one compact line per second)")
    p.set_defaults(func=run)


class SetUpError(AdminError):
    """A server of the local stack cannot be started (a program missing, a port taken, a server that
    does not come up): ``zsched: error: ...``, exit 4."""

    exit_code = EXIT_LOCAL


def need(binary: str, package: str) -> None:
    """Refuse with an install hint if ``binary`` is not on PATH."""
    if shutil.which(binary) is None:
        raise SetUpError(f"zsched dev: {binary} not found; install it with: sudo apt-get install {package} "
                         "(./scripts/dev does this for you)")


class Stack:
    """The servers (unless ``--redis``/``--etcd`` name existing ones) and the zsched processes of
    ``zsched dev``, with their data and logs under ``--home``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.home = Path(args.home).resolve()
        self.servers: dict[str, ServerProcess] = {}
        self.schedulers: dict[str, ZschedProc] = {}
        self.workers: dict[str, ZschedProc] = {}
        self.ns = config.namespace(args.namespace)
        if args.etcd is not None:  # a malformed --etcd is bad input, refused before anything starts
            check_etcd_endpoints(args.etcd)
        if args.reset and args.redis:
            raise BadInput("zsched dev: --reset removes the data of the redis-server zsched dev starts; with --redis "
                           "the jobs live in that server and would stay: drop --reset (or --redis)")
        self.earlier_jobs: int | None = None  # jobs found in data of an earlier run (None: no such data)
        self.metrics_ports: dict[str, int] = {}
        self.consoles: dict[str, ZschedProc] = {}  # zsched ui
        self.ui_token = config.ui_token() or new_token()
        self.ui_url = ""
        # children stop by themselves once zsched dev is gone, even if it was SIGKILLed
        self.lifeline = Lifeline(grace=STOP_TIMEOUT_S)

    def start(self, stopping: StopFlag) -> bool:
        """Start everything; False as soon as ``stopping`` is set (a signal) while the servers come
        up: what was started is in ``servers``, for :meth:`stop`. Refuses (:class:`SetUpError`) while
        processes of an earlier run still write into ``--home``: they would join this one."""
        left = survivors(self.home)
        if left:
            pids = " ".join(str(pid) for pid, _ in left)
            raise SetUpError(f"zsched dev: {len(left)} process(es) of an earlier run still write to {self.home} ("
                             + ", ".join(f"pid {pid}: {path}" for pid, path in left)
                             + f") and would join this run; stop them (kill {pids}) or use another --home")
        if self.args.reset:
            removed = reset(self.home)
            if removed:
                print(f"zsched dev: --reset: removed the data of the earlier run in {shown(self.home)} "
                      f"({', '.join(f'{name}/' for name in removed)})", flush=True)
        earlier = not self.args.redis and has_data(self.home)
        try:
            if not self._start_servers(stopping):
                return False
        except ServerError as exc:
            raise SetUpError(f"zsched dev: {exc} (logs in {self.home / 'logs'})") from None
        a = self.args
        # the URL and the endpoints (they may carry passwords) reach children through their
        # environment, not argv: ps shows every process's argv to every user
        common = ["--namespace", self.ns]
        env = {"ZSCHED_REDIS_URL": self.redis_url, "ZSCHED_ETCD_ENDPOINTS": self.etcd}
        with Client.from_url(self.redis_url, namespace=self.ns).connect() as client:  # fixes the partition count once
            if earlier:
                self.earlier_jobs = sum(q["scheduled"] + q["ready"] + q["running"] + q["dead"]
                                        for q in client.stats().values())
        for i in range(a.replicas):
            name = f"scheduler-{i + 1}"
            self.schedulers[name] = self._zsched(name, ["scheduler", *common, "--replica-id", name], 19100 + i, env)
        apps = list(a.worker) or ([] if a.no_demo else ["scheduler.shell.demo:worker"])
        n = 0
        for app in apps:
            for _ in range(a.workers):
                n += 1
                self.workers[f"worker-{n}"] = self._zsched(
                    f"worker-{n}", ["worker", app, *common, "--drain-timeout", str(DEV_DRAIN_TIMEOUT)], 19200 + n, env)
        if missing_ui_packages():  # installed without the 'ui' extra: the stack runs without its console
            self.ui_url = ""
            return True
        ui_port = pick_port(8089)
        self.consoles["ui"] = ui_proc(self.redis_url, self.ns, port=ui_port, token=self.ui_token, etcd=self.etcd,
                                      log=self.home / "logs" / "ui.log", new_session=True,
                                      lifeline=self.lifeline).start()
        self.ui_url = f"http://127.0.0.1:{ui_port}/"
        return True

    def _start_servers(self, stopping: StopFlag) -> bool:
        logs = self.home / "logs"
        if self.args.redis:
            self.redis_url = config.redis_url(self.args.redis)
        else:
            need("redis-server", "redis-server")
            redis = RedisServer(pick_port(16379), self.home / "redis", keep=True, aof=True, log=logs / "redis.log")
            if not self._start_server("redis", redis, stopping):
                return False
            self.redis_url = redis.url
        if self.args.etcd:
            self.etcd = self.args.etcd
        else:
            need("etcd", "etcd-server")
            etcd = EtcdServer(pick_port(12379), pick_port(12380), self.home / "etcd", name="dev", keep=True,
                              heartbeat_ms=50, election_ms=500, log=logs / "etcd.log")
            etcd.start_timeout = 15.0  # its data is on disk: the first start preallocates the WAL
            if not self._start_server("etcd", etcd, stopping):
                return False
            self.etcd = etcd.endpoint
        return True

    def _start_server(self, name: str, server: RedisServer | EtcdServer, stopping: StopFlag) -> bool:
        """Spawn ``server`` and wait until it answers, or until ``stopping`` (False). It is in
        ``servers`` from its spawn on, so :meth:`stop` stops it by its pid whenever the wait ends."""
        print(f"starting {name} on 127.0.0.1:{server.port} (log {server.log})", flush=True)
        server.death_signal = SERVER_DEATH_SIGNAL
        server.spawn()
        self.servers[name] = server
        return server.wait_ready(stop=stopping)

    def _zsched(self, name: str, args: list[str], preferred_port: int, env: dict[str, str]) -> ZschedProc:
        port = pick_port(preferred_port)
        self.metrics_ports[name] = port
        # own session: Ctrl-C in the terminal reaches only zsched dev, which stops children in order
        return ZschedProc([*args, "--metrics-port", str(port)], env=env, metrics=False,
                          log=self.home / "logs" / f"{name}.log", new_session=True, lifeline=self.lifeline).start()

    def stop(self, stopping: Stopping) -> None:
        """Stop every child, in order: the console and the workers (they hand unfinished jobs back),
        then the replicas (they release ownership), then the servers; one group at a time, so etcd
        is never gone before the replicas revoke their lease. A child still running
        :data:`STOP_TIMEOUT_S` s after its SIGTERM is SIGKILLed; after a second SIGINT or SIGTERM
        (``stopping.hurry``) everything left is SIGKILLed at once."""
        groups: list[dict[str, ChildProcess]] = [{**self.consoles, **self.workers}, {**self.schedulers},
                                                 {**self.servers}]
        for group in groups:
            for p in group.values():
                p.terminate()
            stopping.wait(STOP_TIMEOUT_S, partial(_gone_or_hurry, group, stopping), poll=EXIT_POLL_S)
            if stopping.hurry:
                print("zsched dev: stopping again: killing what is left now (jobs that were running run again "
                      "once their leases expire)", flush=True)
                break
            for name, p in group.items():
                if p.running:
                    print(f"zsched dev: {name} still running {STOP_TIMEOUT_S:g} s after SIGTERM; SIGKILL", flush=True)
                    p.kill()
        for group in groups:
            for p in group.values():
                p.kill()  # only those still running: after a hurry, or a failure above
        for srv in self.servers.values():
            srv.stop()  # already stopped: forget it (the exit hook kills the servers still tracked)

    @property
    def started(self) -> bool:
        """True once a child process was spawned (there is something to stop)."""
        return bool(self._children())

    def still_running(self) -> list[str]:
        """Names of the children that are still running."""
        return [name for name, p in self._children() if p.running]

    def dead_children(self) -> list[str]:
        """Names of the children that have exited."""
        return [name for name, p in self._children() if not p.running]

    def _children(self) -> list[tuple[str, ChildProcess]]:
        return [*self.servers.items(), *self.schedulers.items(), *self.workers.items(), *self.consoles.items()]


def _gone_or_hurry(group: dict[str, ChildProcess], stopping: Stopping) -> bool:
    return stopping.hurry or not any(p.running for p in group.values())


def banner(stack: Stack) -> list[str]:
    """What a user needs from the running stack: where an earlier run's data came in, the
    ``export`` line for their own shell, the metrics ports, the console's URL and token. Printed
    once at the start, and on top of every frame of the redrawn view, which clears the screen."""
    lines = []
    if stack.earlier_jobs is not None and stack.earlier_jobs > 0:
        lines.append(f"zsched dev: found data of an earlier run in {shown(stack.home)} ({stack.earlier_jobs} jobs "
                     f"in namespace {stack.ns}): continuing with it; --reset starts fresh")
    lines.append(f"stack up: export ZSCHED_REDIS_URL={mask_secrets(stack.redis_url)} "
                 f"ZSCHED_ETCD_ENDPOINTS={mask_secrets(stack.etcd)} ZSCHED_NAMESPACE={stack.ns}")
    lines.append("metrics: " + " ".join(f"{name}=127.0.0.1:{port}" for name, port in stack.metrics_ports.items()))
    if stack.ui_url:
        lines.append(f"console: {stack.ui_url} (zsched ui; actions need the token {stack.ui_token})")
    else:
        lines.append("console: not started: the web console's packages are not installed (pip install -e '.[ui]' "
                     "in a checkout of zsched)")
    return lines


def run(args: argparse.Namespace) -> int:
    """Run the stack until Ctrl-C, SIGTERM, SIGHUP (the terminal closed), a closed output or
    ``--duration``, then stop everything it started, whatever ended it; 0."""
    producer: Producer | None = None
    stopping = Stopping()
    # before anything is started: a signal while the servers come up (etcd may take seconds) ends
    # the wait, and the finally below stops what was started
    stopping.install()
    stack = Stack(args)
    # a closed output ends the run as Ctrl-C does, and never keeps the clean-up from running
    out = Output(stack.home / "logs" / "dev.log", on_stdout_lost=stopping.request).install()
    try:
        if not stack.start(stopping):
            return 0
        header = banner(stack)
        for line in header:
            print(line, flush=True)
        if not args.no_demo:
            producer = Producer(stack.redis_url, stack.ns)
            producer.start()
        view = View(stack)
        deadline = time.monotonic() + args.duration if args.duration else None
        # a terminal: the view redrawn; --plain: the view as text blocks; not a terminal (a log
        # file, a pipe): one compact line per interval
        tty = sys.stdout.isatty()
        while not stopping.wait(1.0):
            try:
                sample = view.sample()
            except REDIS_ERRORS as exc:  # stalled or restarting: the stack rides it out, so does the view
                line = (f"{time.strftime('%H:%M:%S')} Redis at {mask_secrets(stack.redis_url)} does not answer "
                        f"({mask_secrets(f'{type(exc).__name__}: {exc}')}); the stack keeps running, the view "
                        "tries again every second\n")
                out.frame(("\x1b[H\x1b[2J" + "\n".join(header) + "\n\n" if tty and not args.plain else "") + line)
                continue
            if tty and not args.plain:  # the screen is cleared: the banner goes on top of every frame
                out.frame("\x1b[H\x1b[2J" + "\n".join(header) + "\n\n" + view.render(sample) + "\n")
            elif args.plain:
                out.frame(view.render(sample) + "\n\n")
            else:
                out.frame(compact_line(sample) + "\n")
            if deadline is not None and time.monotonic() >= deadline:
                stopping.request("--duration")
    finally:
        if producer is not None:
            producer.stop_event.set()
            producer.join(5)
        if stack.started:
            print(f"stopping ({stopping.reason or 'an error'}): workers, schedulers, etcd, redis ... "
                  "(Ctrl-C again to kill them at once)", flush=True)
            stack.stop(stopping)
            left = stack.still_running()
            print("stopped" + (f"; still running: {left}" if left else ", no process left behind"), flush=True)
        out.restore()
    return 0
