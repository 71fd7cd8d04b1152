"""``zsched schedule | job | dead | stats`` against a real redis-server (and etcd for owners).

Most tests run the CLI in-process (``scheduler.shell.cli.main``) and read stdout/stderr with capsys;
one runs the installed ``zsched`` console script as a subprocess.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from scheduler import Client, JobState
from scheduler.protocol.calls import error_arg
from scheduler.protocol.codes import FailKind
from scheduler.protocol.transitions import Failure, fail_call
from scheduler.redisio.connection import SyncRedis, sync_redis
from scheduler.shell import admin
from scheduler.shell.cli import main
from scheduler.shell.servers import etcd_put, free_port
from scheduler.testing.transitions import Ops
from tests.support.helpers import on_both_backends, snapshot

NS = "cli"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def client(backend_url: str) -> Iterator[Client]:
    c = Client.from_url(backend_url, namespace=NS, partitions=4).connect()
    yield c
    c.close()


@pytest.fixture
def ops(client: Client) -> Ops:
    return Ops(client)


@pytest.fixture
def r(backend_url: str) -> Iterator[SyncRedis]:
    c = sync_redis(backend_url)
    yield c
    c.close()


class Cli:
    """Runs ``zsched ARGS --redis URL --namespace cli`` in-process."""

    def __init__(self, url: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.url, self.capsys = url, capsys

    def __call__(self, *args: str, ns: str = NS) -> tuple[int, str, str]:
        self.capsys.readouterr()
        try:
            rc = main([*args, "--redis", self.url, "--namespace", ns])
        except SystemExit as exc:  # argparse errors
            rc = int(exc.code or 0)
        out, err = self.capsys.readouterr()
        return rc, out, err

    def json(self, *args: str) -> Any:
        rc, out, err = self(*args, "--json")
        assert rc == 0, err
        return json.loads(out)


@pytest.fixture
def cli(backend_url: str, client: Client, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(backend_url, capsys)


def kill(client: Client, ops: Ops, queue: str = "default", n: int = 1, msg: str = "boom",
         tb: str = "Traceback (most recent call last):\n  File \"h.py\", line 1\nRuntimeError: boom",
         payload: Any = None) -> list[str]:
    """Schedule ``n`` due jobs on ``queue``, claim them and fail them permanently (dead)."""
    now = timedelta(0)
    ids = client.schedule_many([(now, payload if payload is not None else {"n": i}) for i in range(n)], queue=queue)
    jobs = ops.claim(queue, n)
    assert len(jobs) == n
    for j in jobs:
        failure = Failure(j.raw_id, j.token, FailKind.PERMANENT, 0, error_arg("RuntimeError", msg, tb))
        assert ops.send(fail_call(ops.calls, ops.partition(j.raw_id), [failure]))[0] == 2
    return ids


def state(client: Client, jid: str) -> JobState:
    info = client.get(jid)
    assert info is not None
    return info.state


# ---------------------------------------------------------------------------- schedule / job


def test_schedule_show_cancel_round_trip(cli: Cli, client: Client) -> None:
    rc, out, err = cli("schedule", "--at", "+4h", "--queue", "emails", "--payload", '{"to": "a@example.com"}',
                       "--max-attempts", "3")
    assert rc == 0, err
    jid = out.strip()
    assert len(jid) == 30
    info = client.get(jid)
    assert info.state is JobState.SCHEDULED and info.queue == "emails"
    assert info.payload == {"to": "a@example.com"} and info.max_attempts == 3
    assert abs((info.run_at - datetime.now(UTC) - timedelta(hours=4)).total_seconds()) < 5

    rc, out, _ = cli("job", "show", jid)
    assert rc == 0
    assert "scheduled" in out and "emails" in out and '"to": "a@example.com"' in out and "0/3" in out
    doc = cli.json("job", "show", jid)
    assert doc["id"] == jid and doc["state"] == "scheduled" and doc["payload"] == {"to": "a@example.com"}
    assert doc["run_at"].endswith("Z") and doc["max_attempts"] == 3

    rc, out, _ = cli("job", "cancel", jid)
    assert rc == 0 and f"cancelled {jid}" in out
    assert state(client, jid) is JobState.CANCELLED
    rc, _, err = cli("job", "cancel", jid)
    assert rc == 1 and "zsched: error:" in err and "it is cancelled" in err


def test_schedule_json_key_and_options(cli: Cli, client: Client) -> None:
    doc = cli.json("schedule", "--at", "+1h", "--queue", "q", "--payload", "[1, 2]", "--key", "order-7",
                   "--misfire", "skip", "--grace", "5", "--lease", "12")
    again = cli.json("schedule", "--at", "+2h", "--queue", "q", "--payload", "[1, 2]", "--key", "order-7")
    assert again["id"] == doc["id"], "an idempotency key returns the live job"
    assert doc["state"] == "scheduled" and doc["payload"] == [1, 2] and doc["key"] == "order-7"


def test_schedule_payload_from_file_and_stdin(cli: Cli, client: Client, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "p.json"
    f.write_text('{"big": [1, 2, 3]}')
    rc, out, _ = cli("schedule", "--at", "now", "--queue", "q", "--payload", f"@{f}")
    assert rc == 0 and client.get(out.strip()).payload == {"big": [1, 2, 3]}
    import io
    monkeypatch.setattr(sys, "stdin", io.StringIO('"from stdin"'))
    rc, out, _ = cli("schedule", "--at", "now", "--queue", "q", "--payload", "-")
    assert rc == 0 and client.get(out.strip()).payload == "from stdin"


@pytest.mark.parametrize("when, offset_s", [
    ("+90s", 90), ("+4h", 4 * 3600), ("+1d2h30m", 86400 + 2 * 3600 + 1800), ("+1500ms", 1.5),
])
def test_when_relative_forms(cli: Cli, client: Client, when: str, offset_s: float) -> None:
    t0 = time.time()
    rc, out, err = cli("schedule", "--at", when, "--queue", "q", "--payload", "null")
    assert rc == 0, err
    info = client.get(out.strip())
    assert info.state is JobState.SCHEDULED
    assert abs(info.run_at.timestamp() - (t0 + offset_s)) < 2


def test_when_absolute_forms(cli: Cli, client: Client) -> None:
    target = datetime(2031, 12, 1, 8, 0, tzinfo=UTC)
    forms = ["2031-12-01T09:00:00+01:00", "2031-12-01T08:00:00Z", "2031-12-01T08:00:00.000z",
             str(int(target.timestamp())), "2031-12-01 08:00:00+00:00"]
    for when in forms:
        rc, out, err = cli("schedule", "--at", when, "--queue", "q", "--payload", "1")
        assert rc == 0, (when, err)
        assert client.get(out.strip()).run_at == target, when


def test_when_now_and_past_are_ready(cli: Cli, client: Client) -> None:
    for when in ("now", str(int(time.time()) - 60)):
        rc, out, _ = cli("schedule", "--at", when, "--queue", "q", "--payload", "1")
        assert rc == 0 and state(client, out.strip()) is JobState.READY


def test_a_past_at_warns_in_one_line_and_the_job_still_runs_at_once(cli: Cli, client: Client, ops: Ops) -> None:
    past = int(time.time()) - 7200
    rc, out, err = cli("schedule", "--at", str(past), "--queue", "q", "--payload", "1")
    jid = out.strip()
    assert rc == 0 and state(client, jid) is JobState.READY, err
    # the CLI reads the clock after this test did (and past was cut to a whole second): on a loaded
    # machine the delta it prints may be a few seconds over 2h ("2h1s ago"), which failed one run
    [line] = err.splitlines()
    assert re.fullmatch(rf"zsched: warning: --at {re.escape(admin.iso(past * 1000))} is in the past "
                        r"\(2h(\d{1,2}s)? ago\): the job runs at once", line), err
    rc, out, err = cli("schedule", "--at", "+1h", "--queue", "q", "--payload", "1")
    later = out.strip()
    assert rc == 0 and err == ""
    rc, _, err = cli("job", "reschedule", later, "--at", "2001-09-09T01:46:40Z")
    assert rc == 0 and state(client, later) is JobState.READY
    assert err.startswith("zsched: warning: --at 2001-09-09T01:46:40.000Z is in the past (") and err.count("\n") == 1
    [dead] = kill(client, ops, "q2")
    rc, _, err = cli("dead", "requeue", "--queue", "q2", "--at", str(past), "-q")
    assert rc == 0 and state(client, dead) is JobState.READY
    assert err.endswith(": the requeued jobs run at once\n") and err.count("\n") == 1, err


@pytest.mark.parametrize("when", ["now", "+0s", "+1s", "2031-12-01T08:00:00Z"])
def test_now_relative_and_future_at_do_not_warn(cli: Cli, client: Client, when: str) -> None:
    rc, _, err = cli("schedule", "--at", when, "--queue", "q", "--payload", "1")
    assert rc == 0 and err == ""


def test_a_past_at_with_misfire_skip_gets_the_refusal_alone(cli: Cli, client: Client) -> None:
    """Past its grace, ``--misfire skip`` refuses the job: no warning that says it runs at once."""
    rc, _, err = cli("schedule", "--at", str(int(time.time()) - 3600), "--queue", "q", "--payload", "1",
                     "--misfire", "skip")
    assert rc == 2 and [line.split(":")[1] for line in err.splitlines()] == [" error"], err


@pytest.mark.parametrize("args, needle", [
    (["--at", "2026-12-01T09:00:00"], "has no time zone"),
    (["--at", "2026-12-01"], "has no time zone"),
    (["--at", "tomorrow"], "expected ISO-8601 with a zone"),
    (["--at", "+4x"], "expected a number with a unit"),
    (["--at", "+90"], "a unit is required"),
    (["--at", "1767225600000"], "looks like epoch milliseconds"),
    (["--at", "now", "--payload", "{nope"], "is not valid JSON"),
    (["--at", "now", "--queue", "bad:queue"], "queue 'bad:queue' is invalid"),
    (["--at", "now", "--grace", "5"], "--grace only applies with --misfire skip"),
    (["--at", "now", "--max-attempts", "0"], "expected an integer from 1 to 255"),
    (["--at", "now", "--misfire", "sometimes"], "invalid choice"),
    (["--at", "now", "--key", ""], "key must be 1-200 bytes"),
])
def test_schedule_bad_input_exits_2(cli: Cli, client: Client, args: list[str], needle: str) -> None:
    base = {"--queue": "q", "--payload": "1"}
    for i in range(0, len(args), 2):
        base.pop(args[i], None)
    flat = args + [x for kv in base.items() for x in kv]
    rc, out, err = cli("schedule", *flat)
    assert rc == 2, (rc, out, err)
    assert "zsched: error:" in err and needle in err, err
    assert out == ""
    assert client.stats() == {}, "nothing was scheduled"


def test_job_show_by_key_finds_the_live_job_then_the_finished_one_then_says_none(cli: Cli, client: Client,
                                                                                  ops: Ops) -> None:
    jid = client.schedule(timedelta(0), {"n": 1}, queue="bykey", key="invoice-42")
    doc = cli.json("job", "show", "--key", "invoice-42")
    assert doc["id"] == jid and doc["state"] == "ready" and doc["key"] == "invoice-42"
    [job] = ops.claim("bykey", 1)
    ops.ack(job)  # finished: the key is free again, its tombstone still names the job
    rc, out, err = cli("job", "show", "--key", "invoice-42")
    assert rc == 0, err
    assert jid in out and "done" in out
    rc, _, err = cli("job", "show", "--key", "no-such-key")
    assert rc == 1 and err.count("\n") == 1
    assert "zsched: error: no job with key 'no-such-key'" in err and "tombstones expire" in err
    rc, _, err = cli("job", "show")
    assert rc == 2 and "one of the arguments ID --key is required" in err
    rc, _, err = cli("job", "show", jid, "--key", "invoice-42")
    assert rc == 2 and "not allowed with argument" in err


def test_job_not_found_and_bad_ids(cli: Cli, client: Client) -> None:
    missing = "00000000000000010000000000000a"
    for cmd in (["job", "show", missing], ["job", "cancel", missing], ["job", "reschedule", missing, "--at", "+1h"],
                ["dead", "show", missing], ["dead", "requeue", missing], ["dead", "purge", missing]):
        rc, out, err = cli(*cmd)
        assert rc == 1, (cmd, err)
        assert "zsched: error:" in err and "not found" in err, (cmd, err)
    rc, _, err = cli("job", "show", "xyz")
    assert rc == 2 and "30-character" in err
    rc, _, err = cli("job", "show", "0000000000000fff0000000000000a")  # any well-formed id names a partition
    assert rc == 1 and "not found" in err


def test_reschedule_and_state_refusals(cli: Cli, client: Client, ops: Ops) -> None:
    jid = client.schedule(timedelta(hours=1), "x", queue="q")
    rc, out, err = cli("job", "reschedule", jid, "--at", "2032-01-01T00:00:00Z")
    assert rc == 0, err
    assert client.get(jid).run_at == datetime(2032, 1, 1, tzinfo=UTC)
    doc = cli.json("job", "reschedule", jid, "--at", "now")
    assert doc["state"] == "ready" and state(client, jid) is JobState.READY

    [running] = ops.claim("q")
    rc, _, err = cli("job", "cancel", jid)
    assert rc == 1 and "it is running" in err
    rc, _, err = cli("job", "reschedule", jid, "--at", "+1h")
    assert rc == 1 and "it is running" in err
    ops.fail(running, kind="p")
    rc, _, err = cli("job", "cancel", jid)
    assert rc == 1 and "it is dead" in err and "zsched dead purge" in err
    rc, _, err = cli("job", "reschedule", jid, "--at", "+1h")
    assert rc == 1 and "it is dead" in err and "zsched dead requeue" in err
    assert state(client, jid) is JobState.DEAD


def test_unknown_namespace_and_unreachable_redis(cli: Cli, client: Client, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = cli("stats", ns="typo")
    assert rc == 1 and "namespace 'typo' does not exist" in err
    assert not client.redis.exists("{typo}:cfg"), "a read command must not create the namespace"
    port = free_port()
    rc = main(["stats", "--redis", f"redis://u:secret@127.0.0.1:{port}/0", "--namespace", NS])
    err = capsys.readouterr().err
    assert rc == 3 and "cannot reach Redis" in err and "secret" not in err and "u:***@" in err
    rc = main(["stats", "--redis", "http://x", "--namespace", NS])
    assert rc == 2 and "Redis URL 'http://x' is invalid" in capsys.readouterr().err


# ------------------------------------------------------------------------------ dead letters


def test_dead_list_and_show(cli: Cli, client: Client, ops: Ops) -> None:
    mails = kill(client, ops, "emails", 3, msg="SMTP 550 mailbox unavailable\nsecond line")
    sms = kill(client, ops, "sms", 2, msg="gateway timeout", payload={"to": "+155501", "b": b"\x00\x01"})
    rc, out, _ = cli("dead", "list")
    assert rc == 0
    lines = out.strip().splitlines()
    assert lines[0] == "5 of 5 dead jobs, newest first"
    assert lines[1].split() == ["ID", "QUEUE", "ATTEMPTS", "DIED", "AT", "LAST", "ERROR"]
    assert len(lines) == 7
    assert "RuntimeError: SMTP 550 mailbox unavailable" in out and "second line" not in out
    doc = cli.json("dead", "list", "--queue", "sms")
    assert doc["count"] == 2 and {j["id"] for j in doc["jobs"]} == set(sms)
    assert all(j["queue"] == "sms" and j["attempts"] == 1 and j["error"] == "RuntimeError: gateway timeout"
               for j in doc["jobs"])
    assert cli.json("dead", "list", "--limit", "2")["count"] == 2

    rc, out, _ = cli("dead", "show", mails[0])
    assert rc == 0
    assert "SMTP 550 mailbox unavailable" in out and "second line" in out
    assert 'File "h.py", line 1' in out and "payload:" in out and '"n": ' in out
    doc = cli.json("dead", "show", sms[0])
    assert doc["state"] == "dead" and doc["payload"]["to"] == "+155501"
    assert doc["payload"]["b"] == {"$base64": "AAE="}
    assert doc["last_error"]["type"] == "RuntimeError" and "Traceback" in doc["last_error"]["traceback"]

    live = client.schedule(timedelta(hours=1), "x")
    rc, _, err = cli("dead", "show", live)
    assert rc == 1 and "is not dead: it is scheduled" in err
    rc, out, _ = cli("dead", "list", "--queue", "nothing-here")
    assert rc == 0 and "no dead jobs" in out


@on_both_backends
def test_requeue_by_id_twice_runs_once(cli: Cli, client: Client, ops: Ops, r: SyncRedis) -> None:
    [jid] = kill(client, ops, "q")
    rc, out, err = cli("dead", "requeue", jid)
    assert rc == 0 and f"requeued {jid}" in out, err
    rc, out, err = cli("dead", "requeue", jid)
    assert rc == 0 and "nothing to do" in out and "already requeued/not dead" in out
    assert snapshot(r, client) == {jid: "ready"}
    claimed = ops.claim("q", 10)
    assert [c.raw_id.hex() for c in claimed] == [jid] and claimed[0].record.attempt == 1
    doc = cli.json("dead", "requeue", jid)
    run_at = doc.pop("run_at")  # the due time of the running attempt (when it was requeued)
    assert doc == {"id": jid, "requeued": False, "state": "running"}
    assert run_at.endswith("Z") and client.get(jid).run_at.isoformat(timespec="milliseconds")[:23] == run_at[:23]


def test_requeue_single_at_later_time(cli: Cli, client: Client, ops: Ops) -> None:
    [jid] = kill(client, ops, "q")
    rc, out, _ = cli("dead", "requeue", jid, "--at", "+1h")
    assert rc == 0
    info = client.get(jid)
    assert info.state is JobState.SCHEDULED and info.attempts == 0
    assert abs(info.run_at.timestamp() - time.time() - 3600) < 5


@on_both_backends
def test_requeue_filters_and_dry_run_change_nothing(cli: Cli, client: Client, ops: Ops, r: SyncRedis) -> None:
    mails = kill(client, ops, "emails", 4, msg="SMTP 550 mailbox unavailable")
    other = kill(client, ops, "emails", 2, msg="DNS failure", tb="socket.gaierror: Name or service not known")
    sms = kill(client, ops, "sms", 3, msg="gateway timeout")
    before = snapshot(r, client)

    for sel, expect in ((["--queue", "sms"], sms), (["--error-contains", "550"], mails),
                        (["--error-contains", "gaierror"], other),  # matched in the traceback
                        (["--queue", "emails", "--error-contains", "smtp", "-i"], mails),
                        (["--all"], mails + other + sms)):
        doc = cli.json("dead", "requeue", *sel, "--dry-run")
        assert doc["dry_run"] is True and doc["matched"] == len(expect), sel
        assert {j["id"] for j in doc["jobs"]} == set(expect), sel
        assert {j["status"] for j in doc["jobs"]} == {"would requeue"}
        rc, out, _ = cli("dead", "requeue", *sel, "--dry-run")
        assert rc == 0 and f"would requeue {len(expect)} dead job(s)" in out and "nothing was changed" in out
        assert all(j in out for j in expect)
    assert snapshot(r, client) == before, "--dry-run must change nothing"

    rc, out, _ = cli("dead", "requeue", "--error-contains", "550", "--rate", "0")
    assert rc == 0 and "requeued 4 job(s)" in out
    rc, out, _ = cli("dead", "requeue", "--queue", "sms", "--rate", "0")
    assert rc == 0 and "requeued 3 job(s)" in out
    st = snapshot(r, client)
    assert {j for j, s in st.items() if s == "ready"} == set(mails + sms)
    assert {j for j, s in st.items() if s == "dead"} == set(other)

    rc, out, _ = cli("dead", "requeue", "--queue", "sms")
    assert rc == 0 and "nothing to requeue" in out, "a second run finds nothing"
    doc = cli.json("dead", "requeue", "--all", "--rate", "0")
    assert doc["requeued"] == 2 and doc["not_dead"] == 0 and {j["id"] for j in doc["jobs"]} == set(other)
    assert set(snapshot(r, client).values()) == {"ready"}
    assert len(ops.claim("emails", 100)) == 6 and len(ops.claim("sms", 100)) == 3


@pytest.mark.parametrize("args, needle", [
    ([], "nothing selected"),
    (["--all", "--queue", "q"], "cannot be combined"),
    (["00000000000000010000000000000a", "--all"], "not both"),
    (["--error-contains", ""], "non-empty"),
    (["--all", "--rate", "-1"], "expected jobs per second from 0"),
    (["--all", "--at", "noon"], "expected ISO-8601"),
])
def test_requeue_bad_selection_exits_2(cli: Cli, client: Client, args: list[str], needle: str) -> None:
    rc, _, err = cli("dead", "requeue", *args)
    assert rc == 2 and "zsched: error:" in err and needle in err, err


def test_requeue_rate_is_paced(cli: Cli, client: Client, ops: Ops, r: SyncRedis) -> None:
    ids = kill(client, ops, "q", 20)
    t0 = time.monotonic()
    rc, out, err = cli("dead", "requeue", "--all", "--rate", "40", "--quiet")
    elapsed = time.monotonic() - t0
    assert rc == 0 and "requeued 20 job(s)" in out, err
    assert 0.35 <= elapsed < 3.0, f"20 jobs at 40/s took {elapsed:.2f}s"
    assert "STATUS" not in out, "--quiet prints only the summary"
    assert snapshot(r, client) == {j: "ready" for j in ids}


def test_requeue_later_spreads_due_times_instead_of_waiting(cli: Cli, client: Client, ops: Ops) -> None:
    ids = kill(client, ops, "q", 20)
    t0 = time.monotonic()
    doc = cli.json("dead", "requeue", "--all", "--rate", "10", "--at", "+1h")
    assert time.monotonic() - t0 < 1.5, "a future --at must not make the operator wait"
    assert doc["requeued"] == 20
    runs = sorted(client.get(j).run_at.timestamp() for j in ids)
    assert all(client.get(j).state is JobState.SCHEDULED for j in ids)
    assert abs(runs[0] - time.time() - 3600) < 5
    assert runs[-1] - runs[0] == pytest.approx(1.9, abs=0.05), "20 jobs at 10/s: due over 1.9 s"


def test_dead_paging_survives_equal_scores_and_concurrent_requeues(client: Client, ops: Ops,
                                                                   r: SyncRedis) -> None:
    ids = kill(client, ops, "q", 40)
    # many deaths in the same millisecond (a reap batch does that): force equal scores
    for p in range(client.keyspace.partitions):
        key = client.keyspace.key(p, "d")
        for member in r.zrange(key, 0, -1):
            r.zadd(key, {member: 1_000_000}, xx=True)
    seen = [j.id for j in admin.iter_dead(client, admin.DeadFilter(), page=3, chunk=4)]
    assert sorted(seen) == sorted(ids)
    # requeue while paging (every other job), with tiny pages: nothing skipped or repeated
    seen2 = []
    for n, info in enumerate(admin.iter_dead(client, admin.DeadFilter(), page=2, chunk=1)):
        seen2.append(info.id)
        if n % 2 == 0:
            assert client.requeue(info.id)
    assert sorted(seen2) == sorted(ids)
    assert sum(1 for s in snapshot(r, client).values() if s == "dead") == 20


def test_mass_requeue_excludes_jobs_that_die_during_the_run(client: Client, ops: Ops) -> None:
    ids = kill(client, ops, "q", 3)
    bound = admin.redis_now_ms(client)
    time.sleep(0.005)
    late = kill(client, ops, "q", 1)
    got = [j.id for j in admin.iter_dead(client, admin.DeadFilter(), until_ms=bound)]
    assert sorted(got) == sorted(ids) and late[0] not in got


@on_both_backends
def test_purge_older_than_and_by_id(cli: Cli, client: Client, ops: Ops, r: SyncRedis) -> None:
    old = kill(client, ops, "q", 5)
    new = kill(client, ops, "q", 2)
    ten_days_ago = (time.time() - 10 * 86400) * 1000
    for jid in old:  # make them look 10 days dead
        raw = bytes.fromhex(jid)
        assert r.zadd(client.keyspace.key(ops.partition(raw), "d"), {raw: ten_days_ago}, xx=True, ch=True) == 1
    doc = cli.json("dead", "purge", "--older-than", "7d", "--dry-run")
    assert doc["would_purge"] == 5 and doc["dry_run"] is True
    assert len(client.dead()) == 7
    rc, out, err = cli("dead", "purge", "--older-than", "7d")
    assert rc == 0 and "purged 5 dead job(s)" in out, err
    assert {j.id for j in client.dead()} == set(new)
    assert all(client.get(j) is None for j in old)
    rc, out, _ = cli("dead", "purge", "--older-than", "7d")
    assert rc == 0 and "purged 0" in out

    rc, out, _ = cli("dead", "purge", new[0])
    assert rc == 0 and f"purged {new[0]}" in out and client.get(new[0]) is None
    rc, _, err = cli("dead", "purge", new[0])
    assert rc == 1 and "not found" in err
    live = client.schedule(timedelta(hours=1), "x")
    rc, _, err = cli("dead", "purge", live)
    assert rc == 1 and "it is scheduled" in err and "zsched job cancel" in err
    assert snapshot(r, client) == {new[1]: "dead", live: "scheduled"}

    for args, needle in ((["--older-than", "7"], "a unit is required"), ([], "one of the arguments"),
                         ([new[1], "--older-than", "1d"], "not allowed with")):
        rc, _, err = cli("dead", "purge", *args)
        assert rc == 2 and "zsched: error:" in err and needle in err, err


def test_purge_older_loops_in_bounded_batches(client: Client, ops: Ops) -> None:
    kill(client, ops, "q", 25)
    assert admin.purge_older(client, admin.redis_now_ms(client), batch=2) == 25
    assert client.dead() == []


# ------------------------------------------------------------------------------------ stats


def _stats_fixture(client: Client, ops: Ops) -> None:
    client.schedule_many([(timedelta(hours=1), i) for i in range(3)], queue="emails")
    client.schedule_many([(timedelta(0), i) for i in range(2)], queue="sms")
    kill(client, ops, "sms", 1)


def test_stats_table_and_json(cli: Cli, client: Client, ops: Ops, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZSCHED_ETCD_ENDPOINTS", raising=False)
    _stats_fixture(client, ops)
    doc = cli.json("stats")
    assert doc["queues"]["emails"] == {"scheduled": 3, "ready": 0, "running": 0, "dead": 0}
    assert doc["queues"]["sms"] == {"scheduled": 0, "ready": 2, "running": 0, "dead": 1}
    assert doc["totals"] == {"scheduled": 3, "ready": 2, "running": 0, "dead": 1}
    assert doc["partition_count"] == 4 and len(doc["partitions"]) == 4
    assert doc["owners_source"] == "not configured"
    assert set(doc["partitions"][0]) == {"partition", "owner", "epoch", "earliest_due", "earliest_due_ms",
                                         "scheduled", "ready", "running", "dead"}
    assert sum(p["scheduled"] for p in doc["partitions"]) == 3
    dues = [p["earliest_due_ms"] for p in doc["partitions"] if p["earliest_due_ms"] is not None]
    assert dues and all(abs(d / 1000 - time.time() - 3600) < 10 for d in dues)
    assert all(p["earliest_due_ms"] is None for p in doc["partitions"] if p["scheduled"] == 0)

    rc, out, err = cli("stats")
    assert rc == 0
    assert "QUEUE" in out and "PARTITION" in out and "EARLIEST DUE" in out
    row = next(line.split() for line in out.splitlines() if line.startswith("sms"))
    assert row == ["sms", "0", "2", "0", "1", "0"]  # ..., WORKERS: no worker runs in this test
    assert "queue sms has 2 ready job(s) and no live worker" in err and "emails" not in err
    assert "(in 59m" in out or "(in 1h" in out


def test_stats_owners_from_etcd(cli: Cli, client: Client, ops: Ops, etcd_endpoint: str) -> None:
    _stats_fixture(client, ops)
    etcd_put(etcd_endpoint, f"/zsched/{NS}/owners/0", "replica-a")
    etcd_put(etcd_endpoint, f"/zsched/{NS}/owners/2", "replica-b")
    etcd_put(etcd_endpoint, "/zsched/other/owners/1", "replica-x")
    doc = cli.json("stats", "--etcd", etcd_endpoint)
    assert doc["owners_source"] == "etcd"
    assert [p["owner"] for p in doc["partitions"]] == ["replica-a", None, "replica-b", None]
    rc, out, err = cli("stats", "--etcd", etcd_endpoint)
    # no etcd warning (the only one is about the ready jobs no worker takes: none runs here)
    assert rc == 0 and "replica-a" in out and "NONE" in out and "etcd" not in err


def test_stats_with_unreachable_etcd_warns_and_succeeds(cli: Cli, client: Client, ops: Ops,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _stats_fixture(client, ops)
    monkeypatch.setenv("ZSCHED_ETCD_ENDPOINTS", f"127.0.0.1:{free_port()}")
    t0 = time.monotonic()
    rc, out, err = cli("stats", "--etcd-timeout", "0.5")
    assert time.monotonic() - t0 < 4
    assert rc == 0 and "zsched: warning: etcd at" in err and "unknown" in out
    doc = cli.json("stats", "--etcd-timeout", "0.5")
    assert doc["owners_source"] == "unavailable" and all(p["owner"] is None for p in doc["partitions"])
    assert doc["queues"]["sms"]["dead"] == 1


# ------------------------------------------------------------------------ real console script


def _zsched() -> list[str]:
    exe = ROOT / ".venv" / "bin" / "zsched"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "scheduler"]


def test_console_script_round_trip(redis_url: str, client: Client, ops: Ops) -> None:
    env = {**os.environ, "ZSCHED_REDIS_URL": redis_url, "ZSCHED_NAMESPACE": NS}

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*_zsched(), *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def done(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
        out, err = proc.communicate(timeout=30)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    [dead] = kill(client, ops, "emails")
    # the commands that do not depend on each other run at once (each costs a Python start-up);
    # a command that needs another's result or effect starts once that one is done
    scheduled = start("schedule", "--at", "+2h", "--queue", "emails", "--payload", '{"to": "x@example.com"}')
    no_zone = start("schedule", "--at", "2026-12-01T09:00:00", "--queue", "emails", "--payload", "1")
    unknown = start("job", "show", "00000000000000010000000000000a")
    requeued = start("dead", "requeue", dead)
    p = done(scheduled)
    assert p.returncode == 0, p.stderr
    jid = p.stdout.strip()
    assert client.get(jid).state is JobState.SCHEDULED
    shown = start("job", "show", jid, "--json")
    p = done(requeued)
    assert p.returncode == 0 and "requeued" in p.stdout
    again = start("dead", "requeue", dead)
    p = done(shown)
    assert p.returncode == 0 and json.loads(p.stdout)["payload"] == {"to": "x@example.com"}
    p = done(no_zone)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith("zsched: error:")
    assert "no time zone" in p.stderr and p.stdout == ""
    p = done(unknown)
    assert p.returncode == 1 and "not found" in p.stderr
    p = done(again)
    assert p.returncode == 0 and "already requeued/not dead" in p.stdout


def test_cron_add_list_remove_through_the_cli(redis_url: str, capsys) -> None:
    from scheduler.shell.cli import main as cli_main
    base = ["--redis", redis_url, "--namespace", "clicron"]
    assert cli_main(["cron", "add", "digest", "0 9 * * *", "--queue", "emails", "--payload", '{"a": 1}',
                     "--tz", "America/New_York", "--misfire", "skip", "--grace", "600", "--jitter", "60", *base]) == 0
    assert "next occurrence" in capsys.readouterr().out
    assert cli_main(["cron", "list", "--json", *base]) == 0
    import json
    [c] = json.loads(capsys.readouterr().out)
    assert (c["name"], c["expression"], c["tz"], c["misfire"], c["misfire_grace"]) == (
        "digest", "0 9 * * *", "America/New_York", "skip", 600.0)
    assert cli_main(["cron", "add", "bad", "61 * * * *", "--queue", "q", *base]) == 2
    assert "invalid" in capsys.readouterr().err
    assert cli_main(["cron", "add", "bad", "* * * * *", "--queue", "q", "--tz", "Nowhere/X", *base]) == 2
    assert "unknown time zone" in capsys.readouterr().err
    assert cli_main(["job", "cancel", c["pending_id"], *base]) == 1
    assert "pending occurrence of cron 'digest'" in capsys.readouterr().err
    assert cli_main(["cron", "remove", "digest", *base]) == 0
    assert cli_main(["cron", "remove", "digest", *base]) == 1
    assert cli_main(["cron", "list", *base]) == 0
    assert "no crons" in capsys.readouterr().out


def test_job_and_dead_show_print_a_payload_nested_as_deep_as_the_client_accepts(cli: Cli, client: Client,
                                                                                 ops: Ops) -> None:
    deep: Any = "the bottom"
    for i in range(1024):  # msgpack decodes at most 1 024 levels; json.dumps gives up near 1 000
        deep = [deep] if i % 2 else {f"k{i}": deep}
    live = client.schedule(timedelta(hours=1), deep, queue="deep")
    (dead,) = kill(client, ops, "deep-dead", payload=deep)
    for args in (("job", "show", live), ("job", "show", live, "--json"), ("dead", "show", dead),
                 ("dead", "show", dead, "--json")):
        rc, out, err = cli(*args)
        assert (rc, err) == (0, ""), args
        assert out.count("[") >= 512 and out.count("{") >= 512 and '[{"k0": "the bottom"}]' in out, args
