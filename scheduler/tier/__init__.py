"""The scheduler tier: partition ownership through etcd and the firing loop per partition."""
from .ownership import Ownership
from .process import SchedulerConfig, SchedulerProcess
from .runner import PartitionRunner, RunnerConfig

__all__ = ["Ownership", "PartitionRunner", "RunnerConfig", "SchedulerConfig", "SchedulerProcess"]
