"""The database handle every layer above uses: :class:`Database` and its :class:`Tx`.

Every unit of work is one transaction opened with :meth:`Database.begin`, which
yields a :class:`Tx`: its connection and its database time, read lazily and
once (so a keyed claim can read it after taking the key lock) [INV-CLK-1].

Before its first transaction a Database checks that its database has ductwork's
tables and raises :class:`~ductwork.errors.MissingTablesError` naming the database
if not (:class:`~ductwork.errors.MissingDatabaseError` for a SQLite file that does
not exist, which it never creates).

Also the default app (:func:`default_app`), the most recent ``ductwork.connect``,
which ``Pipeline.trigger`` uses. Not done here: choosing the URL and config
(``ductwork.app.connect``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ductwork.config import Config
from ductwork.db import dialects, engines, schema
from ductwork.db.clock import Clock, DatabaseClock, to_us
from ductwork.db.wakeup import ADVANCERS, WORKERS, Wakeup
from ductwork.errors import MissingDatabaseError, MissingTablesError, RunStateError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")
#: a statement's bound values: one row's, or several rows' (an executemany); what
#: SQLAlchemy's ``Connection.execute`` takes
Params = Mapping[str, object] | Sequence[Mapping[str, object]]


class Tx:
    """One open transaction: ``conn``, and ``now`` (database time, read on first use)."""

    __slots__ = ("_clock", "_now", "advancers_woken", "conn", "held_keys", "woken")

    def __init__(self, conn: Connection, clock: Clock):
        self.conn = conn
        #: limit keys whose lock this transaction holds, and their header rows as it has
        #: left them (``ductwork.limits.executions.lock_key``): ``KeyHeader``s of the limits
        #: layer, which this one cannot name (``limits.executions._held`` reads them back)
        self.held_keys: dict[str, object] = {}
        self._clock = clock
        self._now: datetime | None = None
        self.woken = self.advancers_woken = False

    def wake(self, *, advancers: bool = False) -> None:
        """Mark that this transaction made work a job worker may claim (an execution
        created, a slot freed): one idle worker thread is woken once it commits
        (ductwork.db.wakeup); the idle advancers too only with ``advancers`` (it gave them
        a step), since a wake of theirs wakes every idle advancer thread of every process."""
        self.woken, self.advancers_woken = True, self.advancers_woken or advancers

    def wake_advancers(self) -> None:
        """Mark that this transaction gave advancers work (a step left ``advancing``) and
        nothing a job worker could claim: only idle advancers are woken once it commits.
        A worker woken for it would poll for nothing (with a saturated key, every
        completion would make every idle worker thread of the fleet scan the lanes)."""
        self.advancers_woken = True

    def send_wakeups(self) -> None:
        """Tell the other processes what the marks ask for, in this transaction (so they
        hear it once it commits): one statement at its end, whatever was marked and how
        often. Called by :meth:`Database.begin` as the block ends, and by whoever runs
        ductwork's writes in a transaction it did not begin (a trigger through the
        caller's connection)."""
        channels = [c for c, marked in ((WORKERS, self.woken), (ADVANCERS, self.advancers_woken)) if marked]
        if channels:
            dialects.notify_wakeup(self.conn, channels)

    @property
    def now(self) -> datetime:
        if self._now is None:
            self._now = self._clock.now(self.conn)  # [INV-CLK-1] the one clock, once per transaction
        return self._now

    @property
    def now_us(self) -> int:
        return to_us(self.now)

    def read_by_routine(self, moment: datetime) -> None:
        """The time a server-side routine read after its locks (``Clock.in_sql``): this
        transaction's time from here on [INV-CLK-1]. Not done: moving the times already
        written (what a success wrote before the key's lock keeps its earlier time)."""
        self._now = moment

    def execute(self, stmt: sa.Executable, params: Params | None = None) -> sa.CursorResult[Any]:
        """``conn.execute(stmt, params)``: ``params`` one row's values, or a list of rows'
        (an executemany)."""
        return self.conn.execute(stmt, params)


class Database:
    """The bottom half of an App: engine, config, clock, wake-ups and transactions.

    Everything below the public face takes one of these (an :class:`~ductwork.app.App`
    is one). Thread-safe. Not done here: parsing definitions
    (:func:`ductwork.pipelines.runs.cached_definition`) and registering process
    rows (the App does, :meth:`register_inline_process`), which live in layers above.
    """

    def __init__(self, url: str, config: Config, clock: Clock | None = None,
                 engine: Engine | None = None, *, url_source: str = "argument",
                 **engine_settings: Unpack[engines.EngineSettings]):
        self.url = url
        #: where ``url`` came from: ``argument``, ``DUCTWORK_DATABASE_URL``,
        #: ``<config file> database.url`` or ``default`` (nothing configured one)
        self.url_source = url_source
        self.config = config
        self.clock: Clock = clock or DatabaseClock()
        self.engine = engine or engines.create_engine(url, **engine_settings)
        self._schema_checked = False
        self.backend = dialects.backend(self.engine)
        self._lock = threading.Lock()
        self._inline_process: str | None = None
        self.wakeup = Wakeup()
        #: the keys a poll of this process is trying to fill or holds full, and its lock
        #: (``claims._try_marked``)
        self.filling: set[str] = set()
        self.filling_lock = threading.Lock()
        #: woken when advancers have work (``Tx.wake``, ``Tx.wake_advancers``)
        self.advancer_wakeup = Wakeup()
        #: parsed definition snapshots by digest (``pipelines.runs.cached_definition``)
        self._definitions: dict[str, Any] = {}
        self._async_engine: AsyncEngine | None = None

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
        if (path := engines.absent_database_file(self.engine.url)) is not None:
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
        from ductwork.db import migrate  # a sibling, imported late: alembic is slow to import

        with self.engine.connect() as conn:
            missing = migrate.missing_tables(conn.execution_options(ductwork_readonly=True))
        if missing:
            raise MissingTablesError(missing, self.database, every=len(missing) == len(schema.metadata.tables))
        self._schema_checked = True

    # -- transactions ---------------------------------------------------------------

    @contextlib.contextmanager
    def begin(self, *, readonly: bool = False, one_statement: bool = False) -> Iterator[Tx]:
        """One transaction; commits when the block exits normally, else rolls back.

        ``readonly``: the block only reads (a lane scan, a candidate query, status).
        On SQLite it then starts deferred and takes no write lock, so readers do not
        queue behind writers; a decision made on what it read is re-checked by a
        writing transaction anyway. ``one_statement``: the block makes one statement (a
        poll's call of the lane routine). On PostgreSQL both run without BEGIN and COMMIT,
        each statement a transaction of its own (``dialects.runs_outside_transactions``).

        The App's first transaction is preceded by :meth:`check_schema`, so a database
        without ductwork's tables raises :class:`MissingTablesError` naming it.
        """
        if not self._schema_checked:
            self.check_schema()
        with self.engine.connect() as conn:
            if readonly:
                conn = conn.execution_options(ductwork_readonly=True)
            if (readonly or one_statement) and dialects.runs_outside_transactions(conn):
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            with conn.begin():
                tx = Tx(conn, self.clock)
                yield tx
                tx.send_wakeups()
        if tx.woken:
            self.wakeup.notify(1)  # one idle worker looks; one that finds work wakes the next
        if tx.advancers_woken:
            self.advancer_wakeup.notify()

    def require_async(self, user: str) -> None:
        """Raise :class:`~ductwork.errors.MissingExtraError` naming ``user`` (the async
        method called) and ``pip install 'ductwork[async]'`` unless what the async client
        needs on this database imports (``engines.require_async``); every async method
        calls it first, before it writes or reads anything."""
        engines.require_async(self.engine.url, user)

    def async_engine(self) -> AsyncEngine:
        """The async twin of ``engine`` (``engines.create_async_engine``: the same database
        through psycopg 3's async connections, aiomysql or aiosqlite, pooling nothing),
        created at first use."""
        with self._lock:
            if self._async_engine is None:
                self._async_engine = engines.create_async_engine(self.url)
            return self._async_engine

    async def aread(self, read: Callable[[Connection], T]) -> T:
        """Run ``read`` (code written for a sync :class:`Connection`) in one read-only
        transaction on :meth:`async_engine`, from a coroutine: SQLAlchemy's
        ``AsyncConnection.run_sync`` turns each of its statements into an await on the
        caller's event loop, so the loop runs on while the database answers. The schema
        check of :meth:`begin` runs in a thread the first time. Not for writes (ductwork's
        writing transactions take locks and read the clock through :class:`Tx`)."""
        if not self._schema_checked:
            await asyncio.to_thread(self.check_schema)
        async with self.async_engine().connect() as aconn:
            aconn = await aconn.execution_options(ductwork_readonly=True)
            async with aconn.begin():
                return await aconn.run_sync(read)

    def now(self) -> datetime:
        """Database time, in a transaction of its own."""
        with self.begin() as tx:
            return tx.now

    # -- identities -----------------------------------------------------------------

    def process_id(self) -> str:
        """The process row this App uses for work done in this OS process (registered once)."""
        with self._lock:
            if self._inline_process is None:
                self._inline_process = self.register_inline_process()
            return self._inline_process

    def register_inline_process(self) -> str:
        """Register the inline process row and return its id. Process rows are the
        fleet's (:func:`ductwork.fleet.processes.register`), a layer above this one, so
        :class:`~ductwork.app.App` implements this; a bare Database registers none."""
        raise NotImplementedError("a bare Database registers no process row: use ductwork.App")

    def forget_process(self) -> None:
        """Drop the cached inline process id (after it was reaped or the tables were reset)."""
        with self._lock:
            self._inline_process = None

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()

    def __repr__(self) -> str:
        url = self.engine.url.render_as_string(hide_password=True)
        return f"{type(self).__name__}({url!r}, env={self.config.env!r})"


_default: Database | None = None


def default_app() -> Database:
    """The app of the most recent ``ductwork.connect``; raises if there was none."""
    if _default is None:
        raise RunStateError("no ductwork app: call ductwork.connect() first or pass app=")
    return _default


def current_default_app() -> Database | None:
    """The default app, or None when there is none (``default_app`` raises instead)."""
    return _default


def set_default_app(app: Database | None) -> None:
    """Make ``app`` the default (``ductwork.connect`` and tests)."""
    global _default
    _default = app
