"""The history of a chaos run: what the producer was told, what handlers did, what workers logged,
and what the nemesis broke. Plain data (dataclasses), written as files while the run goes on and
read back for the checker (``tests/chaos/checker.py``), so a failed run can be checked again offline.

Files in the history directory:

* ``producer-N.jsonl``: one JSON object per ``schedule`` call (:class:`Call`), written by producer N.
* ``runs-PID.log``: one line per handler start and end, written by the worker app in process PID
  with one ``O_APPEND`` ``write()`` each (atomic, unbuffered: a kill -9 cannot lose a line that was
  written, the kernel has it; only a line not yet written is missing). Format::

      START|END  JOB_ID  ATTEMPT  FENCE  PID  TIME  DUE  SEQ

  ``TIME`` and ``DUE`` (when this attempt became due) are epoch seconds; ``SEQ`` is the producer's
  sequence number from the payload (ties a run to its ``schedule`` call even when the call failed).
* ``worker-*.log``: each worker process's own log; lease losses are parsed from it
  (:func:`parse_worker_log`).
* ``nemesis.jsonl``: one JSON object per fault (:class:`Fault`), written when the fault is healed.
* ``final.json``: the namespace's counts after quiescing and the final state of every job.

Times are ``time.time()`` of the same host everywhere (producer, handlers, nemesis, Redis ``TIME``).
Only complete lines are read: a process killed while writing loses that line only.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

# -- records ---------------------------------------------------------------------------------------


@dataclass
class Call:
    """One ``schedule`` call of a producer.

    ``outcome``: ``ok`` (returned: the job exists and, with ``durable="replica"``, a replica has it),
    ``durability_timeout`` (``DurabilityTimeout``: written to the master, replica not confirmed; ``id``
    is known) or ``error`` (any other exception; ``id`` unknown, the job may or may not exist)."""

    seq: int
    producer: int
    t0: float                 # call started
    t1: float                 # call returned or raised (= acknowledged at, for ok)
    outcome: str
    run_at: float             # requested run_at, epoch s (ms precision, as in the id)
    id: str | None = None
    error: str | None = None  # "Type: message"


@dataclass
class Run:
    """One handler run (a START line, with its END line if there is one)."""

    id: str
    seq: int
    attempt: int
    fence: int
    pid: int
    start: float
    due: float                # when this attempt became due (the claim's due_ms)
    end: float | None = None  # None: no END line (the worker died during the run, or is still in it)


@dataclass
class LeaseLoss:
    """A worker log line saying an outcome or heartbeat of a job was refused.

    ``kind``: ``lost`` (WARNING "the lease was lost") or ``uncertain`` (INFO "refused after a
    connection error": either applied before the connection dropped or the lease had expired)."""

    pid: int
    id: str
    t: float
    kind: str
    what: str


@dataclass
class Fault:
    """One fault injected by the nemesis (or a Redis master change it observed).

    ``t``: when the fault began (kill, SIGSTOP, stall start, master kill); ``until``: when it was
    healed (restarted and ready, SIGCONT, stall over, failover settled). ``info`` per kind:

    * ``failover``: ``promoted_at`` (the replica is master), ``old_port``, ``new_port``
    * ``restart-master``: ``up_at`` (answers again), ``became_failover`` (Sentinel promoted anyway)
    * ``kill-replica``: ``up_at``
    * ``stop-worker``/``stop-sched``: ``seconds``; ``stop-worker`` also ``long`` (past the job lease)
    * ``observed-master-change``: a master change nobody asked for (``old_port``, ``new_port``)
    """

    kind: str
    target: str
    pid: int | None
    t: float
    until: float
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Final:
    """The namespace after quiescing: ``stats`` (queue -> scheduled/ready/running/dead) and the state
    of every job the history knows of (``None``: no record at all, not even a tombstone)."""

    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    states: dict[str, str | None] = field(default_factory=dict)
    quiesced: bool = True
    quiesce_error: str | None = None


@dataclass
class Params:
    """Settings the checker needs to judge the history."""

    lease: float = 4.0               # job lease (s)
    retry_budget: float = 10.0       # the producers' retry budget (the client's default; informational)
    durable_timeout: float = 1.5     # producer durable_timeout (s)
    rollback_window: float = 2.0     # writes acknowledged this long before a master kill may be lost
    ack_slack: float = 2.0           # an outcome normally reaches Redis within this after END
    early_tolerance: float = 0.0015  # runs may start this much before run_at (ms rounding)
    clock_tolerance: float = 0.05    # between times taken in different processes


@dataclass
class History:
    calls: list[Call] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    losses: list[LeaseLoss] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    final: Final = field(default_factory=Final)
    params: Params = field(default_factory=Params)
    t_start: float = 0.0
    t_end: float = 0.0


# -- writing ---------------------------------------------------------------------------------------


class JsonlWriter:
    """Appends one JSON object per line, flushed at once (a crash of the test loses nothing written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 - line-buffered, closed by close()

    def write(self, obj: Any) -> None:
        self._f.write(json.dumps(asdict(obj) if hasattr(obj, "__dataclass_fields__") else obj) + "\n")

    def close(self) -> None:
        self._f.close()


def complete_lines(path: Path) -> list[str]:
    """The complete lines of a file another process may be writing (or died writing)."""
    text = path.read_text(errors="replace")
    return text[: text.rfind("\n") + 1].splitlines()


# -- reading ---------------------------------------------------------------------------------------


def read_calls(d: Path) -> list[Call]:
    out = []
    for f in sorted(d.glob("producer-*.jsonl")):
        out += [Call(**json.loads(line)) for line in complete_lines(f) if line.strip()]
    return out


def read_faults(d: Path) -> list[Fault]:
    f = d / "nemesis.jsonl"
    return [Fault(**json.loads(line)) for line in complete_lines(f) if line.strip()] if f.exists() else []


def parse_run_lines(lines: Iterable[str]) -> list[Run]:
    """Pair START and END lines by (job id, fence): a fence is unique per claim of a job."""
    runs: dict[tuple[str, int], Run] = {}
    ends: dict[tuple[str, int], float] = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 8:
            continue  # not a run line (never expected: lines are written whole)
        kind, jid, attempt, fence, pid, at, due, seq = parts
        key = (jid, int(fence))
        if kind == "START":
            runs[key] = Run(jid, int(seq), int(attempt), int(fence), int(pid), float(at), float(due))
        elif kind == "END":
            ends[key] = float(at)
    for key, end in ends.items():
        if key in runs:
            runs[key].end = end
    return sorted(runs.values(), key=lambda r: (r.start, r.fence))


def read_runs(d: Path) -> list[Run]:
    lines: list[str] = []
    for f in sorted(d.glob("runs-*.log")):
        lines += complete_lines(f)
    return parse_run_lines(lines)


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_LOST = re.compile(r"job (\w+) \(queue '[^']*'\): (.+?) refused, the lease was lost")
_UNCERTAIN = re.compile(r"(\S+(?: \S+)?) of job (\w+) was refused after a connection error")


def parse_worker_log(pid: int, lines: Iterable[str]) -> list[LeaseLoss]:
    """Lease losses a worker logged (``workers/worker.py`` ``_lease_lost``)."""
    out = []
    for line in lines:
        m = _LOG_TIME.match(line)
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() if m else 0.0
        if (lm := _LOST.search(line)) is not None:
            out.append(LeaseLoss(pid, lm.group(1), t, "lost", lm.group(2)))
        elif (um := _UNCERTAIN.search(line)) is not None:
            out.append(LeaseLoss(pid, um.group(2), t, "uncertain", um.group(1)))
    return out


def read_losses(d: Path) -> list[LeaseLoss]:
    out: list[LeaseLoss] = []
    for f in sorted(d.glob("worker-*.log")):
        m = re.match(r"worker-\w+-(\d+)\.log$", f.name)
        if m:
            out += parse_worker_log(int(m.group(1)), complete_lines(f))
    return out


def read_final(d: Path) -> tuple[Final, Params, float, float]:
    f = d / "final.json"
    if not f.exists():
        return Final(quiesced=False, quiesce_error="no final.json"), Params(), 0.0, 0.0
    obj = json.loads(f.read_text())
    return Final(**obj["final"]), Params(**obj["params"]), obj["t_start"], obj["t_end"]


def write_final(d: Path, final: Final, params: Params, t_start: float, t_end: float) -> None:
    (d / "final.json").write_text(json.dumps({"final": asdict(final), "params": asdict(params),
                                              "t_start": t_start, "t_end": t_end}))


def load(d: Path) -> History:
    """Read a whole history directory (e.g. one kept by a failed run: ``check_dir``)."""
    final, params, t0, t1 = read_final(d)
    return History(read_calls(d), read_runs(d), read_losses(d), read_faults(d), final, params, t0, t1)
