"""``zsched scheduler`` command line."""
from __future__ import annotations

import argparse

from ..metrics import host_arg, port_arg
from ..protocol import config
from .ownership import default_replica_id
from .process import SchedulerConfig, run_forever
from .runner import RunnerConfig

DEFAULT_LEASE_TTL = SchedulerConfig.lease_ttl
MIN_LEASE_TTL = 1.0  # etcd's granularity (see Ownership)
MAX_LEASE_TTL = 3600.0
MIN_HORIZON, MAX_HORIZON = 0.0, 86400.0  # --due-soon-horizon


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``scheduler`` to the ``zsched`` subcommands."""
    p = sub.add_parser("scheduler", help="run a scheduler replica (owns partitions through etcd leases)",
                       description="Run one scheduler replica. Any number may run; they split the partitions "
                                   "through etcd leases and fire due jobs onto ready lists.")
    config.add_connection_options(p)
    p.add_argument("--etcd", help="etcd endpoints, comma-separated (env ZSCHED_ETCD_ENDPOINTS, default "
                                  f"{config.DEFAULT_ETCD_ENDPOINTS}); http://user:password@host:port for etcd auth "
                                  "(a password is better in the variable: ps shows the command line), https:// for TLS "
                                  "(CA and client certificate from the files in ZSCHED_ETCD_CA, ZSCHED_ETCD_CERT, "
                                  "ZSCHED_ETCD_KEY)")
    p.add_argument("--partitions", type=int, help="expected partition count (env ZSCHED_PARTITIONS)")
    p.add_argument("--replica-id", help="this replica's name in etcd (default host-pid-random)")
    p.add_argument("--lease-ttl", type=float, metavar="S",
                   help=f"etcd lease TTL in seconds, {MIN_LEASE_TTL:g} to {MAX_LEASE_TTL:g} (env ZSCHED_LEASE_TTL, "
                        f"default {DEFAULT_LEASE_TTL:g}): failover takes about this long")
    p.add_argument("--batch", type=int, default=RunnerConfig.batch,
                   help=f"jobs moved per tick call (default {RunnerConfig.batch})")
    p.add_argument("--handoff-lead", type=float, default=RunnerConfig.handoff_lead * 1000, metavar="MS",
                   help=f"hand jobs to the workers this many ms before they are due (default "
                        f"{RunnerConfig.handoff_lead * 1000:g}); the "
                        "worker starts each at its due time, never before, so the hops in between do "
                        "not make it late. 0: fire at the due time")
    p.add_argument("--coalesce-lead", type=float, default=RunnerConfig.coalesce_lead * 1000, metavar="MS",
                   help="a partition firing many jobs per second hands them off up to this many ms ahead, "
                        "doubling its --handoff-lead only as far as needed for a tick and a claim to carry "
                        "several jobs (cheaper spread traffic); jobs still start at their due time; give each "
                        "worker a --prefetch covering its jobs due within this lead (default "
                        f"{RunnerConfig.coalesce_lead * 1000:g}: off; at or below --handoff-lead: off)")
    p.add_argument("--burst-lead", type=float, default=RunnerConfig.burst_lead * 1000, metavar="MS",
                   help="hand a partition's next timers off this many ms ahead when they are a burst (4 or more "
                        "due within one tick step), so the idle workers the burst wakes claim before they are due; "
                        f"jobs still start at their due time (default {RunnerConfig.burst_lead * 1000:g}; at or "
                        "below --handoff-lead: off)")
    p.add_argument("--trace-firing", type=float, default=RunnerConfig.trace_firing, metavar="RATIO",
                   help="share of the ticks that fire jobs recorded as OpenTelemetry spans, 0 to 1 (default "
                        f"{RunnerConfig.trace_firing:g}: none); needs a tracer provider in this process, e.g. "
                        "'opentelemetry-instrument zsched scheduler ...' (docs/tracing.md)")
    p.add_argument("--redis-timeout", type=float, default=SchedulerConfig.redis_timeout, metavar="S",
                   help=f"socket timeout of a Redis call, seconds (default {SchedulerConfig.redis_timeout:g}): "
                        "a reply slower than this is "
                        "treated as lost and the call retried (ticks are epoch-fenced, so that is safe)")
    p.add_argument("--metrics-port", type=port_arg, metavar="PORT",
                   help="serve Prometheus /metrics on this port, and the probes /livez (event loop turning) and "
                        "/readyz (Redis answers, etcd lease held)")
    p.add_argument("--metrics-host", type=host_arg, default=config.DEFAULT_METRICS_HOST, metavar="ADDR",
                   help=f"address for /metrics and the probes (default {config.DEFAULT_METRICS_HOST})")
    p.add_argument("--due-soon-horizon", type=float, default=SchedulerConfig.due_soon_horizon, metavar="S",
                   help=f"zsched_queue_due_soon counts the jobs ready or due within this many seconds, "
                        f"{MIN_HORIZON:g} to {MAX_HORIZON:g} (default {SchedulerConfig.due_soon_horizon:g}): "
                        "what an autoscaler (KEDA) scales the workers on")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return run_forever(config_from_args(args))


def _lease_ttl(given: float | None) -> float:
    """``--lease-ttl``, else ZSCHED_LEASE_TTL, else the default; checked (read when the command runs,
    so a bad variable stops ``zsched scheduler`` with one line, not every ``zsched`` command)."""
    if given is None:
        raw = config.lease_ttl_env() or ""
        try:
            ttl, what = (float(raw) if raw else DEFAULT_LEASE_TTL), f"ZSCHED_LEASE_TTL={raw!r}"
        except ValueError:
            raise ValueError(f"ZSCHED_LEASE_TTL must be a number of seconds, got {raw!r}") from None
    else:
        ttl, what = given, f"--lease-ttl {given:g}"
    if not MIN_LEASE_TTL <= ttl <= MAX_LEASE_TTL:  # refuses nan too
        raise ValueError(f"{what}: the etcd lease TTL must be from {MIN_LEASE_TTL:g} to {MAX_LEASE_TTL:g} seconds "
                         "(failover after a crash takes about this long)")
    return ttl


def config_from_args(args: argparse.Namespace) -> SchedulerConfig:
    """The replica's configuration from the parsed ``zsched scheduler`` arguments (and the
    environment for what they leave out)."""
    if args.batch < 1 or args.batch > 5000:
        raise ValueError(f"--batch must be from 1 to 5000, got {args.batch}")
    if not 0 <= args.handoff_lead <= 1000:
        raise ValueError(f"--handoff-lead must be from 0 to 1000 ms, got {args.handoff_lead:g}")
    if not 0 <= args.coalesce_lead <= 1000:  # refuses nan too
        raise ValueError(f"--coalesce-lead must be from 0 to 1000 ms, got {args.coalesce_lead:g}")
    if not 0 <= args.burst_lead <= 1000:  # refuses nan too
        raise ValueError(f"--burst-lead must be from 0 to 1000 ms, got {args.burst_lead:g}")
    if not 0 <= args.trace_firing <= 1:  # refuses nan too
        raise ValueError(f"--trace-firing must be from 0 to 1 (a share of the firing ticks), got {args.trace_firing}")
    if not 0.01 <= args.redis_timeout <= 3600:
        raise ValueError(f"--redis-timeout must be from 0.01 to 3600 seconds, got {args.redis_timeout}")
    if not MIN_HORIZON <= args.due_soon_horizon <= MAX_HORIZON:  # refuses nan too
        raise ValueError(f"--due-soon-horizon must be from {MIN_HORIZON:g} to {MAX_HORIZON:g} seconds, got "
                         f"{args.due_soon_horizon:g}")
    lease_ttl = _lease_ttl(args.lease_ttl)
    cfg = SchedulerConfig(
        redis_url=config.redis_url(args.redis),
        etcd_endpoints=config.etcd_endpoints(args.etcd),
        namespace=config.namespace(args.namespace),
        partitions=config.partitions(args.partitions),
        replica_id=args.replica_id or default_replica_id(),
        lease_ttl=lease_ttl,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        redis_timeout=args.redis_timeout,
        due_soon_horizon=args.due_soon_horizon,
    )
    cfg.runner.batch = args.batch
    cfg.runner.handoff_lead = args.handoff_lead / 1000.0
    cfg.runner.coalesce_lead = args.coalesce_lead / 1000.0
    cfg.runner.burst_lead = args.burst_lead / 1000.0
    cfg.runner.trace_firing = args.trace_firing
    return cfg
