"""zsched: a distributed job scheduler on Redis sorted sets, with etcd-leased scheduler replicas.

Producer API::

    from scheduler import Client
    client = Client.from_url("redis://127.0.0.1:6379/0", namespace="zsched")
    job_id = client.schedule(timedelta(hours=4), {"to": "a@example.com"}, queue="emails")
"""
from .client import AsyncClient, Client
from .protocol.cron import CronInfo
from .protocol.errors import ConfigError, PayloadError, ScriptError, ZschedError
from .protocol.keys import Keyspace
from .protocol.models import JobError, JobInfo, JobState

__all__ = [
    "AsyncClient", "Client", "ConfigError", "CronInfo", "JobError", "JobInfo", "JobState", "Keyspace",
    "PayloadError", "ScriptError", "ZschedError",
]
