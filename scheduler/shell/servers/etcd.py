"""etcd processes on loopback (:class:`EtcdServer`, :class:`EtcdCluster`) and a few calls to etcd's
v3 HTTP gateway (standard library only), to probe them and reset them between uses."""

from __future__ import annotations

import base64
import http.client
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Self

from .ports import HOST, free_port, free_ports
from .process import ServerError, ServerProcess

ETCD_ENV = "ZSCHED_ETCD"  # the etcd binary to run (default: from PATH)


# --------------------------------------------------------------------------- HTTP gateway


def etcd_request(endpoint: str, path: str, body: dict[str, Any] | None = None, timeout: float = 2.0) -> dict[str, Any]:
    """POST JSON to etcd's v3 HTTP gateway (``path`` like ``/v3/kv/put``)."""
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(
        f"http://{endpoint}{path}", data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            out: dict[str, Any] = json.loads(resp.read() or b"{}")
            return out
    except urllib.error.HTTPError as e:
        # The gateway reports gRPC errors as non-2xx with a JSON body; surface its message.
        detail = e.read().decode(errors="replace")
        raise ServerError(f"etcd {path} on {endpoint}: HTTP {e.code}: {detail}") from None
    except http.client.HTTPException as e:  # e.g. a half-started server; not an OSError
        raise ConnectionError(f"etcd {path} on {endpoint}: {e!r}") from None


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def etcd_put(endpoint: str, key: str | bytes, value: str | bytes, timeout: float = 2.0) -> dict[str, Any]:
    """Put one key through the HTTP gateway."""
    return etcd_request(endpoint, "/v3/kv/put", {"key": _b64(key), "value": _b64(value)}, timeout)


def etcd_get(endpoint: str, key: str | bytes, timeout: float = 2.0) -> bytes | None:
    """Get one key's value through the HTTP gateway (None if absent)."""
    kvs = etcd_request(endpoint, "/v3/kv/range", {"key": _b64(key)}, timeout).get("kvs") or []
    return base64.b64decode(kvs[0].get("value", "")) if kvs else None


def etcd_delete_all(endpoint: str, timeout: float = 2.0) -> int:
    """Delete every key (key="\\0", range_end="\\0" means the whole keyspace)."""
    res = etcd_request(endpoint, "/v3/kv/deleterange", {"key": _b64(b"\0"), "range_end": _b64(b"\0")}, timeout)
    return int(res.get("deleted", 0))


def etcd_revoke_all_leases(endpoint: str, timeout: float = 2.0) -> int:
    """Revoke every lease, so the next user never sees leases left by an earlier one."""
    leases = etcd_request(endpoint, "/v3/lease/leases", {}, timeout).get("leases") or []
    n = 0
    for lease in leases:
        try:
            etcd_request(endpoint, "/v3/lease/revoke", {"ID": lease["ID"]}, timeout)
            n += 1
        except ServerError:
            pass  # expired between list and revoke
    return n


def _http_get(url: str, timeout: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def etcd_healthy(endpoint: str, timeout: float = 1.0) -> bool:
    """True if ``GET /health`` answers 200 with health "true" (HEAD gets 405)."""
    try:
        status, body = _http_get(f"http://{endpoint}/health", timeout)
        return status == 200 and json.loads(body).get("health") == "true"
    except (OSError, ValueError, http.client.HTTPException):
        return False


# --------------------------------------------------------------------------- processes


class EtcdServer(ServerProcess):
    """One etcd member on loopback; alone by default, or part of an ``EtcdCluster``.

    ``heartbeat_ms``/``election_ms`` default to 10/100: fast failovers on loopback (``zsched dev``
    runs with calmer values)."""

    kind = "etcd"

    def __init__(
        self,
        client_port: int | None = None,
        peer_port: int | None = None,
        dir: str | os.PathLike[str] | None = None,
        name: str = "n0",
        initial_cluster: str | None = None,
        extra_args: Sequence[str] = (),
        keep: bool = False,
        binary: str | None = None,
        *,
        heartbeat_ms: int = 10,
        election_ms: int = 100,
        log: Path | None = None,
    ) -> None:
        super().__init__(dir, keep, log)
        self.name = name
        self.client_port = client_port if client_port is not None else free_port()
        self.peer_port = peer_port if peer_port is not None else free_port()
        self.initial_cluster = initial_cluster or f"{name}={self.peer_url}"
        self.extra_args = list(extra_args)
        self.binary = binary or os.environ.get(ETCD_ENV, "etcd")
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.member_id: str | None = None  # raft id (decimal string), filled in by status()

    @property
    def port(self) -> int:
        """The client port."""
        return self.client_port

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:CLIENT_PORT``, as ``--etcd`` takes it."""
        return f"{HOST}:{self.client_port}"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:CLIENT_PORT``."""
        return f"http://{self.endpoint}"

    @property
    def peer_url(self) -> str:
        """``http://127.0.0.1:PEER_PORT``."""
        return f"http://{HOST}:{self.peer_port}"

    @property
    def data_dir(self) -> Path:
        """etcd's ``--data-dir`` (inside the server's dir)."""
        return self.dir / "data"

    def argv(self) -> list[str]:
        """``etcd --name N --data-dir D ...`` listening on loopback only, with ``extra_args`` last."""
        return [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url,
            "--advertise-client-urls", self.url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", "new",
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            # 3.4 defaults to the deprecated capnslog logger, which ignores
            # --log-level for raft's INFO lines; zap honours it.
            "--logger", "zap",
            "--log-level", "error",
            "--log-outputs", "stderr",
            *self.extra_args,
        ]  # fmt: skip

    def ready(self) -> bool:
        """True once ``/health`` says healthy."""
        return etcd_healthy(self.endpoint, timeout=0.5)

    def healthy(self, timeout: float = 1.0) -> bool:
        """True if ``/health`` says healthy within ``timeout``."""
        return etcd_healthy(self.endpoint, timeout)

    def status(self, timeout: float = 1.0) -> dict[str, Any]:
        """``/v3/maintenance/status``: has ``leader`` and ``header.member_id`` (decimal strings)."""
        res = etcd_request(self.endpoint, "/v3/maintenance/status", {}, timeout)
        self.member_id = res.get("header", {}).get("member_id", self.member_id)
        return res

    def __repr__(self) -> str:
        return f"EtcdServer(name={self.name}, client={self.client_port}, peer={self.peer_port}, pid={self.pid})"


class EtcdCluster:
    """A ``size``-member etcd cluster on loopback (3 by default) of ``member_class`` members."""

    start_timeout = 15.0
    member_class: type[EtcdServer] = EtcdServer

    def __init__(self, size: int = 3, keep: bool = False, extra_args: Sequence[str] = ()) -> None:
        ports = free_ports(2 * size)
        names = [f"n{i}" for i in range(size)]
        initial = ",".join(f"{n}=http://{HOST}:{ports[2 * i + 1]}" for i, n in enumerate(names))
        self.members: list[EtcdServer] = [
            self.member_class(
                client_port=ports[2 * i],
                peer_port=ports[2 * i + 1],
                name=n,
                initial_cluster=initial,
                extra_args=extra_args,
                keep=keep,
            )
            for i, n in enumerate(names)
        ]
        self.keep = keep

    @property
    def endpoints(self) -> str:
        """Comma-joined ``127.0.0.1:C1,127.0.0.1:C2,...``."""
        return ",".join(m.endpoint for m in self.members)

    def _answering(self) -> list[EtcdServer]:
        return [m for m in self.members if m.running and not m.paused]

    def start(self) -> Self:
        """Spawn every member first (none is healthy before quorum), then wait for all."""
        return self.launch().wait_started()

    def launch(self) -> Self:
        """Spawn every member without waiting for them (the election takes about a second): a
        caller with other things to start does them meanwhile, then calls :meth:`wait_started`."""
        try:
            for m in self.members:
                m.spawn()
        except BaseException:
            self.kill()
            raise
        return self

    def wait_started(self) -> Self:
        """After :meth:`launch`: wait until every member is ready (``start_timeout``), and learn the
        member ids while everyone is up; SIGKILL them all if that fails."""
        try:
            deadline = time.monotonic() + self.start_timeout
            for m in self.members:
                m.wait_ready(max(0.1, deadline - time.monotonic()))
            for m in self.members:
                m.status()
        except BaseException:
            self.kill()
            raise
        return self

    def wait_healthy(self, timeout: float = 10.0, members: Iterable[EtcdServer] | None = None) -> None:
        """Wait until every given (default: every running, unpaused) member reports healthy."""
        todo = list(members) if members is not None else self._answering()
        deadline = time.monotonic() + timeout
        while not all(m.healthy(0.5) for m in todo):
            if time.monotonic() > deadline:
                raise ServerError("cluster not healthy; " + "; ".join(f"{m!r}: {m.log_tail(5)}" for m in todo))
            time.sleep(0.05)

    def leader(self, timeout: float = 5.0) -> EtcdServer:
        """The member every reachable member agrees is leader (polls up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        last = "no member answered"
        while True:
            views: dict[str, str] = {}
            for m in self._answering():
                try:
                    st = m.status(0.5)
                except (OSError, ServerError) as e:
                    last = f"{m!r}: {e}"
                    continue
                views[m.name] = st.get("leader", "0")
            ids = set(views.values())
            if len(ids) == 1 and "0" not in ids:
                (lid,) = ids
                for m in self.members:
                    if m.member_id == lid:
                        return m
                last = f"leader id {lid} is not a known member"
            elif views:
                last = f"members disagree or have no leader: {views}"
            if time.monotonic() > deadline:
                raise ServerError(f"no single etcd leader after {timeout}s ({last})")
            time.sleep(0.05)

    def stop(self, keep: bool | None = None, grace: float = 1.0) -> None:
        """Stop followers, then the leader once it has stepped down; SIGKILL after ``grace`` s.

        A leader asked to stop first hands leadership to the peer its transport
        has known longest, even a dead or stopping one, and then waits ~5 s for a
        handover that never comes.  A leader that lost quorum steps down within
        one election timeout (CheckQuorum), after which SIGTERM is instant.
        """
        lead: set[str | None] = set()
        for m in self._answering():
            try:
                lead.add(m.status(0.5).get("leader"))
            except (OSError, ServerError):
                pass
        followers = [m for m in self.members if m.member_id not in lead]
        leaders = [m for m in self.members if m.member_id in lead]
        for m in followers:
            m.stop(keep, grace=grace)
        deadline = time.monotonic() + grace
        for m in leaders:
            while m.running and time.monotonic() < deadline:
                try:
                    if m.status(0.2).get("leader") != m.member_id:
                        break
                except (OSError, ServerError):
                    break
                time.sleep(0.02)
            m.stop(keep, grace=max(0.1, deadline - time.monotonic()))

    def kill(self) -> None:
        """SIGKILL every member (dirs kept)."""
        for m in self.members:
            m.kill()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EtcdCluster({self.endpoints})"
