"""Database URLs: the spellings ductwork reads as its drivers, the ones it refuses, a
MySQL URL without a database, a driver that is not installed, and a SQLite file that
does not exist (checked without creating it). No database is needed.

Checks: none (configuration errors name the offending URL, password masked).
"""

from __future__ import annotations

import importlib.abc
import re
import sys

import pytest

from ductwork.app import App
from ductwork.config import Config
from ductwork.db import dialects, engines, extras
from ductwork.errors import DatabaseURLError, MissingDatabaseError, MissingExtraError, MissingTablesError


@pytest.mark.parametrize(("url", "read_as"), [
    ("postgresql+psycopg2://u:pw@h/db", "postgresql+psycopg://u:***@h/db"),
    ("postgresql+asyncpg://h/db", "postgresql+psycopg://h/db"),
    ("postgresql+pg8000://h:5433/db?sslmode=require", "postgresql+psycopg://h:5433/db?sslmode=require"),
    ("postgres://h/db", "postgresql+psycopg://h/db"),
    ("mysql+mysqldb://root@h/db", "mysql+pymysql://root@h/db?charset=utf8mb4"),
    ("mysql+mysqlconnector://root@h/db", "mysql+pymysql://root@h/db?charset=utf8mb4"),
    ("mariadb://root@h/db", "mariadb+pymysql://root@h/db?charset=utf8mb4"),
    ("mariadb+mariadbconnector://root@h/db", "mariadb+pymysql://root@h/db?charset=utf8mb4"),
    ("sqlite+aiosqlite:///x.sqlite3", "sqlite+pysqlite:///x.sqlite3"),
])
def test_common_driver_spellings_are_read_as_ductworks_driver(url, read_as):
    assert engines.describe(url) == read_as


@pytest.mark.parametrize(("url", "fragment"), [
    ("postgresql+pygresql://u:secret@h/db",
     "database.url='postgresql+pygresql://u:***@h/db': driver 'pygresql' is not supported; write "
     "postgresql:// or postgresql+psycopg:// (also read as +psycopg: +psycopg2, "),
    ("mysql+oursql://h/db", "pip install 'ductwork[mysql]'"),
    ("postgresql+pygresql://h/db", "pip install 'ductwork[postgres]'"),
])
def test_an_unknown_driver_names_the_url_the_spellings_and_the_extra(url, fragment):
    with pytest.raises(DatabaseURLError) as info:
        engines.normalize_url(url)
    assert fragment in str(info.value)
    assert "secret" not in str(info.value)


def test_an_unknown_sqlite_driver_names_the_spellings_and_no_extra():
    """SQLite's driver comes with Python: the refusal names the spellings, and no pip extra."""
    with pytest.raises(DatabaseURLError) as info:
        engines.normalize_url("sqlite+pysqlcipher:///x.sqlite3")
    assert str(info.value).endswith("driver 'pysqlcipher' is not supported; write sqlite:///path or "
                                    "sqlite+pysqlite:// (also read as +pysqlite: +aiosqlite)")


@pytest.mark.parametrize("url", ["not a url", "postgresql://h:port/db"])
def test_a_malformed_url_is_refused_naming_it(url):
    with pytest.raises(DatabaseURLError, match=r"not a database URL") as info:
        engines.normalize_url(url)
    assert info.value.path == "database.url"
    assert info.value.value == url


@pytest.mark.parametrize(("name", "backend"), [
    ("postgresql://h/db", "postgresql"), ("mysql://h/db", "mysql"), ("mariadb://h/db", "mysql"),
    ("sqlite:///x.sqlite3", "sqlite"),
])
def test_the_backend_of_a_dialect_names_its_family(name, backend):
    engine = engines.create_engine(name)  # connects to nothing
    try:
        assert dialects.backend(engine.dialect) == backend
        assert dialects.backend(engine) == backend
    finally:
        engine.dispose()


@pytest.mark.parametrize("url", ["mysql://root:pw@127.0.0.1:3306", "mysql://root@h/", "mariadb://h"])
def test_a_mysql_url_without_a_database_is_named(url):
    with pytest.raises(DatabaseURLError, match=r"names no database; add one, e\.g\. m") as info:
        engines.create_engine(url)
    assert info.value.path == "database.url"
    assert "pw" not in str(info.value)


def test_a_url_without_a_database_is_refused_only_where_the_backend_has_none_to_default_to():
    """In-memory SQLite (no path, or ``:memory:``) is refused: ductwork's several
    connections could not share it; a server URL without a database is refused only for
    the MySQL family (no default schema), and PostgreSQL connects to the user's database.
    A MySQL-family URL with its database is read as it is, with ``charset=utf8mb4`` added
    unless it names a charset. (No database's name in the test's id: it runs on every
    database's run of the tests.)"""
    for url in ("sqlite://", "sqlite:///:memory:", "sqlite+pysqlite:///:memory:"):
        with pytest.raises(DatabaseURLError, match=r"in-memory SQLite cannot be shared by ductwork's connections"):
            engines.normalize_url(url)
    assert engines.describe("postgresql://u:pw@h") == "postgresql+psycopg://u:***@h"
    assert engines.describe("postgres://h:5433") == "postgresql+psycopg://h:5433"
    assert engines.describe("mysql://root@h/db") == "mysql+pymysql://root@h/db?charset=utf8mb4"
    assert engines.describe("mariadb://h/db?charset=latin1") == "mariadb+pymysql://h/db?charset=latin1"
    with pytest.raises(DatabaseURLError, match=r"names no database; add one, e\.g\. mariadb://user@host/ductwork"):
        engines.normalize_url("mariadb://h")


def test_a_pool_size_is_a_servers_and_sqlite_keeps_its_default_pool():
    """``pool_size`` and ``max_overflow`` reach a server's pool (connects to nothing);
    SQLite's engine ignores them (EngineSettings: PostgreSQL, MySQL)."""
    server = engines.create_engine("postgresql://u@h/db", pool_size=2, max_overflow=3)
    default = engines.create_engine("postgresql://u@h/db")
    local = engines.create_engine("sqlite:///x.sqlite3", pool_size=1, max_overflow=0)
    try:
        assert (server.pool.size(), server.pool._max_overflow) == (2, 3)
        assert (default.pool.size(), default.pool._max_overflow) == (5, 10)
        assert (local.pool.size(), local.pool._max_overflow) == (5, 10)
    finally:
        for engine in (server, default, local):
            engine.dispose()


def test_the_async_engine_of_a_mariadb_url_passes_no_io_timeouts_and_keeps_the_rest(monkeypatch):
    """aiomysql takes no read or write timeout (PyMySQL does): the async engine's connect
    arguments drop those two and keep the connect timeout and the session's sql_mode."""
    import sqlalchemy.ext.asyncio

    seen = {}
    real = sqlalchemy.ext.asyncio.create_async_engine

    def spy(url, **options):
        seen.update(url=url, options=options)
        return real(url, **options)

    monkeypatch.setattr(sqlalchemy.ext.asyncio, "create_async_engine", spy)
    engine = engines.create_async_engine("mariadb://h/db", connect_timeout=4, io_timeout=7)
    try:
        assert seen["url"].drivername == "mariadb+aiomysql"
        assert seen["options"]["connect_args"] == {
            "connect_timeout": 4, "init_command": f"SET SESSION sql_mode = '{engines.MYSQL_SQL_MODE}'"}
    finally:
        _dispose_async(engine)


def _dispose_async(engine) -> None:
    import asyncio

    asyncio.run(engine.dispose())


def test_an_async_sqlite_engine_sets_the_pragmas_and_begins_immediate(tmp_path):
    """The async client's SQLite connections are ductwork's as the sync ones are: WAL,
    foreign keys, the busy timeout, and every writing transaction ``BEGIN IMMEDIATE``
    (which holds the write lock from its first statement: a second connection's write
    waits, here refused at once by a zero busy timeout)."""
    import asyncio
    import sqlite3

    import sqlalchemy as sa

    path = tmp_path / "async.sqlite3"
    engine = engines.create_async_engine(f"sqlite:///{path}", busy_timeout=7)

    async def read() -> tuple:
        async with engine.connect() as conn:
            pragmas = tuple([(await conn.execute(sa.text(f"PRAGMA {p}"))).scalar_one()
                             for p in ("journal_mode", "foreign_keys", "busy_timeout")])
        async with engine.begin():
            other = sqlite3.connect(path, timeout=0, isolation_level=None)
            try:
                with pytest.raises(sqlite3.OperationalError, match="database is locked"):
                    other.execute("BEGIN IMMEDIATE")
            finally:
                other.close()
        return pragmas

    try:
        assert asyncio.run(read()) == ("wal", 1, 7000)
    finally:
        _dispose_async(engine)


@pytest.mark.parametrize(("url", "module", "extra"), [
    ("postgresql://u:secret@h/db", "psycopg", "postgres"),
    ("postgresql+psycopg2://h/db", "psycopg", "postgres"),
    ("mysql://h/db", "pymysql", "mysql"),
])
def test_a_driver_that_is_not_installed_is_named_with_its_extra(monkeypatch, url, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed: its import fails
    with pytest.raises(MissingExtraError) as info:
        engines.create_engine(url)
    message = str(info.value)
    assert message.startswith("database.url='")
    assert message.endswith(f"' needs {module}, which is not installed: pip install 'ductwork[{extra}]' "
                            "(nothing was written)")
    assert "secret" not in message
    assert isinstance(info.value, ImportError)
    assert (info.value.module, info.value.extra) == (module, extra)


@pytest.mark.parametrize(("error", "reason"), [
    (ImportError("no pq wrapper available"), "no pq wrapper available"),
    # an ImportError that names the module itself (a name it lacks: another version's
    # psycopg) is not a missing module either: only ModuleNotFoundError is
    (ImportError("cannot import name 'Connection' from 'psycopg'", name="psycopg"),
     "cannot import name 'Connection' from 'psycopg'"),
], ids=["no-libpq", "names-the-module"])
def test_a_driver_that_is_installed_but_does_not_load_says_why(monkeypatch, error, reason):
    """psycopg without its C library (``pip install psycopg``, no ``[binary]``, no libpq)
    is found but raises ImportError when imported: the reason is kept."""
    class Broken(importlib.abc.MetaPathFinder):
        def find_spec(self, name, *_):
            if name == "psycopg":
                raise error
            return None

    monkeypatch.delitem(sys.modules, "psycopg", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    with pytest.raises(MissingExtraError, match=r"^database\.url='postgresql\+psycopg://h/db' needs psycopg, "
                                                rf"which does not import \({re.escape(reason)}\): "
                                                r"pip install 'ductwork\[postgres\]'"):
        engines.create_engine("postgresql://h/db")


def test_sqlite_needs_no_driver_beyond_python(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.setitem(sys.modules, "pymysql", None)
    engines.create_engine(f"sqlite:///{tmp_path}/x.sqlite3").dispose()


def test_a_missing_sqlite_file_is_reported_not_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = App("sqlite:///typo.sqlite3", Config())
    try:
        with pytest.raises(MissingDatabaseError) as info, app.begin():
            pass
    finally:
        app.dispose()
    assert isinstance(info.value, MissingTablesError)
    assert str(info.value) == (f"no database at sqlite+pysqlite:///typo.sqlite3: no file {tmp_path}/typo.sqlite3 "
                               "(run `ductwork db upgrade` to create it)")
    assert list(tmp_path.iterdir()) == []


def test_a_sqlite_uri_filename_is_left_to_sqlite(tmp_path, monkeypatch):
    """A URI filename (``file:…?uri=true``) is not read as a path: its ``mode`` decides
    whether connecting creates the file, so ductwork does not call it absent."""
    monkeypatch.chdir(tmp_path)
    for url in ("sqlite:///file:typo.sqlite3?mode=ro&uri=true", "sqlite:///file:typo.sqlite3?mode=ro"):
        assert engines.absent_database_file(url) is None
    assert engines.absent_database_file("sqlite:///typo.sqlite3") == tmp_path / "typo.sqlite3"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("url", "module", "extra"), [
    ("postgresql://h/db", "greenlet", "async"),
    ("mysql://h/db", "aiomysql", "async"),
    ("sqlite:///x.sqlite3", "aiosqlite", "async"),
    ("sqlite:///x.sqlite3", "greenlet", "async"),
    ("mysql://h/db", "sqlalchemy.ext.asyncio", "async"),
    ("postgresql://h/db", "psycopg", "postgres"),  # the async driver is the sync one's module
])
def test_an_async_driver_that_is_not_installed_is_named_with_its_extra(monkeypatch, url, module, extra):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingExtraError) as info:
        engines.create_async_engine(url)
    assert str(info.value) == (f"the async client needs {module}, which is not installed: "
                               f"pip install 'ductwork[{extra}]' (nothing was written)")


def test_every_module_with_an_extra_is_in_that_extra():
    """The map of modules to extras agrees with pyproject.toml: each module's extra lists
    the distribution that installs it."""
    import tomllib
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    distribution = {"psycopg": "psycopg", "pymysql": "PyMySQL", "greenlet": "SQLAlchemy[asyncio]",
                    "sqlalchemy.ext.asyncio": "SQLAlchemy[asyncio]", "aiomysql": "aiomysql",
                    "aiosqlite": "aiosqlite", "starlette": "starlette", "jinja2": "jinja2", "uvicorn": "uvicorn",
                    "prometheus_client": "prometheus-client"}
    assert set(extras.EXTRAS) == set(distribution)
    for module, extra in extras.EXTRAS.items():
        assert any(requirement.startswith(distribution[module]) for requirement in declared[extra]), (module, extra)
    # the URL scheme's and the server's names install the same drivers
    assert declared["postgresql"] == declared["postgres"]
    assert declared["mariadb"] == declared["mysql"]


def test_the_default_database_says_it_is_the_default(tmp_path, monkeypatch):
    from ductwork.app import connect, set_default_app

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DUCTWORK_DATABASE_URL", raising=False)
    monkeypatch.delenv("DUCTWORK_CONFIG", raising=False)
    app = connect()
    try:
        assert app.url_source == "default"
        assert app.database == "sqlite+pysqlite:///ductwork.sqlite3 (ductwork's default: no database URL configured)"
        with pytest.raises(MissingDatabaseError, match=r"ductwork's default"):
            app.check_schema()
    finally:
        app.dispose()
        set_default_app(None)
    assert list(tmp_path.iterdir()) == []


def test_an_apps_repr_names_its_database_password_masked():
    app = App("postgresql://u:secret@h/db", Config())  # connects to nothing
    try:
        assert repr(app) == "App('postgresql+psycopg://u:***@h/db', env='default')"
    finally:
        app.dispose()


def test_connect_takes_a_config_object_as_it_is(tmp_path, monkeypatch):
    """``connect(url, config=Config)``: that config, not the environment's nor a file's."""
    from ductwork.app import connect, set_default_app
    from ductwork.db.database import default_app

    monkeypatch.setenv("DUCTWORK_ENV", "elsewhere")
    config = Config.from_section({"database": {"url": f"sqlite:///{tmp_path}/config.db"}}, source="<object>")
    app = connect(config=config)
    try:
        assert app.config is config
        assert app.url_source == "<object> database.url"
        assert default_app() is app
    finally:
        app.dispose()
        set_default_app(None)
    assert list(tmp_path.iterdir()) == []  # connects to nothing yet


def test_a_backend_or_seam_ductwork_does_not_implement_is_refused_by_name():
    """Never a silent fallback: a dialect name outside the three (URLs are refused before
    an engine exists, DatabaseURLError; this is the guard under it), and a seam with no
    implementation for a backend, raise UnsupportedDialectError naming both."""
    from ductwork.errors import UnsupportedDialectError

    with pytest.raises(UnsupportedDialectError) as refused:
        dialects.backend("oracle")
    assert str(refused.value) == ("ductwork is not implemented for dialect 'oracle' "
                                  "(supported: postgresql, mysql/mariadb, sqlite)")
    assert refused.value.dialect == "oracle"
    probe = dialects.Seam("probe")
    probe.for_db("postgresql")(lambda bind: bind)
    assert probe("postgresql") == "postgresql"
    with pytest.raises(UnsupportedDialectError, match=r"^probe is not implemented for dialect 'sqlite' "):
        probe("sqlite")


def test_a_bare_database_registers_no_process_and_no_app_is_no_default(tmp_path):
    """The layer under App: a Database (no fleet) refuses to register a process row, and
    before any connect() (or after it is cleared) there is no default app to fall back on."""
    from ductwork.db.database import Database, default_app, set_default_app
    from ductwork.errors import RunStateError

    bare = Database(f"sqlite:///{tmp_path}/bare.db", Config.from_section({}, source="<tests>"))
    try:
        with pytest.raises(NotImplementedError, match=r"^a bare Database registers no process row: use ductwork\.App$"):
            bare.process_id()
    finally:
        bare.dispose()
    set_default_app(None)
    with pytest.raises(RunStateError, match=r"^no ductwork app: call ductwork\.connect\(\) first or pass app=$"):
        default_app()


@pytest.mark.parametrize(("mariadb", "version", "collation"), [
    (True, (10, 11, 19), "utf8mb4_nopad_bin"),
    (True, (11, 4, 2), "utf8mb4_nopad_bin"),
    (False, (8, 4, 0), "utf8mb4_0900_bin"),
    (False, (8, 0, 17), "utf8mb4_0900_bin"),  # the first MySQL with a binary NO PAD collation
    (False, (8, 0, 16), "utf8mb4_bin"),  # none: exact for case, still padded
    (False, (5, 7, 44), "utf8mb4_bin"),
    (False, None, "utf8mb4_0900_bin"),  # a version not read yet (DDL compiled offline): today's MySQL
])
def test_a_process_label_gets_the_servers_binary_no_pad_collation(mariadb, version, collation):
    """``ductwork_processes.label`` (``schema.NoPadBin``, revision 0016) compiles with each
    server's binary NO PAD collation (``schema.no_pad_bin``): the MySQL branches CI's
    MariaDB never takes, the 8.0.17 boundary on both sides."""
    from sqlalchemy.dialects import mysql
    from sqlalchemy.schema import CreateTable

    from ductwork.db import schema

    dialect = mysql.dialect(is_mariadb=mariadb)
    dialect.server_version_info = version
    ddl = str(CreateTable(schema.processes).compile(dialect=dialect))
    assert (schema.no_pad_bin(dialect), f"label VARCHAR(100) COLLATE {collation} NOT NULL" in ddl) == (collation, True)


def _db_error(**orig: object) -> Exception:
    """A DBAPIError as SQLAlchemy raises it, over a driver error with ``orig``'s attributes."""
    import sqlalchemy.exc

    driver = type("DriverError", (Exception,), {})(*orig.pop("args", ()))
    for name, value in orig.items():
        setattr(driver, name, value)
    return sqlalchemy.exc.OperationalError("UPDATE …", {}, driver)


@pytest.mark.parametrize(("error", "retryable"), [
    (_db_error(sqlstate="40001"), True),  # serialization failure
    (_db_error(sqlstate="40P01"), True),  # deadlock
    (_db_error(sqlstate="55P03"), True),  # lock not available
    (_db_error(sqlstate="23505"), False),  # a unique violation: not contention
    (_db_error(args=(1213, "Deadlock found")), True),
    (_db_error(args=(1205, "Lock wait timeout exceeded")), True),
    (_db_error(args=(1062, "Duplicate entry")), False),
    (_db_error(args=("1213",)), False),  # an errno is an int
    (_db_error(args=("database is locked",)), True),  # SQLite
    (ValueError("database is locked"), False),  # not the database's
], ids=["pg-serialization", "pg-deadlock", "pg-lock-not-available", "pg-unique", "my-deadlock",
        "my-lock-wait", "my-duplicate", "my-errno-text", "sqlite-locked", "not-a-db-error"])
def test_a_transaction_is_retried_only_when_the_database_rolled_it_back_for_contention(error, retryable):
    """``driver_errors.is_retryable``: PostgreSQL's SQLSTATEs, MySQL-family's errnos and
    SQLite's message for contention, nothing else (each server's lines run in CI only on
    that server; these are the driver errors as each driver raises them)."""
    assert dialects.is_retryable(error) is retryable


def test_retry_transient_retries_contention_and_raises_anything_else_at_once(monkeypatch):
    """``retry_transient`` runs the transaction again after a rollback for contention
    (backing off 50 ms, then 100 ms), and lets any other database error through on its
    first occurrence, without running the transaction again."""
    import sqlalchemy.exc

    from ductwork.db import driver_errors

    naps: list[float] = []
    monkeypatch.setattr(driver_errors.time, "sleep", naps.append)
    calls: list[int] = []

    def contended() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _db_error(sqlstate="40P01")
        return "done"

    assert (driver_errors.retry_transient(contended), len(calls), naps) == ("done", 3, [0.05, 0.1])
    calls.clear()

    def refused() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise _db_error(sqlstate="23505")
        return "ran again"

    with pytest.raises(sqlalchemy.exc.OperationalError):
        driver_errors.retry_transient(refused)
    assert (len(calls), naps) == (1, [0.05, 0.1])
