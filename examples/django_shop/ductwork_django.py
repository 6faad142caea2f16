"""Trigger a ductwork run inside Django's ``transaction.atomic()``: copy this module into
your project.

    with transaction.atomic():
        order = Order.objects.create(item=item)
        with ductwork_connection() as conn:
            FulfilOrder.trigger(order.pk, key=f"order-{order.pk}", connection=conn)

:func:`ductwork_connection` gives a SQLAlchemy ``Connection`` on the very DBAPI connection
Django's ``transaction.atomic()`` uses: the run commits with the atomic block, or rolls
back with it. SQLAlchemy would end Django's transaction in three places: the first use of
an engine rolls its new connection back once the dialect has read the server's settings;
``Connection.close()`` rolls back "unconditionally", whatever the pool's
``reset_on_return``; and ``engine.begin()`` commits when its block ends. So SQLAlchemy gets
Django's connection through a wrapper whose ``commit()``, ``rollback()`` and ``close()`` do
nothing: the atomic block alone decides. The engine has ``pool_reset_on_return=None`` and a
``StaticPool`` too (the one borrowed connection, kept, never closed by the pool).
Statements, savepoints included, go to Django's connection as they are.

Use it to trigger. Reads through it get Django's conversions, not SQLAlchemy's (on
PostgreSQL Django loads ``jsonb`` as text; on SQLite it parses DATETIME columns, which
``_DjangoSQLiteDateTime`` accepts); ``trigger`` reads only the run's status, pipeline and
times.

Works with Django's SQLite, PostgreSQL (psycopg 3) and MySQL/MariaDB (PyMySQL installed
as MySQLdb) backends. Not done: mysqlclient (SQLAlchemy's ``mysql+mysqldb`` dialect would
be needed), psycopg2, other backends, async views (use ``sync_to_async``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from django.db import connections
from sqlalchemy.dialects import sqlite
from sqlalchemy.pool import StaticPool

#: SQLAlchemy's dialect for each Django backend, with the DBAPI driver Django uses there,
#: and its options: on PostgreSQL, no look-up of the hstore type at the first connect
#: (psycopg's TypeInfo.fetch takes only a real psycopg connection, not the wrapper).
_DIALECTS: dict[str, tuple[str, dict[str, Any]]] = {
    "sqlite": ("sqlite+pysqlite://", {}),
    "postgresql": ("postgresql+psycopg://", {"use_native_hstore": False}),
    "mysql": ("mysql+pymysql://", {}),
}


class _Borrowed:
    """Django's DBAPI connection as SQLAlchemy sees it: ``commit``, ``rollback`` and
    ``close`` do nothing (the transaction and the connection are Django's); every other
    attribute is the connection's own."""

    def __init__(self, dbapi_connection: Any) -> None:
        self._dbapi_connection = dbapi_connection

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dbapi_connection, name)


class _DjangoSQLiteDateTime(sqlite.DATETIME):
    """SQLAlchemy's DATETIME on Django's sqlite3 connection, which parses DATETIME columns
    itself (``detect_types``, with converters Django registers): a ``datetime`` that arrives
    parsed is taken as it is."""

    def result_processor(self, dialect: Any, coltype: object) -> Callable[[Any], Any] | None:
        parse = super().result_processor(dialect, coltype)
        if parse is None:
            return None
        return lambda value: value if value is None or isinstance(value, datetime) else parse(value)


def _engine_for(django_connection: Any) -> sa.Engine:
    """A SQLAlchemy engine over ``django_connection``'s current DBAPI connection (one per
    DBAPI connection, kept on Django's connection wrapper, which is per thread)."""
    dbapi_connection = django_connection.connection
    cached = getattr(django_connection, "_ductwork_engine", None)
    if cached is not None and cached[0] is dbapi_connection:
        return cached[1]
    if django_connection.vendor not in _DIALECTS:
        raise RuntimeError(f"no SQLAlchemy dialect for Django's {django_connection.vendor!r} backend")
    borrowed = _Borrowed(dbapi_connection)
    url, options = _DIALECTS[django_connection.vendor]
    engine = sa.create_engine(url, creator=lambda: borrowed, poolclass=StaticPool, pool_reset_on_return=None,
                              **options)
    if django_connection.vendor == "sqlite":
        engine.dialect.colspecs = {**engine.dialect.colspecs, sa.DateTime: _DjangoSQLiteDateTime}
    django_connection._ductwork_engine = (dbapi_connection, engine)
    return engine


@contextmanager
def ductwork_connection(using: str = "default") -> Iterator[sa.Connection]:
    """A SQLAlchemy ``Connection`` inside the ``transaction.atomic()`` block you are in,
    on Django's connection ``using``: what is written through it commits or rolls back
    with that block (the outermost one), never on its own.

    Raises ``RuntimeError`` outside an atomic block: in Django's autocommit mode each
    statement would commit by itself, and a run could be left half written.
    """
    django_connection = connections[using]
    if not django_connection.in_atomic_block:
        raise RuntimeError("ductwork_connection() must be used inside transaction.atomic()")
    django_connection.ensure_connection()
    with _engine_for(django_connection).begin() as conn:  # its commit and rollback do nothing
        yield conn
