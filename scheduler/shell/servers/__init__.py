"""Real redis-server, Sentinel, etcd and ``zsched`` processes on loopback, started and stopped by us.

One place that runs them, for ``zsched dev``, the tests and the benchmarks:

- ``process``: a child process with a log file (:class:`ChildProcess`), signalled only by the pid
  we started, and a server with a directory and a readiness probe (:class:`ServerProcess`);
- ``ports``: free loopback ports;
- ``resp``: a minimal RESP client to probe and drive Redis without a client library;
- ``redis``: :class:`RedisServer`;  ``sentinel``: :class:`SentinelServer`, :class:`SentinelSet`;
- ``cluster``: :class:`ClusterServer`, :class:`ClusterSet` (Redis Cluster formed with ``redis-cli``,
  online resharding with ``move_slots``);
- ``etcd``: :class:`EtcdServer`, :class:`EtcdCluster` and calls to etcd's HTTP gateway;
- ``zsched``: :class:`ZschedProc`, ``python -m scheduler`` child processes;
- ``lifeline``: :class:`Lifeline`, children that stop by themselves when their parent is gone
  (servers get the kernel's parent-death signal instead: :func:`die_with_parent`).

Everything listens on 127.0.0.1 only.  Fault injection (SIGSTOP, busy scripts, rollbacks, role
swaps) is not here: it lives with the tests (``tests/support/faults.py``, ``tests/support/servers.py``).
"""

from .cluster import CLUSTER_SLOTS, ClusterServer, ClusterSet, NodeLine, parse_cluster_nodes, slot_of
from .etcd import (
    EtcdCluster,
    EtcdServer,
    etcd_delete_all,
    etcd_get,
    etcd_healthy,
    etcd_put,
    etcd_request,
    etcd_revoke_all_leases,
)
from .lifeline import Lifeline, watch_lifeline
from .ports import HOST, free_port, free_ports, pick_port
from .process import (
    OWNER_FILE,
    ChildProcess,
    ServerError,
    ServerProcess,
    StopFlag,
    die_with_parent,
    pid_alive,
    shutdown_all,
    sweep_stale_dirs,
    wait_for,
)
from .redis import RedisServer
from .resp import encode_command, read_reply, redis_command, redis_info
from .sentinel import SentinelServer, SentinelSet
from .zsched import ZschedProc, scheduler_proc, stop_all, ui_proc

__all__ = [
    "CLUSTER_SLOTS",
    "HOST",
    "OWNER_FILE",
    "ChildProcess",
    "ClusterServer",
    "ClusterSet",
    "EtcdCluster",
    "EtcdServer",
    "Lifeline",
    "NodeLine",
    "RedisServer",
    "SentinelServer",
    "SentinelSet",
    "ServerError",
    "ServerProcess",
    "StopFlag",
    "ZschedProc",
    "die_with_parent",
    "encode_command",
    "etcd_delete_all",
    "etcd_get",
    "etcd_healthy",
    "etcd_put",
    "etcd_request",
    "etcd_revoke_all_leases",
    "free_port",
    "free_ports",
    "pick_port",
    "parse_cluster_nodes",
    "pid_alive",
    "read_reply",
    "redis_command",
    "redis_info",
    "scheduler_proc",
    "shutdown_all",
    "stop_all",
    "ui_proc",
    "slot_of",
    "sweep_stale_dirs",
    "wait_for",
    "watch_lifeline",
]
