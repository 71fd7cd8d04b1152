"""The console's routes: pages (GET, no token needed) and actions (POST: session, CSRF token,
same origin, not ``--read-only``), each action logged with who and when."""
from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ...client import Client
from ...protocol.calls import LIST_STATES
from ...protocol.masking import mask_secrets
from ...protocol.models import JobState
from .. import admin
from . import views
from .security import SECURITY_HEADERS, SESSION_COOKIE, ConsoleAuth, audit, clean_name, same_origin
from .tasks import ALL_QUEUES, Busy, RequeueTasks

log = logging.getLogger("zsched.ui")
PAGE = 50
SYNC_REQUEUE = 500  # a requeue without a rate of at most this many jobs (one batch) runs in the request


@dataclass
class ConsoleConfig:
    """What ``zsched ui`` serves: the client (its URL is shown with the password masked), the
    operator token, ``read_only`` (no action anywhere), etcd endpoints for partition owners."""

    client: Client
    token: str
    redis_url: str = ""
    read_only: bool = False
    etcd: str | None = None
    refresh_seconds: float = 3.0


def _templates() -> jinja2.Environment:
    root = resources.files("scheduler.shell.ui") / "templates"
    env = jinja2.Environment(loader=jinja2.FunctionLoader(lambda name: (root / name).read_text("utf-8")),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["iso"] = lambda v: admin.iso(v) or "-"
    env.filters["ago"] = lambda s: admin.human_delta(-s) if s else "-"
    env.filters["rate"] = lambda v: "-" if v is None else f"{v:.1f}"
    env.filters["errtext"] = admin.error_text
    env.filters["payload"] = views.payload_text
    return env


def create_app(cfg: ConsoleConfig) -> Starlette:
    """The console as an ASGI app."""
    c = Console(cfg)
    routes = [
        Route("/", c.overview), Route("/fragment/overview", c.overview), Route("/jobs", c.jobs),
        Route("/job/{job_id}", c.job), Route("/dead", c.dead), Route("/crons", c.crons),
        Route("/task/{task_id}", c.task), Route("/fragment/task/{task_id}", c.task),
        Route("/login", c.login, methods=["GET", "POST"]), Route("/logout", c.logout, methods=["POST"]),
        Route("/action/{kind}/{target}/{op}", c.act, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(resources.files("scheduler.shell.ui") / "static")), name="static"),
    ]

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await run_in_threadpool(c.tasks.stop_all)  # running requeues stop between batches

    return Starlette(routes=routes, lifespan=lifespan)


class Console:
    """The route handlers, sharing the client, the templates, the auth and the rate sampler."""

    def __init__(self, cfg: ConsoleConfig) -> None:
        self.cfg = cfg
        self.env = _templates()
        self.auth = ConsoleAuth(cfg.token)
        self.rates = views.Rates()
        self.client = cfg.client
        self.tasks = RequeueTasks(cfg.client)

    def render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        cookie = request.cookies.get(SESSION_COOKIE)
        who = self.auth.who(cookie)
        ctx.update(request=request, who=who, read_only=self.cfg.read_only, can_act=bool(who) and not self.cfg.read_only,
                   csrf=self.auth.csrf_for(cookie) if who and cookie else "", msg=request.query_params.get("msg", ""),
                   namespace=self.client.keyspace.namespace, redis=mask_secrets(self.cfg.redis_url),
                   refresh_ms=int(self.cfg.refresh_seconds * 1000))
        html = self.env.get_template(name).render(**ctx)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def back(self, path: str, msg: str) -> RedirectResponse:
        sep = "&" if "?" in path else "?"
        return RedirectResponse(f"{path}{sep}msg={quote(msg)}", status_code=303, headers=SECURITY_HEADERS)

    # -- pages ---------------------------------------------------------------------------------
    async def overview(self, request: Request) -> Response:
        ov = await run_in_threadpool(views.overview, self.client, self.rates, self.cfg.etcd)
        name = "overview_body.html" if request.url.path == "/fragment/overview" else "overview.html"
        return self.render(request, name, ov=ov)

    async def jobs(self, request: Request) -> Response:
        q = request.query_params
        find = q.get("find", "").strip()
        if find:
            info = await run_in_threadpool(views.find_job, self.client, find)
            if info is None:
                return self.render(request, "jobs.html", status=404, rows=[], cursor=None, args=dict(q),
                                   states=LIST_STATES, error=f"no job with id or idempotency key {find!r}",
                                   per_page=False)
            return RedirectResponse(f"/job/{info.id}", status_code=303)
        queue, state = q.get("queue", ""), q.get("state", "ready")
        rows: list[Any] = []
        cursor = None
        error = ""
        per_page = False
        if queue:
            try:
                tz = q.get("tz", "UTC")
                start = views.parse_local(q["from"], tz) if q.get("from") else None
                end = views.parse_local(q["to"], tz) if q.get("to") else None
                rows, cursor, per_page = await run_in_threadpool(
                    views.jobs_page, self.client, admin.parse_queue(queue), state, PAGE, q.get("cursor") or None,
                    start, end)
            except (ValueError, admin.AdminError) as exc:
                error = str(exc)
        nxt = urlencode({**{k: v for k, v in q.items() if k not in ("cursor", "msg")}, "cursor": cursor}) \
            if cursor else None
        return self.render(request, "jobs.html", rows=rows, cursor=nxt, args=dict(q), states=LIST_STATES, error=error,
                           per_page=per_page)

    async def job(self, request: Request) -> Response:
        jid = request.path_params["job_id"]
        try:
            info = await run_in_threadpool(admin.get_job, self.client, jid)
        except (ValueError, admin.AdminError) as exc:
            return self.render(request, "error.html", status=404, error=str(exc))
        return self.render(request, "job.html", job=info, fields=_fields(info), S=JobState)

    async def dead(self, request: Request) -> Response:
        q = request.query_params
        try:
            flt, start, end = _dead_filter(q)
            limit = min(500, int(q.get("limit", "100")))
            rows = await run_in_threadpool(_dead_rows, self.client, flt, start, end, limit)
            error = ""
        except (ValueError, admin.AdminError) as exc:
            rows, error = [], str(exc)
        return self.render(request, "dead.html", rows=rows, args=dict(q), error=error, confirm=None,
                           tasks=self.tasks.recent())

    async def task(self, request: Request) -> Response:
        task = self.tasks.get(request.path_params["task_id"])
        if task is None:
            return self.render(request, "error.html", status=404, error="no such requeue task (the console "
                               "remembers the running ones and the last finished ones since it started)")
        name = "task_body.html" if request.url.path.startswith("/fragment/") else "task.html"
        return self.render(request, name, task=task)

    async def crons(self, request: Request) -> Response:
        items = await run_in_threadpool(self.client.crons)
        return self.render(request, "crons.html", crons=items)

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return self.render(request, "login.html", next=request.query_params.get("next", "/"), error="")
        if not same_origin(request.headers.get("origin"), request.headers.get("referer"), request.headers.get("host")):
            return Response("cross-site request refused", status_code=403, headers=SECURITY_HEADERS)
        form = await request.form()
        nxt = str(form.get("next") or "/")
        nxt = nxt if nxt.startswith("/") and not nxt.startswith("//") else "/"
        try:
            who = clean_name(str(form.get("name") or ""))
        except ValueError as exc:
            return self.render(request, "login.html", status=400, next=nxt, error=str(exc))
        if not self.auth.token_ok(str(form.get("token") or "")):
            audit.warning("login refused: wrong token (name %r, from %s)", who, _peer(request))
            return self.render(request, "login.html", status=403, next=nxt, error="wrong token")
        audit.info("login: %s from %s", who, _peer(request))
        resp = RedirectResponse(nxt, status_code=303, headers=SECURITY_HEADERS)
        resp.set_cookie(SESSION_COOKIE, self.auth.session_for(who), max_age=int(self.auth.session_seconds),
                        httponly=True, samesite="strict", path="/")
        return resp

    async def logout(self, request: Request) -> Response:
        resp = RedirectResponse("/", status_code=303, headers=SECURITY_HEADERS)
        resp.delete_cookie(SESSION_COOKIE, path="/")
        return resp

    # -- actions -------------------------------------------------------------------------------
    async def act(self, request: Request) -> Response:
        if self.cfg.read_only:
            return Response("the console runs with --read-only: no actions", status_code=403,
                            headers=SECURITY_HEADERS)
        cookie = request.cookies.get(SESSION_COOKIE)
        who = self.auth.who(cookie)
        if who is None:
            return Response("log in with the console token first (/login)", status_code=401, headers=SECURITY_HEADERS)
        if not same_origin(request.headers.get("origin"), request.headers.get("referer"), request.headers.get("host")):
            return Response("cross-site request refused", status_code=403, headers=SECURITY_HEADERS)
        form = await request.form()
        if not self.auth.csrf_ok(cookie, str(form.get("csrf") or "")):
            audit.warning("%s: action refused, bad CSRF token (%s %s)", who, request.method, request.url.path)
            return Response("bad or missing CSRF token: reload the page and try again", status_code=403,
                            headers=SECURITY_HEADERS)
        kind, target, op = (request.path_params[k] for k in ("kind", "target", "op"))
        handler = ACTIONS.get((kind, op))
        if handler is None:
            return Response("unknown action", status_code=404, headers=SECURITY_HEADERS)
        fields = {k: str(v) for k, v in form.multi_items() if k != "csrf"}
        ids = [str(v) for v in form.getlist("id")]
        try:
            result = await run_in_threadpool(handler, self.client, target, fields, ids)
        except (ValueError, admin.AdminError) as exc:
            audit.info("%s from %s: %s %s %s refused: %s", who, _peer(request), kind, op, target, exc)
            return self.back(_return_to(fields, kind, target), f"refused: {exc}")
        if isinstance(result, Confirm):
            return self.render(request, "dead.html", rows=result.rows, args=fields, error="", confirm=result,
                               tasks=self.tasks.recent())
        if isinstance(result, StartRequeue):
            try:
                task = self.tasks.start(who, result.scope, result.jobs, result.rate)
            except Busy as exc:
                audit.info("%s from %s: dead requeue refused: %s", who, _peer(request), exc)
                return self.back("/dead", f"refused: {exc}")
            return RedirectResponse(f"/task/{task.id}", status_code=303, headers=SECURITY_HEADERS)
        audit.info("%s from %s: %s %s %s: %s", who, _peer(request), kind, op, target, result)
        return self.back(_return_to(fields, kind, target), result)


def _peer(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "?"


def _return_to(fields: dict[str, str], kind: str, target: str) -> str:
    back = fields.get("back", "")
    if back.startswith("/") and not back.startswith("//"):
        return back
    return {"job": f"/job/{target}", "cron": "/crons", "dead": "/dead"}.get(kind, "/")


def _fields(info: Any) -> list[tuple[str, Any]]:
    names = ("id", "state", "queue", "key", "run_at", "attempts", "max_attempts", "created", "lease_deadline",
             "fence", "died_at", "finished_at", "expires_at")
    return [(n, getattr(info, n)) for n in names]


# -- dead letters ------------------------------------------------------------------------------
@dataclass
class Confirm:
    """A dead-letter action's dry run: how many jobs it would touch, shown before confirming."""

    op: str
    count: int
    rows: list[Any]
    fields: dict[str, str]
    ids: list[str]


@dataclass
class StartRequeue:
    """A confirmed requeue to run in the background (with a rate, or more than one batch)."""

    scope: str
    jobs: list[Any]
    rate: float | None


def _dead_filter(q: Any) -> tuple[admin.DeadFilter, datetime | None, datetime | None]:
    tz = q.get("tz", "UTC") or "UTC"
    start = views.parse_local(q["since"], tz) if q.get("since") else None
    end = views.parse_local(q["until"], tz) if q.get("until") else None
    queue = admin.parse_queue(q["queue"]) if q.get("queue") else None
    return admin.DeadFilter(queue=queue, error_contains=q.get("error") or None, ignore_case=True), start, end


def _dead_matching(client: Client, fields: dict[str, str], ids: list[str]) -> list[Any]:
    if ids:
        infos = client.get_many(ids)
        return [i for i in infos.values() if i is not None and i.state is JobState.DEAD]
    flt, start, end = _dead_filter(fields)
    return [i for i in admin.iter_dead(client, flt) if views.in_range(i.died_at, start, end)]


def _dead_rows(client: Client, flt: admin.DeadFilter, start: datetime | None, end: datetime | None,
               limit: int) -> list[Any]:
    return list(itertools.islice((i for i in admin.iter_dead(client, flt) if views.in_range(i.died_at, start, end)),
                                 limit))


def _dead_op(op: str) -> Callable[[Client, str, dict[str, str], list[str]], Any]:
    def run(client: Client, _target: str, fields: dict[str, str], ids: list[str]) -> Any:
        jobs = _dead_matching(client, fields, ids)
        if fields.get("confirm") != "1":
            return Confirm(op, len(jobs), jobs[:PAGE], fields, [j.id for j in jobs] if ids else [])
        if op == "purge":
            for j in jobs:
                admin.purge_one(client, j.id)
            return f"purged {len(jobs)} dead jobs"
        rate = float(fields["rate"]) if fields.get("rate") else None
        if rate is not None and not 0 < rate <= 100_000:
            raise ValueError(f"rate must be > 0 and <= 100000 jobs/s, got {rate:g}")
        if rate is not None or len(jobs) > SYNC_REQUEUE:
            queues = {j.queue for j in jobs}
            scope = fields.get("queue") or (queues.pop() if len(queues) == 1 else ALL_QUEUES)
            return StartRequeue(scope, jobs, rate)
        done = sum(1 for o in admin.requeue_stream(client, jobs, rate=None) if o.status == "requeued")
        return f"requeued {done} of {len(jobs)} dead jobs"
    return run


# -- the other actions: (client, target, form fields, selected ids) -> message -----------------
def _reschedule(client: Client, jid: str, fields: dict[str, str], _ids: list[str]) -> str:
    at = views.parse_local(fields.get("at", ""), fields.get("tz", "UTC"))
    info = admin.reschedule_job(client, jid, int(at.timestamp() * 1000))
    return f"job {jid} rescheduled to {admin.iso(info.run_at)}"


def _run_now(client: Client, jid: str, _f: dict[str, str], _ids: list[str]) -> str:
    admin.reschedule_job(client, jid, int(datetime.now(UTC).timestamp() * 1000))
    return f"job {jid} runs now"


def _cancel(client: Client, jid: str, _f: dict[str, str], _ids: list[str]) -> str:
    admin.cancel_job(client, jid)
    return f"job {jid} cancelled"


def _requeue(client: Client, jid: str, _f: dict[str, str], _ids: list[str]) -> str:
    admin.get_dead_job(client, jid)
    done, _info = admin.requeue_one(client, jid)
    return f"job {jid} requeued" if done else f"job {jid} was not dead any more"


def _purge(client: Client, jid: str, _f: dict[str, str], _ids: list[str]) -> str:
    admin.purge_one(client, jid)
    return f"job {jid} purged"


def _queue(pause: bool) -> Callable[[Client, str, dict[str, str], list[str]], str]:
    def run(client: Client, queue: str, _f: dict[str, str], _ids: list[str]) -> str:
        name = admin.parse_queue(queue)
        changed = client.pause(name) if pause else client.resume(name)
        verb = "paused" if pause else "resumed"
        return f"queue {name} {verb}" if changed else f"queue {name} was already {verb if pause else 'running'}"
    return run


def _cron(pause: bool) -> Callable[[Client, str, dict[str, str], list[str]], str]:
    def run(client: Client, name: str, _f: dict[str, str], _ids: list[str]) -> str:
        changed = client.pause_cron(name) if pause else client.resume_cron(name)
        verb = "paused" if pause else "resumed"
        return f"cron {name} {verb}" if changed else f"cron {name} was already {verb if pause else 'active'}"
    return run


ACTIONS: dict[tuple[str, str], Callable[[Client, str, dict[str, str], list[str]], Any]] = {
    ("job", "cancel"): _cancel, ("job", "reschedule"): _reschedule, ("job", "run-now"): _run_now,
    ("job", "requeue"): _requeue, ("job", "purge"): _purge,
    ("queue", "pause"): _queue(True), ("queue", "resume"): _queue(False),
    ("cron", "pause"): _cron(True), ("cron", "resume"): _cron(False),
    ("dead", "requeue"): _dead_op("requeue"), ("dead", "purge"): _dead_op("purge"),
}
