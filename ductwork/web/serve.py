"""``ductwork web``: the dashboard served by uvicorn until SIGINT or SIGTERM.

Binds to 127.0.0.1 unless told otherwise; on another address without a token it says
so (anyone who reaches the port could then resume and revive runs, unless
``--read-only``). One process, its pages run in uvicorn's thread pool.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING

import uvicorn

from ductwork.web.site import dashboard

if TYPE_CHECKING:
    from ductwork.app import App

log = logging.getLogger("ductwork.web")


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(app: App, host: str, port: int, *, read_only: bool, token: str | None, refresh_s: float) -> None:
    if not loopback(host) and not token:
        log.warning("ductwork web: listening on %s without --token: whoever reaches port %d can see every run%s",
                    host, port, "" if read_only else ", and resume and revive runs (add --read-only or --token)")
    site = dashboard(app, read_only=read_only, token=token, refresh_s=refresh_s)
    mode = " (read-only)" if read_only else ""
    shown = f"[{host}]" if ":" in host else host
    print(f"ductwork web: {app.database} on http://{shown}:{port}/{mode}", flush=True)
    uvicorn.run(site, host=host, port=port, log_level="warning", access_log=False, proxy_headers=False)
