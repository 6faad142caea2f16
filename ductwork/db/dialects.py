"""The one seam where PostgreSQL, MySQL/MariaDB and SQLite differ.

    >>> engine = create_engine("sqlite:///ductwork.sqlite3")
    >>> stmt = for_update(select(limit_keys).where(...), engine.dialect)

Every backend-specific statement or setting lives here, registered per backend
with :meth:`Seam.for_db`; callers never test ``dialect.name``. PostgreSQL is the
reference; each other variant opens with "Differs from PostgreSQL in that …
because …". An unknown backend raises :class:`UnsupportedDialectError`, never a
silent fallback.

Not API: internal to ductwork.
"""

from __future__ import annotations

import contextlib
import functools
import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import URL, Connection, Dialect, Engine, make_url
from sqlalchemy.sql.elements import UnaryExpression
from sqlalchemy.sql.operators import custom_op

from ductwork.db.extras import EXTRAS, require
from ductwork.db.schema import CONSTRAINT_COLUMNS
from ductwork.errors import DatabaseURLError, UnsupportedDialectError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

BACKENDS = ("postgresql", "mysql", "sqlite")
_ALIASES = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql", "sqlite": "sqlite"}


def backend(bind: Connection | Engine | Dialect | str) -> str:
    """``postgresql``, ``mysql`` (MySQL and MariaDB) or ``sqlite``; else raises."""
    if isinstance(bind, str):
        name = bind
    elif isinstance(bind, Dialect):
        name = bind.name
    else:
        name = bind.dialect.name
    try:
        return _ALIASES[name]
    except KeyError:
        raise UnsupportedDialectError(name, "ductwork") from None


class Seam:
    """A function with one implementation per backend: ``@seam.for_db("mysql")``."""

    def __init__(self, name: str):
        self.name = name
        self._impls: dict[str, Callable[..., Any]] = {}

    def for_db(self, *backends: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            for b in backends:
                self._impls[b] = fn
            return fn

        return register

    def __call__(self, bind: Connection | Engine | Dialect | str, *args: Any, **kw: Any) -> Any:
        name = backend(bind)
        try:
            impl = self._impls[name]
        except KeyError:
            raise UnsupportedDialectError(name, self.name) from None
        return impl(bind, *args, **kw)


# --------------------------------------------------------------------------- URLs and engines


#: the driver ductwork uses per URL scheme, and the module that must be importable
DRIVERS = {"postgresql": "psycopg", "mysql": "pymysql", "mariadb": "pymysql", "sqlite": "pysqlite"}
_MODULES = {"psycopg": "psycopg", "pymysql": "pymysql", "pysqlite": "sqlite3"}
#: other drivers' spellings read as ductwork's driver: the URL's host, user, password,
#: database and libpq/MySQL options mean the same to both, and ductwork opens its own
#: synchronous connections (an async driver's URL works the same way)
DRIVER_ALIASES = {
    "postgresql": ("psycopg2", "psycopg2cffi", "asyncpg", "pg8000", "psycopg_async"),
    "mysql": ("mysqldb", "mysqlconnector", "mariadbconnector", "aiomysql", "asyncmy", "cymysql"),
    "sqlite": ("aiosqlite",),
}
DRIVER_ALIASES["mariadb"] = DRIVER_ALIASES["mysql"]


def _spellings(scheme: str) -> str:
    """The URL spellings ductwork accepts for ``scheme``, and where its driver comes from."""
    driver = DRIVERS[scheme]
    others = ", ".join(f"+{d}" for d in DRIVER_ALIASES[scheme])
    form = "sqlite:///path" if scheme == "sqlite" else f"{scheme}://"
    text = f"write {form} or {scheme}+{driver}:// (also read as +{driver}: {others})"
    if _MODULES[driver] in EXTRAS:
        text += f"; the driver comes with pip install 'ductwork[{EXTRAS[_MODULES[driver]]}]'"
    return text


def normalize_url(url: str | URL) -> URL:
    """Parse a database URL and pin ductwork's drivers (psycopg 3, PyMySQL).

    Other drivers' spellings (``postgresql+psycopg2``, ``postgresql+asyncpg``,
    ``mysql+mysqldb``, ``mysql+mysqlconnector``, … in :data:`DRIVER_ALIASES`) and
    ``postgres://`` are read as ductwork's driver. Raises :class:`DatabaseURLError`
    naming the URL (password masked) when it is malformed, names an unsupported
    backend or driver, is an in-memory SQLite database (which ductwork's several
    connections could not share), or is a MySQL/MariaDB URL without a database name.
    Does not check that the driver is installed (:func:`create_engine` does).
    """
    try:
        parsed = make_url(url)
    except (exc.ArgumentError, ValueError) as e:
        raise DatabaseURLError("database.url", str(url), f"not a database URL ({e})") from None
    shown = parsed.render_as_string(hide_password=True)
    scheme, _, driver = parsed.drivername.partition("+")
    if scheme == "postgres":
        scheme = "postgresql"
    if scheme not in _ALIASES:
        raise DatabaseURLError(
            "database.url", shown, f"unsupported backend {scheme!r} (postgresql, mysql, mariadb, sqlite)"
        )
    if driver and driver != DRIVERS[scheme] and driver not in DRIVER_ALIASES[scheme]:
        raise DatabaseURLError(
            "database.url", shown, f"driver {driver!r} is not supported; {_spellings(scheme)}"
        )
    parsed = parsed.set(drivername=f"{scheme}+{DRIVERS[scheme]}")
    if scheme == "sqlite" and parsed.database in (None, "", ":memory:"):
        raise DatabaseURLError(
            "database.url", shown, "in-memory SQLite cannot be shared by ductwork's connections; use a file"
        )
    if scheme in ("mysql", "mariadb") and not parsed.database:
        # Differs from PostgreSQL in that a MySQL session without a database has no
        # default schema (PostgreSQL connects to the database named after the user).
        raise DatabaseURLError(
            "database.url", shown, f"names no database; add one, e.g. {scheme}://user@host/ductwork"
        )
    if scheme in ("mysql", "mariadb") and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return parsed


def require_driver(url: URL) -> None:
    """``extras.require`` ``url``'s driver (a normalised URL, named with its password
    masked) when an extra installs it: MissingExtraError names the extra."""
    module = _MODULES[url.drivername.partition("+")[2]]
    if module in EXTRAS:
        require(f"database.url={url.render_as_string(hide_password=True)!r}", module)


def require_async(url: str | URL, user: str) -> None:
    """``extras.require`` what the async client needs on ``url``'s database: greenlet (for
    SQLAlchemy's asyncio extension), the extension, and ductwork's async driver there."""
    driver = ASYNC_DRIVERS[normalize_url(url).drivername.partition("+")[2]]
    require(user, "greenlet", "sqlalchemy.ext.asyncio", _ASYNC_MODULES[driver])


def describe(url: str | URL) -> str:
    """The URL as messages show it: ductwork's driver, password masked."""
    return normalize_url(url).render_as_string(hide_password=True)


_database_file = Seam("database_file")


@_database_file.for_db("sqlite")
def _sqlite_file(_: str, url: URL) -> Path | None:
    # Differs from PostgreSQL in that connecting creates the database: a SQLite file
    # springs into existence on first connect, so whether it exists is checked first.
    if url.query.get("uri") in ("true", "1") or str(url.database).startswith("file:"):
        return None  # a URI filename: its mode decides, sqlite3 reports the rest
    return Path(str(url.database)).absolute()


@_database_file.for_db("postgresql", "mysql")
def _server_database(_: str, url: URL) -> Path | None:
    return None  # a server database exists or the connect fails; connecting never creates it


def absent_database_file(url: str | URL) -> Path | None:
    """The absolute path of ``url``'s SQLite file when the file does not exist, else None.

    Connecting to SQLite creates the file; callers that must not create a database
    (``ductwork check``, ``status``, ``start``, an App before its first transaction)
    ask this first. Always None for PostgreSQL and MySQL.
    """
    parsed = normalize_url(url)
    path = _database_file(parsed.get_backend_name(), parsed)
    return path if path is not None and not path.exists() else None


_engine_options = Seam("engine options")


@_engine_options.for_db("postgresql")
def _pg_engine_options(_: str, settings: dict[str, Any]) -> dict[str, Any]:
    # READ COMMITTED (the default) is what every fence and count relies on: each
    # statement sees rows committed before it started.
    connect_args = {
        "connect_timeout": int(settings.get("connect_timeout", 10)),
        # A frozen server or a dead peer must not hang a worker forever.
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": int(settings.get("io_timeout", 30) * 1000),
    }
    return {"isolation_level": "READ COMMITTED", "connect_args": connect_args}


@_engine_options.for_db("mysql")
def _mysql_engine_options(_: str, settings: dict[str, Any]) -> dict[str, Any]:
    # Differs from PostgreSQL in that InnoDB defaults to REPEATABLE READ, whose
    # snapshot would make a count read after a lock stale; READ COMMITTED gives
    # each statement a fresh view, like PostgreSQL.
    io_timeout = int(settings.get("io_timeout", 30))
    return {
        "isolation_level": "READ COMMITTED",
        "connect_args": {
            "connect_timeout": int(settings.get("connect_timeout", 10)),
            "read_timeout": io_timeout,
            "write_timeout": io_timeout,
        },
    }


@_engine_options.for_db("sqlite")
def _sqlite_engine_options(_: str, settings: dict[str, Any]) -> dict[str, Any]:
    # Differs from PostgreSQL in that there is no server and no row locks: every
    # transaction takes the database write lock at BEGIN (see _sqlite_hooks), which
    # serialises claims exactly as a key lock would.
    return {"connect_args": {"timeout": float(settings.get("busy_timeout", 30))}}


def create_engine(url: str | URL, **settings: Any) -> Engine:
    """An Engine with ductwork's per-backend settings applied.

    ``settings`` may carry ``connect_timeout``, ``io_timeout`` (seconds a network
    read or write may block) and ``busy_timeout`` (SQLite lock wait); ``pool_size``
    is passed through. Raises :class:`DatabaseURLError` for a URL :func:`normalize_url`
    rejects and :class:`MissingExtraError` when the driver does not import
    (:func:`require_driver`). Connects to nothing: the first
    connection to a SQLite file that does not exist creates it.
    """
    parsed = normalize_url(url)
    require_driver(parsed)
    name = backend(parsed.get_backend_name())
    options = _engine_options(name, settings)
    if "pool_size" in settings and name != "sqlite":
        options["pool_size"] = settings["pool_size"]
        options["max_overflow"] = settings.get("max_overflow", 10)
    options["pool_pre_ping"] = True
    engine = sa.create_engine(parsed, **options)
    if name == "sqlite":
        _sqlite_hooks(engine, float(settings.get("busy_timeout", 30)))
    return engine


def _sqlite_hooks(engine: Engine, busy_timeout: float) -> None:
    """SQLAlchemy's documented pysqlite recipe: ductwork emits BEGIN itself.

    Differs from PostgreSQL in that ``SELECT … FOR UPDATE`` renders nothing on
    SQLite, so every transaction is ``BEGIN IMMEDIATE``: it holds the database
    write lock from its first statement, which serialises it against every other
    writer in every process. WAL lets readers proceed meanwhile.
    """

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite must not emit its own BEGIN
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # A read-only transaction (App.begin(readonly=True)) starts deferred: under WAL
        # it reads a snapshot without the write lock, so readers never queue behind
        # writers. Everything that decides and writes starts IMMEDIATE.
        readonly = conn.get_execution_options().get("ductwork_readonly")
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")


#: ductwork's async driver per sync driver (``Database.async_engine``), its module, its extra
ASYNC_DRIVERS = {"psycopg": "psycopg_async", "pymysql": "aiomysql", "pysqlite": "aiosqlite"}
_ASYNC_MODULES = {"psycopg_async": "psycopg", "aiomysql": "aiomysql", "aiosqlite": "aiosqlite"}


def create_async_engine(url: str | URL, **settings: Any) -> AsyncEngine:
    """An AsyncEngine on ``url`` through ductwork's async driver (psycopg 3's async
    connections, aiomysql, aiosqlite) with the same per-backend settings as
    :func:`create_engine`: READ COMMITTED, timeouts, SQLite's ``BEGIN IMMEDIATE`` and
    pragmas (the ``ductwork_readonly`` execution option starts a deferred transaction).

    It pools nothing (``NullPool``): a pooled async connection belongs to the event
    loop that opened it, and callers (a web app, tests, ``asyncio.run`` per script)
    use several loops; each use opens a connection on the loop it runs on. Raises
    :class:`MissingExtraError` naming ``pip install 'ductwork[async]'`` when the async
    driver or greenlet does not import (:func:`require_async`)."""
    require_async(url, "the async client")
    from sqlalchemy.ext.asyncio import create_async_engine as _create
    from sqlalchemy.pool import NullPool

    parsed = normalize_url(url)
    name = backend(parsed.get_backend_name())
    driver = ASYNC_DRIVERS[parsed.drivername.partition("+")[2]]
    parsed = parsed.set(drivername=f"{parsed.drivername.partition('+')[0]}+{driver}")
    options = _engine_options(name, settings)
    if name == "mysql":
        # Differs from PostgreSQL in that aiomysql takes no read or write timeout (PyMySQL
        # does): an await that never returns blocks only its own task, and the caller
        # bounds it (``Run.await_completion(timeout=)``).
        options["connect_args"] = {k: v for k, v in options["connect_args"].items()
                                   if k not in ("read_timeout", "write_timeout")}
    engine = _create(parsed, poolclass=NullPool, **options)
    if name == "sqlite":
        _sqlite_hooks(engine.sync_engine, float(settings.get("busy_timeout", 30)))
    return engine


statement_limit = Seam("statement_limit")


@statement_limit.for_db("postgresql", "sqlite")
def _no_statement_limit(conn: Connection) -> int | None:
    return None  # a statement may carry a value of up to 1 GB


@statement_limit.for_db("mysql")
def _mysql_statement_limit(conn: Connection) -> int | None:
    # Differs from PostgreSQL in that the server refuses (and drops the connection
    # of) a statement longer than max_allowed_packet, because it reads each client
    # packet whole into a buffer of at most that size.
    return int(conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one())


# --------------------------------------------------------------------------- the clock

db_now = Seam("db_now")


@db_now.for_db("postgresql")
def _pg_now(conn: Connection) -> datetime:
    # clock_timestamp(), not now(): the time of this statement, not of BEGIN.
    now: datetime = conn.exec_driver_sql("SELECT clock_timestamp() AT TIME ZONE 'UTC'").scalar_one()
    return now


@db_now.for_db("mysql")
def _mysql_now(conn: Connection) -> datetime:
    # Differs from PostgreSQL in that the function is UTC_TIMESTAMP(6): like
    # CURRENT_TIMESTAMP(6) but independent of the session time zone, because
    # DATETIME columns store no zone.
    now: datetime = conn.exec_driver_sql("SELECT UTC_TIMESTAMP(6)").scalar_one()
    return now


@db_now.for_db("sqlite")
def _sqlite_now(conn: Connection) -> datetime:
    # Differs from PostgreSQL in that an embedded database has no server clock and
    # SQLite's own 'now' has only millisecond precision: the host clock is the
    # database clock, read with microseconds. Every process sharing the file runs
    # on this host, so they all read the same clock.
    return datetime.now(UTC).replace(tzinfo=None)


# --------------------------------------------------------------------------- locking reads

_for_update = Seam("for_update")


@_for_update.for_db("postgresql", "mysql")
def _row_lock(_: Any, stmt: sa.Select[Any], skip_locked: bool, no_key: bool) -> sa.Select[Any]:
    return stmt.with_for_update(skip_locked=skip_locked, key_share=no_key)


@_for_update.for_db("sqlite")
def _sqlite_lock(_: Any, stmt: sa.Select[Any], skip_locked: bool, no_key: bool) -> sa.Select[Any]:
    # Differs from PostgreSQL in that there are no row locks: the transaction
    # already holds the database write lock (BEGIN IMMEDIATE), so the plain read
    # is as exclusive as FOR UPDATE.
    return stmt


def for_update(stmt: sa.Select[Any], bind: Any, *, skip_locked: bool = False) -> sa.Select[Any]:
    """``SELECT … FOR UPDATE [SKIP LOCKED]`` (nothing on SQLite: see _sqlite_lock)."""
    locked: sa.Select[Any] = _for_update(bind, stmt, skip_locked, False)
    return locked


def inline_ids(ids: list[str], name: str = "batch_ids") -> sa.ColumnElement[Any]:
    """A batch's ids for ``column.in_(...)``, written into the statement's text.

    A batch's statements (claim, load, group commit) are then planned for the ids they
    carry. With bound parameters psycopg prepares a statement on the server after five
    runs, and the server may keep one generic plan for the connection's life: a plan for
    the batch load chosen while the queue tables were small (sequential scans, hash
    joins) was kept as they grew, and five drains of 5,000 jobs in one process slowed
    from 2,508 to 783 jobs/s. Forcing custom plans on every statement instead cost
    40-50 % of an expand's inserts. The ids are ductwork's own (uuid text), quoted as a
    whole list at once (:class:`_QuotedIds`). ``ids_param(name)`` is the same list
    given at execution (``{name: ids}``), for a statement built once (:func:`prepared`).
    """
    return sa.tuple_(sa.bindparam(name, list(ids), type_=_QuotedIds(), literal_execute=True))


def ids_param(name: str = "batch_ids") -> sa.ColumnElement[Any]:
    """:func:`inline_ids` whose list is given when the statement is executed (``{name: ids}``)."""
    return sa.tuple_(sa.bindparam(name, type_=_QuotedIds(), literal_execute=True))


#: ids, joined by spaces, that need no escaping on any backend
_PLAIN_IDS = re.compile(r"[A-Za-z0-9_.:\-]+(?: [A-Za-z0-9_.:\-]+)*")


class _QuotedIds(sa.types.UserDefinedType[list[str]]):
    """The type of :func:`inline_ids`' parameter, a list rendered as ``'a', 'b'``: ids
    made of letters, digits and ``-_.:`` (ductwork's own) are joined in one string
    (SQLAlchemy renders a list item by item, and a worker's batch writes ten lists of 64);
    any other text is quoted as SQLAlchemy quotes a string for the backend. An empty list
    is ``NULL`` (``IN (NULL)`` matches nothing, as an empty list does)."""

    cache_ok = True

    def get_col_spec(self, **kw: Any) -> str:  # noqa: ARG002 - UserDefinedType's signature
        return "TEXT"  # pragma: no cover  the type only renders IN lists (literal_execute): no DDL or CAST names it

    def literal_processor(self, dialect: Dialect) -> Callable[[list[str]], str]:
        quote = sa.String().literal_processor(dialect)  # type: ignore[no-untyped-call]
        assert quote is not None, "a string literal can be rendered on every backend"

        def process(ids: list[str]) -> str:
            if not ids:
                return "NULL"
            if _PLAIN_IDS.fullmatch(" ".join(ids)):  # (a space is in no plain id)
                return "'" + "', '".join(ids) + "'"
            return ", ".join(quote(i) for i in ids)

        return process


_prepared: dict[tuple[Callable[..., Any], str], Any] = {}


def prepared(bind: Connection | Engine, build: Callable[[Connection | Engine], Any]) -> Any:
    """The statement ``build(bind)`` makes, built once per backend and kept: its values
    are bound parameters given at execution (batch ids as :func:`ids_param`). Building
    and keying a SQLAlchemy statement costs more Python than executing a cached one, and
    a worker runs a dozen per batch. ``build`` must depend on nothing but the backend."""
    key = (build, backend(bind))
    statement = _prepared.get(key)
    if statement is None:
        statement = _prepared[key] = build(bind)
    return statement


_insert_rows = Seam("insert_rows")


@_insert_rows.for_db("postgresql")
def _pg_insert_rows(_: Any, table: sa.Table, rows: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    # Differs from MySQL and SQLite in the statement: one INSERT … SELECT FROM unnest(one
    # array per column), where psycopg would pipeline one INSERT per row (PyMySQL writes
    # one multi-row INSERT itself, SQLite's executemany runs in C). A multi-row VALUES
    # costs psycopg more than the rows: its placeholders are converted uncached.
    columns = tuple(rows[0])
    return _unnest_insert(table, columns), {f"c{i}": [row[c] for row in rows] for i, c in enumerate(columns)}


@functools.lru_cache(maxsize=64)
def _unnest_insert(table: sa.Table, columns: tuple[str, ...]) -> sa.TextClause:
    from sqlalchemy.dialects import postgresql

    pg = postgresql.dialect()  # type: ignore[no-untyped-call]
    arrays = ", ".join(f"CAST(:c{i} AS {table.c[c].type.compile(dialect=pg)}[])" for i, c in enumerate(columns))
    return sa.text(f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT * FROM unnest({arrays})")


@_insert_rows.for_db("mysql", "sqlite")
def _plain_insert_rows(_: Any, table: sa.Table, rows: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    return table.insert(), rows


def insert_rows(bind: Connection, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` (dicts with the same keys, none of them a large text: each column
    travels as one array on PostgreSQL) in one statement: ``executemany`` of
    ``table.insert()`` on MySQL and SQLite, one ``INSERT … SELECT FROM unnest`` on
    PostgreSQL. Nothing when ``rows`` is empty."""
    if rows:
        statement, params = _insert_rows(bind, table, rows)
        bind.execute(statement, params)


_by_key = Seam("by_primary_key")


@_by_key.for_db("sqlite")
def _sqlite_by_key(_: Any, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    # Differs from PostgreSQL and MySQL in that SQLite's planner, without statistics,
    # prefers an index on ``column`` (``status = ?``, ``process_id = ?``) to a
    # primary-key IN list and then reads every row with that value: 100,000 pending
    # steps made a batch's status update 30x slower, and a worker's group commit read
    # every execution its process ever ran. A unary + keeps the value and makes the
    # column unindexable.
    return UnaryExpression(column, operator=custom_op("+"), type_=column.type)


@_by_key.for_db("postgresql", "mysql")
def _other_by_key(_: Any, column: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    return column  # their planners weigh the IN list's few rows against the index


def by_primary_key(column: sa.ColumnElement[Any], bind: Any) -> sa.ColumnElement[Any]:
    """``column`` in a guard that must not steer the plan away from a primary-key lookup."""
    guarded: sa.ColumnElement[Any] = _by_key(bind, column)
    return guarded


_run_lock = Seam("lock_run")


@_run_lock.for_db("postgresql")
def _pg_run_lock(bind: Any, stmt: sa.Select[Any]) -> sa.Select[Any]:
    # FOR NO KEY UPDATE: inserts of rows referencing the run hold FOR KEY SHARE on
    # it; a plain FOR UPDATE would conflict with them and deadlock two transitions.
    locked: sa.Select[Any] = _for_update(bind, stmt, False, True)
    return locked


@_run_lock.for_db("mysql", "sqlite")
def _other_run_lock(bind: Any, stmt: sa.Select[Any]) -> sa.Select[Any]:
    # Differs from PostgreSQL in that there is no NO KEY lock mode; transactions
    # that take this lock insert nothing that references the run before it, so the
    # plain exclusive lock cannot deadlock with their own foreign-key checks.
    locked: sa.Select[Any] = _for_update(bind, stmt, False, False)
    return locked


def for_update_run(stmt: sa.Select[Any], bind: Any) -> sa.Select[Any]:
    """The run-row lock taken before deciding a run's terminal state."""
    locked: sa.Select[Any] = _run_lock(bind, stmt)
    return locked


# --------------------------------------------------------------------------- inserts

insert_ignore = Seam("insert_ignore")


@insert_ignore.for_db("postgresql")
def _pg_insert_ignore(_: Any, table: sa.Table) -> Any:
    from sqlalchemy.dialects.postgresql import insert

    return insert(table).on_conflict_do_nothing()


@insert_ignore.for_db("mysql")
def _mysql_insert_ignore(_: Any, table: sa.Table) -> Any:
    # Differs from PostgreSQL in that MySQL has no ON CONFLICT; INSERT IGNORE turns
    # the duplicate-key error into a warning.
    return sa.insert(table).prefix_with("IGNORE")


@insert_ignore.for_db("sqlite")
def _sqlite_insert_ignore(_: Any, table: sa.Table) -> Any:
    from sqlalchemy.dialects.sqlite import insert

    return insert(table).on_conflict_do_nothing()


upsert = Seam("upsert")


@upsert.for_db("postgresql")
def _pg_upsert(_: Any, table: sa.Table, keys: list[str], values: dict[str, Any],
               update: list[str]) -> Any:
    from sqlalchemy.dialects.postgresql import insert

    stmt = insert(table).values(**values)
    return stmt.on_conflict_do_update(index_elements=keys,
                                      set_={c: stmt.excluded[c] for c in update})


@upsert.for_db("mysql")
def _mysql_upsert(_: Any, table: sa.Table, keys: list[str], values: dict[str, Any],
                  update: list[str]) -> Any:
    # Differs from PostgreSQL in that ON DUPLICATE KEY has no conflict target: it
    # fires on any unique key, which is the primary key here.
    from sqlalchemy.dialects.mysql import insert

    stmt = insert(table).values(**values)
    return stmt.on_duplicate_key_update({c: stmt.inserted[c] for c in update})


@upsert.for_db("sqlite")
def _sqlite_upsert(_: Any, table: sa.Table, keys: list[str], values: dict[str, Any],
                   update: list[str]) -> Any:
    from sqlalchemy.dialects.sqlite import insert

    stmt = insert(table).values(**values)
    return stmt.on_conflict_do_update(index_elements=keys,
                                      set_={c: stmt.excluded[c] for c in update})


# --------------------------------------------------------------------------- savepoints

statement_savepoint = Seam("statement_savepoint")


@statement_savepoint.for_db("postgresql")
def _pg_savepoint(conn: Connection) -> contextlib.AbstractContextManager[Any]:
    # A failed statement aborts the whole transaction on PostgreSQL: a statement that may
    # violate a unique index inside a transaction that must go on (the caller's) runs in a
    # savepoint, rolled back to on the violation.
    return conn.begin_nested()


@statement_savepoint.for_db("mysql", "sqlite")
def _no_savepoint(conn: Connection) -> contextlib.AbstractContextManager[Any]:
    # Differs from PostgreSQL in that a statement failing on a unique index rolls back only
    # itself (InnoDB's statement rollback, SQLite's ABORT): the transaction goes on without a
    # savepoint, and pysqlite's own transaction handling (a caller's plain SQLite engine)
    # does not support SAVEPOINT reliably.
    return contextlib.nullcontext()


# --------------------------------------------------------------------------- wakeups

notify_wakeup = Seam("notify_wakeup")


@notify_wakeup.for_db("postgresql")
def _pg_notify(conn: Connection, channel: str) -> None:
    # Delivered to listeners only if this transaction commits; coalesced per transaction.
    conn.exec_driver_sql(f"SELECT pg_notify('{channel}', '')")


@notify_wakeup.for_db("mysql", "sqlite")
def _no_notify(conn: Connection, channel: str) -> None:
    # Differs from PostgreSQL in that there is no notification channel: processes
    # other than this one find the work at their next poll.
    return None


# --------------------------------------------------------------------------- error boundary

_MYSQL_KEY = re.compile(r"for key '(?:[^'.]*\.)?([^']+)'")
_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: (.+)$")


def violated_constraint(error: exc.IntegrityError) -> str | None:
    """The name of the unique constraint an IntegrityError violated, if known.

    PostgreSQL reports the name; MySQL names the index in its message; SQLite names
    the columns, which are mapped back through ``schema.CONSTRAINT_COLUMNS``.
    """
    orig = error.orig
    diag = getattr(orig, "diag", None)
    name: str | None = getattr(diag, "constraint_name", None) if diag is not None else None
    if name:
        return name
    text = str(orig)
    match = _MYSQL_KEY.search(text)
    if match:
        return match.group(1)
    match = _SQLITE_UNIQUE.search(text)
    if match:
        cols = [c.strip() for c in match.group(1).split(",")]
        table = cols[0].split(".")[0]
        names = tuple(c.split(".", 1)[1] for c in cols)
        for name, (t, columns) in CONSTRAINT_COLUMNS.items():
            if t == table and columns == names:
                return name
    return None


@contextlib.contextmanager
def translate_db_errors(mapping: dict[str, Callable[[exc.IntegrityError], Exception]]) -> Iterator[None]:
    """Map unique-constraint violations to domain errors by constraint name.

    ``mapping`` gives, per constraint name, a factory for the error to raise (with
    ``raise … from``). Any other database error propagates unchanged.
    """
    try:
        yield
    except exc.IntegrityError as error:
        name = violated_constraint(error)
        if name in mapping:
            raise mapping[name](error) from error
        raise


_RETRYABLE_PG = {"40001", "40P01", "55P03"}  # serialization, deadlock, lock not available
_RETRYABLE_MYSQL = {1205, 1213}  # lock wait timeout, deadlock


def is_retryable(error: BaseException) -> bool:
    """A transaction was rolled back by the database for contention; retrying is safe."""
    if not isinstance(error, exc.DBAPIError):
        return False
    orig = error.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate in _RETRYABLE_PG:
        return True
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int) and args[0] in _RETRYABLE_MYSQL:
        return True
    return "database is locked" in str(orig)


def is_disconnect(error: BaseException) -> bool:
    """The connection to the database was lost (server restart, killed session)."""
    return isinstance(error, exc.DBAPIError) and bool(error.connection_invalidated)


def retry_transient(fn: Callable[[], Any], *, attempts: int = 8) -> Any:
    """Run ``fn`` (one whole transaction), retrying it when the database rolled it back
    for contention or the connection was lost; back-off doubles from 50 ms to 2 s
    (about 6 s in all). Anything else, or the last failure, propagates.

    Only for transactions that are safe to repeat: a commit whose acknowledgement was
    lost is repeated too, so the transaction must be guarded (the outcome writes match
    nothing the second time and say so).
    """
    for attempt in range(attempts):
        try:
            return fn()
        except exc.DBAPIError as error:
            if attempt + 1 == attempts or not (is_retryable(error) or is_disconnect(error)):
                raise
            time.sleep(min(2.0, 0.05 * 2 ** attempt))
    raise AssertionError("unreachable")  # pragma: no cover  the last attempt returns or raises; callers pass none < 1


# --------------------------------------------------------------------------- emptying (test fixtures)

delete_all_rows = Seam("delete_all_rows")


@delete_all_rows.for_db("postgresql", "sqlite")
def _delete_children_first(conn: Connection, tables: list[sa.Table]) -> None:
    for table in tables:
        conn.execute(table.delete())


@delete_all_rows.for_db("mysql")
def _mysql_delete_all(conn: Connection, tables: list[sa.Table]) -> None:
    # Differs from PostgreSQL in that InnoDB checks foreign keys row by row within one
    # DELETE, because it does not defer them to the statement's end: deleting branches
    # that point at each other fails part-way. The checks are off for these deletes only.
    conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS=0")
    try:
        _delete_children_first(conn, tables)
    finally:
        conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS=1")
