"""workers.effects against a real PostgreSQL: a fenced block's writes commit once per job and step,
a repeat or a stale attempt writes nothing and says which, bad set-ups fail before any write."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from workers import Job
from workers.effects import (
    AlreadyApplied,
    EffectsError,
    EffectSkipped,
    EffectsTableMissing,
    StaleAttempt,
    ddl,
    fenced,
    fenced_async,
    prune,
)

NS = "fx"


def job(n: int = 1, fence: int = 100, attempt: int = 1, namespace: str = NS) -> Job:
    return Job(n.to_bytes(15, "big"), "q", {"n": n}, None, attempt, 5, 1_700_000_000_000, fence, 30.0,
               namespace=namespace)


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn) as c:
        c.execute(ddl())
        c.execute("CREATE TABLE ledger (job_id text, amount int)")
        c.commit()
        yield c


def ledger(c: psycopg.Connection) -> list[tuple[str, int]]:
    rows = c.execute("SELECT job_id, amount FROM ledger ORDER BY job_id").fetchall()
    c.commit()
    return rows


def effects(c: psycopg.Connection) -> list[tuple[str, str, str, int, int]]:
    rows = c.execute("SELECT namespace, job_id, step, fence, attempt FROM zsched_effects ORDER BY job_id, step")
    out = rows.fetchall()
    c.commit()
    return out


def pay(c: psycopg.Connection, j: Job, amount: int = 10, step: str = "") -> None:
    with fenced(c, j, step=step):
        c.execute("INSERT INTO ledger VALUES (%s, %s)", (j.id, amount))


def test_the_first_attempt_commits_its_writes_with_the_fence_row(conn: psycopg.Connection) -> None:
    j = job(fence=100, attempt=1)
    pay(conn, j)
    assert ledger(conn) == [(j.id, 10)]
    assert effects(conn) == [(NS, j.id, "", 100, 1)]


def test_a_repeat_after_a_commit_raises_already_applied_and_writes_nothing(conn: psycopg.Connection) -> None:
    first = job(fence=100, attempt=1)
    pay(conn, first)
    again = job(fence=105, attempt=2)
    with pytest.raises(AlreadyApplied) as e:
        pay(conn, again, amount=99)
    assert (e.value.recorded_fence, e.value.recorded_attempt, e.value.fence) == (100, 1, 105)
    assert e.value.applied_at is not None and "wrote nothing" in str(e.value)
    assert ledger(conn) == [(first.id, 10)]
    with pytest.raises(AlreadyApplied):  # the same attempt entering its block twice
        pay(conn, first)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # rolled back, usable


def test_a_stale_attempt_after_a_newer_one_committed_raises_stale_attempt(conn: psycopg.Connection) -> None:
    pay(conn, job(fence=200, attempt=2))
    with pytest.raises(StaleAttempt) as e:
        pay(conn, job(fence=100, attempt=1), amount=99)
    assert isinstance(e.value, EffectSkipped) and e.value.recorded_fence == 200
    assert ledger(conn) == [(job().id, 10)]


def test_an_error_in_the_block_rolls_back_the_fence_row_too_so_the_retry_applies(conn: psycopg.Connection) -> None:
    with pytest.raises(ZeroDivisionError), fenced(conn, job(fence=100)):
        conn.execute("INSERT INTO ledger VALUES ('x', 1)")
        _ = 1 / 0
    assert ledger(conn) == [] and effects(conn) == []
    pay(conn, job(fence=101, attempt=2))
    assert ledger(conn) == [(job().id, 10)]


def test_steps_of_one_job_are_fenced_each_on_their_own(conn: psycopg.Connection) -> None:
    j = job()
    pay(conn, j, step="ledger")
    pay(conn, j, step="audit", amount=1)
    with pytest.raises(AlreadyApplied):
        pay(conn, j, step="audit")
    assert [r[2] for r in effects(conn)] == ["audit", "ledger"]


def _overlap(pg_dsn: str, conn: psycopg.Connection, n: int, newer_commits: bool) -> BaseException | None:
    """The newer attempt (fence 200) enters its block and holds it; the stale one (fence 100) then
    tries its own; the newer one commits or fails. Returns what the stale attempt's block raised."""
    entered, release = threading.Event(), threading.Event()
    newer_errors: list[BaseException] = []
    stale_result: list[BaseException | None] = []

    def newer() -> None:
        with psycopg.connect(pg_dsn) as c2:
            try:
                with fenced(c2, job(n, fence=200, attempt=2)):
                    c2.execute("INSERT INTO ledger VALUES (%s, 2)", (job(n).id,))
                    entered.set()
                    release.wait(10)
                    if not newer_commits:
                        raise RuntimeError("the newer attempt fails")
            except RuntimeError as exc:
                newer_errors.append(exc)

    def stale() -> None:
        try:
            with psycopg.connect(pg_dsn) as c3:
                pay(c3, job(n, fence=100, attempt=1), amount=1)
            stale_result.append(None)
        except EffectSkipped as exc:
            stale_result.append(exc)

    t = threading.Thread(target=newer)
    t.start()
    assert entered.wait(10)
    s = threading.Thread(target=stale)
    s.start()
    s.join(0.3)
    assert s.is_alive(), "the stale attempt waits on the newer one's row"
    release.set()
    t.join(10)
    s.join(10)
    assert len(stale_result) == 1 and len(newer_errors) == (0 if newer_commits else 1)
    return stale_result[0]


def test_overlapping_attempts_the_stale_one_waits_and_writes_nothing_if_the_newer_commits(
        pg_dsn: str, conn: psycopg.Connection) -> None:
    assert isinstance(_overlap(pg_dsn, conn, 1, newer_commits=True), StaleAttempt)
    assert ledger(conn) == [(job(1).id, 2)]


def test_overlapping_attempts_the_stale_one_writes_if_the_newer_rolls_back(
        pg_dsn: str, conn: psycopg.Connection) -> None:
    assert _overlap(pg_dsn, conn, 2, newer_commits=False) is None  # the effects still apply once
    assert ledger(conn) == [(job(2).id, 1)]
    assert [r[3] for r in effects(conn)] == [100]


def test_bad_set_ups_fail_with_one_clear_error_and_write_nothing(pg_dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT 1")  # a transaction is open now
    with pytest.raises(EffectsError, match="already in one"):
        pay(conn, job())
    conn.rollback()
    with psycopg.connect(pg_dsn) as other:
        other.execute("DROP TABLE zsched_effects")
        other.commit()
        with pytest.raises(EffectsTableMissing, match="zsched effects apply"):
            pay(other, job())
        other.execute(ddl())
        other.commit()
    closed = psycopg.connect(pg_dsn)
    closed.close()
    with pytest.raises(EffectsError, match="closed"):
        pay(closed, job())
    with pytest.raises(EffectsError, match="not 'name' or 'schema.name'"):
        with fenced(conn, job(), table="x; DROP TABLE ledger"):
            pass
    with pytest.raises(EffectsError, match="namespace"):
        pay(conn, job(namespace=""))
    with pytest.raises(EffectsError, match="step"):
        pay(conn, job(), step="a b")
    with pytest.raises(EffectsError, match="the job a handler received"):
        with fenced(conn, object()):
            pass
    assert ledger(conn) == [] and effects(conn) == []


def test_the_block_s_own_missing_table_is_not_reported_as_the_effects_table(conn: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.UndefinedTable), fenced(conn, job()):
        conn.execute("INSERT INTO no_such_table VALUES (1)")
    assert effects(conn) == []


def test_the_asyncio_variant_keeps_the_same_contract(pg_dsn: str, conn: psycopg.Connection) -> None:
    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as ac:
            async with fenced_async(ac, job(fence=100)):
                await ac.execute("INSERT INTO ledger VALUES (%s, 10)", (job().id,))
            with pytest.raises(AlreadyApplied):
                async with fenced_async(ac, job(fence=101, attempt=2)):
                    await ac.execute("INSERT INTO ledger VALUES ('never', 1)")
            await ac.execute("SELECT 1")
            with pytest.raises(EffectsError, match="already in one"):
                async with fenced_async(ac, job(2)):
                    pass

    asyncio.run(main())
    assert ledger(conn) == [(job().id, 10)]


def test_prune_deletes_rows_past_the_retention_in_batches_and_keeps_the_rest(conn: psycopg.Connection) -> None:
    for n in range(1, 8):
        pay(conn, job(n), amount=n)
    pay(conn, job(9, namespace="other"))
    conn.execute("UPDATE zsched_effects SET applied_at = now() - interval '2 hours' WHERE job_id <> %s",
                 (job(7).id,))
    conn.commit()
    assert prune(conn, timedelta(hours=1), namespace=NS, batch=2) == 6  # 3 full batches and an empty one
    assert sorted(r[1] for r in effects(conn)) == sorted([job(7).id, job(9).id])
    assert prune(conn, 3600.0) == 1  # every namespace: the other one's old row
    assert prune(conn, 3600.0) == 0
    for bad in (0, -1, True):
        with pytest.raises(EffectsError, match="batch"):
            prune(conn, 60, batch=bad)
    with pytest.raises(EffectsError, match="retention"):
        prune(conn, -5)
