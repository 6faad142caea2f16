"""The optional extras of pyproject.toml: which module each brings, and the check that a
feature's modules import before it writes anything.

    >>> require("the async client", "greenlet")      # MissingExtraError if greenlet is absent

Not done here: which modules a database URL needs (``engines.require_driver``,
``engines.require_async`` map a URL onto the modules of this table).
"""

from __future__ import annotations

import importlib

from ductwork.errors import MissingExtraError

#: every module ductwork imports only when a feature needs it, and the extra of
#: pyproject.toml that installs it (SQLite's driver, ``sqlite3``, comes with Python; the
#: async client's psycopg is the postgres driver, also in the async extra): the one place
#: a missing module is mapped to the ``pip install`` that brings it
EXTRAS = {"psycopg": "postgres", "pymysql": "mysql", "greenlet": "async", "sqlalchemy.ext.asyncio": "async",
          "aiomysql": "async", "aiosqlite": "async", "starlette": "web", "jinja2": "web", "uvicorn": "web",
          "prometheus_client": "web"}


def require(user: str, *modules: str) -> None:
    """Import each of ``modules`` (keys of :data:`EXTRAS`), in order; the first that does
    not import raises :class:`MissingExtraError` naming ``user`` (what needs it), the
    module, why, and the extra that installs it. Callers call it before they write
    anything, so the error never leaves half of an operation behind.

    Imported, not only looked up: a module that is installed but cannot load (psycopg
    without its C library, a greenlet built for another Python) fails here too, with the
    import's own reason. What it imports, the caller would import next anyway.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as error:
            missing = isinstance(error, ModuleNotFoundError) and error.name in (module, module.partition(".")[0])
            reason = "is not installed" if missing else f"does not import ({error})"
            raise MissingExtraError(module, EXTRAS[module], user, reason) from error
