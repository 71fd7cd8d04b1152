"""The chaos history checker: pure functions over a :class:`~tests.chaos.history.History`.

What it proves (each a violation category of :class:`Verdict`):

``lost_durable``
    Every job whose ``schedule`` returned (``durable="replica"`` confirmed) has a completed run
    (an END line). No excuse: a replica had it, whatever Redis went through.
``lost_unconfirmed``
    A job whose call raised ``DurabilityTimeout`` (written to the master, not confirmed on a replica)
    may be lost only if a master was lost (failover, restart) after the call began; otherwise it
    must have run like any other. Explained losses are reported, not failed.
``unexplained_extra``
    Every run of a job after its first (by fence: every claim gets a larger one) is explained by the
    run before it: that run's worker was killed (kill -9) or stopped (SIGSTOP) after the run started
    and before its outcome could reach Redis (END + ``ack_slack``, longer when Redis was down at
    END), and before the new run started; or that worker logged a lease loss for the job (WARNING
    "lease was lost", or the INFO "refused after a connection error"); or the run overlapped a Redis
    rollback window (a master lost up to ``rollback_window`` s of acknowledged writes, the new run
    started after it). The scheduler tier is never an explanation: it must never cause a duplicate.
``early``
    No run started before its job's run_at (the ms in its id) or before its attempt's due time,
    beyond ``early_tolerance`` (ms rounding; one host clock).
``leftover``
    After quiescing nothing is scheduled, ready, running or dead, and no job of the history is in a
    live state.
``producer_failure``
    No ``schedule`` call failed while Redis was up: an error is allowed only when the call overlapped
    a Redis-down window (master killed until promoted/restarted, stall) plus a short grace; a
    ``DurabilityTimeout`` only when it overlapped a replica-down window (replica killed until
    resynced, failover until the old master rejoined) plus ``durable_timeout``. A call that fails
    after Redis is back, for its whole retry budget, means a client stayed broken: an outage.
``phantom``
    Every run belongs to a ``schedule`` call (payload sequence number), with the id that call
    returned (if it returned one).
``unfinished``
    A run without an END line is one whose worker was killed after it started.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise

from scheduler.protocol.ids import decode_id, run_at_of
from tests.chaos.history import Call, Fault, Final, History, Run

VIOLATIONS = ("lost_durable", "lost_unconfirmed", "unexplained_extra", "early", "leftover",
              "producer_failure", "phantom", "unfinished")
EXPLANATIONS = ("worker killed", "lease lost", "worker stopped", "rollback")
LIVE_STATES = ("scheduled", "ready", "running", "dead")
MASTER_LOSS = ("failover", "restart-master", "observed-master-change")
Window = tuple[float, float]


@dataclass
class Verdict:
    violations: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in VIOLATIONS})
    counts: dict[str, int] = field(default_factory=Counter)
    explained: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def add(self, kind: str, text: str) -> None:
        self.violations[kind].append(text)

    def summary(self, seed: int, seconds: float) -> str:
        c = self.counts
        faults = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items()))
        extra = ", ".join(f"{k} {self.explained[k]}" for k in EXPLANATIONS)
        return (f"chaos seed={seed} seconds={seconds:g} faults={sum(self.faults.values())} ({faults}) "
                f"jobs={c['jobs']} runs={c['runs']} extra={c['extra']} ({extra}, unexplained "
                f"{len(self.violations['unexplained_extra'])}) early={len(self.violations['early'])} "
                f"lost_durable={len(self.violations['lost_durable'])} "
                f"lost_unconfirmed={c['lost_unconfirmed_explained'] + len(self.violations['lost_unconfirmed'])} "
                f"(unexplained {len(self.violations['lost_unconfirmed'])}) "
                f"leftover={c['leftover']} producer_failures={c['producer_errors'] + c['durability_timeouts']} "
                f"(errors {c['producer_errors']}, durability timeouts {c['durability_timeouts']}; "
                f"while Redis up {len(self.violations['producer_failure'])}) "
                f"phantom={len(self.violations['phantom'])} unfinished={len(self.violations['unfinished'])}")

    def report(self, limit: int = 10) -> str:
        """The violations, ``limit`` examples per category."""
        lines = []
        for k in VIOLATIONS:
            v = self.violations[k]
            if v:
                lines.append(f"{k}: {len(v)}")
                lines += [f"  {x}" for x in v[:limit]]
        return "\n".join(lines) or "no violations"


# -- windows ---------------------------------------------------------------------------------------


def redis_down_windows(faults: Iterable[Fault]) -> list[Window]:
    """When Redis could not take writes: master killed until a master answered again, stalls."""
    out = []
    for f in faults:
        if f.kind == "failover":
            out.append((f.t, f.info.get("promoted_at", f.until)))
        elif f.kind == "restart-master":
            out.append((f.t, f.until if f.info.get("became_failover") else f.info.get("up_at", f.until)))
        elif f.kind == "redis-stall":
            out.append((f.t, f.until))
        elif f.kind == "observed-master-change":  # seen at t; the master died up to ~10 s before
            out.append((f.t - 10.0, f.t))
        elif f.kind in ("heal-redis", "nemesis-error"):
            out.append((f.t, f.until))
    return out


def replica_down_windows(faults: Iterable[Fault]) -> list[Window]:
    """When the master had no replica in sync (``WAIT`` cannot be confirmed)."""
    out = []
    for f in faults:
        if f.kind in ("kill-replica", "failover", "restart-master", "heal-redis", "nemesis-error"):
            out.append((f.t, f.until))
        elif f.kind == "observed-master-change":
            out.append((f.t - 10.0, f.t))
    return out


def rollbacks(faults: Iterable[Fault], window: float) -> list[tuple[float, float, float]]:
    """(a, b, k): writes acknowledged in [a, b] may be gone after a master was lost at k (a run
    caused by the loss starts after k). b is when the failover was settled: until then Sentinel may
    promote and demote again, and a restarted master may take writes before it is demoted."""
    out = []
    for f in faults:
        if f.kind == "failover" or (f.kind == "nemesis-error" and f.target in ("failover", "restart-master")):
            # until the failover settled: on a loaded machine Sentinel can flip back and forth
            # (seen: a promoted replica judged down 1 s later, the old master promoted again),
            # and each flip drops what the short-lived master acknowledged
            out.append((f.t - window, max(f.t, f.until), f.t))
        elif f.kind == "restart-master":
            out.append((f.t - window, f.until if f.info.get("became_failover") else f.t, f.t))
        elif f.kind == "observed-master-change":
            out.append((f.t - 10.0 - window, f.t, f.t - 10.0))
    return out


def _overlaps(a0: float, a1: float, windows: Iterable[Window], grace: float) -> bool:
    return any(a0 <= b1 + grace and a1 >= b0 for b0, b1 in windows)


def _effective_end(end: float | None, down: list[Window]) -> float:
    """When a run's outcome could reach Redis at the latest: END, or the end of a Redis-down window
    END fell into (the worker keeps the outcome and sends it on reconnect)."""
    if end is None:
        return math.inf
    for a, b in down:
        if a <= end <= b:
            end = max(end, b)
    return end


def job_run_at(job_id: str) -> float:
    return run_at_of(decode_id(job_id)) / 1000.0


# -- the checks ------------------------------------------------------------------------------------


def explain_extra(prev: Run, cur: Run, h: History, down: list[Window], rb: list[tuple[float, float, float]],
                  losses: set[tuple[int, str]]) -> str | None:
    """Why ``cur`` ran although ``prev`` (the run before it) had the job; None if nothing explains it."""
    p = h.params
    tol = p.clock_tolerance
    end = _effective_end(prev.end, down) + p.ack_slack
    stopped = False
    for f in h.faults:
        if f.pid != prev.pid or f.t > cur.start + tol:
            continue
        if f.kind == "kill-worker" and prev.start - tol <= f.t <= end:
            return "worker killed"
        if f.kind == "stop-worker" and f.t <= end and f.until >= prev.start - tol \
                and f.until - f.t >= p.lease / 2:  # a shorter freeze cannot outlast a heartbeat period
            stopped = True
    if (prev.pid, prev.id) in losses:
        return "lease lost"
    if stopped:
        return "worker stopped"
    for a, b, k in rb:
        if prev.start <= b + tol and (prev.end is None or prev.end >= a) and cur.start >= k - tol:
            return "rollback"
    return None


@dataclass
class Facts:
    """What the checks read besides the history: its windows and indexes."""

    h: History
    down: list[Window]                      # Redis could not take writes
    rdown: list[Window]                     # no replica in sync
    rb: list[tuple[float, float, float]]    # rollback windows (see rollbacks())
    kills: dict[int, list[float]]           # worker pid -> when it was killed
    losses: set[tuple[int, str]]            # (worker pid, job id) of every logged lease loss
    by_seq: dict[int, Call]                 # producer calls by payload sequence number
    runs_by_id: dict[str, list[Run]]        # runs by job id, in fence order
    completed: set[str]                     # ids of jobs with a run that ended

    @classmethod
    def of(cls, h: History) -> Facts:
        kills: dict[int, list[float]] = defaultdict(list)
        for f in h.faults:
            if f.kind == "kill-worker" and f.pid is not None:
                kills[f.pid].append(f.t)
        runs_by_id: dict[str, list[Run]] = defaultdict(list)
        for r in h.runs:
            runs_by_id[r.id].append(r)
        for rs in runs_by_id.values():
            rs.sort(key=lambda r: r.fence)
        return cls(h=h, down=redis_down_windows(h.faults), rdown=replica_down_windows(h.faults),
                   rb=rollbacks(h.faults, h.params.rollback_window), kills=kills,
                   losses={(x.pid, x.id) for x in h.losses}, by_seq={c.seq: c for c in h.calls},
                   runs_by_id=runs_by_id,
                   completed={jid for jid, rs in runs_by_id.items() if any(r.end is not None for r in rs)})


def check_call(c: Call, facts: Facts, v: Verdict) -> None:
    """One producer call: a confirmed job ran; a failure or an unconfirmed loss has a fault that
    explains it."""
    p = facts.h.params
    if c.outcome == "ok":
        v.counts["jobs"] += 1
        v.counts["jobs_durable"] += 1
        if c.id not in facts.completed:
            v.add("lost_durable", f"job {c.id} (seq {c.seq}) acknowledged durable at {c.t1:.3f}, never ran"
                  + (" (started, never finished)" if c.id in facts.runs_by_id else ""))
    elif c.outcome == "durability_timeout":
        v.counts["jobs"] += 1
        v.counts["durability_timeouts"] += 1
        if not _overlaps(c.t0, c.t1, facts.rdown, p.durable_timeout + 0.5):
            v.add("producer_failure", f"seq {c.seq}: DurabilityTimeout at {c.t1:.3f} (call began {c.t0:.3f}) "
                  f"while the replica was up: {c.error}")
        if c.id not in facts.completed:
            if any(b >= c.t0 - p.clock_tolerance for _, b, _ in facts.rb):
                v.counts["lost_unconfirmed_explained"] += 1
            else:
                v.add("lost_unconfirmed", f"job {c.id} (seq {c.seq}, DurabilityTimeout at {c.t1:.3f}) never ran, "
                      "and no master was lost after it was written")
    else:
        v.counts["producer_errors"] += 1
        if not _overlaps(c.t0, c.t1, facts.down, 1.0):
            v.add("producer_failure", f"seq {c.seq}: failed at {c.t1:.3f} (call began {c.t0:.3f}, "
                  f"{c.t1 - c.t0:.2f} s) while Redis was up: {c.error}")


def check_origin(jid: str, first: Run, facts: Facts, v: Verdict) -> None:
    """A job's first run belongs to the producer call of its sequence number, with that call's id."""
    call = facts.by_seq.get(first.seq)
    if call is None:
        v.add("phantom", f"job {jid}: ran (seq {first.seq}) but no producer call has that sequence number")
    elif call.id is not None and call.id != jid:
        v.add("phantom", f"job {jid}: ran with seq {first.seq}, whose call returned id {call.id}")
    elif call.outcome == "error":
        v.counts["runs_of_failed_calls"] += 1


def check_run(jid: str, run_at: float, r: Run, facts: Facts, v: Verdict) -> None:
    """One run: not early, and ended unless its worker was killed."""
    p = facts.h.params
    if r.start < run_at - p.early_tolerance:
        v.add("early", f"job {jid} attempt {r.attempt} (pid {r.pid}) started at {r.start:.4f}, "
              f"{(run_at - r.start) * 1000:.1f} ms before its run_at {run_at:.3f}")
    elif r.start < r.due - p.early_tolerance:
        v.add("early", f"job {jid} attempt {r.attempt} (pid {r.pid}) started at {r.start:.4f}, "
              f"{(r.due - r.start) * 1000:.1f} ms before this attempt was due ({r.due:.3f})")
    if r.end is None and not any(t >= r.start - p.clock_tolerance for t in facts.kills.get(r.pid, [])):
        v.add("unfinished", f"job {jid} attempt {r.attempt} (pid {r.pid}, fence {r.fence}) started at "
              f"{r.start:.3f} and never ended, but its worker was not killed")


def check_extras(jid: str, rs: list[Run], facts: Facts, v: Verdict) -> None:
    """Every run of a job after its first is explained by the run before it."""
    for prev, cur in pairwise(rs):
        v.counts["extra"] += 1
        why = explain_extra(prev, cur, facts.h, facts.down, facts.rb, facts.losses)
        if why is None:
            v.add("unexplained_extra",
                  f"job {jid}: run {cur.attempt} (pid {cur.pid}, fence {cur.fence}, start {cur.start:.3f}) after "
                  f"run {prev.attempt} (pid {prev.pid}, fence {prev.fence}, {prev.start:.3f}-"
                  f"{'none' if prev.end is None else f'{prev.end:.3f}'}): that worker was neither killed nor "
                  "stopped then, logged no lease loss, and no Redis rollback covers it")
        else:
            v.explained[why] += 1


def check_job(jid: str, rs: list[Run], facts: Facts, v: Verdict) -> None:
    """The runs of one job (in fence order)."""
    check_origin(jid, rs[0], facts, v)
    try:
        run_at = job_run_at(jid)
    except ValueError:
        v.add("phantom", f"run of a malformed job id {jid!r}")
        return
    for r in rs:
        check_run(jid, run_at, r, facts, v)
    check_extras(jid, rs, facts, v)


def check_leftovers(final: Final, v: Verdict) -> None:
    """After quiescing, nothing is live: per queue (stats) and per job of the history."""
    if not final.quiesced:
        v.add("leftover", f"the namespace did not quiesce: {final.quiesce_error}")
    for q, st in final.stats.items():
        for k in LIVE_STATES:
            if st.get(k, 0):
                v.counts["leftover"] += st[k]
                v.add("leftover", f"queue {q}: {st[k]} job(s) {k} after quiescing")
    live = sorted((jid, s) for jid, s in final.states.items() if s in LIVE_STATES)
    for jid, s in live:
        v.add("leftover", f"job {jid} is {s} after quiescing")
    if not v.counts["leftover"]:
        v.counts["leftover"] = len(live)


def check(h: History) -> Verdict:
    """Judge a history: every violation category of the module docstring, with counts."""
    v = Verdict()
    for f in h.faults:
        v.faults[f.kind] += 1
    facts = Facts.of(h)
    for c in h.calls:
        check_call(c, facts, v)
    v.counts["runs"] = len(h.runs)
    for jid, rs in facts.runs_by_id.items():
        check_job(jid, rs, facts, v)
    check_leftovers(h.final, v)
    return v


def windows_summary(faults: list[Fault]) -> str:
    """The fault timeline, for failure messages."""
    t0 = min((f.t for f in faults), default=0.0)
    return "\n".join(f"  {f.t - t0:8.2f}..{f.until - t0:8.2f} {f.kind:<22} {f.target:<14} pid={f.pid} {f.info}"
                     for f in sorted(faults, key=lambda f: f.t))
