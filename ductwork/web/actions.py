"""The dashboard's two actions, each a POST with a CSRF token and a confirmation:
resume a dampened run (with JSON input, or the previous step's output) and revive a
halted run.

The first POST (from the run page) only shows what would be done, on a confirmation
page whose form repeats the values with ``confirmed=yes``; the second does it through
``Run.resume`` or ``Run.revive`` (their one transaction, their exactly-once) and
redirects to the run. Refused with 403 in read-only mode or without the CSRF token; a
run not in the state the action needs is the method's own error, shown with 409.
Nothing is done through GET. Every action and every refusal is logged
(``ductwork.web``) with the client's address.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ductwork.errors import DuctworkError
from ductwork.web.guard import csrf_ok
from ductwork.web.render import dashboard_of, page, segment, url

if TYPE_CHECKING:
    from ductwork.app import App

log = logging.getLogger("ductwork.web")

#: the largest form body read (a resume's JSON input is within it)
MAX_FORM_BYTES = 4 * 1024 * 1024


async def read_form(request: Request) -> dict[str, str] | None:
    """The url-encoded form (the last value of a repeated field); None when too large."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return None
    return dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))


async def _checked(request: Request, action: str) -> dict[str, str] | Response:
    """The form, or the response refusing it (too large, no CSRF token, read-only)."""
    form = await read_form(request)
    client = request.client.host if request.client else "?"
    run_id = request.path_params["run_id"]
    if form is None:
        return PlainTextResponse(f"413: a form of at most {MAX_FORM_BYTES} bytes\n", status_code=413)
    if not csrf_ok(request, form):
        log.warning("dashboard: %s of run %s refused: no valid CSRF token (from %s)", action, run_id, client)
        return PlainTextResponse("403: the form's CSRF token is missing or wrong; reload the page\n",
                                 status_code=403)
    if dashboard_of(request).read_only:
        log.warning("dashboard: %s of run %s refused: read-only (from %s)", action, run_id, client)
        return PlainTextResponse("403: this dashboard is read-only\n", status_code=403)
    return form


#: what an action does: from the form, the run's id and the App, the call that does it
#: (returning the id of the run to show) and what the confirmation page shows; or the
#: response that refuses the form
Plan = Callable[[dict[str, str], str, "App"], "tuple[Callable[[], str], dict[str, Any]] | Response"]


async def _act(request: Request, action: str, plan: Plan) -> Response:
    checked = await _checked(request, action)
    if isinstance(checked, Response):
        return checked
    form, run_id = checked, request.path_params["run_id"]
    client = request.client.host if request.client else "?"
    planned = plan(form, run_id, dashboard_of(request).app)
    if isinstance(planned, Response):
        return planned
    do, shown = planned
    if form.get("confirmed") != "yes":
        return page(request, "confirm.html", action=action, run_id=run_id, form=form, error=None, **shown)
    try:
        target = await run_in_threadpool(do)
    except DuctworkError as error:
        log.warning("dashboard: %s of run %s refused: %s: %s (from %s)", action, run_id,
                    type(error).__name__, error, client)
        return page(request, "refused.html", 409, action=action, run_id=run_id,
                    error=f"{type(error).__name__}: {error}")
    log.info("dashboard: %s of run %s done: run %s (from %s)", action, run_id, target, client)
    return RedirectResponse(url(request, f"/runs/{segment(target)}", done=action), status_code=303)


async def resume(request: Request) -> Response:
    def plan(form: dict[str, str], run_id: str, app: App) -> tuple[Callable[[], str], dict[str, Any]] | Response:
        previous = form.get("input_from") == "previous"
        value: Any = None
        if not previous:
            try:
                value = json.loads(form.get("input", ""))
            except ValueError as error:
                return page(request, "confirm.html", 400, action="resume", run_id=run_id, form=form,
                            error=f"the input is not JSON: {error}", value=None, previous=False)

        def do() -> str:
            handle = app.run(run_id)
            return (handle.resume() if previous else handle.resume(value)).id

        return do, {"value": value, "previous": previous}

    return await _act(request, "resume", plan)


async def revive(request: Request) -> Response:
    def plan(form: dict[str, str], run_id: str, app: App) -> tuple[Callable[[], str], dict[str, Any]]:
        duplicate = form.get("duplicate_context") == "yes"
        return (lambda: app.run(run_id).revive(duplicate_context=duplicate).id), {"duplicate": duplicate}

    return await _act(request, "revive", plan)
