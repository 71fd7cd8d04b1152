"""``zsched epochs show | reset`` and the ``epoch_reset`` script, against a real redis-server (and
etcd for owners). The CLI runs in-process (``scheduler.shell.cli.main``); stdout/stderr via capsys.

The full story (a replica in an epoch conflict after etcd was replaced, fixed by the console
script) is in tests/fault/test_epoch_conflict.py."""
from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Iterator

import pytest
import redis

from scheduler import Client, ScriptArgumentError
from scheduler.protocol.control import epoch_reset_call
from scheduler.protocol.keys import Keyspace
from scheduler.protocol.tick import NO_RETENTION, tick_call
from scheduler.shell.cli import main
from scheduler.shell.servers import etcd_get, etcd_put, etcd_request, free_port
from scheduler.testing.transitions import Ops
from tests.support.helpers import raw_call

NS = "epochs"
PARTS = 4


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    c = Client.from_url(redis_url, namespace=NS, partitions=PARTS).connect()
    yield c
    c.close()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def cli(capsys: pytest.CaptureFixture[str], url: str, *args: str, ns: str = NS) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        rc = main([*args, "--redis", url, "--namespace", ns])
    except SystemExit as exc:  # argparse errors
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def set_epochs(client: Client, epochs: dict[int, int]) -> None:
    """Raise the stored epochs the way an owner does: a tick with that epoch."""
    ops = Ops(client)
    for p, e in epochs.items():
        assert ops.send(tick_call(ops.calls, p, e, 10, {}, NO_RETENTION, tomb_ms=0))[0] == 0


def stored(r: redis.Redis, client: Client) -> list[int]:
    return [int(r.hget(client.keyspace.key(p, "meta"), "epoch") or 0) for p in range(PARTS)]


# ----------------------------------------------------------------------------- the script


def test_epoch_reset_script_is_a_compare_and_set(client: Client, r: redis.Redis) -> None:
    ops = Ops(client)
    set_epochs(client, {0: 57})
    assert ops.send(epoch_reset_call(ops.calls, 0, 56)) == [0, 57], "a stale expectation must not reset"
    assert stored(r, client)[0] == 57
    assert ops.send(epoch_reset_call(ops.calls, 0, 57)) == [1, 57]
    assert stored(r, client)[0] == 0
    assert ops.send(epoch_reset_call(ops.calls, 0, 57)) == [0, 0], "a second (re-sent) reset changes nothing"
    assert ops.send(epoch_reset_call(ops.calls, 1, 0)) == [2, 0], "nothing stored: nothing to do"
    # the next owner's tick re-establishes its epoch, and older ones are refused again
    assert ops.send(tick_call(ops.calls, 0, 5, 10, {}, NO_RETENTION, tomb_ms=0))[0] == 0
    assert stored(r, client)[0] == 5
    assert ops.send(tick_call(ops.calls, 0, 4, 10, {}, NO_RETENTION, tomb_ms=0)) == [-1, 5]
    with pytest.raises(ScriptArgumentError, match="expected_epoch: expected an integer from 0"):
        ops.send(raw_call(ops.calls, "epoch_reset", 0, "abc"))
    assert stored(r, client)[0] == 5


def test_reset_publishes_the_partition_so_backing_off_replicas_retry(client: Client, redis_url: str) -> None:
    set_epochs(client, {2: 9})
    sub = redis.Redis.from_url(redis_url).pubsub(ignore_subscribe_messages=True)
    sub.subscribe(Keyspace(NS, 1).epoch_reset_channel)
    try:
        assert Ops(client).send(epoch_reset_call(client.calls, 2, 9)) == [1, 9]
        msg = None
        deadline = time.monotonic() + 2
        while msg is None and time.monotonic() < deadline:
            msg = sub.get_message(timeout=0.1)
        assert msg is not None and msg["data"] == b"2", msg
    finally:
        sub.close()


# -------------------------------------------------------------------------------- show


def test_show_lists_stored_epochs(client: Client, redis_url: str, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZSCHED_ETCD_ENDPOINTS", raising=False)
    set_epochs(client, {0: 7, 3: 12})
    rc, out, err = cli(capsys, redis_url, "epochs", "show", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert [(p["partition"], p["epoch"]) for p in doc["partitions"]] == [(0, 7), (1, 0), (2, 0), (3, 12)]
    assert doc["owners_source"] == "not configured" and doc["conflicts"] is None
    rc, out, err = cli(capsys, redis_url, "epochs", "show")
    assert rc == 0 and "PARTITION" in out and "give --etcd" in out
    assert [ln.split() for ln in out.splitlines() if ln.strip()[:1].isdigit()] == [
        ["0", "7"], ["1", "0"], ["2", "0"], ["3", "12"]]


def test_show_with_etcd_marks_conflicts(client: Client, redis_url: str, etcd_endpoint: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    etcd_put(etcd_endpoint, f"/zsched/{NS}/owners/0", "replica-a")
    etcd_put(etcd_endpoint, f"/zsched/{NS}/owners/1", "replica-b")
    revs = {p: int(etcd_request(etcd_endpoint, "/v3/kv/range", {"key": _b64(f"/zsched/{NS}/owners/{p}")})
                   ["kvs"][0]["create_revision"]) for p in (0, 1)}
    assert etcd_get(etcd_endpoint, f"/zsched/{NS}/owners/0") == b"replica-a"
    # partition 0: Redis has seen a newer epoch than its owner's (conflict); 1: its owner's (ok)
    set_epochs(client, {0: revs[0] + 100, 1: revs[1]})
    rc, out, err = cli(capsys, redis_url, "epochs", "show", "--etcd", etcd_endpoint, "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["owners_source"] == "etcd" and doc["conflicts"] == [0]
    assert [(p["owner"], p["owner_epoch"], p["conflict"]) for p in doc["partitions"]] == [
        ("replica-a", revs[0], True), ("replica-b", revs[1], False), (None, None, False), (None, None, False)]
    rc, out, err = cli(capsys, redis_url, "epochs", "show", "--etcd", etcd_endpoint)
    assert rc == 0 and err == ""
    assert "CONFLICT" in out and "no owner" in out
    assert f"Fix: zsched epochs reset --partition 0 --namespace {NS}" in out


def test_show_with_unreachable_etcd_warns_and_succeeds(client: Client, redis_url: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    set_epochs(client, {1: 3})
    rc, out, err = cli(capsys, redis_url, "epochs", "show", "--etcd", f"127.0.0.1:{free_port()}",
                       "--etcd-timeout", "0.5", "--json")
    assert rc == 0 and "zsched: warning: etcd at" in err
    doc = json.loads(out)
    assert doc["owners_source"] == "unavailable" and doc["conflicts"] is None
    assert [p["epoch"] for p in doc["partitions"]] == [0, 3, 0, 0]


# ------------------------------------------------------------------------------- reset


def test_reset_selected_partitions(client: Client, r: redis.Redis, redis_url: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    set_epochs(client, {0: 7, 1: 8, 2: 9})
    rc, out, err = cli(capsys, redis_url, "epochs", "reset", "--partition", "2", "--partition", "0",
                       "--partition", "2", "--yes")
    assert rc == 0, err
    assert stored(r, client) == [0, 8, 0, 0]
    assert "partition 0: epoch 7 -> 0 (reset)" in out and "partition 2: epoch 9 -> 0 (reset)" in out
    assert "reset 2 of 2 partition(s)" in out
    rc, out, err = cli(capsys, redis_url, "epochs", "reset", "--all", "--yes", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert (doc["reset"], doc["unchanged"], doc["changed"]) == (1, 3, 0)
    assert [(p["partition"], p["status"], p["epoch_before"]) for p in doc["partitions"]] == [
        (0, "unchanged", 0), (1, "reset", 8), (2, "unchanged", 0), (3, "unchanged", 0)]
    assert stored(r, client) == [0, 0, 0, 0]


def test_reset_never_clobbers_an_epoch_that_changed(client: Client, r: redis.Redis, redis_url: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """--expect is the value the operator saw; a legitimate owner raised it since: left alone."""
    set_epochs(client, {1: 20})
    rc, out, err = cli(capsys, redis_url, "epochs", "reset", "--partition", "1", "--expect", "15", "--yes")
    assert rc == 1
    assert "NOT reset: the stored epoch is 20, not 15" in out
    assert "zsched: error: 1 partition(s) not reset because their epoch changed" in err
    assert stored(r, client)[1] == 20
    rc, out, err = cli(capsys, redis_url, "epochs", "reset", "--partition", "1", "--expect", "20", "--yes")
    assert rc == 0 and stored(r, client)[1] == 0, err


def test_reset_asks_for_confirmation(client: Client, r: redis.Redis, redis_url: str,
                                     capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    set_epochs(client, {3: 44})
    # stdin not a terminal and no --yes: refuse, change nothing
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    rc, out, err = cli(capsys, redis_url, "epochs", "reset", "--partition", "3")
    assert rc == 2 and "without confirmation" in err and "add --yes" in err and out == ""
    assert stored(r, client)[3] == 44

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Tty("n\n"))
    rc, out, err = cli(capsys, redis_url, "epochs", "reset", "--partition", "3")
    assert rc == 1 and "partition(s) 3 (epoch 44) to 0?" in err and "nothing was changed" in err
    assert stored(r, client)[3] == 44
    monkeypatch.setattr("sys.stdin", Tty("yes\n"))
    rc, out, err = cli(capsys, redis_url, "epochs", "reset", "--partition", "3")
    assert rc == 0 and "epoch 44 -> 0" in out
    assert stored(r, client)[3] == 0


@pytest.mark.parametrize("args, needle", [
    ([], "nothing selected: give --partition P"),
    (["--all", "--partition", "1"], "either --partition P (repeatable) or --all, not both"),
    (["--partition", "-1"], "expected a partition number from 0 to 4095, got '-1'"),
    (["--partition", "one"], "expected a partition number, got 'one'"),
    (["--partition", "4096"], "expected a partition number from 0 to 4095"),
    (["--all", "--expect", "3"], "--expect EPOCH applies to exactly one --partition"),
    (["--partition", "1", "--partition", "2", "--expect", "3"], "--expect EPOCH applies to exactly one --partition"),
])
def test_reset_refuses_bad_selections_before_touching_redis(args: list[str], needle: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 with a message that says what to give, even with Redis unreachable (nothing listens
    on the port): the selection is checked first."""
    rc, out, err = cli(capsys, f"redis://127.0.0.1:{free_port()}/0", "epochs", "reset", *args, "--yes")
    assert rc == 2, (rc, err)
    assert needle in err and err.strip().splitlines()[-1].startswith("zsched: error:"), err
    assert out == ""


def test_reset_refuses_partitions_the_namespace_does_not_have(client: Client, r: redis.Redis, redis_url: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    set_epochs(client, {0: 5})
    rc, out, err = cli(capsys, redis_url, "epochs", "reset", "--partition", "0", "--partition", "4",
                       "--partition", "9", "--yes")
    assert rc == 2
    assert "partition 4, 9 does not exist: this namespace has 4 partition(s), numbered 0 to 3" in err
    assert stored(r, client)[0] == 5, "nothing may be reset when part of the selection is invalid"


def test_unknown_namespace_and_unreachable_redis(client: Client, redis_url: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli(capsys, redis_url, "epochs", "reset", "--all", "--yes", ns="no-such-ns")
    assert rc == 1 and "namespace 'no-such-ns' does not exist" in err
    rc, _, err = cli(capsys, f"redis://127.0.0.1:{free_port()}/0", "epochs", "show")
    assert rc == 3 and "cannot reach Redis" in err


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()
