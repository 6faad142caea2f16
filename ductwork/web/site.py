"""The dashboard as one ASGI application: its routes, the guard, ``/metrics``, ``/login``.

    >>> asgi = dashboard(app, read_only=True)          # an App, or a database URL
    >>> api.mount("/ductwork", asgi)                    # FastAPI / Starlette: a sub-app

Routes (under the mount point): ``/`` overview, ``/runs``, ``/runs/{id}``,
``/keys``, ``/keys/{key}``, ``/processes`` (GET: pages); ``/runs/{id}/resume``,
``/runs/{id}/revive`` (POST: actions); ``/metrics`` (Prometheus text); ``/login``;
``/static/…``.
"""

from __future__ import annotations

import hmac
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ductwork.web import actions, pages
from ductwork.web.guard import SESSION_COOKIE, Guard, csrf_ok, session_value
from ductwork.web.metrics import FleetCollector
from ductwork.web.render import Dashboard, dashboard_of, page, url

if TYPE_CHECKING:
    from ductwork.app import App

log = logging.getLogger("ductwork.web")


def _metrics_endpoint(registry: CollectorRegistry) -> Any:
    def metrics(_: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return metrics


def _login_page(request: Request) -> HTMLResponse:
    return page(request, "login.html", next=request.query_params.get("next", "/"), error=None)


async def _login(request: Request) -> Response:
    form = await actions.read_form(request) or {}
    token = dashboard_of(request).token
    target = form.get("next", "/")
    target = target if target.startswith("/") and not target.startswith("//") else "/"
    client = request.client.host if request.client else "?"
    if token is None:
        return RedirectResponse(url(request, target), status_code=303)
    if not csrf_ok(request, form) or not hmac.compare_digest(form.get("token", "").encode(), token.encode()):
        log.warning("dashboard: login refused: wrong token or no CSRF token (from %s)", client)
        return page(request, "login.html", 401, next=target, error="wrong token")
    response = RedirectResponse(url(request, target), status_code=303)
    response.set_cookie(SESSION_COOKIE, session_value(token), httponly=True, samesite="strict",
                        path=request.scope.get("root_path", "") or "/", secure=request.url.scheme == "https")
    return response


def dashboard(app: App | str, *, config: Any = None, env: str | None = None, read_only: bool = False,
              token: str | None = None, refresh_s: float = 5.0) -> Starlette:
    """The dashboard over ``app`` (an :class:`~ductwork.app.App`, or a database URL with
    ``config``/``env`` read as :func:`ductwork.connect` reads them, without making it the
    default app). ``read_only``: no action is offered or accepted. ``token``: every
    request must carry it (``Authorization: Bearer``, or the cookie ``/login`` sets).
    ``refresh_s``: seconds between a page's refreshes (0: never). Reads only through
    read-only transactions; the actions write through ``Run.resume`` and ``Run.revive``."""
    if isinstance(app, str):
        from ductwork.app import connect, set_default_app
        from ductwork.db.database import current_default_app

        before = current_default_app()
        app = connect(app, config, env)
        set_default_app(before)
    registry = CollectorRegistry(auto_describe=False)
    state = Dashboard(app, read_only=read_only, token=token or None, refresh_s=refresh_s)
    registry.register(FleetCollector(app, state.rates))
    metrics = _metrics_endpoint(registry)
    routes = [
        Route("/", pages.overview, name="overview"),
        Route("/runs", pages.runs, name="runs"),
        Route("/runs/{run_id}", pages.run, name="run"),
        Route("/runs/{run_id}/resume", actions.resume, methods=["POST"]),
        Route("/runs/{run_id}/revive", actions.revive, methods=["POST"]),
        Route("/keys", pages.keys, name="keys"),
        Route("/keys/{key:path}", pages.key, name="key"),
        Route("/processes", pages.processes, name="processes"),
        Route("/metrics", metrics),
        Route("/login", _login_page, methods=["GET"]),
        Route("/login", _login, methods=["POST"]),
        Mount("/static", StaticFiles(directory=Path(__file__).with_name("static")), name="static"),
    ]
    site = Starlette(routes=routes, middleware=[Middleware(Guard)])
    site.state.dashboard = state
    return site
