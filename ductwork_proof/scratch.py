"""The database ``ductwork verify`` may fill and drop: a scratch one beside the adopter's,
or, with ``--in-place``, the one given.

    with scratch_database("postgresql://verify@db.internal/shop") as url:
        ...   # url names ductwork_verify_3f9a0c1e on the same server

Verify migrates the database it is given here, starts fleets on it, kills their
processes and reads everything back, so it must never run among an application's rows:

- PostgreSQL, MySQL/MariaDB: ``CREATE DATABASE ductwork_verify_<8 hex>`` on the same
  server (so the checks see that server: its version, settings, locks and clock), with
  the given database's encoding and collation, dropped on exit. Creating one needs
  CREATEDB (PostgreSQL) or CREATE (MySQL); without it :class:`VerifyError` says so and
  names ``--in-place``.
- SQLite: a fresh file in a new directory beside the given file (the same file system,
  whose locking SQLite relies on), removed on exit. ``sqlite:///:memory:`` is refused:
  the fleet verify starts is several processes, and an in-memory database is private to
  the connection that opened it.
- ``in_place=True``: the given database itself. Refused while ductwork's tables (or the
  chaos witness table) hold rows, unless ``force=True``: verify's runs would mix with
  the application's, and the checkers would read both. On exit verify removes what it
  created: the tables that were not there before (through the migrations' downgrade when
  it created the schema, so the server routines go too), the rows of tables that were
  there empty; tables that held rows before (``force``) are left as they are, verify's
  rows among them.

``keep=True`` leaves everything in place (the report names the URL). A password is
never printed: messages show :func:`mask`'s form of a URL.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url

from ductwork.db import dialects, engines, migrate, schema
from ductwork_proof.workload import WITNESS

#: the names of the scratch databases (and SQLite directories) verify creates
SCRATCH_PREFIX = "ductwork_verify_"
#: what verify may create in a database besides ductwork's tables
VERIFY_TABLES = (migrate.VERSION_TABLE, WITNESS.name)


class VerifyError(Exception):
    """``ductwork verify`` cannot go on; the message names what and what to do instead."""


def mask(url: str | URL) -> str:
    """``url`` as messages show it: the password replaced by ``***``."""
    return make_url(url).render_as_string(hide_password=True)


def first_line(error: BaseException) -> str:
    """The first line of a driver's message (SQLAlchemy appends the statement and a link)."""
    orig = getattr(error, "orig", None)
    text = str(orig if orig is not None else error).strip()
    return text.splitlines()[0] if text else type(error).__name__


@contextlib.contextmanager
def scratch_database(url: str, *, in_place: bool = False, force: bool = False, keep: bool = False) -> Iterator[str]:
    """Yield the URL of a database verify may fill and drop (module docstring); remove
    it, or what verify created in it, on exit unless ``keep``.

    Raises :class:`VerifyError` for an in-memory SQLite URL, a server that refuses the
    connection or ``CREATE DATABASE``, an in-place database whose ductwork tables hold
    rows (without ``force``), and a scratch database that could not be dropped;
    :class:`ductwork.errors.DatabaseURLError` for a URL ductwork cannot use.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and _in_memory(parsed):
        raise VerifyError(f"{mask(url)} is an in-memory SQLite database: verify runs a fleet of several processes, "
                          "and an in-memory database is private to one connection of one process; give a file, "
                          "e.g. sqlite:///verify.sqlite3")
    name = dialects.backend(engines.normalize_url(url).get_backend_name())
    if in_place:
        scratch = _in_place(url, force=force, keep=keep)
    elif name == "sqlite":
        scratch = _sqlite_scratch(parsed, keep=keep)
    else:
        scratch = _server_scratch(url, name, keep=keep)
    with scratch as scratch_url:
        yield scratch_url


def _in_memory(url: URL) -> bool:
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in database or url.query.get("mode") == "memory"


@contextlib.contextmanager
def _cleaned(what: str, clean: Callable[[], None]) -> Iterator[None]:
    """Run the body, then ``clean``. A failure to clean up is a VerifyError naming
    ``what`` was left; when the body raised too, it is a note on the body's error (the
    one that matters)."""
    try:
        yield
    except BaseException as error:
        try:
            clean()
        except Exception as cleanup_error:  # noqa: BLE001 - whatever it was, the body's error goes on
            error.add_note(f"ductwork verify also could not remove {what}: {first_line(cleanup_error)}")
        raise
    try:
        clean()
    except (sa.exc.DBAPIError, OSError) as cleanup_error:
        raise VerifyError(f"could not remove {what}: {first_line(cleanup_error)}") from cleanup_error


# --------------------------------------------------------------------------- SQLite


@contextlib.contextmanager
def _sqlite_scratch(url: URL, *, keep: bool) -> Iterator[str]:
    given = Path(str(url.database))
    parent = given.absolute().parent if url.query.get("uri") is None and not str(given).startswith("file:") else None
    directory = parent if parent is not None and parent.is_dir() else Path(tempfile.gettempdir())
    try:
        made = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=directory))
    except OSError as error:
        raise VerifyError(f"cannot create a scratch directory in {directory} for the SQLite database verify fills "
                          f"({error}); SQLite needs to write beside its file there too") from error
    try:
        scratch = f"sqlite:///{made / 'verify.sqlite3'}"
        engine = engines.create_engine(scratch)  # the first connection creates the file, as CREATE DATABASE
        engine.connect().close()
        engine.dispose()
        yield scratch
    finally:
        if not keep:
            shutil.rmtree(made, ignore_errors=True)


# --------------------------------------------------------------------------- servers


def _admin(engine: Engine) -> sa.Connection:
    """A connection whose statements commit on their own: CREATE DATABASE runs in no transaction."""
    try:
        return engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    except sa.exc.DBAPIError as error:
        raise VerifyError(f"cannot connect to {mask(engine.url)}: {first_line(error)}") from error


#: per backend: the privilege CREATE DATABASE needs, and how to grant it
_PRIVILEGE = {
    "postgresql": ("CREATEDB", "ALTER ROLE {user} CREATEDB"),
    "mysql": ("CREATE (and DROP)", "GRANT ALL PRIVILEGES ON `ductwork\\_verify\\_%`.* TO '{user}'@'%'"),
}


def _create_statement(conn: sa.Connection, name: str, database: str) -> str:
    """``CREATE DATABASE`` for ``database``, with the encoding and collation of the one
    ``conn`` is on, so the checks run on text stored as the application's is."""
    if name == "postgresql":
        encoding, collate, ctype = conn.exec_driver_sql(
            "SELECT pg_encoding_to_char(encoding), datcollate, datctype FROM pg_database "
            "WHERE datname = current_database()").one()
        return (f'CREATE DATABASE "{database}" TEMPLATE template0 ENCODING {_quote(encoding)} '
                f"LC_COLLATE {_quote(collate)} LC_CTYPE {_quote(ctype)}")
    charset, collation = conn.exec_driver_sql("SELECT @@character_set_database, @@collation_database").one()
    return f"CREATE DATABASE `{database}` CHARACTER SET {charset} COLLATE {collation}"


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _drop(conn: sa.Connection, name: str, database: str) -> None:
    """Drop ``database``, ending the sessions still on it (a killed fleet's leftovers)."""
    if name == "postgresql":
        if (conn.dialect.server_version_info or (0,)) >= (13,):
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            return
        conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                     {"name": database})
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{database}"')
        return
    sessions = conn.execute(sa.text("SELECT id FROM information_schema.PROCESSLIST "
                                    "WHERE db = :name AND id <> CONNECTION_ID()"), {"name": database}).scalars()
    for session in list(sessions):
        with contextlib.suppress(sa.exc.DBAPIError):  # gone meanwhile, or another user's
            conn.exec_driver_sql(f"KILL {int(session)}")
    conn.exec_driver_sql("SET SESSION lock_wait_timeout = 20")  # within the engine's 30 s read timeout
    conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{database}`")


@contextlib.contextmanager
def _server_scratch(url: str, name: str, *, keep: bool) -> Iterator[str]:
    database = f"{SCRATCH_PREFIX}{secrets.token_hex(4)}"
    engine = engines.create_engine(url, connect_timeout=10)
    try:
        with _admin(engine) as conn:
            try:
                conn.exec_driver_sql(_create_statement(conn, name, database))
            except sa.exc.DBAPIError as error:
                privilege, grant = _PRIVILEGE[name]
                raise VerifyError(
                    f"{mask(make_url(url).set(database=None))} refused to create the scratch database {database} "
                    f"({first_line(error)}): ductwork verify fills a database of its own there and drops it "
                    f"afterwards, which needs the {privilege} privilege "
                    f"({grant.format(user=engine.url.username or 'USER')}); or run it with --in-place on a "
                    "database it may fill (one without ductwork's rows)") from error

        def drop() -> None:
            if not keep:
                with _admin(engine) as conn:
                    _drop(conn, name, database)

        with _cleaned(f"the scratch database {database} on {mask(url)} (drop it by hand)", drop):
            yield make_url(url).set(database=database).render_as_string(hide_password=False)
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- in place


def row_counts(conn: sa.Connection) -> dict[str, int]:
    """Rows per table, of ductwork's tables and the witness table that exist here."""
    present = set(sa.inspect(conn).get_table_names())
    tables = [*schema.metadata.sorted_tables, WITNESS]
    return {t.name: int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one())
            for t in tables if t.name in present}


@contextlib.contextmanager
def _in_place(url: str, *, force: bool, keep: bool) -> Iterator[str]:
    absent_file = engines.absent_database_file(url)
    engine = engines.create_engine(url, connect_timeout=10)
    try:
        try:
            with engine.connect() as conn:
                present = set(sa.inspect(conn).get_table_names())
                counts = row_counts(conn)
        except sa.exc.DBAPIError as error:
            raise VerifyError(f"cannot read {mask(url)}: {first_line(error)}") from error
        full = {table: rows for table, rows in counts.items() if rows}
        if full and not force:
            listed = ", ".join(f"{table} ({rows:,} row{'' if rows == 1 else 's'})"
                               for table, rows in sorted(full.items()))
            raise VerifyError(f"{mask(url)} holds rows in ductwork's tables: {listed}. Verifying in place would mix "
                              "its runs with these and its checkers would read both; verify a scratch database "
                              "(without --in-place), empty these tables, or pass --force to run among them anyway")

        def restore() -> None:
            if not keep:
                _restore(engine, present, set(full), absent_file)

        with _cleaned(f"what verify created in {mask(url)}", restore):
            yield url
    finally:
        engine.dispose()


def _restore(engine: Engine, present: set[str], full: set[str], absent_file: Path | None) -> None:
    """Remove what verify created: the SQLite file it created; else the tables that were
    not ``present`` (the migrations' downgrade first when verify made the schema: it
    drops the server routines too) and the rows of those that were there empty (not
    ``full``). Tables that held rows are left as they are."""
    if absent_file is not None:
        engine.dispose()
        for path in (absent_file, *(absent_file.with_name(absent_file.name + s) for s in ("-wal", "-shm"))):
            path.unlink(missing_ok=True)
        return
    failed: sa.exc.DBAPIError | None = None
    if migrate.VERSION_TABLE not in present and migrate.current(engine) is not None:
        try:
            migrate.downgrade(engine, "base")
        except sa.exc.DBAPIError as error:  # a migration cut short (MySQL's DDL commits each statement)
            failed = error  # the tables are dropped below all the same
    with engine.begin() as conn:
        created = set(sa.inspect(conn).get_table_names()) - present
        schema.metadata.drop_all(conn, tables=[t for t in schema.metadata.sorted_tables if t.name in created])
        for extra in VERIFY_TABLES:
            if extra in created:
                conn.exec_driver_sql(f"DROP TABLE {conn.dialect.identifier_preparer.quote(extra)}")
        emptied = [t for t in reversed(schema.metadata.sorted_tables) if t.name in present - full]
        if emptied:
            dialects.delete_all_rows(conn, emptied)
        if WITNESS.name in present - full:
            conn.execute(WITNESS.delete())
    if failed is not None:
        raise failed


def migrated(url: str) -> str:
    """``url``, its database migrated to the head revision (verify's scratch databases,
    the ``ductwork_chaos`` fixture's and the repository's test databases alike)."""
    from ductwork.db import engines, migrate

    engine = engines.create_engine(url)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()
    return url
