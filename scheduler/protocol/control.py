"""Queue pause and resume, cron resume and look-ups by idempotency key: the steps around the
scripts (config-hash commands, script calls, reply parsing; ``cron_pause_status`` from
:mod:`.codes`) that :class:`~scheduler.Client` and
:class:`~scheduler.AsyncClient` share, so each client only sends them (blocking or awaited).

A queue's pause is kept twice: namespace-wide in ``{ns}:cfg`` (field ``paused:QUEUE`` -> epoch ms
the pause started; the record an operator reads and ``migrate-partitions`` carries over) and in
each partition's ``paused`` hash, which ``claim`` reads (lua/pause.lua, lua/resume.lua).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .call import Call
from .codes import Outcome, cron_pause_status, toggled
from .ids import encode_id
from .keys import validate_name

if TYPE_CHECKING:
    from .calls import Calls

__all__ = ["PAUSED_PREFIX", "QueuePause", "cron_pause_status", "cron_resume_call", "epoch_reset_call", "key_holder",
           "migrate_in_call", "migrate_out_call", "parse_paused", "paused_field", "paused_queues", "queue_resumed",
           "time_ms", "toggled"]

PAUSED_PREFIX = "paused:"  # {ns}:cfg field paused:QUEUE -> epoch ms when the queue was paused


def paused_field(queue: str) -> str:
    """The config field that says ``queue`` is paused (checked name)."""
    return PAUSED_PREFIX + validate_name("queue", queue)


def parse_paused(cfg: Mapping[Any, Any]) -> dict[str, int]:
    """Queue -> epoch ms when its pause started, from the namespace config."""
    out: dict[str, int] = {}
    prefix = PAUSED_PREFIX.encode()
    for k, v in cfg.items():
        if k.startswith(prefix):
            try:
                out[k[len(prefix):].decode()] = int(v)
            except ValueError:
                continue
    return out


def paused_queues(cfg: Mapping[Any, Any]) -> dict[str, datetime]:
    """``paused()``'s result from the namespace config: queue -> when its pause started, by name."""
    return {q: datetime.fromtimestamp(ms / 1000, tz=UTC) for q, ms in sorted(parse_paused(cfg).items())}


def time_ms(reply: Any) -> int:
    """A Redis ``TIME`` reply ``(seconds, microseconds)`` -> epoch milliseconds."""
    sec, usec = reply
    return int(sec) * 1000 + int(usec) // 1000


class QueuePause:
    """One ``pause(queue)``, in three round trips the client sends::

        p = QueuePause(calls, queue)
        pipe = redis.pipeline(transaction=False); p.config_commands(pipe, time_ms(redis.time()))
        changed = p.result(transport.call_many(p.script_calls(pipe.execute())))

    The config field is set only if absent (HSETNX), so a second pause keeps the first start time,
    and every partition is given that same time (a re-send or a retry changes nothing)."""

    def __init__(self, calls: Calls, queue: str) -> None:
        self.calls, self.queue, self.field = calls, queue, paused_field(queue)
        self.fresh = False

    def config_commands(self, pipe: Any, now_ms: int) -> None:
        """Queue on a pipeline: set the namespace-wide flag unless set, then read its start time."""
        pipe.hsetnx(self.calls.ks.config_key, self.field, str(now_ms))
        pipe.hget(self.calls.ks.config_key, self.field)

    def script_calls(self, config_replies: list[Any]) -> list[Call]:
        """From the replies of :meth:`config_commands`: the ``pause`` call of every partition."""
        fresh, since = config_replies
        self.fresh = bool(fresh)
        return self.calls.pause_calls(self.queue, int(since))

    def result(self, replies: list[Any]) -> Outcome:
        """``DONE`` when the queue was paused now (anywhere), ``UNCHANGED`` when it already was
        everywhere."""
        return toggled(self.fresh or any(int(r) for r in replies))


def queue_resumed(config_deleted: Any, replies: list[Any]) -> Outcome:
    """``resume()``'s outcome from the HDEL of the config flag and the partitions' ``resume`` replies."""
    return toggled(bool(config_deleted) or any(int(r) for r in replies))


def cron_resume_call(calls: Calls, name: str, definition: Any, now_ms: int) -> Call | None:
    """The ``cron_resume`` call from the cron's stored definition (``HGET cron_definition_key
    def``); None when there is no such cron (no definition: the outcome is ``NO_CRON``)."""
    if not isinstance(definition, bytes):
        return None
    return calls.cron_resume_call(name, definition, now_ms)


def key_holder(raw: Any) -> str | None:
    """The job id an idempotency key maps to (``HGET key_index(key) key``), or None."""
    return encode_id(raw) if isinstance(raw, bytes) else None


# -- operator scripts: epoch reset, partition migration --------------------------------------------


def epoch_reset_call(calls: Calls, partition: int, expected_epoch: int) -> Call:
    """``epoch_reset``: forget ``partition``'s stored ownership epoch if it is still
    ``expected_epoch`` (``zsched epochs reset``; lua/epoch_reset.lua)."""
    return calls.call("epoch_reset", partition, expected_epoch)


def migrate_out_call(calls: Calls, partition: int, to: int, batch: int, delivered: Sequence[bytes] = ()) -> Call:
    """``migrate_out``: walk up to ``batch`` entries of ``partition`` into its outbox for the new
    count ``to``, dropping the entries ``delivered`` by the last round (lua/migrate_out.lua)."""
    return calls.call("migrate_out", partition, to, batch, *delivered)


def migrate_in_call(calls: Calls, partition: int, floor: int, again: int, items: Sequence[Any]) -> Call:
    """``migrate_in``: take ``items`` (field, entry pairs) into ``partition`` of the new count;
    ``again`` (1): entries delivered before, looked up so none is taken twice (lua/migrate_in.lua)."""
    return calls.call("migrate_in", partition, floor, again, *items)

