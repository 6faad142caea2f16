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

import importlib.util

#: the web extra's modules (pyproject.toml): their import names
REQUIRED = ("starlette", "jinja2", "uvicorn", "prometheus_client")

_missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
if _missing:
    raise ImportError(f"the dashboard needs {', '.join(_missing)}, not installed here: "
                      "pip install 'ductwork[web]'")

from ductwork.web.site import dashboard  # noqa: E402  after the check, which names the extra

__all__ = ["dashboard"]
