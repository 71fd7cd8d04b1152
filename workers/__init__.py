"""zsched workers: run handlers for scheduled jobs (at-least-once, leased, fenced).

::

    from workers import Worker, Retry, PermanentError

    worker = Worker.from_url("redis://127.0.0.1:6379/0", namespace="zsched", concurrency=16)

    @worker.handler("emails")
    async def send(job):
        ...

    worker.run()   # or: zsched worker myapp:worker

See docs/workers.md for the handler contract.
"""
from .errors import PermanentError, Retry
from .job import Job
from .stats import WorkerMetrics, WorkerStats
from .worker import Worker

__all__ = ["Job", "PermanentError", "Retry", "Worker", "WorkerMetrics", "WorkerStats"]
