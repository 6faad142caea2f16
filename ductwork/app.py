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
(:func:`ductwork.migrate.upgrade`) creates a database.

Every unit of work is one transaction opened with :meth:`App.begin`, which
yields a :class:`Tx`: its connection and its database time, read lazily and
once (so a keyed claim can read it after taking the key lock) [INV-CLK-1].
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ductwork import dialects
from ductwork.clock import Clock, DatabaseClock, to_us
from ductwork.config import Config, config_from_mapping, load_config
from ductwork.wakeup import Wakeup

if TYPE_CHECKING:
    from ductwork.definition import Definition
    from ductwork.runs import Run

DEFAULT_URL = "sqlite:///ductwork.sqlite3"


class Tx:
    """One open transaction: ``conn``, and ``now`` (database time, read on first use)."""

    __slots__ = ("conn", "_clock", "_now", "backend", "woken")

    def __init__(self, conn: Connection, clock: Clock, backend: str):
        self.conn = conn
        self._clock = clock
        self._now: datetime | None = None
        self.backend = backend
        self.woken = False

    def wake(self) -> None:
        """Mark that this transaction made work claimable (an execution created or
        completed): idle workers are woken once it commits (ductwork.wakeup)."""
        if not self.woken:
            self.woken = True
            dialects.notify_wakeup(self.conn)

    @property
    def now(self) -> datetime:
        if self._now is None:
            self._now = self._clock.now(self.conn)  # [INV-CLK-1] the one clock, once per transaction
        return self._now

    @property
    def now_us(self) -> int:
        return to_us(self.now)

    def execute(self, stmt: Any, params: Any = None) -> sa.CursorResult[Any]:
        return self.conn.execute(stmt, params) if params is not None else self.conn.execute(stmt)


class App:
    """A connected ductwork: engine, config and clock. Thread-safe."""

    def __init__(self, url: str, config: Config, clock: Clock | None = None,
                 engine: Engine | None = None, *, url_source: str = "argument", **engine_settings: Any):
        self.url = url
        #: where ``url`` came from: ``argument``, ``DUCTWORK_DATABASE_URL``,
        #: ``<config file> database.url`` or ``default`` (nothing configured one)
        self.url_source = url_source
        self.config = config
        self.clock: Clock = clock or DatabaseClock()
        self.engine = engine or dialects.create_engine(url, **engine_settings)
        self._schema_checked = False
        self.backend = dialects.backend(self.engine)
        self._lock = threading.Lock()
        self._inline_process: str | None = None
        self.wakeup = Wakeup()
        self._definitions: dict[str, Definition] = {}

    @property
    def database(self) -> str:
        """The database this App uses, for messages: its URL, password masked, and
        ``(ductwork's default: …)`` when nothing configured one."""
        shown = self.engine.url.render_as_string(hide_password=True)
        if self.url_source == "default":
            shown += " (ductwork's default: no database URL configured)"
        return shown

    def check_database(self) -> None:
        """Raise :class:`MissingDatabaseError` when the database is a SQLite file that
        does not exist. Creates nothing (connects to nothing)."""
        path = dialects.absent_database_file(self.engine.url)
        if path is not None:
            from ductwork import schema
            from ductwork.errors import MissingDatabaseError

            raise MissingDatabaseError(schema.metadata.tables, self.database, str(path))

    def check_schema(self) -> None:
        """Raise :class:`MissingTablesError` naming this database when ductwork's tables
        are absent (:meth:`check_database` first, so a missing SQLite file is reported,
        not created).

        :meth:`begin` calls this before the App's first transaction, until it passes
        once; tables dropped later are not noticed (the driver's error propagates).
        Does not compare the schema revision (``ductwork check`` does).
        """
        self.check_database()
        from ductwork import migrate, schema
        from ductwork.errors import MissingTablesError

        with self.engine.connect() as conn:
            missing = migrate.missing_tables(conn.execution_options(ductwork_readonly=True))
        if missing:
            raise MissingTablesError(missing, self.database, every=len(missing) == len(schema.metadata.tables))
        self._schema_checked = True

    # -- transactions ---------------------------------------------------------------

    @contextlib.contextmanager
    def begin(self, *, readonly: bool = False) -> Iterator[Tx]:
        """One transaction; commits when the block exits normally, else rolls back.

        ``readonly``: the block only reads (a lane scan, a candidate query, status).
        On SQLite it then starts deferred and takes no write lock, so readers do not
        queue behind writers; a decision made on what it read is re-checked by a
        writing transaction anyway.

        The App's first transaction is preceded by :meth:`check_schema`, so a database
        without ductwork's tables raises :class:`MissingTablesError` naming it.
        """
        if not self._schema_checked:
            self.check_schema()
        with self.engine.connect() as conn:
            if readonly:
                conn = conn.execution_options(ductwork_readonly=True)
            with conn.begin():
                tx = Tx(conn, self.clock, self.backend)
                yield tx
        if tx.woken:
            self.wakeup.notify()

    def now(self) -> datetime:
        """Database time, in a transaction of its own."""
        with self.begin() as tx:
            return tx.now

    # -- identities -----------------------------------------------------------------

    def process_id(self) -> str:
        """The process row this App uses for work done in this OS process (registered once)."""
        with self._lock:
            if self._inline_process is None:
                from ductwork.processes import register

                self._inline_process = register(self, role="inline", label="inline")
            return self._inline_process

    def forget_process(self) -> None:
        """Drop the cached inline process id (after it was reaped or the tables were reset)."""
        with self._lock:
            self._inline_process = None

    def definition(self, sha1: str, text: str | None = None, *, tx: Tx | None = None) -> Definition:
        """The parsed definition snapshot with this digest (cached per App).

        Read, when not cached and ``text`` is not given, through ``tx`` if given, else in
        a read-only transaction of its own. A caller inside a transaction passes it: a
        second connection opened while the first holds SQLite's write lock would wait
        for that lock until ``busy_timeout`` and fail (``database is locked``).
        """
        cached = self._definitions.get(sha1)
        if cached is not None:
            return cached
        from ductwork import schema
        from ductwork.definition import Definition
        import json

        if text is None:
            if not self._schema_checked:
                self.check_schema()
            query = sa.select(schema.runs.c.definition).where(schema.runs.c.definition_sha1 == sha1).limit(1)
            if tx is not None:
                text = tx.execute(query).scalar_one()
            else:
                with self.begin(readonly=True) as own:
                    text = own.execute(query).scalar_one()
        parsed = Definition.from_json(json.loads(text))
        self._definitions[sha1] = parsed
        return parsed

    # -- runs -----------------------------------------------------------------------

    def run(self, run_id: str) -> Run:
        """A handle on an existing run."""
        from ductwork.runs import Run

        return Run(self, run_id)

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"App({self.engine.url.render_as_string(hide_password=True)!r}, env={self.config.env!r})"


_default: App | None = None


def connect(url: str | None = None, config: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
            env: str | None = None, *, clock: Clock | None = None, **engine_settings: Any) -> App:
    """Connect to a database and make the result the default app.

    >>> app = connect("postgresql://localhost/shop", config="ductwork.yml", env="production")

    Connects to nothing yet: the first transaction checks the tables (see
    :meth:`App.check_schema`). ``app.database`` names the database chosen.
    """
    global _default
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
    _default = app
    return app


def default_app() -> App:
    """The app of the most recent :func:`connect`; raises if there was none."""
    if _default is None:
        from ductwork.errors import RunStateError

        raise RunStateError("no ductwork app: call ductwork.connect() first or pass app=")
    return _default


def set_default_app(app: App | None) -> None:
    """Make ``app`` the default (tests)."""
    global _default
    _default = app
