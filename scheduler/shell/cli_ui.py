"""``zsched ui``: the web console (:mod:`scheduler.shell.ui`), served by uvicorn.

Binds 127.0.0.1 by default; actions need the token from ``ZSCHED_UI_TOKEN`` or the one printed at
start-up; ``--read-only`` hides every action. SIGINT/SIGTERM stop it promptly, without a traceback.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from . import admin
from .cli_common import SubParsers, number, patch_errors
from .cli_errors import EXIT_LOCAL

DEFAULT_PORT = 8089
UI_PACKAGES = ("starlette", "jinja2", "uvicorn", "multipart")  # the 'ui' extra (python-multipart is 'multipart')


def missing_ui_packages() -> list[str]:
    """The console's packages (the ``ui`` extra) that are not installed; [] when it can run."""
    import importlib.util

    return [name for name in UI_PACKAGES if importlib.util.find_spec(name) is None]


def add_parsers(sub: SubParsers) -> None:
    """Register ``ui`` (called by scheduler/shell/cli.py)."""
    p = patch_errors(sub.add_parser(
        "ui", help="web console: find, read and act on jobs; pause queues and crons",
        description="Serve the web console: overview (counts, rates, partition owners), jobs by queue and state, "
                    "one job with its payload and last error, dead letters (filter, requeue, purge), crons; "
                    "pause/resume queues and crons. Actions need the token from ZSCHED_UI_TOKEN, or the one "
                    "printed at start-up."))
    p.add_argument("--redis", metavar="URL", help="Redis URL (env ZSCHED_REDIS_URL, default redis://127.0.0.1:6379/0)")
    p.add_argument("--namespace", metavar="NS", help="namespace (env ZSCHED_NAMESPACE, default zsched)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; anything else exposes the console to the network)")
    p.add_argument("--port", type=number("a port", 0, 65535, integer=True), default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--read-only", action="store_true", help="show no action anywhere (pages only)")
    p.add_argument("--etcd", metavar="ENDPOINTS",
                   help="etcd endpoints for partition owners (env ZSCHED_ETCD_ENDPOINTS; without: owners unknown)")
    p.add_argument("--refresh", type=number("seconds", 0.5, 300), default=3.0, metavar="S",
                   help="overview refresh period in the browser (default 3)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; exit 0 then."""
    missing = missing_ui_packages()
    if missing:
        print(f"zsched: error: zsched ui needs the web console's packages, missing here: {', '.join(missing)} "
              "(install them with: pip install 'zsched[ui]')", file=sys.stderr)
        return EXIT_LOCAL
    import uvicorn

    from ..protocol import config
    from .ui import ConsoleConfig, create_app
    from .ui.security import new_token

    etcd = config.optional_etcd_endpoints(args.etcd)  # a malformed list is bad input, before connecting
    try:
        client = admin.open_client(args.redis, args.namespace)
    except admin.AdminError as exc:
        print(f"zsched: error: {exc}", file=sys.stderr)
        return exc.exit_code
    token = os.environ.get("ZSCHED_UI_TOKEN") or new_token()
    url = config.redis_url(args.redis)
    cfg = ConsoleConfig(client, token, redis_url=url, read_only=args.read_only,
                        etcd=etcd,
                        refresh_seconds=args.refresh)
    app = create_app(cfg)
    if not _loopback(args.host):
        print(f"zsched: warning: binding {args.host}: the console is reachable from the network", file=sys.stderr)
    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # ours below: stop and exit 0, where uvicorn re-raises the signal after shutdown

    server = Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                   access_log=False, lifespan="on"))

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, _stop, server)
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1] if server.servers else args.port
            ro = " (read-only)" if args.read_only else ""
            print(f"zsched ui{ro}: http://{args.host}:{port}/ namespace {client.keyspace.namespace}", flush=True)
            if not args.read_only:
                shown = token if "ZSCHED_UI_TOKEN" not in os.environ else "from ZSCHED_UI_TOKEN"
                print(f"zsched ui: actions need the token: {shown}", flush=True)
        await task

    try:
        asyncio.run(serve())
    finally:
        with contextlib.suppress(Exception):
            client.close()
    return 0 if server.started else 1


def _stop(server: Any) -> None:
    if server.should_exit:  # a second signal: do not wait for open connections
        server.force_exit = True
    server.should_exit = True


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
