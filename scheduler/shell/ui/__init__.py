"""``zsched ui``: the web console (Starlette + Jinja2 templates, served by uvicorn; no front-end
build, one vendored script in ``static/``). Pages: overview, jobs, job, dead letters, crons; actions
through the same client API and admin helpers as the CLI (no second path to Redis).

:func:`create_app` builds the ASGI app (:mod:`.app`, the routes; :mod:`.actions`, what each action
does). In front of every route :mod:`.gate` checks the Host header against the names the console
answers to (:mod:`.hosts`) and applies a trusted proxy's headers; :mod:`.security` holds the token,
the server-side sessions, CSRF and Origin checks, :mod:`.throttle` the failed-login throttle;
:mod:`.params` checks every query parameter; :mod:`.views` turns client reads into what the
templates show and :mod:`.payload` prints a payload of any depth.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import ConsoleConfig, create_app
    from .security import ConsoleAuth

__all__ = ["ConsoleAuth", "ConsoleConfig", "create_app"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: the console's packages (the 'ui' extra) may be missing where zsched
    # only schedules and runs jobs; `zsched dev` and `zsched ui` check for them first.
    if name in ("ConsoleConfig", "create_app"):
        from . import app

        return getattr(app, name)
    if name == "ConsoleAuth":
        from .security import ConsoleAuth

        return ConsoleAuth
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
