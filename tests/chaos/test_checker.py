"""The chaos checker on hand-made histories: a clean one passes, and each kind of violation the chaos
run must catch (a lost durable job, an unexplained duplicate run, an early run, a leftover job, a
producer failure while Redis was up, ...) is caught, while the faults that excuse a duplicate or a
failure do excuse it."""
from __future__ import annotations

import os
from pathlib import Path

from scheduler.protocol.ids import IdGenerator
from tests.chaos.checker import check
from tests.chaos.history import (
    Call,
    Fault,
    History,
    LeaseLoss,
    Run,
    complete_lines,
    load,
    parse_run_lines,
    parse_worker_log,
    write_final,
)

T0 = 1_700_000_000.0
_gen = IdGenerator()


def job_id(run_at: float) -> str:
    return _gen.new(round(run_at * 1000), 8)[0].hex()


def clean(n: int = 3) -> History:
    """n jobs, scheduled (durable) at T0 + i, due 1 s later, each run once by pid 100."""
    h = History(t_start=T0, t_end=T0 + 100)
    for i in range(n):
        at = T0 + i + 1.0
        jid = job_id(at)
        h.calls.append(Call(seq=i, producer=0, t0=T0 + i, t1=T0 + i + 0.002, outcome="ok", run_at=at, id=jid))
        h.runs.append(Run(jid, i, 1, 1000 + i, 100, at + 0.01, at, at + 0.1))
        h.final.states[jid] = "done"
    h.final.stats = {"chaos": {"scheduled": 0, "ready": 0, "running": 0, "dead": 0}}
    return h


def violations(h: History) -> dict[str, int]:
    return {k: len(v) for k, v in check(h).violations.items() if v}


def rerun(h: History, i: int = 0, pid: int = 200, start_after: float = 5.0, end: bool = True) -> Run:
    """A second run of job i by ``pid``, ``start_after`` s after the first started."""
    first = h.runs[i]
    r = Run(first.id, first.seq, 2, first.fence + 500, pid, first.start + start_after, first.due,
            first.start + start_after + 0.1 if end else None)
    h.runs.append(r)
    return r


def test_a_clean_history_passes() -> None:
    v = check(clean())
    assert v.ok, v.report()
    assert v.counts["jobs"] == 3 and v.counts["runs"] == 3 and v.counts["extra"] == 0
    line = v.summary(seed=7, seconds=60)
    assert line.startswith("chaos seed=7 seconds=60 faults=0 () jobs=3 runs=3 extra=0 ")
    assert "lost_durable=0" in line and "early=0" in line and "leftover=0" in line


# -- lost jobs ------------------------------------------------------------------------------------


def test_a_lost_durable_job_is_caught() -> None:
    h = clean()
    del h.runs[1]
    assert violations(h) == {"lost_durable": 1}


def test_a_durable_job_that_started_but_never_finished_is_lost() -> None:
    h = clean()
    h.runs[1].end = None
    h.faults.append(Fault("kill-worker", "w0", 100, h.runs[1].start + 0.01, h.runs[1].start + 1))
    assert violations(h) == {"lost_durable": 1}


def test_a_durable_job_lost_across_a_failover_is_still_lost() -> None:
    h = clean()
    del h.runs[1]
    c = h.calls[1]
    h.faults.append(Fault("failover", "redis", 1, c.t1 + 0.2, c.t1 + 5, {"promoted_at": c.t1 + 3}))
    assert violations(h) == {"lost_durable": 1}


def test_an_unconfirmed_job_may_be_lost_only_if_a_master_was_lost_after_it_was_written() -> None:
    h = clean()
    c = h.calls[1]
    c.outcome, c.error = "durability_timeout", "DurabilityTimeout: only 0 of 1 replica(s) confirmed"
    del h.runs[1]
    # the replica was down (so the timeout is allowed), but the master never died: lost for nothing
    h.faults.append(Fault("kill-replica", "redis", 2, c.t0 - 1, c.t1 + 2, {"up_at": c.t1 + 1}))
    assert violations(h) == {"lost_unconfirmed": 1}
    h.faults.append(Fault("failover", "redis", 1, c.t1 + 0.5, c.t1 + 9, {"promoted_at": c.t1 + 3}))
    v = check(h)
    assert v.ok, v.report()
    assert v.counts["lost_unconfirmed_explained"] == 1


# -- duplicates -----------------------------------------------------------------------------------


def test_an_unexplained_duplicate_run_is_caught() -> None:
    h = clean()
    rerun(h)
    assert violations(h) == {"unexplained_extra": 1}


def test_a_scheduler_fault_does_not_excuse_a_duplicate() -> None:
    h = clean()
    r = h.runs[0]
    h.faults.append(Fault("kill-sched", "s0", 300, r.start, r.start + 1))
    h.faults.append(Fault("stop-sched", "s1", 301, r.start, r.start + 3))
    h.faults.append(Fault("kill-etcd", "n0", 302, r.start, r.start + 2))
    rerun(h)
    assert violations(h) == {"unexplained_extra": 1}


def test_a_duplicate_after_its_worker_was_killed_mid_run_is_explained() -> None:
    h = clean()
    first = h.runs[0]
    first.end = None
    h.faults.append(Fault("kill-worker", "w0", 100, first.start + 0.05, first.start + 1))
    rerun(h)
    v = check(h)
    assert v.ok, v.report()
    assert v.explained["worker killed"] == 1


def test_a_kill_of_another_worker_or_after_the_rerun_does_not_explain_it() -> None:
    h = clean()
    first = h.runs[0]
    h.faults.append(Fault("kill-worker", "w1", 999, first.start + 0.05, first.start + 1))  # another pid
    h.faults.append(Fault("kill-worker", "w0", 100, first.start + 7, first.start + 8))    # after the rerun
    rerun(h)
    assert violations(h) == {"unexplained_extra": 1}


def test_a_kill_long_after_the_run_ended_does_not_explain_a_rerun() -> None:
    h = clean()
    first = h.runs[0]
    h.faults.append(Fault("kill-worker", "w0", 100, first.end + 3.0, first.end + 4))  # acked long before
    rerun(h, start_after=6.0)
    assert violations(h) == {"unexplained_extra": 1}


def test_a_kill_just_after_end_explains_a_rerun_the_ack_never_left() -> None:
    h = clean()
    first = h.runs[0]
    h.faults.append(Fault("kill-worker", "w0", 100, first.end + 0.01, first.end + 1))
    rerun(h)
    assert check(h).ok


def test_a_duplicate_after_its_worker_was_stopped_is_explained() -> None:
    h = clean()
    first = h.runs[0]
    h.faults.append(Fault("stop-worker", "w0", 100, first.start + 0.02, first.start + 7, {"seconds": 7}))
    rerun(h)
    v = check(h)
    assert v.ok, v.report()
    assert v.explained["worker stopped"] == 1


def test_a_freeze_shorter_than_half_a_lease_does_not_explain_a_duplicate() -> None:
    h = clean()
    first = h.runs[0]
    h.faults.append(Fault("stop-worker", "w0", 100, first.start + 0.02, first.start + 1.2, {"seconds": 1.18}))
    rerun(h)
    assert violations(h) == {"unexplained_extra": 1}


def test_a_logged_lease_loss_explains_a_duplicate() -> None:
    h = clean()
    first = h.runs[0]
    rerun(h)
    h.losses.append(LeaseLoss(100, h.runs[1].id, first.start + 6, "lost", "ack"))  # another job: no
    assert violations(h) == {"unexplained_extra": 1}
    h.losses.append(LeaseLoss(100, first.id, first.start + 6, "lost", "ack"))
    v = check(h)
    assert v.ok, v.report()
    assert v.explained["lease lost"] == 1


def test_a_redis_rollback_explains_a_duplicate_whose_ack_was_lost() -> None:
    h = clean()
    first = h.runs[0]
    h.faults.append(Fault("failover", "redis", 1, first.end + 0.3, first.end + 6, {"promoted_at": first.end + 3}))
    rerun(h, start_after=4.0)
    v = check(h)
    assert v.ok, v.report()
    assert v.explained["rollback"] == 1


def test_a_failover_long_after_the_ack_does_not_explain_a_duplicate() -> None:
    h = clean()
    first = h.runs[0]
    h.faults.append(Fault("failover", "redis", 1, first.end + 5, first.end + 9, {"promoted_at": first.end + 7}))
    rerun(h, start_after=8.0)
    assert violations(h) == {"unexplained_extra": 1}


def test_every_extra_run_needs_its_own_explanation() -> None:
    h = clean()
    first = h.runs[0]
    first.end = None
    h.faults.append(Fault("kill-worker", "w0", 100, first.start + 0.05, first.start + 1))
    rerun(h, pid=200, start_after=5.0)
    third = rerun(h, pid=300, start_after=10.0)
    third.fence += 1
    assert violations(h) == {"unexplained_extra": 1}  # run 3 after a healthy run 2


# -- early, leftover, unfinished, phantom ---------------------------------------------------------


def test_an_early_run_is_caught() -> None:
    h = clean()
    r = h.runs[2]
    r.start = h.calls[2].run_at - 0.01
    assert violations(h) == {"early": 1}


def test_ms_rounding_is_not_early() -> None:
    h = clean()
    h.runs[2].start = h.calls[2].run_at - 0.0009
    assert check(h).ok


def test_a_retry_that_starts_before_its_attempt_was_due_is_early() -> None:
    h = clean()
    r = rerun(h)
    r.due = r.start + 0.5
    h.losses.append(LeaseLoss(100, r.id, r.start, "lost", "ack"))
    assert violations(h) == {"early": 1}


def test_a_leftover_job_is_caught() -> None:
    h = clean()
    h.final.stats["chaos"]["ready"] = 1
    h.final.states[h.calls[0].id] = "ready"
    v = check(h)
    assert {k for k, x in v.violations.items() if x} == {"leftover"}
    assert v.counts["leftover"] == 1


def test_a_dead_letter_is_a_leftover() -> None:
    h = clean()
    h.final.stats["chaos"]["dead"] = 2
    assert violations(h) == {"leftover": 1}


def test_a_run_that_quiesce_never_saw_the_end_of_is_leftover() -> None:
    h = clean()
    h.final.quiesced, h.final.quiesce_error = False, "still 3 running after 60 s"
    assert violations(h) == {"leftover": 1}


def test_an_unfinished_run_without_a_kill_is_caught() -> None:
    h = clean()
    r = rerun(h)
    r.end = None
    h.losses.append(LeaseLoss(100, r.id, r.start, "lost", "ack"))
    assert violations(h) == {"unfinished": 1}


def test_a_run_nobody_scheduled_is_a_phantom() -> None:
    h = clean()
    h.runs.append(Run(job_id(T0 + 3), 99, 1, 5, 100, T0 + 4, T0 + 3, T0 + 4.1))
    assert violations(h) == {"phantom": 1}


def test_a_job_of_a_failed_call_may_run() -> None:
    h = clean()
    c = h.calls[1]
    c.outcome, c.id, c.error = "error", None, "ConnectionError: boom"
    h.faults.append(Fault("failover", "redis", 1, c.t0 - 1, c.t1 + 5, {"promoted_at": c.t1 + 1}))
    v = check(h)
    assert v.ok, v.report()
    assert v.counts["runs_of_failed_calls"] == 1 and v.counts["producer_errors"] == 1


# -- producer failures ----------------------------------------------------------------------------


def test_a_producer_failure_while_redis_is_up_is_caught() -> None:
    h = clean()
    h.calls.append(Call(10, 0, T0 + 20, T0 + 30, "error", T0 + 22, None, "ConnectionError: Connection refused"))
    assert violations(h) == {"producer_failure": 1}


def test_a_client_still_broken_after_redis_came_back_is_caught() -> None:
    h = clean()
    # master killed at +20, promoted at +23; a call that began after that and failed is an outage
    h.faults.append(Fault("failover", "redis", 1, T0 + 20, T0 + 26, {"promoted_at": T0 + 23}))
    h.calls.append(Call(10, 0, T0 + 25, T0 + 35, "error", T0 + 27, None, "ConnectionError: stale master"))
    assert violations(h) == {"producer_failure": 1}


def test_a_producer_failure_during_a_failover_is_allowed_and_reported() -> None:
    h = clean()
    h.faults.append(Fault("failover", "redis", 1, T0 + 20, T0 + 26, {"promoted_at": T0 + 23}))
    h.calls.append(Call(10, 0, T0 + 19, T0 + 29, "error", T0 + 22, None, "ConnectionError: Connection refused"))
    v = check(h)
    assert v.ok, v.report()
    assert v.counts["producer_errors"] == 1
    assert "producer_failures=1 (errors 1, durability timeouts 0; while Redis up 0)" in v.summary(1, 1)


def test_a_durability_timeout_while_the_replica_is_up_is_caught() -> None:
    h = clean()
    c = h.calls[2]
    c.outcome, c.error = "durability_timeout", "DurabilityTimeout"
    assert violations(h) == {"producer_failure": 1}
    h.faults.append(Fault("kill-replica", "redis", 2, c.t0 - 0.5, c.t1 + 2, {"up_at": c.t1 + 1}))
    assert check(h).ok


# -- reading histories ----------------------------------------------------------------------------


def test_run_lines_pair_by_fence_and_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    a, b = job_id(T0), job_id(T0 + 1)
    f = tmp_path / "runs-100.log"
    f.write_text(f"START {a} 1 10 100 {T0 + 0.1} {T0} 0\n"
                 f"START {b} 1 11 100 {T0 + 1.1} {T0 + 1} 1\n"
                 f"END {a} 1 10 100 {T0 + 0.2} {T0} 0\n"
                 f"START {a} 2 12 100 {T0 + 5} {T0 + 4} 0\n"
                 f"END {b} 1 11 1")  # torn by a kill -9
    runs = parse_run_lines(complete_lines(f))
    assert [(r.id, r.fence, r.end) for r in runs] == [(a, 10, T0 + 0.2), (b, 11, None), (a, 12, None)]


def test_worker_lease_loss_lines_are_parsed() -> None:
    jid = job_id(T0)
    lines = [
        "2024-05-01 10:00:00,123 INFO workers.worker: worker serving namespace 'chaos'",
        (f"2024-05-01 10:00:01,500 WARNING workers.worker: job {jid} (queue 'chaos'): ack refused, the lease was "
         "lost (expired or taken over); the job may run again elsewhere"),
        (f"2024-05-01 10:00:02,000 INFO workers.worker: lease extension of job {jid} was refused after a "
         "connection error: it was either applied before the connection dropped or the lease had expired"),
    ]
    got = parse_worker_log(42, lines)
    assert [(x.pid, x.id, x.kind, x.what) for x in got] == [(42, jid, "lost", "ack"),
                                                             (42, jid, "uncertain", "lease extension")]


def test_the_parsed_messages_are_the_ones_the_worker_logs() -> None:
    src = (Path(__file__).resolve().parents[2] / "workers" / "worker.py").read_text()
    assert '"job %s (queue %r): %s refused, the lease was lost' in src
    assert '"%s of job %s was refused after a connection error' in src


def test_a_history_directory_round_trips(tmp_path: Path) -> None:
    import json
    from dataclasses import asdict
    h = clean()
    with open(tmp_path / "producer-0.jsonl", "w") as f:
        f.writelines(json.dumps(asdict(c)) + "\n" for c in h.calls)
    with open(tmp_path / "runs-100.log", "w") as f:
        for r in h.runs:
            f.write(f"START {r.id} {r.attempt} {r.fence} {r.pid} {r.start} {r.due} {r.seq}\n")
            f.write(f"END {r.id} {r.attempt} {r.fence} {r.pid} {r.end} {r.due} {r.seq}\n")
    write_final(tmp_path, h.final, h.params, h.t_start, h.t_end)
    back = load(tmp_path)
    assert back.calls == h.calls and back.runs == h.runs and back.final == h.final
    assert check(back).ok
    del back.runs[0]
    assert violations(back) == {"lost_durable": 1}
    assert os.path.exists(tmp_path / "final.json")
