"""``zsched ui``: the web console (:mod:`scheduler.shell.ui`), served by uvicorn.

Binds 127.0.0.1 by default; actions need the token from ``ZSCHED_UI_TOKEN`` or the one printed at
start-up; ``--read-only`` hides every action. SIGINT/SIGTERM stop it promptly, without a traceback.

What can go wrong before it serves is one line and an exit code: a ``--host`` that is not an
address or does not resolve (2, at argument parsing), an address that is not this machine's (2), a
port in use or a privileged one (4), TLS files that cannot be read or do not match (4), Redis
unreachable (3) or the namespace unknown (1). The sockets are bound here, before uvicorn starts,
so these are ours to explain rather than uvicorn's log and ``sys.exit``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import functools
import ipaddress
import socket
import ssl
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from ..protocol import config
from ..runtime import run as run_loop
from ..runtime import stop_signals
from . import admin
from .cli_common import SubParsers, number
from .cli_errors import EXIT_BAD_INPUT, EXIT_LOCAL
from .ui.hosts import LOOPBACK_PROXIES, IPNetwork, parse_host, parse_networks

DEFAULT_PORT = 8089
UI_PACKAGES = ("starlette", "jinja2", "uvicorn", "multipart")  # the 'ui' extra (python-multipart is 'multipart')
BACKLOG = 2048


def missing_ui_packages() -> list[str]:
    """The console's packages (the ``ui`` extra) that are not installed; [] when it can run."""
    import importlib.util

    return [name for name in UI_PACKAGES if importlib.util.find_spec(name) is None]


def _argtype(name: str, fn: Callable[[str], Any]) -> Callable[[str], Any]:
    def conv(text: str) -> Any:
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    conv.__name__ = name
    return conv


def bind_host(text: str) -> str:
    """``--host``: an IP address (``[v6]`` too), or a host name that resolves here; ValueError else."""
    bare = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    try:
        name, port = parse_host(bare)
    except ValueError as exc:
        raise ValueError(f"{exc} (give an IP address of this machine, e.g. 127.0.0.1, or its name)") from None
    if port is not None:
        raise ValueError(f"{text!r} carries a port: give the port with --port")
    try:
        socket.getaddrinfo(name, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"{text!r} does not resolve ({exc.strerror}): give an IP address of this machine, "
                         "e.g. 127.0.0.1, or a name that resolves to one") from None
    return name


def allowed_host(text: str) -> str:
    """``--allowed-host``: ``NAME`` or ``NAME:PORT`` (``[v6]:PORT``), normalised."""
    try:
        name, port = parse_host(text)
    except ValueError as exc:
        raise ValueError(f"{exc}; list each name (no wildcards), e.g. "
                         "--allowed-host console.example.com") from None
    shown = f"[{name}]" if ":" in name else name
    return shown if port is None else f"{shown}:{port}"


def _one_line(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    # no usage block (ui has many options: it would be several lines): the error and where to look
    parser.exit(EXIT_BAD_INPUT, f"zsched: error: {message} (see: {parser.prog} --help)\n")


def add_parsers(sub: SubParsers) -> None:
    """Register ``ui`` (called by scheduler/shell/cli.py). Its argument errors are one line."""
    p = (sub.add_parser(
        "ui", help="web console: find, read and act on jobs; pause queues and crons",
        description="Serve the web console: overview (counts, rates, partition owners), jobs by queue and state, "
                    "one job with its payload and last error, dead letters (filter, requeue, purge), crons; "
                    "pause/resume queues and crons. Actions need the token from ZSCHED_UI_TOKEN, or the one "
                    "printed at start-up. It answers only to requests whose Host header is localhost, an IP "
                    "address, or a name given with --allowed-host (DNS rebinding); see docs/operations.md for the "
                    "threat model and a reverse-proxy set-up.",
        epilog="exit codes: 0 stopped by SIGINT/SIGTERM, 1 unknown namespace, 2 bad input (a --host that is not an "
               "address of this machine or does not resolve, a malformed option), 3 Redis unreachable or refusing, "
               "4 the port is in use or needs privileges, a TLS file cannot be read, or the ui packages are missing"))
    config.add_connection_options(p)
    p.add_argument("--host", default="127.0.0.1", type=_argtype("address", bind_host), metavar="ADDRESS",
                   help="address to bind (default 127.0.0.1; anything else exposes the console to the network: use "
                        "TLS then); a name binds every address it resolves to; :: is IPv6 only")
    p.add_argument("--port", type=number("a port", 0, 65535, integer=True), default=DEFAULT_PORT,
                   help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME[:PORT]",
                   type=_argtype("host name", allowed_host),
                   help="also answer to requests for this host name (repeatable), e.g. the name a reverse proxy "
                        "serves the console under; without :PORT any port. localhost and IP addresses on the "
                        "console's port are always answered")
    p.add_argument("--trust-proxy", nargs="?", const=LOOPBACK_PROXIES, default=(), metavar="ADDRS",
                   type=_argtype("addresses", parse_networks),
                   help="honour X-Forwarded-Proto (https: Secure cookie, https origins) and X-Forwarded-For (the "
                        "client, for the login throttle and the audit log) from a reverse proxy at these addresses "
                        "or networks, comma-separated (when given alone: loopback, 127.0.0.0/8 and ::1); without "
                        "it these headers are ignored")
    p.add_argument("--tls-cert", metavar="FILE", help="serve https with this PEM certificate (chain); with --tls-key")
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's PEM private key (not encrypted)")
    p.add_argument("--read-only", action="store_true", help="show no action anywhere (pages only; no login)")
    p.add_argument("--etcd", metavar="ENDPOINTS",
                   help="etcd endpoints for partition owners (env ZSCHED_ETCD_ENDPOINTS; without: owners unknown)")
    p.add_argument("--refresh", type=number("seconds", 0.5, 300), default=3.0, metavar="S",
                   help="overview refresh period in the browser (default 3)")
    p.error = functools.partial(_one_line, p)  # type: ignore[method-assign]
    p.set_defaults(func=run)


def tls_problem(cert: str, key: str) -> str | None:
    """Why the console cannot serve https with ``cert`` and ``key`` (None: it can). Loaded as
    uvicorn will, but an encrypted key fails here instead of prompting on the terminal."""
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as exc:
            return f"cannot read {flag} {path}: {exc.strerror or exc} (check the path and that this user may read it)"
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key, password=lambda: b"")
    except (ssl.SSLError, ValueError) as exc:
        reason = getattr(exc, "reason", None)
        if reason == "KEY_VALUES_MISMATCH":
            why = "the key does not belong to the certificate"
        else:
            why = "expected a PEM certificate (chain) and its PEM private key, not encrypted"
        return f"cannot use --tls-cert {cert} with --tls-key {key}: {why} (OpenSSL: {' '.join(str(exc).split())})"
    except OSError as exc:
        return f"cannot use --tls-cert {cert} with --tls-key {key}: {exc.strerror or exc}"
    return None


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def listen(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to (one for an address); with port 0
    a free port, the same on each. OSError as the system gives it (see :func:`listen_error`)."""
    socks: list[socket.socket] = []
    try:
        seen = set()
        for family, _type, proto, _name, addr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                    flags=socket.AI_PASSIVE):
            if (family, addr[0]) in seen:
                continue
            seen.add((family, addr[0]))
            sock = socket.socket(family, socket.SOCK_STREAM, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio does: an IPv6 socket serves IPv6 only
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind((addr[0], port, *addr[2:]))
            port = port or sock.getsockname()[1]
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    return socks


def listen_error(exc: OSError, host: str, port: int) -> tuple[str, int]:
    """The error line (without ``zsched: error:``) and exit code for a socket that could not listen."""
    where = f"{_shown(host)}:{port}"
    if isinstance(exc, socket.gaierror):
        return f"--host {host!r} does not resolve ({exc.strerror}): give an IP address of this machine", EXIT_BAD_INPUT
    if exc.errno == errno.EADDRINUSE:
        return (f"cannot listen on {where}: the port is in use (choose another with --port, --port 0 for a free "
                "one, or stop the process that has it)", EXIT_LOCAL)
    if exc.errno == errno.EADDRNOTAVAIL:
        return (f"cannot listen on {where}: {host} is not an address of this machine (check --host; 127.0.0.1 "
                "serves this machine only, 0.0.0.0 every IPv4 interface)", EXIT_BAD_INPUT)
    if exc.errno == errno.EACCES:
        return (f"cannot listen on {where}: permission denied (ports below 1024 need privileges: use --port 1024 "
                "or above, with a reverse proxy in front if the console must be on 443)", EXIT_LOCAL)
    return f"cannot listen on {where}: {exc.strerror or exc}", EXIT_LOCAL


def _fail(message: str, code: int) -> int:
    print(f"zsched: error: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; exit 0 then."""
    missing = missing_ui_packages()
    if missing:
        return _fail(f"zsched ui needs the web console's packages, missing here: {', '.join(missing)} "
                     "(install them from a checkout of zsched: pip install -e '.[ui]')", EXIT_LOCAL)
    if bool(args.tls_cert) != bool(args.tls_key):
        return _fail("--tls-cert and --tls-key go together: give the certificate and its private key",
                     EXIT_BAD_INPUT)
    if args.tls_cert:
        problem = tls_problem(args.tls_cert, args.tls_key)
        if problem:
            return _fail(problem, EXIT_LOCAL)
    etcd = config.optional_etcd_endpoints(args.etcd)  # a malformed list is bad input, before binding or connecting
    try:
        socks = listen(args.host, args.port)
    except OSError as exc:
        return _fail(*listen_error(exc, args.host, args.port))
    try:
        return _serve(args, socks, etcd)
    finally:
        for sock in socks:
            sock.close()


def _serve(args: argparse.Namespace, socks: list[socket.socket], etcd: str | None) -> int:
    import uvicorn

    from .ui import ConsoleConfig, create_app
    from .ui.security import new_token

    try:
        client = admin.open_client(args.redis, args.namespace)
    except admin.AdminError as exc:
        return _fail(str(exc), exc.exit_code)
    token = config.ui_token() or new_token()
    trusted: tuple[IPNetwork, ...] = tuple(args.trust_proxy)
    cfg = ConsoleConfig(client, token, redis_url=config.redis_url(args.redis), read_only=args.read_only,
                        etcd=etcd, refresh_seconds=args.refresh, allowed_hosts=tuple(args.allowed_host),
                        trusted_proxies=trusted)
    app = create_app(cfg)
    if not _loopback(args.host):
        clear = "" if args.tls_cert else "; without --tls-cert/--tls-key the token and session cross it in clear"
        print(f"zsched: warning: binding {args.host}: the console is reachable from the network{clear}",
              file=sys.stderr)

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # ours below: stop and exit 0, where uvicorn re-raises the signal after shutdown

    # proxy_headers off: uvicorn would otherwise believe X-Forwarded-* from 127.0.0.1 by default;
    # the console's Gate honours them only with --trust-proxy
    server = Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", proxy_headers=False,
                                   server_header=False, ssl_certfile=args.tls_cert, ssl_keyfile=args.tls_key))
    port = socks[0].getsockname()[1]

    async def serve() -> None:
        stop_signals(asyncio.get_running_loop(), lambda _sig: _stop(server))
        task = asyncio.create_task(server.serve(sockets=socks))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            ro = " (read-only)" if args.read_only else ""
            scheme = "https" if args.tls_cert else "http"
            print(f"zsched ui{ro}: {scheme}://{_shown(args.host)}:{port}/ namespace {client.keyspace.namespace}",
                  flush=True)
            if not args.read_only:
                shown = token if config.ui_token() is None else "from ZSCHED_UI_TOKEN"
                print(f"zsched ui: actions need the token: {shown}", flush=True)
        await task

    try:
        run_loop(serve())
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
