"""Dead letters a page at a time against a real redis-server: newest death first across
partitions (deaths in the same millisecond included, each once), next and previous pages, the
total with and without filters, in the console's dead-letter page and in ``zsched dead list``
alike; a one-line error per row, the whole traceback on the job's page."""
from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest

from scheduler import Client
from scheduler.protocol.calls import error_arg
from scheduler.protocol.codes import FailKind
from scheduler.protocol.transitions import Failure, fail_call
from scheduler.shell import admin
from scheduler.shell.cli import main
from scheduler.testing.transitions import Ops
from tests.support.ui import console, namespace_client

NS = "deadpages"
TB = 'Traceback (most recent call last):\n  File "pay.py", line 7, in charge\nRuntimeError: declined'


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    yield from namespace_client(redis_url, NS, partitions=4)


def kill(client: Client, queue: str, n: int, msg: str) -> list[str]:
    """``n`` jobs of ``queue`` claimed and failed for good, one fail call per partition: the jobs of
    one partition die in the same millisecond."""
    ops = Ops(client)
    ids = client.schedule_many([(timedelta(0), i) for i in range(n)], queue=queue)
    jobs = ops.claim(queue, n)
    by_part: dict[int, list[Failure]] = {}
    for j in jobs:
        fail = Failure(j.raw_id, j.token, FailKind.PERMANENT, 0, error_arg("RuntimeError", msg, TB))
        by_part.setdefault(ops.partition(j.raw_id), []).append(fail)
    for p, failures in by_part.items():
        ops.send(fail_call(ops.calls, p, failures))
    return ids


def newest_first(client: Client, ids: list[str]) -> list[str]:
    infos = client.get_many(ids)
    return sorted(ids, key=lambda j: (infos[j].died_at, bytes.fromhex(j)), reverse=True)  # type: ignore[union-attr]


def pages(client: Client, flt: admin.DeadFilter, limit: int) -> list[admin.DeadPage]:
    out = [admin.dead_page(client, flt, limit)]
    while out[-1].older:
        out.append(admin.dead_page(client, flt, limit, older_than=out[-1].older))
    return out


def test_pages_go_newest_first_across_partitions_each_job_once_with_a_total(client: Client) -> None:
    a = kill(client, "a", 37, "card declined")
    b = kill(client, "b", 8, "smtp 550")
    everything = newest_first(client, a + b)
    got = pages(client, admin.DeadFilter(), 5)
    assert [j.id for p in got for j in p.jobs] == everything
    assert [len(p.jobs) for p in got] == [5] * 9 and all((p.total, p.exact) == (45, True) for p in got)
    assert got[0].newer is None and got[-1].older is None
    back = admin.dead_page(client, admin.DeadFilter(), 5, newer_than=got[3].newer)
    assert [j.id for j in back.jobs] == [j.id for j in got[2].jobs], "the previous page is the page before"
    assert back.older == got[2].older and back.newer == got[2].newer
    only_a = pages(client, admin.DeadFilter(queue="a"), 10)
    assert [j.id for p in only_a for j in p.jobs] == [j for j in everything if j in a]
    assert (only_a[0].total, only_a[0].exact) == (37, True)
    smtp = admin.dead_page(client, admin.DeadFilter(error_contains="SMTP", ignore_case=True), 50)
    assert [j.id for j in smtp.jobs] == [j for j in everything if j in b] and (smtp.total, smtp.exact) == (8, True)
    last = got[-1]
    for j in last.jobs:  # requeued meanwhile: the page past them is empty, and leads back
        client.requeue(j.id)
    empty = admin.dead_page(client, admin.DeadFilter(), 5, older_than=got[-2].older)
    assert (empty.jobs, empty.total, empty.older, empty.newer) == ([], 40, None, got[-2].older)
    with pytest.raises(admin.BadInput, match="MILLISECONDS-JOBID"):
        admin.dead_page(client, admin.DeadFilter(), 5, older_than="yesterday")


def test_zsched_dead_list_pages_in_the_same_order(client: Client, redis_url: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    ids = newest_first(client, kill(client, "c", 23, "timeout\nsecond line of the message"))

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        rc = main(["dead", "list", *args, "--redis", redis_url, "--namespace", NS])
        out, err = capsys.readouterr()
        return rc, out, err

    seen: list[str] = []
    args: list[str] = ["--limit", "10"]
    prev = None
    for _ in range(5):
        rc, out, err = run(*args)
        assert rc == 0, err
        lines = out.strip().splitlines()
        assert lines[0].endswith(" of 23 dead jobs, newest first") and lines[1].startswith("ID")
        seen += [ln.split()[0] for ln in lines[2:] if re.match(r"[0-9a-f]{30} ", ln)]
        assert "second line" not in out and "Traceback" not in out, "one line per error"
        nxt = [ln for ln in lines if ln.startswith("next page (older): zsched dead list")]
        prev = [ln for ln in lines if ln.startswith("previous page (newer)")] or prev
        if not nxt:
            break
        args = nxt[0].split("zsched dead list ", 1)[1].split()
    assert seen == ids
    assert prev is not None
    rc, out, _ = run(*prev[0].split("zsched dead list ", 1)[1].split())
    assert [ln.split()[0] for ln in out.splitlines() if re.match(r"[0-9a-f]{30} ", ln)] == ids[10:20]
    rc, _, err = run("--older", "nope")
    assert rc == 2 and err.startswith("zsched: error: older_than must be a mark") and len(err.splitlines()) == 1


def test_the_console_pages_dead_letters_newest_first_with_a_total_and_a_one_line_error(client: Client) -> None:
    ids = newest_first(client, kill(client, "d", 12, "declined\nby the issuer"))
    tc = console(client, read_only=True)
    text = tc.get("/dead", params={"limit": "5"}).text
    assert re.search(r'id="dead-total"><strong>12</strong> dead jobs match', text)
    assert re.findall(r'<td><a href="/job/([0-9a-f]{30})">', text) == ids[:5]
    assert 'id="newer-page"' not in text
    row = re.search(rf'<td><a href="/job/{ids[0]}">.*?</tr>', text, re.S).group(0)  # type: ignore[union-attr]
    assert "RuntimeError: declined" in row and "by the issuer" not in row and "Traceback" not in row
    assert f'href="/job/{ids[0]}#traceback"' in row
    seen, url = [], "/dead?limit=5"
    while url:
        text = tc.get(url).text
        seen += re.findall(r'<td><a href="/job/([0-9a-f]{30})">', text)
        m = re.search(r'id="older-page" href="([^"]+)"', text)
        url = m.group(1).replace("&amp;", "&") if m else ""
        if len(seen) == 10:
            newer = re.search(r'id="newer-page" href="([^"]+)"', text).group(1)  # type: ignore[union-attr]
    assert seen == ids
    assert re.findall(r'<td><a href="/job/([0-9a-f]{30})">', tc.get(newer.replace("&amp;", "&")).text) == ids[:5]
    job = tc.get(f"/job/{ids[0]}").text
    assert 'id="traceback"' in job and "File &#34;pay.py&#34;, line 7" in job and "by the issuer" in job
    assert tc.get("/dead", params={"older": "1-2"}).status_code == 400
