"""Building the producer side's script calls and reading their replies: :class:`Calls`.

:class:`Calls` is bound to one namespace's :class:`~.keys.Keyspace`; it validates input, builds
the ``(script, keys, args)`` triples the transports send (:data:`~.transport.Call`) and turns the
replies into typed values (with :mod:`.replies` and :mod:`.codes`). It does no I/O, so the
blocking client, the asyncio client, the tier, the workers and the operator tools share it and
cannot disagree about the wire format. Job options live in :mod:`.options`, the paging of
``jobs()`` in :mod:`.listing`.
"""
from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence, Sized
from datetime import timedelta
from typing import Any

import msgpack

from . import codec
from .call import Call
from .codec import RESERVED_KEY_PREFIX, build_record, finite_number, pack_payload, split_template, validate_key
from .codes import Outcome, requeue_outcomes
from .cron import LOOKAHEAD, MAX_JITTER_S, CronInfo, occurrences, validate_expression, validate_tz, with_jitter
from .errors import MisfiredAtSchedule, ScriptError
from .ids import (
    IdGenerator,
    decode_id,
    derived_id,
    encode_id,
    id_names,
    partition_for_key,
    partition_of,
    placement_for_key,
)
from .keys import Keyspace, validate_name
from .listing import LIST_MAX_LIMIT, LIST_STATES, ListWalk, MergeWalk, list_walk
from .models import JobInfo, JobState
from .options import MISFIRE_POLICIES, JobOptions
from .replies import ScheduleReply, dead_list_infos, inspect_infos, job_info, parse_schedule
from .timeutil import MAX_MS, At, job_time_ms, ms_to_datetime

# LIST_* (listing.py) and MISFIRE_POLICIES (options.py) are re-exported: the CLI's argument
# choices are imported from here.
__all__ = ["BATCH", "CLAIM_MAX", "INSPECT_BATCH", "LIST_MAX_LIMIT", "LIST_STATES", "MISFIRE_POLICIES",
           "RESERVED_KEY_PREFIX", "Calls", "error_arg", "id_list", "tombstone_ms",
           "validate_key"]

BATCH = 1000  # jobs per schedule script call: bounded work per EVALSHA
INSPECT_BATCH = 500  # ids per inspect script call (get_many): bounded work per EVALSHA
CLAIM_MAX = 5000  # jobs one claim call takes at most (lua/claim.lua refuses more: bounded work per EVALSHA)


def error_arg(etype: str, message: str, tb: str = "", limit: int = 4096) -> bytes:
    """Build the error argument of ``fail`` (bounded; NULs removed so the format stays parseable)."""
    etype, message, tb = (s.replace("\0", " ") for s in (etype, message, tb))
    etype = etype[:200]
    message = message[: max(0, limit - len(etype))]
    tb = tb[-max(0, limit - len(etype) - len(message)):] if limit - len(etype) - len(message) > 0 else ""
    return f"{etype}\0{message}\0{tb}".encode("utf-8", "replace")


def id_list(job_ids: Iterable[str]) -> list[str]:
    """Job ids as a list; one id passed by mistake is refused instead of read as its characters."""
    if isinstance(job_ids, (str, bytes)):
        raise TypeError("job_ids must be a list of job ids, not one id (use get() for one)")
    return list(job_ids)


def tombstone_ms(tombstone_ttl: object) -> int:
    """How long finished jobs keep a tombstone (``get()`` answers for them), checked, in ms."""
    ttl = finite_number("tombstone_ttl", tombstone_ttl)
    if not 0 <= ttl * 1000 <= MAX_MS:  # the scripts take no longer one (lua/_lib_args.lua MAX_MS)
        raise ValueError(f"tombstone_ttl must be from 0 to {MAX_MS // 1000} seconds, got {tombstone_ttl!r}")
    return int(ttl * 1000)


UNFENCED = frozenset({"ack", "fail", "extend", "release", "epoch_reset", "migrate_out", "migrate_in"})
"""Scripts not behind the layout fence: they finish a running job where it runs, which
``zsched migrate-partitions`` lets happen while it moves the others (see docs/scaling.md)."""


ONE_KEY_OFF_CLUSTER = frozenset({"schedule", "tick", "claim", "ack", "reap"})
"""Scripts that may declare only the partition's timer set and name its other keys from the prefix
(lua/_lib.lua, K_T): the hot paths of producers (schedule), the tier (tick, and reap: two a second
per partition, idle or not) and workers (claim, ack), where 13 more declared keys cost about 11-15 k
Redis instructions per call (callgrind: a tenth of a one-job schedule's, 5 % of a tick's, a claim's
or an ack's) and their bytes on the wire. Only off a cluster (``Calls(declare_all_keys=False)``):
while a slot migrates, Redis Cluster decides between running a script, ASK and TRYAGAIN by its
declared keys, and a script that wrote undeclared keys on the
importing node would make the migration fail with BUSYKEY (tests/fault/test_cluster_faults.py
reshards under load)."""


class Calls:
    """The producer side's script calls for one namespace: builders and reply parsers."""

    def __init__(self, keyspace: Keyspace, *, max_payload_bytes: int, tombstone_ttl: float,
                 declare_all_keys: bool = True) -> None:
        self.ks = keyspace
        # False: the server is not a cluster, the scripts of ONE_KEY_OFF_CLUSTER declare one key
        self.declare_all_keys = declare_all_keys
        self.max_payload = int(max_payload_bytes)
        self.tomb_ms = tombstone_ms(tombstone_ttl)
        self.ids = IdGenerator()
        self.clock_offset_ms = 0  # Redis clock - this host's clock, from the last schedule reply
        # This host's clock (epoch seconds): ids' run_at estimates, created times, cron plans;
        # scheduler.testing puts its fake clock here, as its Redis's TIME.
        self.clock: Callable[[], float] = time.time
        self._keys = [keyspace.partition_keys(p) for p in range(keyspace.partitions)]
        # CHAN per partition: "ns:" for plain pub/sub, the partition's "{ns:p}:" when sharded (the
        # scripts' publish() picks PUBLISH or SPUBLISH from it; see Keyspace.channel_prefix)
        # ARGV[3] is "p/P" (partition/count) for the scripts behind the layout fence, so a caller
        # with an outdated count is refused instead of looking in the wrong partition (lua/_lib.lua
        # layout_fence); "p" for those that finish a running job, which may run during a migration.
        P = keyspace.partitions
        self._common = [[keyspace.prefix(p), keyspace.channel_prefix(p), f"{p}/{P}"] for p in range(P)]
        self._common_unfenced = [[keyspace.prefix(p), keyspace.channel_prefix(p), str(p)] for p in range(P)]

    def call(self, name: str, partition: int, *args: Any) -> Call:
        """Any script's call on ``partition``: its keys and the common arguments (prefix, channel
        prefix, partition[/count]), then ``args`` (see the script's ARGV header)."""
        common = self._common_unfenced if name in UNFENCED else self._common
        keys = self._keys[partition]
        if name in ONE_KEY_OFF_CLUSTER and not self.declare_all_keys:
            keys = keys[:1]
        return name, keys, common[partition] + list(args)

    def call_unfenced(self, name: str, partition: int, *args: Any) -> Call:
        """A call that passes the layout fence: for ``zsched migrate-partitions``, which works
        behind it (e.g. reaping expired leases while the tier is fenced out)."""
        return name, self._keys[partition], self._common_unfenced[partition] + list(args)

    def locate(self, job_id: str) -> tuple[bytes, int]:
        """A job id -> (raw id, partition); ValueError for a malformed id or one of another namespace."""
        raw = decode_id(job_id)
        return raw, partition_of(raw, self.ks.partitions)

    # -- schedule ---------------------------------------------------------------------------------
    def validate_key(self, key: object) -> str | None:
        """An idempotency key, checked (None: no key): :func:`validate_key`."""
        return validate_key(key)

    def prepare(self, items: Iterable[Sequence[Any]], opts: JobOptions,
                ids_from: Sequence[str] | None = None,
                trace: bytes | None = None) -> tuple[list[Call], list[list[int]]]:
        """Validate every job, then build the schedule calls (one per partition and BATCH jobs) and,
        per call, the input positions of its jobs. Nothing is written if any job is bad.
        ``ids_from``: a stable name per job, its id derived from it (:func:`~.ids.derived_id`);
        the calls carry the re-send flag, so a batch sent again creates nothing twice. ``trace``:
        the producer's trace context (:func:`~.tracecontext.trace_section`), stored in every job."""
        items = list(items)
        names = id_names(ids_from, len(items))
        now_s = self.clock()
        created = int(now_s)
        parts = self.ks.partitions
        rec_opts = opts.record_fields()
        by_part: dict[int, list[Any]] = defaultdict(list)
        order: dict[int, list[int]] = defaultdict(list)
        new_id = self.ids.new
        for n, item in enumerate(items):
            if isinstance(item, str | bytes) or not isinstance(item, Sized):
                raise TypeError(f"job {n}: expected an (at, payload) or (at, payload, key) tuple, "
                                f"got {type(item).__name__}")
            if len(item) == 2:
                at, payload = item
                key = None
            elif len(item) == 3:
                at, payload, key = item
                key = self.validate_key(key)
            else:
                raise ValueError(f"job {n}: expected (at, payload) or (at, payload, key), got {len(item)} items")
            ms, when = self.run_at(at, opts.jitter_ms, now_s)
            data = pack_payload(payload, self.max_payload)
            rec = build_record(data, created_s=created, key=key, trace=trace, **rec_opts)
            if names is None:
                raw, p = new_id(ms, parts, key)
            elif isinstance(when, str):
                raise ValueError(f"job {n}: an id derived from a name needs an absolute time (a datetime or "
                                 "epoch seconds): a relative one differs at each send")
            else:  # from the time before jitter: the same at each send (the job keeps its jittered time)
                raw, p = derived_id(self.run_at(at, 0, now_s)[0] if opts.jitter_ms else ms, names[n], key, parts)
            lst = by_part[p]
            lst.append(raw + rec)  # placeholder queue index = first 2 bytes of the record (0)
            lst.append(when)
            lst.append(key if key is not None else "")
            order[p].append(n)
        calls: list[Call] = []
        positions: list[list[int]] = []
        for p, flat in by_part.items():
            idx = order[p]
            for s in range(0, len(idx), BATCH):
                chunk = flat[s * 3 : (s + BATCH) * 3]
                calls.append(self.call("schedule", p, opts.queue, self.tomb_ms, len(chunk) // 3,
                                       0 if names is None else 1, *chunk))
                positions.append(idx[s : s + BATCH])
        return calls, positions

    def prepare_one(self, at: At, payload: Any, key: str | None, opts: JobOptions,
                    trace: bytes | None = None) -> Call:
        """Fast path of :meth:`prepare` for one job (the common producer call)."""
        key = self.validate_key(key)
        now_s = self.clock()
        ms, when = self.run_at(at, opts.jitter_ms, now_s)
        rec = build_record(pack_payload(payload, self.max_payload), created_s=int(now_s), key=key,
                           max_attempts=opts.max_attempts, lease_ms=opts.lease_ms,
                           misfire_skip=opts.misfire_skip, misfire_grace_ms=opts.misfire_grace_ms,
                           backoff_base_ms=opts.backoff_base_ms, backoff_cap_ms=opts.backoff_cap_ms, trace=trace)
        raw, p = self.ids.new(ms, self.ks.partitions, key)
        return self.call("schedule", p, opts.queue, self.tomb_ms, 1, 0, raw + rec, when, key or "")

    def run_at(self, at: At, jitter_ms: int, now_s: float) -> tuple[int, int | str]:
        """``at`` as (estimated epoch ms in Redis's clock, the schedule script's run_at argument).

        Absolute times (datetimes, epoch seconds) are sent as they are. A timedelta is relative
        to *now*, and now is Redis's clock, not this host's: it is sent as ``ESTrDELTA`` and the
        script resolves it with TIME (lua/schedule.lua), so a producer whose clock is off fires
        nothing early and misfires nothing. The estimate (local clock + the offset learned from
        earlier replies) names the id and usually is the run_at itself."""
        if isinstance(at, timedelta):
            delta = int(round(at.total_seconds() * 1000))
            if jitter_ms:
                delta += random.randint(0, jitter_ms)
            est = int(now_s * 1000) + self.clock_offset_ms + delta
            if not 0 <= est <= MAX_MS:
                raise ValueError(f"at must land between 1970-01-01 and 9999-12-31 UTC, got now + {at!r}")
            return est, f"{est}r{delta}"
        ms = job_time_ms(at, now=now_s)
        if jitter_ms:
            ms = min(MAX_MS, ms + random.randint(0, jitter_ms))
        return ms, ms

    def schedule_reply(self, reply: list[Any]) -> ScheduleReply:
        """A ``schedule`` reply, typed; learns the Redis clock offset for the next relative times."""
        parsed = parse_schedule(reply)
        self.clock_offset_ms = parsed.now_ms - int(self.clock() * 1000)
        return parsed

    def one_id(self, reply: list[Any]) -> str:
        """The id of a one-job ``schedule`` call; MisfiredAtSchedule when it misfired."""
        raw, misfired, _now = self.schedule_reply(reply)
        if len(raw) != 1:
            raise ScriptError(f"schedule returned {len(raw)} ids for 1 job")
        job_id = encode_id(raw[0])
        if misfired:
            raise MisfiredAtSchedule([job_id], [job_id])
        return job_id

    def collect_ids(self, replies: list[Any], positions: list[list[int]], total: int) -> list[str]:
        """The ids of a :meth:`prepare` batch in input order; MisfiredAtSchedule (with every id)
        when any job misfired."""
        out: list[str] = [""] * total
        missed: list[int] = []
        for reply, pos in zip(replies, positions):
            raw, misfired, _now = self.schedule_reply(reply)
            if len(raw) != len(pos):
                raise ScriptError(f"schedule returned {len(raw)} ids for {len(pos)} jobs")
            for n, r in zip(pos, raw):
                out[n] = encode_id(r)
            missed += [pos[i] for i in misfired]
        if missed:
            raise MisfiredAtSchedule(out, [out[n] for n in sorted(missed)])
        return out

    # -- inspect ----------------------------------------------------------------------------------
    def inspect_call(self, job_id: str) -> Call:
        """``inspect`` of one job; :meth:`one_info` reads the reply."""
        raw, p = self.locate(job_id)
        return self.call("inspect", p, raw)

    def one_info(self, job_id: str, reply: list[Any]) -> JobInfo | None:
        """The reply of an ``inspect`` call for one id (None: unknown, or its tombstone expired)."""
        return job_info(job_id, reply[0], self.max_payload) if reply else None

    def _inspect_plan(self, job_ids: Iterable[str]) -> list[tuple[int, list[tuple[str, bytes]]]]:
        """Ids grouped by partition (first-seen order, duplicates once), at most INSPECT_BATCH per
        group: one ``inspect`` call per group. Every id is checked first (ValueError naming it)."""
        by_part: dict[int, list[tuple[str, bytes]]] = {}
        for jid in dict.fromkeys(job_ids):
            raw, p = self.locate(jid)
            by_part.setdefault(p, []).append((jid, raw))
        return [(p, group[s:s + INSPECT_BATCH]) for p, group in by_part.items()
                for s in range(0, len(group), INSPECT_BATCH)]

    def inspect_calls(self, job_ids: list[str]) -> list[Call]:
        """``inspect`` calls for many jobs (one per partition and INSPECT_BATCH ids), to pipeline
        in one round trip; :meth:`job_infos` maps their replies back to the ids."""
        return [self.call("inspect", p, *(raw for _, raw in group)) for p, group in self._inspect_plan(job_ids)]

    def job_infos(self, job_ids: list[str], replies: list[Any]) -> dict[str, JobInfo | None]:
        """The replies of ``call_many(inspect_calls(job_ids))`` as id -> JobInfo (None: unknown)."""
        out: dict[str, JobInfo | None] = {}
        for (_p, group), reply in zip(self._inspect_plan(job_ids), replies):
            ids = [jid for jid, _raw in group]
            out.update(zip(ids, inspect_infos(ids, reply, self.max_payload)))
        return out

    # -- state changes: cancel, reschedule, requeue, purge (their replies are codes: see codes.py) --
    def cancel_call(self, job_id: str) -> Call:
        """``cancel`` of one job; :func:`~.codes.cancel_outcome` reads the reply."""
        raw, p = self.locate(job_id)
        return self.call("cancel", p, raw, self.tomb_ms)

    def when(self, at: At) -> int | str:
        """``at`` (an aware datetime, a timedelta from now, epoch seconds) as the run_at argument of
        ``reschedule`` and ``requeue``: epoch ms, or for a timedelta ``ESTrDELTA``, resolved by the
        script on Redis's clock as ``schedule`` does (see :meth:`run_at`)."""
        return self.run_at(at, 0, self.clock())[1]

    def reschedule_call(self, job_id: str, at_ms: int | str) -> Call:
        """``reschedule`` of one job to epoch ms ``at_ms`` (or a relative :meth:`when`);
        :func:`~.codes.reschedule_outcome` reads the reply."""
        raw, p = self.locate(job_id)
        return self.call("reschedule", p, raw, at_ms)

    def requeue_calls(self, job_ids: Sequence[str], at_ms: int | str | None = None) -> list[tuple[Call, list[int]]]:
        """``requeue`` calls for dead jobs, due now (``at_ms`` None) or at epoch ms ``at_ms`` (or a
        relative :meth:`when`): one per partition (first-seen order), each with the positions in
        ``job_ids`` of the jobs it carries, which :func:`~.codes.requeue_outcomes` answers in the
        same order."""
        ms = at_ms or 0
        by_part: dict[int, tuple[list[bytes], list[int]]] = {}
        for n, jid in enumerate(job_ids):
            raw, p = self.locate(jid)
            raws, pos = by_part.setdefault(p, ([], []))
            raws.append(raw)
            pos.append(n)
        return [(self.call("requeue", p, ms, *raws), pos) for p, (raws, pos) in by_part.items()]

    @staticmethod
    def requeue_replies(plan: list[tuple[Call, list[int]]], replies: list[Any], total: int) -> list[Outcome]:
        """The replies of :meth:`requeue_calls` (a plan for ``total`` ids) as one outcome per id, in
        input order: DONE (requeued) or NOT_DEAD."""
        out = [Outcome.NOT_DEAD] * total
        for (_call, pos), reply in zip(plan, replies):
            for n, outcome in zip(pos, requeue_outcomes(reply)):
                out[n] = outcome
        return out

    def purge_call(self, job_id: str) -> Call:
        """``purge`` of one dead job; :func:`~.codes.purge_outcome` reads the reply."""
        raw, p = self.locate(job_id)
        return self.call("purge", p, "ids", 0, raw)

    def purge_older_call(self, partition: int, cutoff_ms: int, limit: int) -> Call:
        """``purge`` of at most ``limit`` dead jobs of ``partition`` that died at or before
        ``cutoff_ms``; the reply is the number purged."""
        return self.call("purge", partition, "older", cutoff_ms, limit)

    # -- reads of every partition: dead_list, stats -------------------------------------------------
    def dead_list_calls(self, queue: str | None, limit: int) -> list[Call]:
        """``dead_list`` on every partition (the newest ``limit`` of each, scanning a bounded
        number of entries); :meth:`dead_infos` merges the replies."""
        if queue is not None:
            validate_name("queue", queue)
        return [self.call("dead_list", p, queue or "", limit, 10 * limit + 1000) for p in range(self.ks.partitions)]

    def dead_infos(self, replies: list[list[Any]], limit: int) -> list[JobInfo]:
        """The ``limit`` most recent deaths across the replies of :meth:`dead_list_calls`."""
        return dead_list_infos(replies, limit, self.max_payload)

    def stats_call(self, partition: int, due_within_ms: int | None = None, scan_max: int | None = None) -> Call:
        """``stats`` of one partition (read-only; :func:`~.replies.parse_stats` reads the reply); with
        ``due_within_ms``, also the timers due that soon per queue, reading at most ``scan_max``
        (default the script's, 500) to tell their queues apart."""
        extra = () if due_within_ms is None else (due_within_ms, "" if scan_max is None else scan_max)
        return self.call("stats", partition, *extra)

    def stats_calls(self) -> list[Call]:
        """``stats`` on every partition, in partition order."""
        return [self.stats_call(p) for p in range(self.ks.partitions)]

    # -- listing ----------------------------------------------------------------------------------
    def list_walk(self, queue: str, state: str | JobState, limit: int, cursor: str | None,
                  run_at: tuple[Any, Any] = (None, None)) -> ListWalk | MergeWalk:
        """One page of ``jobs()``: see :func:`~.listing.list_walk`."""
        return list_walk(self, queue, state, limit, cursor, run_at)

    # -- cron -------------------------------------------------------------------------------------
    def cron_set_call(self, name: str, expression: str, payload: Any, tz: str, opts: JobOptions) -> Call:
        """Validate everything (nothing is written on error) and build the cron_set call: the
        occurrence record's template and the next LOOKAHEAD + 1 occurrences, jittered."""
        validate_name("cron name", name)
        validate_expression(expression)
        zone = validate_tz(tz)
        if opts.jitter_ms > MAX_JITTER_S * 1000:
            raise ValueError(f"jitter must be at most {MAX_JITTER_S} seconds, got {opts.jitter!r}")
        data = pack_payload(payload, self.max_payload)
        now_s = self.clock()
        head, tail = split_template(build_record(data, created_s=int(now_s), **opts.record_fields()))
        nominals = occurrences(expression, zone, int(now_s * 1000), LOOKAHEAD + 1)
        if not nominals:
            raise ValueError(f"cron expression {expression!r} never fires (e.g. a day that does not exist)")
        pairs = with_jitter(nominals, opts.jitter_ms)
        definition = msgpack.packb({"expr": expression, "tz": tz, "queue": opts.queue, "misfire": opts.misfire,
                                    "grace": opts.misfire_grace, "jitter": opts.jitter, "created": now_s})
        p = partition_for_key(name, self.ks.partitions)
        flat = [x for pair in pairs for x in pair]
        return self.call("cron_set", p, name, opts.queue, definition, head, tail, self.tomb_ms, len(pairs),
                         placement_for_key(name), *flat)

    @staticmethod
    def cron_set_reply(reply: list[Any]) -> str:
        """The id of the cron's pending occurrence."""
        return encode_id(reply[0])

    def cron_remove_call(self, name: str) -> Call:
        """``cron_remove``; :func:`~.codes.cron_removed` reads the reply."""
        validate_name("cron name", name)
        return self.call("cron_remove", partition_for_key(name, self.ks.partitions), name, self.tomb_ms)

    def cron_pause_call(self, name: str) -> Call:
        """``cron_pause``: reply ``{status, since ms}`` (1 paused now, 0 already, -1 no such cron)."""
        validate_name("cron name", name)
        return self.call("cron_pause", partition_for_key(name, self.ks.partitions), name, self.tomb_ms)

    def cron_definition_key(self, name: str) -> str:
        """The hash of cron ``name`` (field ``def``: its msgpack definition)."""
        validate_name("cron name", name)
        return self.ks.key(partition_for_key(name, self.ks.partitions), f"cron:{name}")

    def cron_resume_call(self, name: str, definition: bytes, now_ms: int) -> Call:
        """``cron_resume`` with the cron's next occurrences after ``now_ms`` (Redis's clock),
        computed from its stored ``definition`` (expression, time zone, jitter)."""
        validate_name("cron name", name)
        spec = msgpack.unpackb(definition, raw=False)
        nominals = occurrences(spec["expr"], validate_tz(spec["tz"]), now_ms, LOOKAHEAD)
        planned = with_jitter(nominals, int(float(spec.get("jitter") or 0) * 1000))
        flat = [ms for pair in planned for ms in pair]
        return self.call("cron_resume", partition_for_key(name, self.ks.partitions), name, len(planned), *flat)

    def key_index(self, key: str) -> str:
        """The hash that maps the live jobs' idempotency keys of ``key``'s partition to their ids."""
        if not isinstance(key, str) or not 1 <= len(key.encode("utf-8")) <= codec.MAX_KEY_BYTES:
            raise ValueError(f"key must be 1-{codec.MAX_KEY_BYTES} bytes of UTF-8, got {key!r}")
        return self.ks.key(partition_for_key(key, self.ks.partitions), "k")

    # -- queue pause ------------------------------------------------------------------------------
    def pause_calls(self, queue: str, since_ms: int) -> list[Call]:
        """``pause`` on every partition (lua/pause.lua); each reply is 1 (paused now) or 0."""
        validate_name("queue", queue)
        return [self.call("pause", p, queue, since_ms) for p in range(self.ks.partitions)]

    def resume_calls(self, queue: str) -> list[Call]:
        """``resume`` on every partition (lua/resume.lua); each reply is 1 (was paused) or 0."""
        validate_name("queue", queue)
        return [self.call("resume", p, queue) for p in range(self.ks.partitions)]

    def cron_list_commands(self, pipe: Any) -> None:
        """Queue on a pipeline: the cron names of every partition."""
        for p in range(self.ks.partitions):
            pipe.smembers(self.ks.key(p, "crons"))

    def cron_detail_commands(self, pipe: Any, names_per_partition: list[set[bytes]]) -> list[tuple[int, str]]:
        """Queue on a pipeline: each cron's definition and pending occurrence; returns the
        (partition, name) of each command, for :meth:`cron_infos`."""
        order = []
        for p, names in enumerate(names_per_partition):
            for raw in sorted(names):
                name = raw.decode()
                pipe.hmget(self.ks.key(p, f"cron:{name}"), "def", "pending", "pnom", "last", "paused", "missed")
                order.append((p, name))
        return order

    @staticmethod
    def cron_pending_ids(details: list[list[Any]]) -> list[str]:
        """The pending occurrences named by the replies of :meth:`cron_detail_commands`."""
        return [encode_id(d[1]) for d in details if d[1]]

    @staticmethod
    def cron_infos(order: list[tuple[int, str]], details: list[list[Any]],
                   pending: dict[str, JobInfo | None]) -> list[CronInfo]:
        """Every cron by name, from :meth:`cron_detail_commands` and its pending jobs."""
        out = []
        for (_p, name), (d, pend, pnom, last, paused, missed) in zip(order, details):
            if d is None:
                continue  # removed meanwhile
            spec = msgpack.unpackb(d, raw=False)
            pid_text = encode_id(pend) if pend else None
            job = pending.get(pid_text) if pid_text else None
            out.append(CronInfo(
                name=name, expression=spec["expr"], tz=spec["tz"], queue=spec["queue"], misfire=spec["misfire"],
                misfire_grace=spec.get("grace"), jitter=spec.get("jitter", 0),
                next_fire=job.run_at if job else None,
                next_nominal=ms_to_datetime(int(pnom)) if pnom and pend else None,
                last_fired=ms_to_datetime(int(last)) if last else None,
                pending_id=pid_text, payload=job.payload if job else None,
                paused=ms_to_datetime(int(paused)) if paused else None, missed=int(missed or 0)))
        return sorted(out, key=lambda c: c.name)
