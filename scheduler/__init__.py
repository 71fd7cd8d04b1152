"""zsched: a distributed job scheduler on Redis sorted sets, with etcd-leased scheduler replicas.

Producer API::

    from scheduler import Client
    client = Client.from_url("redis://127.0.0.1:6379/0", namespace="zsched")
    job_id = client.schedule(timedelta(hours=4), {"to": "a@example.com"}, queue="emails")
    if not client.cancel(job_id):  # an Outcome: truthy only when the job was cancelled
        ...
"""
from .client import AsyncClient, Client
from .protocol.codes import Outcome
from .protocol.cron import CronInfo
from .protocol.errors import (
    ConfigError,
    DurabilityError,
    DurabilityTimeout,
    DurabilityUnsupported,
    LayoutChanged,
    MisfiredAtSchedule,
    PayloadError,
    ScriptArgumentError,
    ScriptError,
    ZschedError,
)
from .protocol.models import JobError, JobInfo, JobState
from .protocol.options import JobOptions
from .protocol.timeutil import At
from .redisio.transport import RedisRetry

__all__ = [
    "At", "AsyncClient", "Client", "ConfigError", "CronInfo", "DurabilityError", "DurabilityTimeout",
    "DurabilityUnsupported", "JobError", "JobInfo", "JobOptions", "JobState", "LayoutChanged",
    "MisfiredAtSchedule", "Outcome", "PayloadError", "RedisRetry", "ScriptArgumentError", "ScriptError",
    "ZschedError",
]


def __getattr__(name: str) -> object:
    # RetryPolicy was renamed RedisRetry: it retries round trips to Redis, and sat beside the
    # handler's workers.Retry (run the job again), which it is not. The old name works, with a
    # DeprecationWarning, until the next minor version.
    if name == "RetryPolicy":
        import warnings

        warnings.warn("scheduler.RetryPolicy is now scheduler.RedisRetry (the retries of round trips to Redis); "
                      "the old name goes in the next minor version", DeprecationWarning, stacklevel=2)
        return RedisRetry
    raise AttributeError(f"module 'scheduler' has no attribute {name!r}")
