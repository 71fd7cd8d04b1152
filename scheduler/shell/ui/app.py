"""The console's routes: pages (GET, no token needed) and actions (POST: session, CSRF token,
same origin, not ``--read-only``), each action logged with who and when. In front of all of them
the :class:`~.gate.Gate` (Host allow-list, proxy headers); every query parameter is checked by
:mod:`.params` (a 400 page saying what is accepted)."""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ...client import Client
from ...protocol.calls import LIST_STATES
from ...protocol.masking import mask_secrets
from ...protocol.models import JobState
from .. import admin
from . import fleet, history, links, params, present, views
from .actions import ACTIONS, PAGE, Confirm, StartRequeue, dead_listing, described, return_to
from .gate import Gate
from .hosts import HostPolicy, IPNetwork
from .params import BadRequest
from .payload import payload_text
from .security import (
    SECURITY_HEADERS,
    ConsoleAuth,
    RedisSessions,
    Session,
    audit,
    clean_name,
    same_origin,
    session_cookie,
)
from .tasks import Busy, RequeueTasks
from .throttle import LoginThrottle, retry_after_header

log = logging.getLogger("zsched.ui")
SCOPE_KEY = "zsched.session"  # where a request's session is kept once read


@dataclass
class ConsoleConfig:
    """What ``zsched ui`` serves: the client (its URL is shown with the password masked), the
    operator token, ``read_only`` (no action anywhere, no login), etcd endpoints for partition
    owners, ``allowed_hosts`` (names besides localhost and IP literals that the Host header may
    carry: ``--allowed-host``) and ``trusted_proxies`` (peers whose X-Forwarded-Proto and
    X-Forwarded-For count: ``--trust-proxy``)."""

    client: Client
    token: str
    redis_url: str = ""
    read_only: bool = False
    etcd: str | None = None
    refresh_seconds: float = 3.0
    allowed_hosts: tuple[str, ...] = ()
    trusted_proxies: tuple[IPNetwork, ...] = ()


def _templates() -> jinja2.Environment:
    root = resources.files("scheduler.shell.ui") / "templates"
    env = jinja2.Environment(loader=jinja2.FunctionLoader(lambda name: (root / name).read_text("utf-8")),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["iso"] = lambda v: admin.iso(v) or "-"
    env.filters["relative"] = present.relative
    env.filters["picker"] = present.picker
    env.globals["when"] = env.get_template("present.html").module.when  # type: ignore[attr-defined]
    env.filters["ago"] = lambda s: admin.human_delta(-s) if s else "-"
    env.filters["rate"] = lambda v: "-" if v is None else f"{v:.1f}"
    env.filters["errtext"] = admin.error_text
    env.filters["payload"] = payload_text
    env.globals.update(links.GLOBALS)
    env.filters.update(links.FILTERS)
    return env


def create_app(cfg: ConsoleConfig) -> Starlette:
    """The console as an ASGI app."""
    c = Console(cfg)
    routes = [
        Route("/", c.overview), Route("/fragment/overview", c.overview), Route("/jobs", c.jobs),
        Route("/job/{job_id}", c.job), Route("/dead", c.dead), Route("/crons", c.crons),
        Route("/workers", c.workers),
        Route("/task/{task_id}", c.task), Route("/fragment/task/{task_id}", c.task),
        Route("/login", c.login, methods=["GET", "POST"]), Route("/logout", c.logout, methods=["POST"]),
        Route("/action/{kind}/{target}/{op}", c.act, methods=["POST"]),
        Route("/favicon.ico", favicon),  # what browsers ask for when a page names no icon (base.html does)
        Mount("/static", StaticFiles(directory=str(resources.files("scheduler.shell.ui") / "static")), name="static"),
    ]

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(c.tasks.stop_all)  # running requeues stop between batches

    gate = Middleware(Gate, hosts=HostPolicy(cfg.allowed_hosts), trusted_proxies=cfg.trusted_proxies)
    return Starlette(routes=routes, lifespan=lifespan, middleware=[gate],
                     exception_handlers={BadRequest: c.bad_request})


async def favicon(_request: Request) -> Response:
    """The console's icon (static/favicon.svg) at the path browsers try by default."""
    icon = (resources.files("scheduler.shell.ui") / "static" / "favicon.svg").read_bytes()
    return Response(icon, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})


def _peer(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "?"


def _client_address(request: Request) -> str:
    return request.client.host if request.client else "?"


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _refused(text: str, status: int = 403) -> Response:
    return PlainTextResponse(text, status_code=status, headers=SECURITY_HEADERS)


class Console:
    """The route handlers, sharing the client, the templates, the auth and the rate sampler."""

    def __init__(self, cfg: ConsoleConfig) -> None:
        self.cfg = cfg
        self.env = _templates()
        self.client = cfg.client
        self.auth = ConsoleAuth(cfg.token, RedisSessions(cfg.client.redis, cfg.client.keyspace))
        self.throttle = LoginThrottle()
        self.rates = views.Rates()
        self.history = history.HistoryCache()
        self.tasks = RequeueTasks(cfg.client)

    async def session(self, request: Request) -> Session | None:
        """The request's session (read once per request); None when read-only: nothing to act on."""
        if SCOPE_KEY not in request.scope:
            cookie = request.cookies.get(session_cookie(_secure(request)))
            found = None if self.cfg.read_only or not cookie else await run_in_threadpool(self.auth.session, cookie)
            request.scope[SCOPE_KEY] = found
        found_session: Session | None = request.scope[SCOPE_KEY]
        return found_session

    async def render(self, request: Request, name: str, status: int = 200, headers: dict[str, str] | None = None,
                     **ctx: Any) -> HTMLResponse:
        s = await self.session(request)
        msg = request.query_params.get("msg", "")
        if msg and not self.auth.signed(msg, request.query_params.get("sig", "")):
            msg = ""  # not a message of this console's: a link made elsewhere
        ctx.update(request=request, who=s.who if s else None, read_only=self.cfg.read_only,
                   can_act=s is not None and not self.cfg.read_only, csrf=self.auth.csrf_for(s) if s else "",
                   msg=msg, namespace=self.client.keyspace.namespace, redis=mask_secrets(self.cfg.redis_url),
                   refresh_ms=int(self.cfg.refresh_seconds * 1000))
        html = self.env.get_template(name).render(**ctx)
        return HTMLResponse(html, status_code=status, headers={**SECURITY_HEADERS, **(headers or {})})

    async def error(self, request: Request, status: int, title: str, text: str) -> HTMLResponse:
        return await self.render(request, "error.html", status=status, title=title, error=text)

    async def bad_request(self, request: Request, exc: Exception) -> Response:
        """A query or path parameter the console does not take: 400, saying what it accepts."""
        return await self.error(request, 400, "Bad request", str(exc))

    def back(self, path: str, msg: str) -> RedirectResponse:
        sep = "&" if "?" in path else "?"
        return RedirectResponse(f"{path}{sep}msg={quote(msg)}&sig={self.auth.sign(msg)}", status_code=303,
                                headers=SECURITY_HEADERS)

    def from_here(self, request: Request) -> bool:
        """Whether a POST comes from this console's pages (Origin / Referer; see security.same_origin)."""
        return same_origin(request.headers.get("origin"), request.headers.get("referer"), request.url.scheme,
                           request.headers.get("host"))

    # -- pages ---------------------------------------------------------------------------------
    async def overview(self, request: Request) -> Response:
        ov = await run_in_threadpool(views.overview, self.client, self.rates, self.cfg.etcd)
        live = await run_in_threadpool(fleet.read_fleet, self.client)
        unserved = fleet.unserved(live, {q.name: q.counts for q in ov.queues},
                                  {q.name for q in ov.queues if q.paused_since})
        charts = await run_in_threadpool(history.charts, self.history, self.client, int(ov.now.timestamp() * 1000),
                                         [q.name for q in ov.queues])
        name = "overview_body.html" if request.url.path == "/fragment/overview" else "overview.html"
        return await self.render(request, name, ov=ov, fleet=live, unserved=unserved, charts=charts,
                                 g=history.GEOMETRY)

    async def workers(self, request: Request) -> Response:
        live = await run_in_threadpool(fleet.read_fleet, self.client)
        return await self.render(request, "workers.html", fleet=live)

    async def jobs(self, request: Request) -> Response:
        args = dict(request.query_params)
        q = params.jobs_query(request.query_params, self.client.keyspace.partitions)
        if q.find:
            info, complete = await run_in_threadpool(views.find_job, self.client, q.find)
            if info is None:
                more = "" if complete else (f" (only the first {admin.jobs.FINISHED_SCAN_LIMIT} finished jobs of its "
                                            "partition were searched for the key)")
                return await self.render(request, "jobs.html", status=404, rows=[], cursor=None, args=args,
                                         states=LIST_STATES, per_page=False,
                                         error=f"no job with id or idempotency key {q.find!r}{more}")
            return RedirectResponse(f"/job/{info.id}", status_code=303)
        rows: list[Any] = []
        cursor, per_page = None, False
        if q.queue:
            try:
                rows, cursor, per_page = await run_in_threadpool(
                    views.jobs_page, self.client, q.queue, q.state, PAGE, q.cursor, q.start, q.end)
            except admin.BadInput as exc:
                raise BadRequest(str(exc)) from None
        nxt = urlencode({**{k: v for k, v in request.query_params.items() if k not in ("cursor", "msg", "sig")},
                         "cursor": cursor}) if cursor else None
        return await self.render(request, "jobs.html", rows=rows, cursor=nxt, args=args, states=LIST_STATES,
                                 error="", per_page=per_page)

    async def job(self, request: Request) -> Response:
        jid = params.job_id(request.path_params["job_id"])
        try:
            info = await run_in_threadpool(admin.get_job, self.client, jid)
        except admin.NotFound as exc:
            return await self.error(request, 404, "Not found", str(exc))
        return await self.render(request, "job.html", job=info, fields=_fields(info), S=JobState)

    async def dead(self, request: Request) -> Response:
        q = params.dead_query(request.query_params)
        page = await run_in_threadpool(dead_listing, self.client, q)
        return await self.render(request, "dead.html", rows=page.jobs, page=page, args=dict(request.query_params),
                                 error="", confirm=None, tasks=self.tasks.recent())

    async def task(self, request: Request) -> Response:
        task = self.tasks.get(params.task_id(request.path_params["task_id"]))
        if task is None:
            return await self.error(request, 404, "Not found", "no such requeue task (the console remembers the "
                                    "running ones and the last finished ones since it started)")
        name = "task_body.html" if request.url.path.startswith("/fragment/") else "task.html"
        return await self.render(request, name, task=task)

    async def crons(self, request: Request) -> Response:
        items = await run_in_threadpool(self.client.crons)
        return await self.render(request, "crons.html", crons=items)

    # -- sessions ------------------------------------------------------------------------------
    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            nxt = params.local_path(request.query_params.get("next") or "/")
            if nxt is None:
                raise BadRequest("next must be a path on this console, like /dead")
            return await self.render(request, "login.html", next=nxt, error="")
        if self.cfg.read_only:
            return _refused("the console runs with --read-only: there is nothing to log in for")
        if not self.from_here(request):
            return _refused("cross-site request refused")
        form = await request.form()
        # No await from here to throttle.failed(): concurrent guesses cannot all pass the check
        # before the first of them is counted.
        address = _client_address(request)
        wait = self.throttle.retry_after(address)
        if wait > 0:
            after = retry_after_header(wait)
            if self.throttle.first_refusal(address):
                audit.warning("login refused: too many wrong tokens from %s; its logins are refused for %s s more",
                              address, after)
            return await self.render(request, "login.html", status=429, headers={"Retry-After": after}, next="/",
                                     error=f"too many wrong tokens from your address: try again in {after} s")
        nxt = params.local_path(str(form.get("next") or "/"))
        if nxt is None:
            raise BadRequest("next must be a path on this console, like /dead")
        try:
            who = clean_name(str(form.get("name") or ""))
        except ValueError as exc:
            return await self.render(request, "login.html", status=400, next=nxt, error=str(exc))
        if not self.auth.token_ok(str(form.get("token") or "")):
            failures, lock = self.throttle.failed(address)
            audit.warning("login refused: wrong token (name %r, from %s, %d in a row%s)", who, _peer(request),
                          failures, f"; its logins are refused for {lock:g} s" if lock else "")
            return await self.render(request, "login.html", status=403, next=nxt, error="wrong token")
        self.throttle.succeeded(address)
        old = await self.session(request)
        if old is not None:  # a login replaces the browser's session: the old one is revoked
            await run_in_threadpool(self.auth.logout, old)
        cookie, _session = await run_in_threadpool(self.auth.login, who, address)
        audit.info("login: %s from %s", who, _peer(request))
        resp = RedirectResponse(nxt, status_code=303, headers=SECURITY_HEADERS)
        resp.set_cookie(session_cookie(_secure(request)), cookie, max_age=int(self.auth.session_seconds),
                        httponly=True, samesite="strict", path="/", secure=_secure(request))
        return resp

    async def logout(self, request: Request) -> Response:
        if not self.from_here(request):
            return _refused("cross-site request refused")
        s = await self.session(request)
        if s is not None:
            form = await request.form()
            if not self.auth.csrf_ok(s, str(form.get("csrf") or "")):
                audit.warning("%s: logout refused, bad CSRF token (from %s)", s.who, _peer(request))
                return _refused("bad or missing CSRF token: reload the page and try again")
            await run_in_threadpool(self.auth.logout, s)
            audit.info("logout: %s from %s", s.who, _peer(request))
        resp = RedirectResponse("/", status_code=303, headers=SECURITY_HEADERS)
        resp.delete_cookie(session_cookie(_secure(request)), path="/", secure=_secure(request), httponly=True,
                           samesite="strict")
        return resp

    # -- actions -------------------------------------------------------------------------------
    async def act(self, request: Request) -> Response:
        if self.cfg.read_only:
            return _refused("the console runs with --read-only: no actions")
        s = await self.session(request)
        if s is None:
            return _refused("log in with the console token first (/login)", 401)
        if not self.from_here(request):
            return _refused("cross-site request refused")
        form = await request.form()
        if not self.auth.csrf_ok(s, str(form.get("csrf") or "")):
            audit.warning("%s: action refused, bad CSRF token (%s %s)", s.who, request.method, request.url.path)
            return _refused("bad or missing CSRF token: reload the page and try again")
        kind, target, op = (request.path_params[k] for k in ("kind", "target", "op"))
        handler = ACTIONS.get((kind, op))
        if handler is None:
            return _refused("unknown action", 404)
        fields = {k: str(v) for k, v in form.multi_items() if k != "csrf"}
        ids = [str(v) for v in form.getlist("id")]
        try:
            result = await run_in_threadpool(handler, self.client, target, fields, ids)
        except (ValueError, admin.AdminError) as exc:
            audit.info("%s from %s: %s refused: %s", s.who, _peer(request), described(kind, op, target, fields, ids),
                       exc)
            return self.back(return_to(fields, kind, target), f"refused: {exc}")
        if isinstance(result, Confirm):
            return await self.render(request, "dead.html", rows=result.rows, page=None, args=fields, error="",
                                     confirm=result, tasks=self.tasks.recent())
        if isinstance(result, StartRequeue):
            try:
                task = self.tasks.start(s.who, result.scope, result.jobs, result.rate)
            except Busy as exc:
                audit.info("%s from %s: dead requeue refused: %s", s.who, _peer(request), exc)
                return self.back("/dead", f"refused: {exc}")
            return RedirectResponse(f"/task/{task.id}", status_code=303, headers=SECURITY_HEADERS)
        audit.info("%s from %s: %s: %s", s.who, _peer(request), described(kind, op, target, fields, ids), result)
        return self.back(return_to(fields, kind, target), result)


def _fields(info: Any) -> list[tuple[str, Any]]:
    names = ("id", "state", "queue", "key", "run_at", "attempts", "max_attempts", "created", "lease_deadline",
             "fence", "died_at", "finished_at", "expires_at")
    return [(n, getattr(info, n)) for n in names]
