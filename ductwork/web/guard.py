"""Who may use the dashboard, and how a form proves it came from the dashboard.

- **Bearer token** (``dashboard(token=…)``, ``ductwork web --token`` or
  ``DUCTWORK_WEB_TOKEN``): every request but ``/login`` and ``/static/`` carries
  ``Authorization: Bearer <token>`` (Prometheus: ``authorization: {credentials: …}``) or
  the session cookie ``/login`` sets after the token was typed there (an HMAC of the
  token, HttpOnly, SameSite=Strict). Otherwise a page redirects to ``/login`` and
  anything else answers 401. Compared in constant time.
- **CSRF**: a random token in an HttpOnly, SameSite=Strict cookie, set on the first
  response, is also a hidden field of every form; a POST whose field does not equal the
  cookie, or whose ``Origin`` names another host, is refused (403) before it reads
  anything else (double-submit cookie).
- **Headers** on every response: a Content-Security-Policy that runs no inline script
  and loads nothing from elsewhere, no framing, no MIME sniffing.

Not done: TLS (put the dashboard behind a proxy that terminates it, or bind to
127.0.0.1, the default), users and roles (one token for everyone; ``--read-only`` for a
dashboard that must change nothing), rate-limiting login attempts.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Mapping
from urllib.parse import urlsplit

from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from ductwork.web.render import dashboard_of, url

log = logging.getLogger("ductwork.web")

CSRF_COOKIE = "ductwork_csrf"
SESSION_COOKIE = "ductwork_session"
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
#: reachable without the token
OPEN_PATHS = ("/login", "/static/")


def session_value(token: str) -> str:
    """The session cookie's value for ``token``: an HMAC, so the cookie never holds the token."""
    return hmac.new(token.encode(), b"ductwork web session", hashlib.sha256).hexdigest()


def authorized(request: Request, token: str) -> bool:
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer " and hmac.compare_digest(header[7:].strip().encode(), token.encode()):
        return True
    cookie = request.cookies.get(SESSION_COOKIE, "")
    return hmac.compare_digest(cookie.encode(), session_value(token).encode())


def csrf_ok(request: Request, form: Mapping[str, str]) -> bool:
    """The form's ``csrf`` field equals the cookie, and ``Origin`` (when sent) is this host."""
    cookie, sent = request.cookies.get(CSRF_COOKIE, ""), form.get("csrf", "")
    if not cookie or not hmac.compare_digest(cookie.encode(), sent.encode()):
        return False
    origin = request.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == request.headers.get("host")


def route_path(request: Request) -> str:
    path: str = request.scope["path"]
    root: str = request.scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


class Guard(BaseHTTPMiddleware):
    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        token = dashboard_of(request).token
        path = route_path(request)
        if token and not path.startswith(OPEN_PATHS) and not authorized(request, token):
            if request.method == "GET" and path != "/metrics":
                return self._secured(RedirectResponse(url(request, "/login", next=path), status_code=303))
            return self._secured(PlainTextResponse("401: a bearer token is required\n", status_code=401,
                                                   headers={"WWW-Authenticate": "Bearer"}))
        csrf = request.cookies.get(CSRF_COOKIE, "")
        fresh = len(csrf) < 32
        if fresh:
            csrf = secrets.token_urlsafe(32)
        request.state.csrf = csrf
        response = await call_next(request)
        if fresh:
            response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict",
                                path=request.scope.get("root_path", "") or "/",
                                secure=request.url.scheme == "https")
        return self._secured(response)

    @staticmethod
    def _secured(response: Response) -> Response:
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)
        return response
