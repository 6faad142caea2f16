"""The dashboard's templates and the state every page shares.

    >>> return page(request, "run.html", history=history)

One Jinja2 environment with autoescape on for every template: every value from the
database (step payloads, error messages, context keys and values, key names, labels)
is HTML-escaped where it is written, text or attribute; a path segment is also
percent-encoded (the ``segment`` filter) so a key named ``a/../b`` or ``?x`` stays one
segment. :class:`Dashboard` is what the routes share (``request.app.state.dashboard``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from ductwork.web.rates import ClaimRates

if TYPE_CHECKING:
    from ductwork.app import App

#: at most this many characters of a payload, context value or backtrace are shown
SHOWN_CHARS = 4000


@dataclass
class Dashboard:
    """One dashboard over one App: its options and the claims-rate samples of its pages."""

    app: App
    read_only: bool = False
    #: the bearer token every request must carry; None: no authentication
    token: str | None = None
    #: seconds between a page's refreshes (0: never)
    refresh_s: float = 5.0
    rates: ClaimRates = field(default_factory=ClaimRates)


def dashboard_of(request: Request) -> Dashboard:
    found: Dashboard = request.app.state.dashboard
    return found


def moment(value: datetime | None) -> str:
    return "–" if value is None else value.isoformat(sep=" ", timespec="seconds")


def relative(value: datetime | None, now: datetime) -> str:
    """``3.2 s ago`` or ``in 5.0 s`` (database time)."""
    if value is None:
        return ""
    seconds = (value - now).total_seconds()
    size = abs(seconds)
    if size < 120:
        shown = f"{size:.1f} s"
    elif size < 7200:
        shown = f"{size / 60:.1f} min"
    else:
        shown = f"{size / 3600:.1f} h"
    return f"in {shown}" if seconds > 0 else f"{shown} ago"


def took(start: datetime | None, end: datetime | None) -> str:
    return "" if start is None or end is None else f"{(end - start).total_seconds():.3f} s"


def as_json(value: Any) -> str:
    """Pretty JSON, cut to SHOWN_CHARS (the cut said)."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}\n… ({len(text)} characters in all)"


def cut(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS]}… ({len(text)} characters in all)"


def segment(value: str) -> str:
    """One URL path segment: every reserved character percent-encoded, ``/`` included."""
    return quote(value, safe="")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("ductwork.web", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(moment=moment, relative=relative, took=took, as_json=as_json, cut=cut, segment=segment)
    return env


TEMPLATES = _environment()


def url(request: Request, path: str, **query: Any) -> str:
    """``path`` under the dashboard's mount point, with the query's non-empty values."""
    shown = {name: value for name, value in query.items() if value not in (None, "", False)}
    root: str = request.scope.get("root_path", "")
    return root + path + (f"?{urlencode(shown)}" if shown else "")


def page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    dash = dashboard_of(request)
    body = TEMPLATES.get_template(template).render(
        request=request, base=request.scope.get("root_path", ""), read_only=dash.read_only,
        refresh_s=dash.refresh_s, database=dash.app.database, csrf=request.state.csrf,
        url=lambda path, **query: url(request, path, **query), **context)
    return HTMLResponse(body, status_code=status_code)
