"""Child processes of ``zsched dev``: a real redis-server and etcd with their data under
``./.zsched/``, scheduler replicas and workers. Every process is started here and stopped by its
own PID; nothing else is ever signalled."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def pick_port(preferred: int) -> int:
    """The preferred port if free, else one the kernel hands out."""
    if port_free(preferred):
        return preferred
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def need(binary: str, package: str) -> str:
    path = shutil.which(binary)
    if path is None:
        raise SystemExit(f"zsched dev: {binary} not found; install it with: sudo apt-get install {package} "
                         "(./scripts/dev does this for you)")
    return path


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Child:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.log, "ab")
        # own process group: Ctrl-C in the terminal reaches only zsched dev, which stops children in order
        self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                                     start_new_session=True)
        fh.close()
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
        if not self.alive:
            return
        assert self.proc is not None
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def redis_child(home: Path, port: int) -> Child:
    d = home / "redis"
    d.mkdir(parents=True, exist_ok=True)
    return Child("redis", [need("redis-server", "redis-server"), "--port", str(port), "--bind", "127.0.0.1",
                           "--dir", str(d), "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                           "--hz", "100"], home / "logs" / "redis.log")


def etcd_child(home: Path, client_port: int, peer_port: int) -> Child:
    d = home / "etcd"
    c, p = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return Child("etcd", [need("etcd", "etcd-server"), "--name", "dev", "--data-dir", str(d),
                          "--listen-client-urls", c, "--advertise-client-urls", c, "--listen-peer-urls", p,
                          "--initial-advertise-peer-urls", p, "--initial-cluster", f"dev={p}",
                          "--heartbeat-interval", "50", "--election-timeout", "500",
                          "--logger", "zap", "--log-level", "error"], home / "logs" / "etcd.log")


def zsched_child(name: str, args: list[str], home: Path, env: dict[str, str] | None = None) -> Child:
    """A ``zsched`` child process. Secrets (a Redis URL with a password) go in ``env``
    (``ZSCHED_REDIS_URL``), never on the command line, where ``ps`` shows them to every user."""
    return Child(name, [sys.executable, "-m", "scheduler", *args], home / "logs" / f"{name}.log", dict(env or {}))


def wait_redis(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"zsched dev: redis-server did not answer on 127.0.0.1:{port} (see .zsched/logs/redis.log)")


def wait_etcd(port: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5) as r:
                if b'"true"' in r.read():
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"zsched dev: etcd did not become healthy on 127.0.0.1:{port} (see .zsched/logs/etcd.log)")
