"""The error boundary: what a driver's error means, whichever backend raised it.

    >>> with translate_db_errors({"uq_run_revived_from": lambda _: RevivedConcurrently(run_id)}):
    ...     tx.execute(insert)

A unique violation is named by its constraint (PostgreSQL reports the name, MySQL the
index, SQLite the columns, mapped back through ``schema.CONSTRAINT_COLUMNS``) and
translated to a domain error by that name (:func:`translate_db_errors`); a rollback for
contention is told by SQLSTATE, errno or message (:func:`is_retryable`), a lost
connection by SQLAlchemy's invalidation (:func:`is_disconnect`). Part of the dialect
seam: :mod:`ductwork.db.dialects` exports these names, and callers use them from there.

Not API: internal to ductwork.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from sqlalchemy import exc

from ductwork.db.schema import CONSTRAINT_COLUMNS

T = TypeVar("T")

_MYSQL_KEY = re.compile(r"for key '(?:[^'.]*\.)?([^']+)'")
_SQLITE_UNIQUE = re.compile(r"UNIQUE constraint failed: (.+)$")


def violated_constraint(error: exc.IntegrityError) -> str | None:
    """The name of the unique constraint an IntegrityError violated, if known.

    PostgreSQL reports the name; MySQL names the index in its message; SQLite names
    the columns, which are mapped back through ``schema.CONSTRAINT_COLUMNS``.
    """
    orig = error.orig
    name: str | None = getattr(getattr(orig, "diag", None), "constraint_name", None)  # (psycopg's diagnostics)
    if name:
        return name
    if match := _MYSQL_KEY.search(str(orig)):
        return match.group(1)
    if match := _SQLITE_UNIQUE.search(str(orig)):
        failed = [c.strip() for c in match.group(1).split(",")]  # "table.column" each
        return next((name for name, (table, columns) in CONSTRAINT_COLUMNS.items()
                     if failed == [f"{table}.{column}" for column in columns]), None)
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
    args: tuple[object, ...] = getattr(orig, "args", ())
    return (getattr(orig, "sqlstate", None) in _RETRYABLE_PG  # psycopg's SQLSTATE
            or (bool(args) and isinstance(args[0], int) and args[0] in _RETRYABLE_MYSQL)  # PyMySQL's errno
            or "database is locked" in str(orig))  # SQLite's message


def is_disconnect(error: BaseException) -> bool:
    """The connection to the database was lost (server restart, killed session)."""
    return isinstance(error, exc.DBAPIError) and bool(error.connection_invalidated)


def retry_transient(fn: Callable[[], T], *, attempts: int = 8) -> T:
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
