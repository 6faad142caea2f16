"""The application handle: one database, one config, one clock.

    >>> app = ductwork.connect("sqlite:///ductwork.sqlite3")
    >>> run = SyncOrders.trigger(since="2026-01-01")

``connect`` picks the database URL from its argument, then
``DUCTWORK_DATABASE_URL``, then the config's ``database.url``, then
``sqlite:///ductwork.sqlite3`` (``App.database`` and ``App.url_source`` say which);
the config from its argument (a path, a mapping or a
:class:`~ductwork.config.Config`), else ``DUCTWORK_CONFIG``, else ``./ductwork.yml``
if present, else defaults. The most recent ``connect`` is the default app that
``Pipeline.trigger`` uses.

Before its first transaction an App checks that its database has ductwork's tables
and raises :class:`~ductwork.errors.MissingTablesError` naming the database if not
(:class:`~ductwork.errors.MissingDatabaseError` for a SQLite file that does not
exist, which it never creates); only ``ductwork db upgrade``
(:func:`ductwork.db.migrate.upgrade`) creates a database.

Every unit of work is one transaction opened with :meth:`App.begin`, which
yields a :class:`~ductwork.db.database.Tx`: its connection and its database time,
read lazily and once (so a keyed claim can read it after taking the key lock)
[INV-CLK-1]. That half of the App is :class:`~ductwork.db.database.Database`, the
bottom layer's handle; the App adds what needs the layers above it (definitions,
runs, the inline process row).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Unpack

from ductwork.config import Config
from ductwork.config_file import config_from_mapping, load_config
from ductwork.db.clock import Clock
from ductwork.db.database import Database, Tx, default_app, set_default_app
from ductwork.db.engines import EngineSettings
from ductwork.fleet.processes import register
from ductwork.pipelines.runs import Run, cached_definition
from ductwork.pipelines.snapshot import Definition

__all__ = ["DEFAULT_URL", "App", "Tx", "connect", "default_app", "set_default_app"]

DEFAULT_URL = "sqlite:///ductwork.sqlite3"


class App(Database):
    """A connected ductwork: engine, config and clock (its :class:`Database`), plus the
    definitions and runs read through it. Thread-safe."""

    def register_inline_process(self) -> str:
        """The inline process row (see :meth:`Database.process_id`)."""
        return register(self, role="inline", label="inline")

    def definition(self, sha1: str, text: str | None = None, *, tx: Tx | None = None) -> Definition:
        """The parsed definition snapshot with this digest (cached per App): see
        :func:`~ductwork.pipelines.runs.cached_definition`."""
        return cached_definition(self, sha1, text, tx=tx)

    # -- runs -----------------------------------------------------------------------

    def run(self, run_id: str) -> Run:
        """A handle on an existing run."""
        return Run(self, run_id)

    async def arun(self, run_id: str) -> Run:
        """:meth:`run`, awaited: the handle's first read goes through the async driver
        (:meth:`~ductwork.pipelines.runs.Run.arefresh`), never blocking the event loop.
        Raises :class:`~ductwork.errors.UnknownRunError` for no such run, as ``run`` does."""
        self.require_async("App.arun")
        return await Run(self, run_id, _read=False).arefresh()


def connect(url: str | None = None, config: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
            env: str | None = None, *, clock: Clock | None = None,
            **engine_settings: Unpack[EngineSettings]) -> App:
    """Connect to a database and make the result the default app.

    >>> app = connect("postgresql://localhost/shop", config="ductwork.yml", env="production")

    Connects to nothing yet: the first transaction checks the tables (see
    :meth:`App.check_schema`). ``app.database`` names the database chosen.
    """
    if isinstance(config, Config):
        cfg = config
    elif isinstance(config, Mapping):
        cfg = config_from_mapping(config, env or os.environ.get("DUCTWORK_ENV", "default"))
    else:
        cfg = load_config(Path(config) if config is not None else None, env)
    chosen, source = next((value, source) for value, source in (
        (url, "argument"), (os.environ.get("DUCTWORK_DATABASE_URL"), "DUCTWORK_DATABASE_URL"),
        (cfg.database_url, f"{cfg.source} database.url"), (DEFAULT_URL, "default")) if value)
    app = App(chosen, cfg, clock, url_source=source, **engine_settings)
    set_default_app(app)
    return app
