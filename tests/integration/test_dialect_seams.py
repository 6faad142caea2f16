"""The dialect seams at their edges, on every database: a batch of no ids matches nothing,
a batch of no rows inserts nothing, a violation the error boundary does not map passes
through it unchanged, and a lock refused for contention is read as retryable and retried.

Checks: none of the invariants directly; the error boundary (``translate_db_errors``)
is what maps INV-TRG-1's and INV-REV-1's index violations, so what it lets through matters.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from ductwork.db import dialects, schema
from tests.capabilities import needs

k = schema.limit_keys


def _keys(app) -> list[str]:
    with app.begin(readonly=True) as tx:
        return list(tx.execute(sa.select(k.c.key).order_by(k.c.key)).scalars())


def _add_key(app, key: str) -> None:
    with app.begin() as tx:
        tx.execute(k.insert().values(key=key, seq=0, created_at=tx.now, updated_at=tx.now))


def test_an_empty_batch_of_ids_matches_nothing(app):
    """``inline_ids([])`` renders ``IN (NULL)``: no row, where an empty IN would be a syntax error."""
    _add_key(app, "k")
    with app.begin(readonly=True) as tx:
        assert tx.execute(sa.select(k.c.key).where(k.c.key.in_(dialects.inline_ids([])))).all() == []
        prepared = sa.select(k.c.key).where(k.c.key.in_(dialects.ids_param()))
        assert tx.execute(prepared, {"batch_ids": []}).all() == []
        assert tx.execute(prepared, {"batch_ids": ["k"]}).scalars().all() == ["k"]


def test_inserting_no_rows_writes_nothing(app):
    """``insert_rows`` of an empty list is no statement (PostgreSQL's variant reads the first
    row's columns: it is never called with none)."""
    with app.begin() as tx:
        dialects.insert_rows(tx.conn, k, [])
        dialects.insert_rows(tx.conn, k, [{"key": "k", "seq": 0, "created_at": tx.now, "updated_at": tx.now}])
    assert _keys(app) == ["k"]


def test_a_violation_the_boundary_does_not_map_passes_through_unchanged(app):
    """A duplicate primary key inside ``translate_db_errors`` for another constraint: the
    IntegrityError itself propagates (SQLite names only columns, which map to no named
    constraint; PostgreSQL and MySQL name the primary key, which is not in the mapping)."""
    _add_key(app, "k")

    class Mapped(Exception):
        pass

    with pytest.raises(sa.exc.IntegrityError) as info, \
            dialects.translate_db_errors({"uq_run_trigger_key": lambda _: Mapped()}), app.begin() as tx:
        tx.execute(k.insert().values(key="k", seq=0, created_at=tx.now, updated_at=tx.now))
    assert dialects.violated_constraint(info.value) not in schema.CONSTRAINT_COLUMNS
    assert _keys(app) == ["k"]


@needs("lock_refused_at_once")
def test_a_lock_refused_for_contention_is_retryable_and_retried(app):
    """A row lock refused at once (``FOR UPDATE NOWAIT`` while another transaction holds
    it: PostgreSQL's 55P03, MySQL's 1205) is a contention rollback, not a lost connection;
    ``retry_transient`` runs the transaction again once the holder has let go."""
    _add_key(app, "k")
    nowait = sa.select(k.c.key).where(k.c.key == "k").with_for_update(nowait=True)
    with app.engine.connect() as holder:
        held = holder.begin()
        holder.execute(sa.select(k.c.key).where(k.c.key == "k").with_for_update())
        with pytest.raises(sa.exc.DBAPIError) as refused, app.engine.begin() as conn:
            conn.execute(nowait)
        assert dialects.is_retryable(refused.value)
        assert not dialects.is_disconnect(refused.value)

        attempts: list[int] = []

        def once() -> str:
            attempts.append(1)
            try:
                with app.engine.begin() as conn:
                    return str(conn.execute(nowait).scalar_one())
            finally:
                if len(attempts) == 1:
                    held.rollback()  # the holder lets go after the first refusal

        assert dialects.retry_transient(once) == "k"
    assert len(attempts) == 2


def test_a_value_longer_than_its_column_is_refused_by_a_batch_insert_as_by_any_insert(app):
    """``insert_rows`` (the steps and executions of a batch): on PostgreSQL each column travels
    as an array, and a bounded string's array is text, so a value longer than its column is
    refused by the column, as a one-row INSERT's is (cast to ``VARCHAR(255)[]``, it was cut
    to 255 silently: a step class name cut so, resolving to no class). MySQL refuses it too
    (strict, whatever the server's mode: the engine's session sql_mode); SQLite stores it."""
    long_key = "k" * 256
    if app.backend == "sqlite":
        with app.begin() as tx:
            dialects.insert_rows(tx.conn, k, [{"key": long_key, "seq": 0, "created_at": tx.now, "updated_at": tx.now}])
        assert _keys(app) == [long_key]
        return
    with pytest.raises(sa.exc.DataError), app.begin() as tx:
        dialects.insert_rows(tx.conn, k, [{"key": long_key, "seq": 0, "created_at": tx.now, "updated_at": tx.now}])
    assert _keys(app) == []


def test_a_mysql_session_is_strict_whatever_the_servers_mode(app):
    """Every MySQL-family connection sets the engine's sql_mode (``engines.MYSQL_SQL_MODE``):
    strict, so that a value longer than its column is refused, never cut with a warning."""
    if app.backend != "mysql":
        pytest.skip("MySQL-family's sql_mode")
    from ductwork.db.engines import MYSQL_SQL_MODE

    with app.begin(readonly=True) as tx:
        mode = tx.execute(sa.text("SELECT @@SESSION.sql_mode")).scalar_one()
    assert set(mode.split(",")) == set(MYSQL_SQL_MODE.split(","))


def test_the_statement_limit_is_the_servers_own(app):
    """``dialects.statement_limit``: MySQL-family's ``max_allowed_packet`` (the longest
    statement its server reads; the boot check warns below 16 MiB), and None on PostgreSQL
    and SQLite, which have no limit of their own."""
    with app.engine.connect() as conn:
        limit = dialects.statement_limit(conn)
        own = conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one() if app.backend == "mysql" else None
    assert limit == own
