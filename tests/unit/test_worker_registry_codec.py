"""The worker registry without Redis: the record codec and its size limit, reading a reply, the
per-queue accounting, the worker's settings, and the metrics collector."""
from __future__ import annotations

import asyncio
import re
from pathlib import Path

import msgpack
import pytest

from scheduler.metrics import WorkerRegistryCollector
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.registry import (
    MAX_CURRENT_JOBS,
    MAX_ID_BYTES,
    MAX_RECORD_BYTES,
    CurrentJob,
    QueueWorkers,
    RecordTooLarge,
    WorkerRecord,
    beat_call,
    decode_record,
    encode_record,
    new_worker_id,
    parse_read,
)
from workers import Worker

ROOT = Path(__file__).resolve().parents[2]


def rec(**kw: object) -> WorkerRecord:
    base: dict[str, object] = dict(host="web-1", pid=4242, queues=("emails", "default"), concurrency=16,
                                   prefetch=32, interval_s=5.0)
    return WorkerRecord(**{**base, **kw})  # type: ignore[arg-type]


def test_a_record_survives_its_encoding_and_stays_small() -> None:
    r = rec(busy=3, running=(2, 1), held=4, claimed=10_000_000, acked=9_999_990, uptime_s=3600.25, stopping=True,
            version="1.2.3")
    data = encode_record(r)
    assert decode_record(data) == r
    assert r.free == 13 and r.running_of("emails") == 2 and r.running_of("default") == 1 and r.running_of("x") == 0
    idle = encode_record(rec())
    assert len(idle) < 100, len(idle)  # compact: short keys, no per-queue counts while nothing runs
    assert decode_record(idle).running == ()


def test_a_record_says_how_long_its_acks_linger_and_leaves_it_out_when_they_do_not() -> None:
    r = rec(ack_linger_s=0.1)
    data = encode_record(r)
    assert msgpack.unpackb(data)["al"] == 100 and decode_record(data) == r
    assert "al" not in msgpack.unpackb(encode_record(rec()))
    assert decode_record(encode_record(rec())).ack_linger_s == 0.0
    assert len(encode_record(rec(ack_linger_s=1.0).worst_case())) <= MAX_RECORD_BYTES
    with pytest.raises(ValueError, match="'al'"):
        decode_record(msgpack.packb({"q": ["x"], "al": "100"}))


def test_a_reader_ignores_fields_it_does_not_know_and_defaults_missing_ones() -> None:
    doc = msgpack.packb({"h": "a", "p": 1, "q": ["x"], "c": 4, "future": {"k": 1}})
    r = decode_record(doc)
    assert (r.host, r.pid, r.queues, r.concurrency, r.busy, r.free, r.stopping) == ("a", 1, ("x",), 4, 0, 4, False)
    # per-queue counts that do not line up with the queues are dropped, not misattributed
    assert decode_record(msgpack.packb({"q": ["x", "y"], "r": [1]})).running == ()


def test_a_record_names_its_longest_running_jobs_compactly_with_their_start_by_redis_clock() -> None:
    jobs = tuple(CurrentJob(bytes([i]) * 15, ("emails", "default")[i % 2], 60.0 - i) for i in range(MAX_CURRENT_JOBS))
    r = rec(busy=500, running=(250, 250), current=jobs)
    data = encode_record(r)
    back = decode_record(data)
    assert back == r and back.current[1].queue == "default" and back.current[0].id == "00" * 15
    # about 25 bytes a job: a refresh of a worker running hundreds of handlers stays one small write
    assert len(data) - len(encode_record(rec(busy=500, running=(250, 250)))) <= 26 * MAX_CURRENT_JOBS
    entry = parse_read(_reply(("w", 99_000, b"90000:" + data))).workers[0]
    assert entry.job_started_ms(back.current[0]) == 30_000  # refreshed at 90 s, had run 60 s


@pytest.mark.parametrize("jobs", [[[b"short", 0, 1]], [[b"x" * 15, 2, 1]], [[b"x" * 15, 0]], ["id"]])
def test_a_malformed_current_job_makes_the_record_unreadable(jobs: list[object]) -> None:
    with pytest.raises(ValueError, match="current job"):
        decode_record(msgpack.packb({"q": ["a", "b"], "j": jobs}, use_bin_type=True))


@pytest.mark.parametrize("data", [b"\xc1", msgpack.packb([1, 2]), msgpack.packb({"p": "12"}),
                                  msgpack.packb({"q": [1]}), msgpack.packb({"c": True})])
def test_a_damaged_record_is_a_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_record(data)


def test_the_size_limit_is_checked_on_the_worst_case_and_matches_the_script() -> None:
    few = rec(queues=tuple(f"q{i:02d}" for i in range(50)))
    assert len(encode_record(few.worst_case())) <= MAX_RECORD_BYTES
    many = rec(queues=tuple(f"{'q' * 60}{i:04d}" for i in range(120)))
    with pytest.raises(RecordTooLarge, match=r"over the 8192-byte limit \(120 queues"):
        encode_record(many.worst_case())
    lua = (ROOT / "lua" / "registry_beat.lua").read_text()
    assert f"#rec > {MAX_RECORD_BYTES}" in lua and f"#id > {MAX_ID_BYTES}" in lua


def test_a_worker_serving_too_many_queue_names_is_refused_before_it_connects() -> None:
    w = Worker("redis://127.0.0.1:1/0", queues=[f"{'q' * 60}{i:04d}" for i in range(120)])
    with pytest.raises(ValueError, match="registry record would be"):
        asyncio.run(w.serve())  # port 1: it would retry forever if it got as far as connecting
    assert not w.serving


def test_worker_ids_are_unique_ascii_and_fit_the_script() -> None:
    ids = {new_worker_id("web-1", 4242) for _ in range(100)}
    assert len(ids) == 100 and all(re.fullmatch(r"web-1-4242-[0-9a-f]{8}", i) for i in ids)
    odd = new_worker_id("hôte avec espaces" * 20, 7)
    assert odd.isascii() and " " not in odd and len(odd.encode()) <= MAX_ID_BYTES
    assert new_worker_id("", 7).startswith("unknown-7-")


def test_the_liveness_lasts_three_intervals_and_both_keys_share_one_slot() -> None:
    _name, keys, args = beat_call(Keyspace("ns", 4), "w", b"x", 0.5)
    assert keys == ["{ns}:workers", "{ns}:workers:live"] and args[2] == 1500


def test_the_registry_interval_is_checked_where_it_is_written() -> None:
    assert Worker().registry_interval == 5.0
    assert Worker(registry_interval=0.25).registry_interval == 0.25
    assert Worker().configure(registry_interval=2).registry_interval == 2.0
    for bad in (0, -1, float("inf"), 3601):
        with pytest.raises(ValueError, match="registry_interval"):
            Worker(registry_interval=bad)
    with pytest.raises(TypeError, match="registry_interval"):
        Worker(registry_interval=True)


def _reply(*entries: tuple[str, int, bytes], now: int = 10_000, pruned: int = 0) -> list[object]:
    out: list[object] = [now, pruned]
    for wid, deadline, value in entries:
        out += [wid.encode(), str(deadline).encode(), value]
    return out


def test_a_read_reply_is_parsed_sorted_and_an_unreadable_record_is_listed_not_raised() -> None:
    b = rec(host="b", pid=1, queues=("emails",), concurrency=4, busy=1, running=(1,), uptime_s=2.0)
    a = rec(host="a", pid=9, queues=("emails", "default"), concurrency=8, busy=3, running=(1, 2))
    stopping = rec(host="c", pid=1, queues=("emails",), concurrency=10, stopping=True)
    snap = parse_read(_reply(("b-1-x", 12_000, b"9000:" + encode_record(b)),
                             ("a-9-x", 13_000, b"9500:" + encode_record(a)),
                             ("c-1-x", 12_500, b"9900:" + encode_record(stopping)),
                             ("bad-1", 12_000, b"no stamp"), ("bad-2", 12_000, b"9000:\xc1"), pruned=2))
    assert [w.id for w in snap.workers] == ["a-9-x", "b-1-x", "c-1-x"]
    assert snap.unreadable == ["bad-1", "bad-2"] and snap.pruned == 2 and snap.now_ms == 10_000
    bw = snap.workers[1]
    assert (bw.last_ms, bw.deadline_ms, bw.started_ms) == (9000, 12_000, 7000)
    # stopping workers are listed but not counted: they take no new jobs
    assert [w.id for w in snap.serving] == ["a-9-x", "b-1-x"]
    assert snap.by_queue(also=["idle"]) == {
        "default": QueueWorkers(workers=1, slots=8, busy=2, free=5),
        "emails": QueueWorkers(workers=2, slots=12, busy=2, free=8),
        "idle": QueueWorkers(),
    }
    assert snap.totals() == QueueWorkers(workers=2, slots=12, busy=4, free=8)


def _samples(c: WorkerRegistryCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in c.collect() for s in m.samples}


def test_the_collector_exports_per_queue_and_namespace_gauges_and_keeps_a_gone_queue_at_zero() -> None:
    t = [0.0]
    c = WorkerRegistryCollector("ns", clock=lambda: t[0])
    assert _samples(c) == {}  # nothing before the first read
    one = rec(queues=("emails", "default"), concurrency=8, busy=3, running=(1, 2))
    c.update(parse_read(_reply(("a", 20_000, b"1:" + encode_record(one)))))
    got = _samples(c)
    assert got[("zsched_workers", (("queue", "emails"),))] == 1
    assert got[("zsched_worker_slots", (("queue", "default"), ("state", "busy")))] == 2
    assert got[("zsched_worker_slots", (("queue", "default"), ("state", "free")))] == 5
    assert got[("zsched_worker_processes", (("namespace", "ns"),))] == 1
    assert got[("zsched_worker_capacity", (("namespace", "ns"), ("state", "busy")))] == 3
    t[0] = 60.0
    c.update(parse_read(_reply()))  # the worker is gone: its queues read 0 for a while
    got = _samples(c)
    assert got[("zsched_workers", (("queue", "emails"),))] == 0
    assert got[("zsched_worker_processes", (("namespace", "ns"),))] == 0
    t[0] = 60.0 + WorkerRegistryCollector.KEEP_S
    c.update(parse_read(_reply()))
    assert ("zsched_workers", (("queue", "emails"),)) not in _samples(c)
    c.clear()  # partition 0 went to another replica: it exports the registry now
    assert _samples(c) == {} and not c.exporting
