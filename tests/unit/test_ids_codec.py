"""Pure logic: ids, records, payload limits, time parsing, names (no Redis needed)."""
from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from scheduler.protocol import codec
from scheduler.protocol.errors import PayloadError
from scheduler.protocol.ids import (
    IdGenerator,
    decode_id,
    encode_id,
    partition_for_key,
    partition_of,
    placement_for_key,
    placement_of,
    run_at_of,
)
from scheduler.protocol.keys import Keyspace, validate_name
from scheduler.protocol.replies import backoff_delay_ms
from scheduler.protocol.timeutil import to_ms


@given(st.binary(min_size=15, max_size=15))
def test_id_text_round_trip(raw: bytes) -> None:
    text = encode_id(raw)
    assert len(text) == 30 and decode_id(text) == raw
    assert decode_id(text.upper()) == raw
    assert sorted([raw, bytes(15)]) == [decode_id(t) for t in sorted([text, encode_id(bytes(15))])]


@pytest.mark.parametrize("bad", ["x" * 30, "0" * 29, 5, "0" * 31])
def test_malformed_ids_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="30 characters|30-character"):
        decode_id(bad)  # type: ignore[arg-type]


def test_ids_are_unique_sortable_and_carry_partition_and_run_at() -> None:
    g = IdGenerator()
    made = [g.new(1_700_000_000_000 + (i // 100), 16) for i in range(10_000)]
    ids = [raw for raw, _ in made]
    assert len(set(ids)) == len(ids)
    assert [run_at_of(i) for i in ids] == sorted(run_at_of(i) for i in ids)
    assert all(partition_of(raw, 16) == p for raw, p in made)
    raw, p = g.new(5, 16, key="order-9")
    assert p == partition_of(raw, 16) == partition_for_key("order-9", 16)
    spread = {partition_of(g.new(7, 8)[0], 8) for _ in range(500)}
    assert spread == set(range(8))


@pytest.mark.parametrize("new_count", [1, 3, 16, 64, 4096])
def test_an_id_names_its_partition_under_any_partition_count(new_count: int) -> None:
    """The placement hash h (bytes 6-10) decides the partition for every count: migrating a
    namespace needs no table of where jobs went, and a keyed job stays with its key."""
    g = IdGenerator()
    keyed, _ = g.new(5, 16, key="order-9")
    assert placement_of(keyed) == placement_for_key("order-9")
    assert partition_of(keyed, new_count) == partition_for_key("order-9", new_count)
    counts = Counter(partition_of(g.new(9, 16)[0], new_count) for _ in range(50 * min(new_count, 64)))
    if new_count <= 64:  # unkeyed jobs spread over every partition
        assert set(counts) == set(range(new_count))


def test_record_round_trip_with_every_option() -> None:
    data = codec.pack_payload({"a": [1, 2]}, 1000)
    rec = codec.build_record(data, max_attempts=7, created_s=123, misfire_skip=True, misfire_grace_ms=5000,
                             lease_ms=90_000, key="ké", backoff_base_ms=10, backoff_cap_ms=20, queue_index=3,
                             attempt=2)
    r = codec.decode_record(rec)
    assert (r.queue_index, r.attempt, r.max_attempts, r.created) == (3, 2, 7, 123)
    assert (r.misfire_skip, r.misfire_grace_ms, r.lease_ms, r.key) == (True, 5000, 90_000, "ké")
    assert (r.backoff_base_ms, r.backoff_cap_ms) == (10, 20)
    assert codec.unpack_payload(r.payload_bytes) == {"a": [1, 2]}


def test_default_record_is_compact() -> None:
    payload = {"user_id": 12345, "template": "welcome", "to": "someone@example.com", "pad": "x" * 40}
    data = codec.pack_payload(payload, 10_000)
    rec = codec.build_record(data, max_attempts=5, created_s=1)
    assert len(rec) == codec.HEADER_SIZE + len(data)
    assert 15 + len(rec) <= 124, "timer member must fit jemalloc's 128-byte class (sds header + NUL)"


def test_truncated_record_is_a_clear_error() -> None:
    with pytest.raises(PayloadError, match="malformed"):
        codec.decode_record(b"\x00\x01")
    rec = codec.build_record(b"\xc0", max_attempts=1, created_s=1, key="abc")
    with pytest.raises(PayloadError):
        codec.decode_record(rec[:11])


def test_payload_decoding_is_bounded() -> None:
    bomb = msgpack.packb(["x"] * 2000)
    with pytest.raises(PayloadError):
        codec.unpack_payload(bomb, limit=1000)
    with pytest.raises(PayloadError, match="not valid msgpack"):
        codec.unpack_payload(b"\xc1")


def test_time_forms() -> None:
    t = datetime(2030, 1, 1, tzinfo=UTC)
    assert to_ms(t) == int(t.timestamp() * 1000)
    assert to_ms(timedelta(seconds=2), now=100.0) == 102_000
    assert to_ms(1.5) == 1500


@pytest.mark.parametrize("name", ["", "a b", "{x}", "a:b", "-lead", "x" * 65, "é"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(ValueError):
        validate_name("queue", name)


def test_all_partition_keys_share_one_hash_tag() -> None:
    ks = Keyspace("ns", 8)
    for p in range(8):
        tags = {k[k.index("{") : k.index("}") + 1] for k in ks.partition_keys(p) + [ks.ready(p, "q")]}
        assert tags == {"{ns:%d}" % p}


def test_sharded_channels_share_their_partitions_slot() -> None:
    ks = Keyspace("ns", 8, sharded=True)
    for p in range(8):
        names = ks.partition_keys(p) + [ks.ready(p, "q"), ks.wake_channels()[p], ks.epoch_reset_channels()[p]]
        assert {k[k.index("{") : k.index("}") + 1] for k in names} == {"{ns:%d}" % p}
        assert {key_slot(k.encode()) for k in names} == {key_slot(ks.prefix(p).encode())}
        # the scripts publish on CHAN .. name: CHAN is the partition prefix, and its '{' selects SPUBLISH
        assert ks.channel_prefix(p) == "{ns:%d}:" % p
        assert ks.wake_channels()[p] == "{ns:%d}:wake" % p
        assert ks.epoch_reset_channels()[p] == "{ns:%d}:epoch-reset" % p
    # config changes are announced in the slot of the config hash they change (one MULTI)
    assert ks.config_channel == "{ns}:config"
    assert key_slot(ks.config_channel.encode()) == key_slot(ks.config_key.encode())
    for namespace_wide in ("wake_channel", "epoch_reset_channel"):
        with pytest.raises(ValueError, match="per partition"):
            getattr(ks, namespace_wide)
    # every doorbell of a namespace is in one slot (a worker waits on all its queues' with one command)
    assert {key_slot(ks.bell(q).encode()) for q in ("a", "b", "emails")} == {key_slot(ks.config_key.encode())}


def test_plain_channels_keep_their_names() -> None:
    ks = Keyspace("ns", 8)
    assert [ks.channel_prefix(p) for p in range(8)] == ["ns:"] * 8  # no '{': the scripts PUBLISH
    assert ks.wake_channel == "ns:wake" and ks.wake_channels() == ["ns:wake"]
    assert ks.bell("q") == "{ns}:bell:q"
    assert ks.epoch_reset_channel == "ns:epoch-reset" and ks.epoch_reset_channels() == ["ns:epoch-reset"]
    assert ks.config_channel == "ns:config"


def test_full_jitter_backoff_stays_in_window() -> None:
    rng = random.Random(1)
    for attempt in range(1, 12):
        ceiling = min(3_600_000, 1000 * 2**attempt)
        vals = [backoff_delay_ms(attempt, 1000, 3_600_000, rng) for _ in range(200)]
        assert all(0 <= v <= ceiling for v in vals)
        assert max(vals) > ceiling * 0.8 and min(vals) < ceiling * 0.2  # spread over the whole window
