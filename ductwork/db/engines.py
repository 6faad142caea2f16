"""Connecting: database URLs, ductwork's drivers, and engines with its per-backend settings.

    >>> engine = create_engine("sqlite:///ductwork.sqlite3")     # connects to nothing yet
    >>> describe("postgresql+psycopg2://u:pw@h/db")
    'postgresql+psycopg://u:***@h/db'

What differs per backend here (isolation level, timeouts, SQLite's ``BEGIN IMMEDIATE``
and pragmas, whether connecting creates the database) is registered through
:class:`~ductwork.db.dialects.Seam` like every other difference, each variant saying why
it differs. A URL ductwork cannot use raises :class:`DatabaseURLError` naming it
(password masked).

Not API: internal to ductwork.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import sqlalchemy as sa
from sqlalchemy import event, exc
from sqlalchemy.engine import URL, Connection, Engine, make_url

from ductwork.db.dialects import Seam, backend
from ductwork.db.extras import EXTRAS, require
from ductwork.errors import DatabaseURLError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine


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
    scheme, _, driver = parsed.drivername.partition("+")
    scheme = "postgresql" if scheme == "postgres" else scheme
    if (problem := _url_problem(scheme, driver, parsed.database)) is not None:
        raise DatabaseURLError("database.url", parsed.render_as_string(hide_password=True), problem)
    parsed = parsed.set(drivername=f"{scheme}+{DRIVERS[scheme]}")
    if scheme in ("mysql", "mariadb") and "charset" not in parsed.query:
        parsed = parsed.update_query_dict({"charset": "utf8mb4"})
    return parsed


def _url_problem(scheme: str, driver: str, database: str | None) -> str | None:
    """What makes a URL of ``scheme``, ``driver`` and ``database`` unusable, or None."""
    if scheme not in DRIVERS:
        return f"unsupported backend {scheme!r} (postgresql, mysql, mariadb, sqlite)"
    if driver and driver != DRIVERS[scheme] and driver not in DRIVER_ALIASES[scheme]:
        return f"driver {driver!r} is not supported; {_spellings(scheme)}"
    if scheme == "sqlite" and database in (None, "", ":memory:"):
        return "in-memory SQLite cannot be shared by ductwork's connections; use a file"
    if scheme in ("mysql", "mariadb") and not database:
        # Differs from PostgreSQL in that a MySQL session without a database has no
        # default schema (PostgreSQL connects to the database named after the user).
        return f"names no database; add one, e.g. {scheme}://user@host/ductwork"
    return None


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


_database_file = Seam[Path | None]("database_file")


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


class EngineSettings(TypedDict, total=False):
    """What :func:`create_engine` (and ``Database(..., **settings)``, ``ductwork.connect``)
    may be given; each is optional, with the default named."""

    #: seconds to wait for a connection to open (PostgreSQL, MySQL; default 10)
    connect_timeout: float
    #: seconds a network read or write may block (PostgreSQL, MySQL; default 30)
    io_timeout: float
    #: seconds to wait for SQLite's write lock (default 30)
    busy_timeout: float
    #: connections kept in the pool (PostgreSQL, MySQL; SQLAlchemy's default 5)
    pool_size: int
    #: connections opened beyond ``pool_size`` under load (with ``pool_size``; default 10)
    max_overflow: int


_engine_options = Seam[dict[str, Any]]("engine options")


@_engine_options.for_db("postgresql")
def _pg_engine_options(_: str, settings: EngineSettings) -> dict[str, Any]:
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
def _mysql_engine_options(_: str, settings: EngineSettings) -> dict[str, Any]:
    # Differs from PostgreSQL in that InnoDB defaults to REPEATABLE READ, whose
    # snapshot would make a count read after a lock stale; READ COMMITTED gives
    # each statement a fresh view, like PostgreSQL.
    # And the session's sql_mode is the engine's, not the server's: strict, so that a value
    # longer than its column is refused as PostgreSQL refuses it, never cut with a warning
    # (a server configured without STRICT_TRANS_TABLES would cut it), and no mode that
    # changes how the driver's quoting reads (ANSI_QUOTES, NO_BACKSLASH_ESCAPES).
    io_timeout = int(settings.get("io_timeout", 30))
    return {
        "isolation_level": "READ COMMITTED",
        "connect_args": {
            "connect_timeout": int(settings.get("connect_timeout", 10)),
            "read_timeout": io_timeout,
            "write_timeout": io_timeout,
            # (init_command, not sql_mode=: aiomysql sends that one unquoted)
            "init_command": f"SET SESSION sql_mode = '{MYSQL_SQL_MODE}'",
        },
    }


#: the session sql_mode of every MySQL-family connection (the defaults of MySQL 8 and
#: MariaDB 10.x that matter, on any server's configuration)
MYSQL_SQL_MODE = "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION"


@_engine_options.for_db("sqlite")
def _sqlite_engine_options(_: str, settings: EngineSettings) -> dict[str, Any]:
    # Differs from PostgreSQL in that there is no server and no row locks: every
    # transaction takes the database write lock at BEGIN (see _sqlite_hooks), which
    # serialises claims exactly as a key lock would.
    return {"connect_args": {"timeout": float(settings.get("busy_timeout", 30))}}


def create_engine(url: str | URL, **settings: Unpack[EngineSettings]) -> Engine:
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
        for pragma in ("foreign_keys=ON", f"busy_timeout={int(busy_timeout * 1000)}", "journal_mode=WAL",
                       "synchronous=NORMAL"):
            cursor.execute(f"PRAGMA {pragma}")
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


def create_async_engine(url: str | URL, **settings: Unpack[EngineSettings]) -> AsyncEngine:
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
    scheme, _, driver = parsed.drivername.partition("+")
    parsed = parsed.set(drivername=f"{scheme}+{ASYNC_DRIVERS[driver]}")
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
