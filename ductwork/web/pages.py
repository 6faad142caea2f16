"""The dashboard's pages: overview, runs, run, limit keys, one key, processes.

Each reads through ductwork's Python API and nothing else: ``status.snapshot`` (runs
by status, processes, keys), ``list_runs`` (the runs page, keyset-paged),
``Run.history()``, ``Run.steps()``, ``Run.definition()`` and ``Context.get`` (the run
page). Each of those is a read-only transaction that takes no key lock and writes
nothing. A handler is a plain function: Starlette runs it in a worker thread, so the
event loop never waits for the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse

from ductwork.errors import RunFilterError, UnknownRunError
from ductwork.limit_entries import RateEntry
from ductwork.pipelines.context import Context
from ductwork.pipelines.history import DEFAULT_LIMIT, RUN_STATUSES, list_runs
from ductwork.status import KeyStatus, Status, key_statuses, process_statuses, snapshot
from ductwork.web.graph import lay_out, legend, node_states
from ductwork.web.metrics import process_state, refusals
from ductwork.web.render import Dashboard, dashboard_of, page, url

#: keys the overview lists (the busiest); the keys page lists them all, KEYS_PER_PAGE at a time
OVERVIEW_KEYS = 12
KEYS_PER_PAGE = 100
#: at most this many steps, branches and context values on a run page (the rest counted)
RUN_ROWS = 500
CONTEXT_SHOWN = 50


@dataclass(frozen=True)
class BucketView:
    period_s: int
    limit: int
    tokens: float
    burst: int
    #: below one token: a claim now is refused for this entry
    empty: bool


@dataclass(frozen=True)
class KeyView:
    status: KeyStatus
    buckets: tuple[BucketView, ...]
    #: per reason (concurrency, rate): a claim now would be refused
    refusing: dict[str, bool]
    #: rate-blocked until a moment after now
    blocked: bool
    #: the claims-per-second chart: polyline points and its top (claims/s)
    points: str
    peak: float


def key_view(dash: Dashboard, key: KeyStatus, status: Status) -> KeyView:
    entry = dash.app.config.entry_for(key.key)
    rates: tuple[RateEntry, ...] = entry.rates if entry else ()
    shown = tuple(BucketView(period, rate.limit, float(level), burst, level < 1)
                  for rate, (period, level, burst) in zip(rates, key.buckets, strict=True))
    points, peak = dash.rates.sparkline(key.key)
    return KeyView(key, shown, refusals(key, status),
                   key.blocked_until is not None and key.blocked_until > status.now, points, peak)


def _snapshot(dash: Dashboard, **which: Any) -> Status:
    """The snapshot (``status.snapshot``'s ``keys``, ``busy_only``), recorded for the
    claims-rate charts."""
    status = snapshot(dash.app, **which)
    dash.rates.record(status.now, {key.key: key.claims for key in status.keys})
    return status


def overview(request: Request) -> HTMLResponse:
    dash = dashboard_of(request)
    status = _snapshot(dash, busy_only=True)
    busiest = sorted(status.keys, key=lambda k: (-(k.in_flight + k.pending), k.key))[:OVERVIEW_KEYS]
    return page(request, "overview.html", status=status, statuses=RUN_STATUSES,
                keys=[key_view(dash, key, status) for key in busiest], busy_keys=len(status.keys),
                states={proc.id: process_state(proc) for proc in status.processes})


def processes(request: Request) -> HTMLResponse:
    now, procs = process_statuses(dashboard_of(request).app)
    return page(request, "processes.html", now=now, processes=procs,
                states={proc.id: process_state(proc) for proc in procs})


def _cursor(query: Any) -> tuple[datetime, str] | None:
    at, run_id = query.get("before_at"), query.get("before_id")
    if not at or not run_id:
        return None
    try:
        return datetime.fromisoformat(at), run_id
    except ValueError:
        raise RunFilterError("before_at", at, "expected the ISO 8601 time of a run's trigger") from None


def runs(request: Request) -> HTMLResponse:
    dash = dashboard_of(request)
    query = request.query_params
    filters = {name: query.get(name) or None for name in ("status", "pipeline", "since")}
    try:
        records = list_runs(dash.app, limit=DEFAULT_LIMIT + 1, before=_cursor(query), **filters)
        error = None
    except RunFilterError as failure:
        records, error = [], str(failure)
    shown = records[:DEFAULT_LIMIT]
    older_url = None
    if len(records) > DEFAULT_LIMIT:
        older_url = url(request, "/runs", **filters, before_at=shown[-1].triggered_at.isoformat(),
                        before_id=shown[-1].id)
    return page(request, "runs.html", 400 if error else 200, runs=shown, error=error, filters=filters,
                statuses=RUN_STATUSES, older_url=older_url,
                newest_url=url(request, "/runs", **filters) if "before_at" in query else None,
                pipelines=[p for p in dash.app.config.pipelines if p != "*"])


def run(request: Request) -> HTMLResponse:
    dash = dashboard_of(request)
    run_id = request.path_params["run_id"]
    try:
        handle = dash.app.run(run_id)
        history = handle.history()
        infos = {info.id: info for info in handle.steps()}
        definition = handle.definition()
    except UnknownRunError as error:
        return page(request, "missing.html", 404, what=str(error))
    context = Context(dash.app, run_id)
    values = {key: context.get(key) for key in history.context_keys[:CONTEXT_SHOWN]}
    return page(request, "run.html", history=history, infos=infos, values=values,
                graph=lay_out(definition, node_states(history)), legend=legend(), rows=RUN_ROWS,
                done=request.query_params.get("done"))


def keys(request: Request) -> HTMLResponse:
    dash = dashboard_of(request)
    text, busy = request.query_params.get("q", ""), request.query_params.get("busy") == "1"
    try:
        start = max(0, int(request.query_params.get("from", "0")))
    except ValueError:
        start = 0
    now, matched, window = key_statuses(dash.app, busy_only=busy, contains=text, offset=start, limit=KEYS_PER_PAGE)
    dash.rates.record(now, {key.key: key.claims for key in window})
    status = Status(now, {}, [], window)
    kept = {"q": text, "busy": "1" if busy else None}
    return page(request, "keys.html", status=status, keys=[key_view(dash, key, status) for key in window],
                matched=matched, start=start, per_page=KEYS_PER_PAGE, q=text, busy=busy,
                previous_url=url(request, "/keys", **kept, **{"from": max(0, start - KEYS_PER_PAGE)})
                if start else None,
                next_url=url(request, "/keys", **kept, **{"from": start + KEYS_PER_PAGE})
                if start + KEYS_PER_PAGE < matched else None)


def key(request: Request) -> HTMLResponse:
    dash = dashboard_of(request)
    name = request.path_params["key"]
    now, _, found_keys = key_statuses(dash.app, keys=[name])
    dash.rates.record(now, {key.key: key.claims for key in found_keys})
    status = Status(now, {}, [], found_keys)
    found = next(iter(found_keys), None)
    if found is None:
        return page(request, "missing.html", 404, what=f"no limit key {name!r} (no execution ever used it)")
    entry = dash.app.config.entry_for(name)
    return page(request, "key.html", status=status, view=key_view(dash, found, status), entry=entry,
                window_s=dash.rates.window_s)
