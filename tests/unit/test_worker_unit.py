"""Worker pieces that need no Redis: configuration, the claim planner, CLI parsing, stats, Job."""
from __future__ import annotations

import socket
import sys
import threading
from collections import Counter
from datetime import UTC, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from scheduler.metrics import serve, stop_serving
from scheduler.shell.cli import build_parser
from scheduler.shell.servers import free_port
from workers import Job, PermanentError, Retry, Worker, WorkerStats
from workers.cli import load_worker
from workers.outcome import type_name
from workers.planner import CLAIM_CHUNK, ClaimPlanner


def test_retry_delay_forms() -> None:
    assert Retry().delay is None
    assert Retry(2).delay == 2.0
    assert Retry(delay=timedelta(milliseconds=1500)).delay == 1.5
    assert Retry(-1).delay == 0.0
    assert "retry requested in 2 s" in str(Retry(2))
    for bad in (float("nan"), "1", True):
        with pytest.raises(TypeError):
            Retry(bad)  # type: ignore[arg-type]
    assert issubclass(PermanentError, Exception)


def test_worker_settings_are_validated() -> None:
    with pytest.raises(ValueError):
        Worker(concurrency=0)
    with pytest.raises(TypeError):
        Worker(concurrency=2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Worker(shutdown_grace=-1)
    with pytest.raises(TypeError):
        Worker(queues="default")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Worker(queues=["bad name"])
    with pytest.raises(ValueError):
        Worker(handler_timeouts={"q": 0})
    with pytest.raises(ValueError):
        Worker(redis_url="http://nope")
    w = Worker(queues=["a", "b", "a"])
    assert w.queues == ["a", "b"]
    assert w.concurrency == 16 and w.shutdown_grace == 30.0


def test_handler_registration() -> None:
    w = Worker()

    @w.handler("emails", timeout=3)
    async def send(job: Job) -> None:
        pass

    @w.handler("sync")
    def sync(job: Job) -> None:
        pass

    assert w._handlers["emails"].is_async and w._handlers["emails"].timeout == 3.0
    assert not w._handlers["sync"].is_async
    with pytest.raises(ValueError, match="already has a handler"):
        w.handler("emails")(send)
    with pytest.raises(ValueError):
        w.handler("no spaces")
    with pytest.raises(ValueError):
        w.handler("q", timeout=0)


def test_plan_never_exceeds_free_slots_and_probes_unknown_partitions_one_job_each() -> None:
    planner = ClaimPlanner(["default"], 16)
    planner.mark_all()
    plan = planner.plan(16)
    assert [n for *_, n, _ in plan] == [1] * 16  # unknown depth: one each, all partitions at once
    assert sum(n for *_, n, _ in planner.plan(5)) == 5


def test_plan_splits_free_slots_over_few_notified_partitions() -> None:
    planner = ClaimPlanner(["default"], 16)
    planner.notify("default", 3)
    planner.notify("default", 9)
    assert sorted((p, n) for _, p, n, _ in planner.plan(16)) == [(3, 8), (9, 8)]


def test_plan_gives_busy_partitions_big_batches_and_rotates_fairly() -> None:
    planner = ClaimPlanner(["default"], 16)
    planner.mark_all()
    planner.hot["default"] = set(range(16))
    served: Counter[int] = Counter()
    for _ in range(32):
        plan = planner.plan(16)
        assert sum(n for _, _, n, _ in plan) == 16
        assert all(n <= CLAIM_CHUNK for _, _, n, _ in plan)
        for _, p, n, _ in plan:
            served[p] += n
    assert set(served) == set(range(16))
    assert max(served.values()) - min(served.values()) <= CLAIM_CHUNK


def test_sweeps_take_turns_at_which_partition_is_planned_first() -> None:
    """The handler slots go to a plan's first claims (Slots.reserve_many): a sweep that planned
    every partition must not start at the same one next time, else a partition behind the
    handler slots got a claim without one at every sweep."""
    planner = ClaimPlanner(["default"], 16)
    firsts = []
    for _ in range(16):
        planner.mark_all()
        plan = planner.plan(36)  # 4 handler + 32 prefetch slots: every partition planned
        assert sorted(p for _, p, _, _ in plan) == list(range(16))
        firsts.append(plan[0][1])
        for _, p, n, gen in plan:
            planner.claimed("default", p, n, gen, 0)
    assert firsts == list(range(16))


def test_plan_interleaves_queues() -> None:
    planner = ClaimPlanner(["a", "b"], 4)
    for q in ("a", "b"):
        for p in range(4):
            planner.notify(q, p)
    firsts = Counter()
    for _ in range(10):
        plan = planner.plan(4)
        assert Counter(q for q, *_ in plan) == {"a": 2, "b": 2}  # cold: one job per candidate, alternating
        firsts[plan[0][0]] += 1
    assert firsts == {"a": 5, "b": 5}  # queue order rotates too


def test_notify_ignores_unknown_queue_and_partition() -> None:
    planner = ClaimPlanner(["a"], 4)
    planner.notify("zzz", 1)
    planner.notify("a", 99)
    assert planner.candidates == {"a": {}}


def test_stats_sum_and_names() -> None:
    a, b = WorkerStats(claimed=2, acked=1), WorkerStats(claimed=3, dead=1)
    t = WorkerStats.total([a, b])
    assert (t.claimed, t.acked, t.dead) == (5, 1, 1)
    assert set(WorkerStats.names()) == {"claimed", "acked", "failed", "retried", "dead", "lease_lost",
                                        "released", "poison", "notified", "claims", "claims_empty", "skipped"}
    assert t.as_dict()["claimed"] == 5


def test_a_stopped_metrics_server_ends_its_thread_and_frees_its_port() -> None:
    """stop_serving wakes the server's poll rather than waiting for it: once it returns, the
    serving thread ends and the port can be bound again (a worker stopped in-process frees it)."""
    port = free_port()
    before = set(threading.enumerate())
    server = serve(CollectorRegistry(), port)
    [thread] = set(threading.enumerate()) - before
    stop_serving(server)
    thread.join(5)
    assert not thread.is_alive()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_job_lazy_fields() -> None:
    raw = bytes(range(15))
    j = Job(raw, "q", {"a": 1}, None, 1, 5, 1_700_000_000_123, 42, 30.0)
    assert j.id == raw.hex()
    assert j.run_at.tzinfo is UTC and j.run_at.timestamp() == pytest.approx(1_700_000_000.123)
    assert j.fence == 42 and not j.lease_lost
    assert "attempt=1/5" in repr(j)


def test_error_type_names() -> None:
    class Boom(Exception):
        pass

    assert type_name(ValueError("x")) == "ValueError"
    assert type_name(PermanentError("x")) == "workers.errors.PermanentError"
    assert type_name(Boom()).endswith("test_error_type_names.<locals>.Boom")


def test_cli_parser_registers_worker_command() -> None:
    args = build_parser().parse_args(["worker", "pkg.mod:app", "--redis", "redis://h:1/0", "--namespace", "ns",
                                      "--queues", "a, b", "--concurrency", "4", "--metrics-port", "9100",
                                      "--shutdown-grace", "2.5"])
    assert args.app == "pkg.mod:app" and args.queues == ["a", "b"] and args.concurrency == 4
    assert args.metrics_port == 9100 and args.shutdown_grace == 2.5 and callable(args.func)
    for bad in (["--concurrency", "0"], ["--queues", ","], ["--shutdown-grace", "-1"], ["--metrics-port", "70000"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["worker", "m:a", *bad])


def test_load_worker_from_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "wmod_unit.py").write_text(
        "from workers import Worker\n"
        "worker = Worker(concurrency=3)\n"
        "class ns:\n    inner = worker\n"
        "def make():\n    return Worker(concurrency=5)\n"
        "not_a_worker = 42\n"
    )
    (tmp_path / "wmod_broken.py").write_text("import wmod_missing_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        w = load_worker("wmod_unit:worker")
        assert w.concurrency == 3
        assert load_worker("wmod_unit:ns.inner") is w
        assert load_worker("wmod_unit:make").concurrency == 5
        with pytest.raises(TypeError, match="expected a workers.Worker"):
            load_worker("wmod_unit:not_a_worker")
        with pytest.raises(ValueError, match="has no attribute"):
            load_worker("wmod_unit:nope")
        with pytest.raises(ValueError, match="expected MODULE:ATTR"):
            load_worker("wmod_unit")
        with pytest.raises(ValueError, match="cannot import module 'nosuch_mod_xyz'"):
            load_worker("nosuch_mod_xyz:worker")
        # A missing import *inside* the user's module is their bug: the real error propagates.
        with pytest.raises(ModuleNotFoundError, match="wmod_missing_dependency_xyz"):
            load_worker("wmod_broken:worker")
    finally:
        for m in ("wmod_unit", "wmod_broken"):
            sys.modules.pop(m, None)


def test_configure_overrides_only_given_settings() -> None:
    w = Worker("redis://a:1/0", namespace="ns", queues=["a"], concurrency=3, shutdown_grace=4)
    w.configure(concurrency=7)
    assert (w.redis_url, w.namespace, w.queues, w.concurrency, w.shutdown_grace) == ("redis://a:1/0", "ns", ["a"], 7, 4)
    w.configure(redis_url="redis://b:2/0", queues=["x", "y"], shutdown_grace=0)
    assert (w.redis_url, w.queues, w.shutdown_grace) == ("redis://b:2/0", ["x", "y"], 0.0)


def test_the_one_listener_switch_is_checked_kept_and_given_on_the_command_line() -> None:
    assert Worker(queues=["q"]).options.one_listener is True  # the default since 2026-12-04
    assert Worker(queues=["q"], one_listener=False).configure(concurrency=2).options.one_listener is False
    assert Worker(queues=["q"], one_listener=False).configure(one_listener=True).options.one_listener is True
    with pytest.raises(TypeError, match="one_listener must be True or False"):
        Worker(queues=["q"], one_listener="yes")  # type: ignore[arg-type]
    parser = build_parser()
    assert parser.parse_args(["worker", "m:w", "--one-listener"]).one_listener is True
    assert parser.parse_args(["worker", "m:w", "--no-one-listener"]).one_listener is False
    assert parser.parse_args(["worker", "m:w"]).one_listener is None  # the Worker's own setting stays


def test_the_prefetch_allowance_defaults_to_256_with_or_without_one_listener_unless_given() -> None:
    assert Worker(queues=["q"], concurrency=4).prefetch == 256
    assert Worker(queues=["q"], concurrency=4, one_listener=False).prefetch == 256
    w = Worker(queues=["q"], concurrency=4).configure(one_listener=False)
    assert w.configure(concurrency=8).prefetch == 256
    assert w.configure(prefetch=64).prefetch == 64
    assert w.configure(concurrency=2, one_listener=True).prefetch == 64  # a given allowance stays
    assert Worker(queues=["q"], prefetch=0).prefetch == 0
    with pytest.raises(ValueError, match="prefetch must be an int >= 0"):
        Worker(queues=["q"], prefetch=-1)
