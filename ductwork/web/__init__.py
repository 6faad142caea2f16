"""The web dashboard and Prometheus metrics: ``pip install 'ductwork[web]'``.

    >>> from ductwork.web import dashboard
    >>> asgi = dashboard(app)                      # an ASGI app: uvicorn, or mount it
    $ ductwork web --database-url postgresql://… -c ductwork.yml    # 127.0.0.1:8765

Pages for runs, one run (its graph drawn from the definition snapshot), limit keys and
processes, two actions (resume a dampened run, revive a halted one) and ``/metrics``,
all read through ductwork's Python API (docs/dashboard.md). Nothing below the top
layer imports this package.
"""

from __future__ import annotations

from ductwork.db import extras

#: the web extra's modules (from the one map of extras), imported before anything else of
#: the package: one that does not import raises MissingExtraError naming the extra
REQUIRED = tuple(module for module, extra in extras.EXTRAS.items() if extra == "web")
extras.require("the dashboard", *REQUIRED)

from ductwork.web.site import dashboard  # noqa: E402  after the check, which names the extra

__all__ = ["dashboard"]
