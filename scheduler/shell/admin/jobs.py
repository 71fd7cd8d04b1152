"""One job at a time, for an operator: open a client, look a job up, cancel, reschedule, requeue
or purge it, page through a queue. A refusal is a NotFound or WrongState that names the job's
state and what to do instead."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from ...client import Client
from ...protocol import config
from ...protocol.codec import decode_tombstone
from ...protocol.codes import Outcome
from ...protocol.ids import encode_id, partition_for_key
from ...protocol.keys import Keyspace
from ...protocol.masking import mask_secrets
from ...protocol.models import JobInfo, JobState
from ...redisio.connection import sync_redis
from .errors import AdminError, BadInput, NotFound, WrongState


def open_client(url: str | None, namespace: str | None, *, create: bool = False) -> Client:
    """Connect for an operator command.

    With ``create=False`` (every command but ``schedule``) a namespace that does not exist in Redis
    is an error (NotFound) instead of being created on the fly, so a typo in ``--namespace`` does
    not show an empty, healthy-looking system.
    """
    u = config.redis_url(url)
    ns = config.namespace(namespace)
    r = sync_redis(u, socket_connect_timeout=5, socket_timeout=60)
    try:
        if not create and not r.exists(Keyspace(ns, 1).config_key):
            raise NotFound(f"namespace {ns!r} does not exist at {mask_secrets(u)} (nothing was ever scheduled in it); "
                           "check --namespace / ZSCHED_NAMESPACE and --redis / ZSCHED_REDIS_URL")
        return Client(r, namespace=ns).connect()
    except BaseException:
        r.close()
        raise


def redis_now_ms(client: Client) -> int:
    """The Redis server clock (the clock the scripts stamp deaths and leases with)."""
    secs, usecs = client.redis.time()
    return int(secs) * 1000 + int(usecs) // 1000


def _not_found(client: Client, job_id: str) -> NotFound:
    return NotFound(f"job {job_id} not found in namespace {client.keyspace.namespace!r} "
                    "(unknown id, or it finished and its tombstone expired)")


def get_job(client: Client, job_id: str) -> JobInfo:
    """The job, or NotFound (unknown id, or a finished job whose tombstone expired)."""
    info = client.get(job_id)
    if info is None:
        raise _not_found(client, job_id)
    return info


def get_job_by_key(client: Client, key: str) -> JobInfo:
    """The live job holding idempotency ``key``, else the one that last finished with it while its
    tombstone lives (:func:`find_finished_by_key`); NotFound naming how far the search went."""
    info = client.get_by_key(key)
    if info is not None:
        return info
    info, complete = find_finished_by_key(client, key)
    if info is not None:
        return info
    searched = ("" if complete else
                f"; only the first {FINISHED_SCAN_LIMIT} tombstones of its partition were searched")
    raise NotFound(f"no job with key {key!r} in namespace {client.keyspace.namespace!r}: none holds it now and no "
                   f"finished one with it is still remembered (tombstones expire){searched}")


def _refused(client: Client, job_id: str, outcome: Outcome, action: str, done: str, allowed: str,
             hints: dict[JobState, str]) -> AdminError:
    """Explain why ``action`` was refused. When the outcome does not name the job's state (it was
    not found live, or is not dead), the job is inspected once more to name it."""
    state = outcome.state
    if state is None:
        info = client.get(job_id)
        if info is None:
            return _not_found(client, job_id)
        state = info.state
    hint = hints.get(state, "")
    return WrongState(f"cannot {action} job {job_id}: it is {state.value}; only {allowed} jobs can be "
                      f"{done}{'; ' + hint if hint else ''}", state)


def cancel_job(client: Client, job_id: str) -> None:
    """Cancel a scheduled or ready job; WrongState/NotFound say why not."""
    outcome = client.cancel(job_id)
    if outcome:
        return
    if outcome is Outcome.CRON_OCCURRENCE:
        info = get_job(client, job_id)
        name = (info.key or "cron:?:").split(":")[1]
        raise WrongState(f"cannot cancel job {job_id}: it is the pending occurrence of cron {name!r}, and a cron "
                         f"always has exactly one; remove or replace the cron instead (zsched cron remove {name})",
                         info.state)
    raise _refused(client, job_id, outcome, "cancel", "cancelled", "scheduled or ready", {
        JobState.RUNNING: Outcome.RUNNING.message,
        JobState.DEAD: f"delete it with: zsched dead purge {job_id}",
    })


def reschedule_job(client: Client, job_id: str, at_ms: int | timedelta) -> JobInfo:
    """Move a scheduled or ready job to ``at_ms`` (epoch ms, or a timedelta from now that the
    script resolves on Redis's clock); returns the job as it is now."""
    outcome = client.reschedule(job_id, at_ms if isinstance(at_ms, timedelta) else at_ms / 1000)
    if not outcome:
        raise _refused(client, job_id, outcome, "reschedule", "rescheduled", "scheduled or ready", {
            JobState.RUNNING: Outcome.RUNNING.message,
            JobState.DEAD: f"bring it back with: zsched dead requeue {job_id} --at WHEN",
        })
    return get_job(client, job_id)


def get_dead_job(client: Client, job_id: str) -> JobInfo:
    """The job if it is dead; WrongState naming its state if not, NotFound if unknown."""
    info = get_job(client, job_id)
    if info.state is not JobState.DEAD:
        raise WrongState(f"job {job_id} is not dead: it is {info.state.value} (see: zsched job show {job_id})",
                         info.state)
    return info


def requeue_one(client: Client, job_id: str, at_ms: int | timedelta | None = None) -> tuple[bool, JobInfo]:
    """Requeue one dead job (now, or at ``at_ms``: epoch ms, or a timedelta from now resolved on
    Redis's clock). Returns (requeued, job after).

    ``requeued`` is False when the job exists but is not dead (already requeued, or never died):
    nothing was changed, which is what makes requeuing idempotent. Unknown ids raise NotFound.
    """
    outcome = client.requeue(job_id, at_ms if isinstance(at_ms, timedelta) else at_ms / 1000 if at_ms else None)
    return bool(outcome), get_job(client, job_id)


def purge_one(client: Client, job_id: str) -> None:
    """Delete one dead job for good; WrongState/NotFound say why not."""
    outcome = client.purge(job_id)
    if outcome:
        return
    raise _refused(client, job_id, outcome, "purge", "purged", "dead", {
        JobState.SCHEDULED: f"to drop it use: zsched job cancel {job_id}",
        JobState.READY: f"to drop it use: zsched job cancel {job_id}",
    })


def list_jobs(client: Client, queue: str, state: str, limit: int = 50, cursor: str | None = None,
              run_at_from: Any = None, run_at_to: Any = None) -> tuple[list[JobInfo], str | None]:
    """One page of a queue's jobs in one state (``client.jobs``): (jobs, next cursor or None).
    ``run_at_from``/``run_at_to``: scheduled jobs due in that range only (read as a range).
    A malformed cursor, one of another listing, or a range with another state is BadInput."""
    try:
        return client.jobs(queue=queue, state=state, limit=limit, cursor=cursor, run_at_from=run_at_from,
                           run_at_to=run_at_to)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


FINISHED_SCAN_LIMIT = 200_000
"""Tombstones read at most when finding a finished job by its idempotency key (about a second)."""


def find_finished_by_key(client: Client, key: str, limit: int | None = None) -> tuple[JobInfo | None, bool]:
    """The job that last finished (done, cancelled, misfired) holding idempotency ``key``, while
    its tombstone lives, and whether every tombstone of the key's partition was searched.

    A key names its job in the ``k`` index only while the job lives (a finished job's key is free
    for a new job), but its tombstone keeps it, in the key's partition (``f``, keys.py). Nothing
    indexes tombstones by key, so this reads that partition's tombstones (HSCAN, no lock, no
    write), at most ``limit`` (default :data:`FINISHED_SCAN_LIMIT`) of them: an operator's
    look-up, not a producer's."""
    limit = FINISHED_SCAN_LIMIT if limit is None else limit
    ks = client.keyspace
    raw = key.encode("utf-8")
    best: tuple[int, str] | None = None
    seen, now = 0, redis_now_ms(client)
    for field, value in client.redis.hscan_iter(ks.key(partition_for_key(key, ks.partitions), "f"), count=1000):
        seen += 1
        if raw in value:  # cheap test first: most summaries do not hold the key's bytes at all
            t = decode_tombstone(value)
            if t.key == key and t.expires_ms > now and (best is None or t.finished_ms > best[0]):
                best = (t.finished_ms, encode_id(field))
        if seen >= limit:
            break
    complete = seen < limit
    return (client.get(best[1]) if best else None), complete
