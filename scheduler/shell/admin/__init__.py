"""Operator operations behind ``zsched schedule | job | dead | stats``, usable without the command line.

- :mod:`.errors`: what an operation reports when it cannot be done (with the CLI's exit code);
- :mod:`.inputs`: WHEN / DURATION / payload / job id / queue arguments;
- :mod:`.jobs`: one job at a time: look up, cancel, reschedule, requeue, purge, list;
- :mod:`.dead`: the dead-letter runbook at scale: filters, bounded scans, paced requeues, purges;
- :mod:`.dead_pages`: dead letters a page at a time, newest first, with a total;
- :mod:`.stats`: per-queue and per-partition counts, partition owners from etcd;
- :mod:`.workers`: the live worker processes, from the worker registry;
- :mod:`.output`: times, JSON documents and text tables.

Everything goes through the client's public API: its outcome-returning methods, and for batches
the protocol layer's call builders (``client.calls``) sent through ``client.transport`` (EVALSHA
with NOSCRIPT recovery), so every state change stays one atomic script.
"""
from .dead import (
    DEFAULT_MASS_RATE,
    DeadFilter,
    Pacer,
    RequeueOutcome,
    batch_size,
    count_dead_older,
    dead_selection,
    iter_dead,
    iter_dead_ids,
    list_dead,
    purge_older,
    requeue_stream,
)
from .dead_pages import COUNT_SCAN, DeadPage, dead_page, dead_total, format_mark, iter_dead_ordered, parse_mark
from .errors import AdminError, BadInput, NotFound, Refused, WrongState
from .inputs import (
    WHEN_FORMS,
    parse_duration,
    parse_job_id,
    parse_payload,
    parse_queue,
    parse_schedule_when,
    parse_when,
)
from .jobs import (
    cancel_job,
    get_dead_job,
    get_job,
    get_job_by_key,
    list_jobs,
    open_client,
    purge_one,
    redis_now_ms,
    requeue_one,
    reschedule_job,
)
from .output import (
    dead_row_doc,
    error_doc,
    error_line,
    error_text,
    first_line,
    human_delta,
    human_span,
    iso,
    job_doc,
    job_row_doc,
    jsonable,
    table,
    to_json,
)
from .stats import (
    PartitionStats,
    StatsReport,
    collect_stats,
    etcd_failure,
    read_owner_leases,
    read_owner_records,
    read_owners,
    stats_doc,
)
from .workers import listed, queue_summary, read_registry, worker_doc, worker_state, workers_doc

__all__ = [
    "AdminError", "BadInput", "COUNT_SCAN", "DeadPage", "dead_page", "dead_total", "format_mark",
    "iter_dead_ordered", "parse_mark", "DEFAULT_MASS_RATE", "DeadFilter", "NotFound", "Pacer", "PartitionStats",
    "Refused", "RequeueOutcome", "StatsReport", "WHEN_FORMS", "WrongState", "batch_size", "cancel_job", "collect_stats",
    "count_dead_older", "dead_row_doc", "dead_selection", "error_doc", "error_line", "error_text",
    "etcd_failure", "first_line",
    "get_dead_job", "get_job", "get_job_by_key", "human_delta", "human_span", "iso", "iter_dead", "iter_dead_ids",
    "job_doc",
    "job_row_doc", "jsonable", "list_dead", "list_jobs", "listed", "open_client", "parse_duration", "parse_job_id",
    "parse_payload", "parse_queue", "parse_schedule_when", "parse_when", "purge_older", "purge_one", "queue_summary",
    "read_owner_leases", "read_owner_records", "read_owners", "read_registry", "redis_now_ms", "requeue_one",
    "requeue_stream", "reschedule_job", "stats_doc", "table", "to_json", "worker_doc", "worker_state", "workers_doc",
]
