"""The console's actions: (client, target, form fields, selected ids) -> a message for the page,
or for the dead letters a dry run to confirm (:class:`Confirm`) or a background requeue to start
(:class:`StartRequeue`). Each goes through the same admin helpers as the CLI; a refusal is a
ValueError or an AdminError, shown on the page the action came from."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ...client import Client
from ...protocol.codes import Outcome
from ...protocol.models import JobState
from .. import admin
from . import params, views
from .tasks import ALL_QUEUES

PAGE = 50
SYNC_REQUEUE = 500  # a requeue without a rate of at most this many jobs (one batch) runs in the request

Action = Callable[[Client, str, dict[str, str], list[str]], Any]


@dataclass
class Confirm:
    """A dead-letter action's dry run: how many jobs it would touch, shown before confirming."""

    op: str
    count: int
    rows: list[Any]
    fields: dict[str, str]
    ids: list[str]


@dataclass
class StartRequeue:
    """A confirmed requeue to run in the background (with a rate, or more than one batch)."""

    scope: str
    jobs: list[Any]
    rate: float | None


def return_to(fields: Mapping[str, str], kind: str, target: str) -> str:
    """Where the browser goes after an action: the form's ``back`` when it is a console path."""
    back = params.local_path(fields.get("back", ""))
    if back is not None:
        return back
    return {"job": f"/job/{target}", "cron": "/crons", "dead": "/dead"}.get(kind, "/")


def dead_listing(client: Client, query: params.DeadQuery) -> admin.DeadPage:
    """The page of dead jobs matching the dead-letter page's filter, newest death first (as
    ``zsched dead list``), with the total and the marks of the pages before and after."""
    lo = query.start.timestamp() * 1000 if query.start else float("-inf")
    hi = query.end.timestamp() * 1000 if query.end else float("inf")
    return admin.dead_page(client, query.filter, query.limit, older_than=query.older, newer_than=query.newer,
                           lo_ms=lo, hi_ms=hi)


def _dead_matching(client: Client, fields: dict[str, str], ids: list[str]) -> list[Any]:
    if ids:
        infos = client.get_many(ids)
        return [i for i in infos.values() if i is not None and i.state is JobState.DEAD]
    q = params.dead_query(fields)
    return [i for i in admin.iter_dead(client, q.filter) if views.in_range(i.died_at, q.start, q.end)]


def _dead_op(op: str) -> Action:
    def run(client: Client, _target: str, fields: dict[str, str], ids: list[str]) -> Any:
        rate = params.rate(fields.get("rate", ""))
        jobs = _dead_matching(client, fields, ids)
        if fields.get("confirm") != "1":
            return Confirm(op, len(jobs), jobs[:PAGE], fields, [j.id for j in jobs] if ids else [])
        if op == "purge":
            for j in jobs:
                admin.purge_one(client, j.id)
            return f"purged {len(jobs)} dead jobs"
        if rate is not None or len(jobs) > SYNC_REQUEUE:
            queues = {j.queue for j in jobs}
            scope = fields.get("queue") or (queues.pop() if len(queues) == 1 else ALL_QUEUES)
            return StartRequeue(scope, jobs, rate)
        done = sum(1 for o in admin.requeue_stream(client, jobs, rate=None) if o.status == "requeued")
        return f"requeued {done} of {len(jobs)} dead jobs"
    return run


def _reschedule(client: Client, jid: str, fields: dict[str, str], _ids: list[str]) -> str:
    at = params.local_time("at", fields.get("at", ""), fields.get("tz", ""))
    info = admin.reschedule_job(client, jid, int(at.timestamp() * 1000))
    return f"job {jid} rescheduled to {admin.iso(info.run_at)}"


def _run_now(client: Client, jid: str, _f: dict[str, str], _ids: list[str]) -> str:
    admin.reschedule_job(client, jid, int(datetime.now(UTC).timestamp() * 1000))
    return f"job {jid} runs now"


def _cancel(client: Client, jid: str, _f: dict[str, str], _ids: list[str]) -> str:
    admin.cancel_job(client, jid)
    return f"job {jid} cancelled"


def _requeue(client: Client, jid: str, _f: dict[str, str], _ids: list[str]) -> str:
    admin.get_dead_job(client, jid)
    done, _info = admin.requeue_one(client, jid)
    return f"job {jid} requeued" if done else f"job {jid} was not dead any more"


def _purge(client: Client, jid: str, _f: dict[str, str], _ids: list[str]) -> str:
    admin.purge_one(client, jid)
    return f"job {jid} purged"


def _queue(pause: bool) -> Action:
    def run(client: Client, queue: str, _f: dict[str, str], _ids: list[str]) -> str:
        name = admin.parse_queue(queue)
        changed = client.pause(name) if pause else client.resume(name)
        verb = "paused" if pause else "resumed"
        return f"queue {name} {verb}" if changed else f"queue {name} was already {verb if pause else 'running'}"
    return run


def _cron(pause: bool) -> Action:
    def run(client: Client, name: str, _f: dict[str, str], _ids: list[str]) -> str:
        outcome = client.pause_cron(name) if pause else client.resume_cron(name)
        if outcome is Outcome.NO_CRON:
            raise admin.NotFound(f"no cron named {name!r}")
        verb = "paused" if pause else "resumed"
        return f"cron {name} {verb}" if outcome else f"cron {name} was already {verb if pause else 'active'}"
    return run


ACTIONS: dict[tuple[str, str], Action] = {
    ("job", "cancel"): _cancel, ("job", "reschedule"): _reschedule, ("job", "run-now"): _run_now,
    ("job", "requeue"): _requeue, ("job", "purge"): _purge,
    ("queue", "pause"): _queue(True), ("queue", "resume"): _queue(False),
    ("cron", "pause"): _cron(True), ("cron", "resume"): _cron(False),
    ("dead", "requeue"): _dead_op("requeue"), ("dead", "purge"): _dead_op("purge"),
}
"""Every action by (kind, op), as ``/action/{kind}/{target}/{op}`` names it."""


def described(kind: str, op: str, target: str, fields: Mapping[str, str], ids: list[str]) -> str:
    """An action as the audit log names it: what it acted on, not its URL's words. A dead-letter
    action names the jobs it was given (``dead requeue of 1 selected job: ID``), or its filter
    (``dead purge of the jobs matching queue=mail``) when none was selected."""
    if kind != "dead":
        return f"{kind} {op} {target}"
    if ids:
        shown = " ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
        return f"dead {op} of {len(ids)} selected job{'' if len(ids) == 1 else 's'}: {shown}"
    scope = ", ".join(f"{k}={fields[k]}" for k in ("queue", "error", "since", "until", "tz")
                      if fields.get(k) and not (k == "tz" and not (fields.get("since") or fields.get("until"))))
    return f"dead {op} of the jobs matching {scope}" if scope else f"dead {op} of every dead job"
