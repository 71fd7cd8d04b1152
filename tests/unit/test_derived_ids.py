"""Ids derived from a caller's stable name (``schedule_many(ids_from=)``, what the outbox relay
sends): the same name and time give the same id and partition, the calls carry the re-send flag,
and what cannot give a stable id is refused before anything is built."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduler.protocol.calls import Calls
from scheduler.protocol.ids import decode_id, derived_id, partition_for_key, partition_of, run_at_of
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.options import JobOptions

AT = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)
MS = int(AT.timestamp() * 1000)


def calls(partitions: int = 8) -> Calls:
    return Calls(Keyspace("ns", partitions), max_payload_bytes=1 << 20, tombstone_ttl=60.0)


def test_the_same_name_and_time_give_the_same_id_and_partition() -> None:
    a, pa = derived_id(MS, "outbox:t:1", None, 8)
    assert (a, pa) == derived_id(MS, "outbox:t:1", None, 8)
    assert run_at_of(a) == MS and partition_of(a, 8) == pa
    others = {derived_id(MS, f"outbox:t:{n}", None, 8)[0] for n in range(2, 2000)}
    assert a not in others and len(others) == 1998
    keyed, p = derived_id(MS, "outbox:t:1", "order-7", 8)
    assert p == partition_for_key("order-7", 8), "a keyed job lives where its key does"
    with pytest.raises(ValueError, match="time in ms"):
        derived_id(-1, "x", None, 8)


def test_prepare_with_names_derives_the_ids_and_sets_the_resend_flag() -> None:
    c = calls()
    items = [(AT, {"n": n}) for n in range(3)]
    first, _ = c.prepare(items, JobOptions(queue="q"), ["a", "b", "c"])
    again, _ = c.prepare(items, JobOptions(queue="q"), ["a", "b", "c"])
    assert [x[2] for x in first] == [x[2] for x in again]
    assert all(x[2][6] == 1 for x in first), "ARGV[7]: the script looks for each id first"
    plain, _ = c.prepare(items, JobOptions(queue="q"))
    assert all(x[2][6] == 0 for x in plain)
    ids = sorted(bytes(x[2][7 + 3 * i][:15]) for x in first for i in range((len(x[2]) - 7) // 3))
    assert ids == sorted(derived_id(MS, n, None, 8)[0] for n in "abc")
    jittered, _ = c.prepare(items[:1], JobOptions(queue="q", jitter=30), ["a"])
    assert bytes(jittered[0][2][7][:15]) == derived_id(MS, "a", None, 8)[0], "from the time before jitter"
    assert decode_id(derived_id(MS, "a", None, 8)[0].hex()) == derived_id(MS, "a", None, 8)[0]


@pytest.mark.parametrize("items, names, message", [
    ([(timedelta(hours=1), 1)], ["a"], "absolute time"),
    ([(AT, 1), (AT, 2)], ["a"], "names 1 jobs, the batch has 2"),
    ([(AT, 1), (AT, 2)], ["a", "a"], "same name"),
    ([(AT, 1)], [""], "1 to 1024 bytes"),
    ([(AT, 1)], ["x" * 1025], "1 to 1024 bytes"),
    ([(AT, 1)], [7], "1 to 1024 bytes"),
])
def test_what_cannot_give_a_stable_id_is_refused(items: list[tuple[object, object]], names: list[object],
                                                  message: str) -> None:
    with pytest.raises(ValueError, match=message):
        calls().prepare(items, JobOptions(queue="q"), names)  # type: ignore[arg-type]
