"""The one seam where PostgreSQL, MySQL/MariaDB and SQLite differ.

    >>> stmt = for_update(select(limit_keys).where(...), tx.conn)
    >>> with translate_db_errors({"uq_run_trigger_key": lambda _: TriggeredConcurrently(...)}): ...

Every backend-specific statement or setting is registered per backend with
:meth:`Seam.for_db` (a value that is all the difference: a table keyed by backend);
callers never test ``dialect.name``. PostgreSQL is the
reference; each other variant opens with "Differs from PostgreSQL in that …
because …". An unknown backend raises :class:`UnsupportedDialectError`, never a
silent fallback. The statements' variants are here; connecting (URLs, drivers,
engines) is :mod:`ductwork.db.engines`, and the error boundary (which constraint a
driver's error names, which errors are transient) is :mod:`ductwork.db.driver_errors`,
whose names this module exports: callers use them as ``dialects.translate_db_errors``
and so on.

Not API: internal to ductwork.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.sql.elements import UnaryExpression
from sqlalchemy.sql.operators import custom_op

from ductwork.db.driver_errors import is_disconnect as is_disconnect
from ductwork.db.driver_errors import is_retryable as is_retryable
from ductwork.db.driver_errors import retry_transient as retry_transient
from ductwork.db.driver_errors import translate_db_errors as translate_db_errors
from ductwork.db.driver_errors import violated_constraint as violated_constraint
from ductwork.errors import UnsupportedDialectError

_ALIASES = {"postgresql": "postgresql", "mysql": "mysql", "mariadb": "mysql", "sqlite": "sqlite"}


#: what a seam is called with: a connection, an engine, a dialect or a backend's name
Bind = Connection | Engine | Dialect | str
#: the statement :func:`prepared` keeps
S = TypeVar("S")
#: what a seam's implementations return
R = TypeVar("R")


def backend(bind: Bind) -> str:
    """``postgresql``, ``mysql`` (MySQL and MariaDB) or ``sqlite``; else raises."""
    name = bind if isinstance(bind, str) else (bind if isinstance(bind, Dialect) else bind.dialect).name
    if (family := _ALIASES.get(name)) is None:
        raise UnsupportedDialectError(name, "ductwork")
    return family


class Seam(Generic[R]):
    """A function with one implementation per backend: ``@seam.for_db("mysql")``."""

    def __init__(self, name: str):
        self.name = name
        self._impls: dict[str, Callable[..., R]] = {}

    def for_db(self, *backends: str) -> Callable[[Callable[..., R]], Callable[..., R]]:
        def register(fn: Callable[..., R]) -> Callable[..., R]:
            self._impls.update(dict.fromkeys(backends, fn))
            return fn

        return register

    def __call__(self, bind: Bind, *args: Any, **kw: Any) -> R:
        name = backend(bind)
        if (impl := self._impls.get(name)) is None:
            raise UnsupportedDialectError(name, self.name)
        return impl(bind, *args, **kw)


# --------------------------------------------------------------------------- server limits

#: the query for the longest statement the server takes; None: no limit of its own (a
#: statement may carry a value of up to 1 GB). Differs from PostgreSQL on MySQL in that the
#: server refuses (and drops the connection of) a statement longer than max_allowed_packet,
#: because it reads each client packet whole into a buffer of at most that size
_STATEMENT_LIMIT = {"postgresql": None, "mysql": "SELECT @@max_allowed_packet", "sqlite": None}


def statement_limit(conn: Connection) -> int | None:
    """The longest statement the server takes, in bytes; None: no limit of its own (see _STATEMENT_LIMIT)."""
    query = _STATEMENT_LIMIT[backend(conn)]
    return None if query is None else int(conn.exec_driver_sql(query).scalar_one())


# --------------------------------------------------------------------------- the clock

db_now = Seam[datetime]("db_now")


@db_now.for_db("postgresql")
def _pg_now(conn: Connection) -> datetime:
    # clock_timestamp(), not now(): the time of this statement, not of BEGIN.
    return cast(datetime, conn.exec_driver_sql("SELECT clock_timestamp() AT TIME ZONE 'UTC'").scalar_one())


@db_now.for_db("mysql")
def _mysql_now(conn: Connection) -> datetime:
    # Differs from PostgreSQL in that the function is UTC_TIMESTAMP(6): like
    # CURRENT_TIMESTAMP(6) but independent of the session time zone, because
    # DATETIME columns store no zone.
    return cast(datetime, conn.exec_driver_sql("SELECT UTC_TIMESTAMP(6)").scalar_one())


@db_now.for_db("sqlite")
def _sqlite_now(conn: Connection) -> datetime:
    # Differs from PostgreSQL in that an embedded database has no server clock and
    # SQLite's own 'now' has only millisecond precision: the host clock is the
    # database clock, read with microseconds. Every process sharing the file runs
    # on this host, so they all read the same clock.
    return datetime.now(UTC).replace(tzinfo=None)


# --------------------------------------------------------------------------- locking reads

#: whether a locking read takes row locks. Differs from PostgreSQL on SQLite in that there are
#: no row locks: the transaction already holds the database write lock (BEGIN IMMEDIATE), so
#: the plain read is as exclusive as FOR UPDATE
_ROW_LOCKS = {"postgresql": True, "mysql": True, "sqlite": False}


def for_update(stmt: sa.Select[Any], bind: Bind, *, skip_locked: bool = False) -> sa.Select[Any]:
    """``SELECT … FOR UPDATE [SKIP LOCKED]`` (nothing on SQLite: see _ROW_LOCKS)."""
    return stmt.with_for_update(skip_locked=skip_locked) if _ROW_LOCKS[backend(bind)] else stmt


def for_update_run(stmt: sa.Select[Any], bind: Bind) -> sa.Select[Any]:
    """The run-row lock taken before deciding a run's terminal state (FOR NO KEY UPDATE on
    PostgreSQL; nothing on SQLite: see _ROW_LOCKS)."""
    # FOR NO KEY UPDATE: inserts of rows referencing the run hold FOR KEY SHARE on it; a plain
    # FOR UPDATE would conflict with them and deadlock two transitions. Differs from
    # PostgreSQL on MySQL in that there is no NO KEY lock mode (SQLAlchemy renders
    # ``key_share`` on PostgreSQL only): a run's lock is the plain exclusive one. Transactions
    # that take it insert nothing that references the run before it, so it cannot deadlock
    # with their own foreign-key checks.
    return stmt.with_for_update(key_share=True) if _ROW_LOCKS[backend(bind)] else stmt


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


def prepared(bind: Connection | Engine, build: Callable[[Connection | Engine], S]) -> S:
    """The statement ``build(bind)`` makes, built once per backend and kept: its values
    are bound parameters given at execution (batch ids as :func:`ids_param`). Building
    and keying a SQLAlchemy statement costs more Python than executing a cached one, and
    a worker runs a dozen per batch. ``build`` must depend on nothing but the backend."""
    key = (build, backend(bind))
    statement = _prepared.get(key)
    if statement is None:
        statement = _prepared[key] = build(bind)
    return statement


_insert_rows = Seam[tuple[Any, Any]]("insert_rows")


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

    def array(column: sa.Column[Any]) -> str:
        # a bounded string travels as text: an explicit cast to VARCHAR(n) cuts a longer
        # value silently, where the column's own assignment refuses it, as any INSERT does
        bounded = isinstance(column.type, sa.String) and column.type.length
        return "TEXT[]" if bounded else f"{column.type.compile(dialect=pg)}[]"

    arrays = ", ".join(f"CAST(:c{i} AS {array(table.c[c])})" for i, c in enumerate(columns))
    return sa.text(f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT * FROM unnest({arrays})")


@_insert_rows.for_db("mysql", "sqlite")
def _plain_insert_rows(_: Any, table: sa.Table, rows: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    return table.insert(), rows


def insert_rows(bind: Connection, table: sa.Table, rows: Sequence[Mapping[str, object]]) -> None:
    """Insert ``rows`` (dicts with the same keys, none of them a large text: each column
    travels as one array on PostgreSQL) in one statement: ``executemany`` of
    ``table.insert()`` on MySQL and SQLite, one ``INSERT … SELECT FROM unnest`` on
    PostgreSQL. Nothing when ``rows`` is empty."""
    if rows:
        statement, params = _insert_rows(bind, table, rows)
        bind.execute(statement, params)


#: whether a guard's column can steer the planner off a primary-key lookup. Differs from
#: PostgreSQL and MySQL (their planners weigh the IN list's few rows against the index) on
#: SQLite in that its planner, without statistics, prefers an index on the column
#: (``status = ?``, ``process_id = ?``) to a primary-key IN list and then reads every row with
#: that value: 100,000 pending steps made a batch's status update 30x slower, and a worker's
#: group commit read every execution its process ever ran
_GUARDS_STEER_PLANS = {"postgresql": False, "mysql": False, "sqlite": True}


def by_primary_key(column: sa.ColumnElement[Any], bind: Bind) -> sa.ColumnElement[Any]:
    """``column`` in a guard that must not steer the plan away from a primary-key lookup."""
    if _GUARDS_STEER_PLANS[backend(bind)]:  # a unary + keeps the value and makes the column unindexable
        return UnaryExpression(column, operator=custom_op("+"), type_=column.type)
    return column


# --------------------------------------------------------------------------- inserts

insert_ignore = Seam[Any]("insert_ignore")


def _insert(bind: Bind, table: sa.Table) -> Any:
    """The backend's own INSERT of ``table`` (``sqlalchemy.dialects.<backend>.insert``),
    which has its conflict clause; its module imported on first use."""
    return importlib.import_module(f"sqlalchemy.dialects.{backend(bind)}").insert(table)


@insert_ignore.for_db("postgresql", "sqlite")
def _insert_on_conflict_do_nothing(bind: Bind, table: sa.Table) -> Any:
    return _insert(bind, table).on_conflict_do_nothing()


@insert_ignore.for_db("mysql")
def _mysql_insert_ignore(_: Any, table: sa.Table) -> Any:
    # Differs from PostgreSQL in that MySQL has no ON CONFLICT; INSERT IGNORE turns
    # the duplicate-key error into a warning.
    return sa.insert(table).prefix_with("IGNORE")


#: insert ``values``, or on a conflict on ``keys`` set the ``update`` columns to theirs
#: (``add``: add theirs to the stored values, a counter)
upsert = Seam[Any]("upsert")


def _theirs(table: sa.Table, proposed: Any, update: list[str], add: bool) -> dict[str, Any]:
    """An upsert's SET: each ``update`` column to the ``proposed`` row's value (``add``: plus its own)."""
    return {c: table.c[c] + proposed[c] if add else proposed[c] for c in update}


@upsert.for_db("postgresql", "sqlite")
def _upsert_on_conflict(bind: Bind, table: sa.Table, keys: list[str], values: dict[str, Any],
                        update: list[str], add: bool = False) -> Any:
    stmt = _insert(bind, table).values(**values)
    return stmt.on_conflict_do_update(index_elements=keys, set_=_theirs(table, stmt.excluded, update, add))


@upsert.for_db("mysql")
def _mysql_upsert(bind: Bind, table: sa.Table, keys: list[str], values: dict[str, Any],
                  update: list[str], add: bool = False) -> Any:
    # Differs from PostgreSQL in that ON DUPLICATE KEY has no conflict target: it
    # fires on any unique key, which is the primary key here.
    stmt = _insert(bind, table).values(**values)
    return stmt.on_duplicate_key_update(_theirs(table, stmt.inserted, update, add))


# --------------------------------------------------------------------------- savepoints

#: whether a statement that fails on a unique index aborts the whole transaction (PostgreSQL).
#: Differs from PostgreSQL on MySQL and SQLite in that it rolls back only itself (InnoDB's
#: statement rollback, SQLite's ABORT): the transaction goes on without a savepoint, and
#: pysqlite's own transaction handling (a caller's plain SQLite engine) does not support
#: SAVEPOINT reliably
_FAILURE_ABORTS_TRANSACTION = {"postgresql": True, "mysql": False, "sqlite": False}


def statement_savepoint(conn: Connection) -> contextlib.AbstractContextManager[object]:
    """What a statement that may violate a unique index runs in, inside a transaction that
    must go on (the caller's): a savepoint, rolled back to on the violation, where a failed
    statement aborts the whole transaction (PostgreSQL); elsewhere nothing."""
    return conn.begin_nested() if _FAILURE_ABORTS_TRANSACTION[backend(conn)] else contextlib.nullcontext()


# --------------------------------------------------------------------------- server-side routines

@dataclass(frozen=True)
class Json:
    """A routine's argument that travels as JSON (PostgreSQL ``jsonb``, MySQL JSON text)."""

    value: object


#: a routine's argument: a value, a list of texts (PostgreSQL ``text[]``, MySQL JSON text)
#: or :class:`Json`
RoutineArg = str | int | bool | datetime | list[str] | Json | None

call_routine = Seam[list[sa.Row[Any]]]("call_routine")


@call_routine.for_db("postgresql")
def _pg_call_routine(conn: Connection, name: str, args: Sequence[RoutineArg]) -> list[sa.Row[Any]]:
    # A function returning a table: one SELECT, one round trip. A list travels as text[]
    # (psycopg adapts it) and a Json as jsonb.
    from psycopg.types.json import Jsonb

    values = [Jsonb(a.value) if isinstance(a, Json) else a for a in args]
    placeholders = ", ".join("%s::text[]" if isinstance(a, list) else "%s" for a in args)
    return list(conn.exec_driver_sql(f"SELECT * FROM {name}({placeholders})", tuple(values)).all())


@call_routine.for_db("mysql")
def _mysql_call_routine(conn: Connection, name: str, args: Sequence[RoutineArg]) -> list[sa.Row[Any]]:
    # Differs from PostgreSQL in that a stored procedure returns its rows through CALL (a
    # function returns one value) and takes no arrays: a list and a Json travel as JSON
    # text, which the procedure reads with JSON_TABLE.
    import json

    values = [json.dumps(a.value if isinstance(a, Json) else a) if isinstance(a, (list, Json)) else a for a in args]
    placeholders = ", ".join(["%s"] * len(values))
    return list(conn.exec_driver_sql(f"CALL {name}({placeholders})", tuple(values)).all())


#: whether the backend runs routines on the server: a statement is a round trip, which a
#: routine saves but for the first. Differs from PostgreSQL on SQLite, which has no server-side
#: routines: it is in-process, so a statement is a call, not a round trip
_SERVER_ROUTINES = {"postgresql": True, "mysql": True, "sqlite": False}


def has_server_routines(bind: Bind) -> bool:
    """Whether the backend runs ductwork's routines on the server (:data:`call_routine`), or
    the caller runs their steps itself, statement by statement."""
    return _SERVER_ROUTINES[backend(bind)]


#: whether a block that only reads, or makes one statement (a call of a routine that is one
#: statement), runs outside a transaction block: on PostgreSQL, READ COMMITTED gives each
#: statement a snapshot of its own anyway and runs each atomically, so BEGIN and COMMIT would
#: only add two round trips. Differs on MySQL-family, where the driver's switch to autocommit
#: and back is a round trip each and a procedure's statements would each commit on their own,
#: and on SQLite, whose reads share one snapshot in a transaction that costs no round trip
_OUTSIDE_TRANSACTIONS = {"postgresql": True, "mysql": False, "sqlite": False}


def runs_outside_transactions(bind: Bind) -> bool:
    """Whether ``Database.begin(readonly=True)`` and ``begin(one_statement=True)`` run their
    statements outside a transaction block (:data:`_OUTSIDE_TRANSACTIONS`)."""
    return _OUTSIDE_TRANSACTIONS[backend(bind)]


#: the line that separates the statements of a routine's SQL file
STATEMENT_BREAK = "-- ---- "


def install_routine(conn: Connection, sql: str) -> None:
    """Create server-side routines from ``sql`` (a migration's), one statement at a time
    (split at :data:`STATEMENT_BREAK` lines: PyMySQL sends one statement per call), each
    sent as it is through the driver's cursor, which then reads no placeholders in it
    (``%`` in a PL/pgSQL RAISE)."""
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    for statement in re.split(f"^{re.escape(STATEMENT_BREAK)}.*$", sql, flags=re.MULTILINE):
        if statement.strip():
            cursor.execute(statement)


# --------------------------------------------------------------------------- wakeups

notify_wakeup = Seam[None]("notify_wakeup")


@notify_wakeup.for_db("postgresql")
def _pg_notify(conn: Connection, channels: Sequence[str]) -> None:
    # Delivered to listeners only if this transaction commits; coalesced per transaction.
    # The channels are ductwork's own names (ductwork.db.wakeup), never user data.
    conn.exec_driver_sql("SELECT " + ", ".join(f"pg_notify('{channel}', '')" for channel in channels))


@notify_wakeup.for_db("mysql", "sqlite")
def _no_notify(conn: Connection, channels: Sequence[str]) -> None:
    # Differs from PostgreSQL in that there is no notification channel: processes
    # other than this one find the work at their next poll.
    return None


# --------------------------------------------------------------------------- emptying (test fixtures)

delete_all_rows = Seam[None]("delete_all_rows")


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
