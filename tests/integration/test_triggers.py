"""Keyed triggers and triggers in the caller's transaction, on every database.

INV-TRG-1 (one run per pipeline and trigger key: a second trigger returns the first's run,
from threads and processes racing too; the key freed by a prune; the named index
``uq_run_trigger_key`` behind it, its violation mapped by name, the caller's transaction
still usable after it) and INV-TRG-2 (a trigger through the caller's ``Connection`` is
invisible until the caller commits, leaves nothing when it rolls back, and wakes workers on
PostgreSQL only at the commit); a key window (a run finished at least the window before
the trigger gives its key to a new run, also to one of many racing threads; a run in
progress or finished more recently keeps it; a key taken after the caller's snapshot raises
TriggeredConcurrently); the errors for bad keys, bad windows and
unusable connections.
"""

from __future__ import annotations

import functools
from datetime import timedelta

import pytest
import sqlalchemy as sa

from ductwork import (
    Pipeline,
    TriggerConnectionError,
    TriggeredConcurrently,
    TriggerKeyError,
    TriggerKeyWindowError,
)
from ductwork.db import schema
from ductwork.testing import drain
from ductwork_proof.fleet import wait_for
from tests.capabilities import needs
from tests.conftest import installed, make_app, race, race_processes
from tests.workloads import Fails, Times10

RUN_TABLES = (schema.runs, schema.branches, schema.steps, schema.executions)

#: the application's own table, in the same database as ductwork's
orders = sa.Table("trigger_test_orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))


class ChargeOrder(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Times10)


class RefundOrder(ChargeOrder):
    """ChargeOrder's graph under another name (a subclass reuses ``define``): a key is per pipeline."""


@pytest.fixture
def app(db_url):
    application = make_app(db_url)
    orders.drop(application.engine, checkfirst=True)
    orders.create(application.engine)
    try:
        yield from installed(application)
    finally:
        orders.drop(application.engine, checkfirst=True)
        application.dispose()  # again: the drop took a connection after installed() disposed


def _count(app, table, **where) -> int:
    with app.begin(readonly=True) as tx:
        return tx.execute(sa.select(sa.func.count()).select_from(table)
                          .where(*(table.c[k] == v for k, v in where.items()))).scalar_one()


def _nothing_written(app) -> bool:
    return all(_count(app, table) == 0 for table in RUN_TABLES)


# --------------------------------------------------------------------------- INV-TRG-1


def test_a_second_trigger_with_the_key_returns_the_first_run(app):
    first = ChargeOrder.trigger(1, key="order-1")
    again = ChargeOrder.trigger(2, key="order-1")  # other arguments: not compared
    assert again.id == first.id
    assert _count(app, schema.runs) == 1
    assert _count(app, schema.steps) == 1
    assert ChargeOrder.trigger(1, key="order-2").id != first.id
    assert ChargeOrder.trigger(1, key="Order-1").id != first.id  # compared exactly, case included
    assert RefundOrder.trigger(1, key="order-1").id != first.id  # a key is per pipeline
    assert ChargeOrder.trigger(1).id != ChargeOrder.trigger(1).id  # no key: a run per trigger
    drain(app)
    assert first.refresh().status == "completed"
    assert ChargeOrder.trigger(3, key="order-1").id == first.id  # held while the run exists


def test_a_triggers_handle_is_the_run_it_wrote_without_reading_it_back(app):
    """The handle a trigger returns is the run as it wrote it (in progress, its pipeline,
    the trigger time stored to the microsecond, nothing halted), with no read after the
    write; a trigger that finds the key's run reads that run, in whatever state it is."""
    statements = []

    def capture(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001 - SQLAlchemy's hook
        statements.append(statement.lstrip().split(None, 1)[0].upper())

    sa.event.listen(app.engine, "before_cursor_execute", capture)
    try:
        run = ChargeOrder.trigger(1, key="order-1")
    finally:
        sa.event.remove(app.engine, "before_cursor_execute", capture)
    assert "INSERT" in statements
    assert [s for s in statements[statements.index("INSERT"):] if s == "SELECT"] == (
        ["SELECT"] if app.backend == "postgresql" else [])  # PostgreSQL's one NOTIFY, nothing read
    stored = app.run(run.id)
    assert (run.status, run.pipeline, run.triggered_at, run.halt_reasons) == (
        stored.status, stored.pipeline, stored.triggered_at, stored.halt_reasons)
    assert (run.status, run.halt_reasons) == ("in_progress", [])
    drain(app)
    again = ChargeOrder.trigger(2, key="order-1")
    assert (again.id, again.status) == (run.id, "completed")


def test_a_pruned_run_frees_its_key(app):
    from ductwork import prune

    first = ChargeOrder.trigger(1, key="order-1")
    drain(app)
    assert prune(app, timedelta(0)).runs == 1
    second = ChargeOrder.trigger(1, key="order-1")
    assert second.id != first.id
    assert ChargeOrder.trigger(1, key="order-1").id == second.id


def test_a_revived_run_does_not_take_the_key(app):
    from ductwork.pipelines.revive import revive_run

    halted = Fails.trigger(1, key="order-1")
    drain(app)
    assert halted.refresh().status == "halted"
    revived = revive_run(app, halted.id)
    assert revived != halted.id
    assert Fails.trigger(1, key="order-1").id == halted.id


def test_racing_triggers_from_threads_create_one_run(app):
    got = [run.id for run in race([lambda: ChargeOrder.trigger(7, key="order-7")] * 6)]
    assert len(set(got)) == 1
    assert _count(app, schema.runs) == 1
    assert _count(app, schema.executions) == 1


def _trigger_in_process(url, start, out):
    from ductwork.app import App
    from ductwork.config import Config

    app = App(url, Config.from_section({}, source="<trigger>"))
    start.wait(60)
    try:
        out.put(ChargeOrder.trigger(7, key="order-7", app=app).id)
    finally:
        app.dispose()


def test_racing_triggers_from_processes_create_one_run(app, db_url):
    got = race_processes(_trigger_in_process, db_url)
    assert len(set(got)) == 1  # [INV-TRG-1]
    assert _count(app, schema.runs) == 1
    assert _count(app, schema.executions) == 1


def test_racing_triggers_in_callers_transactions_create_one_run(app):
    """Each caller writes its own order and triggers with one key in the same transaction:
    every order commits, one run between them, each caller gets it."""
    def caller(order):
        with app.engine.begin() as conn:
            conn.execute(orders.insert().values(id=order))
            return ChargeOrder.trigger(order, key="batch-1", connection=conn).id

    got = race([functools.partial(caller, n) for n in range(4)])
    assert len(set(got)) == 1
    assert _count(app, schema.runs) == 1
    assert _count(app, orders) == 4


def test_the_unique_index_refuses_a_second_run_with_the_key(app):
    """The guarantee behind the look-up: a second row with the pipeline and key is refused
    by the named index, and the error boundary maps it by that name."""
    from ductwork.db import dialects

    run = ChargeOrder.trigger(1, key="order-1")
    with app.begin(readonly=True) as tx:
        row = tx.execute(sa.select(schema.runs).where(schema.runs.c.id == run.id)).mappings().one()
    with pytest.raises(TriggeredConcurrently), dialects.translate_db_errors(
            {"uq_run_trigger_key": lambda _: TriggeredConcurrently(row["pipeline_klass"], "order-1")}), \
            app.begin() as tx:
        tx.execute(schema.runs.insert().values({**row, "id": "second"}))
    assert _count(app, schema.runs) == 1


@needs("snapshot_older_than_a_commit")
def test_a_key_committed_after_the_callers_snapshot_raises_and_leaves_its_transaction_usable(app):
    """The caller's transaction reads from a snapshot older than the run that took the key
    (REPEATABLE READ): its look-up misses it, the index refuses the insert, the violation is
    mapped by name, and the caller's transaction goes on and commits its own rows."""
    with app.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            conn.execute(sa.select(sa.func.count()).select_from(schema.runs)).scalar_one()  # the snapshot
            winner = ChargeOrder.trigger(1, key="order-1")  # another transaction, committed
            with pytest.raises(TriggeredConcurrently) as info:
                ChargeOrder.trigger(1, key="order-1", connection=conn)
            assert "retry the transaction" in str(info.value)
            conn.execute(orders.insert().values(id=1))  # still usable
    assert _count(app, orders) == 1
    assert _count(app, schema.runs) == 1
    with app.engine.begin() as conn:  # a new transaction sees the run
        assert ChargeOrder.trigger(1, key="order-1", connection=conn).id == winner.id


# --------------------------------------------------------------------------- key windows


def _finished_ago(app, run_id, ago: timedelta) -> None:
    """Move the run's finish time ``ago`` before the database's now (time passing, without waiting)."""
    with app.begin() as tx:
        then = tx.now - ago
        row = tx.execute(sa.select(schema.runs.c.status).where(schema.runs.c.id == run_id)).scalar_one()
        column = {"completed": "completed_at", "halted": "halted_at"}[row]
        tx.execute(schema.runs.update().where(schema.runs.c.id == run_id).values({column: then}))


def _key_of(app, run_id):
    with app.begin(readonly=True) as tx:
        return tx.execute(sa.select(schema.runs.c.trigger_key).where(schema.runs.c.id == run_id)).scalar_one()


def test_a_run_finished_a_window_ago_gives_its_key_to_a_new_run(app):
    first = ChargeOrder.trigger(1, key="order-1")
    drain(app)
    _finished_ago(app, first.id, timedelta(days=1, seconds=5))
    second = ChargeOrder.trigger(2, key="order-1", key_window="1d")
    assert second.id != first.id  # [INV-TRG-1] released
    assert first.refresh().status == "completed"  # the old run keeps its history
    assert _key_of(app, first.id) is None
    assert _key_of(app, second.id) == "order-1"
    assert ChargeOrder.trigger(3, key="order-1", key_window="1d").id == second.id  # in progress: held
    assert ChargeOrder.trigger(3, key="order-1").id == second.id
    assert _count(app, schema.runs) == 2


@needs("locking_reads_past_the_snapshot")
def test_a_windowed_key_taken_after_the_callers_snapshot_raises_and_leaves_its_transaction_usable(app):
    """The caller's snapshot (REPEATABLE READ) still shows the key's old run, finished a
    window ago; another trigger took the key and committed since. The release, a locking
    write, finds the key gone, and the snapshot shows no new holder: TriggeredConcurrently
    (the new run is not the caller's to see), nothing written, the transaction usable."""
    first = ChargeOrder.trigger(1, key="order-1")
    drain(app)
    _finished_ago(app, first.id, timedelta(days=2))
    with app.engine.connect() as conn:
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
        with conn.begin():
            conn.execute(sa.select(sa.func.count()).select_from(schema.runs)).scalar_one()  # the snapshot
            winner = ChargeOrder.trigger(2, key="order-1", key_window="1d")  # another transaction, committed
            assert winner.id != first.id
            with pytest.raises(TriggeredConcurrently) as info:
                ChargeOrder.trigger(3, key="order-1", key_window="1d", connection=conn)
            assert "retry the transaction" in str(info.value)
            conn.execute(orders.insert().values(id=1))  # still usable
    assert _count(app, orders) == 1
    assert _count(app, schema.runs) == 2
    assert _key_of(app, winner.id) == "order-1"
    with app.engine.begin() as conn:  # a new transaction sees the winner holding the key
        assert ChargeOrder.trigger(3, key="order-1", key_window="1d", connection=conn).id == winner.id


def test_a_run_finished_within_the_window_keeps_its_key(app):
    first = ChargeOrder.trigger(1, key="order-1")
    drain(app)
    _finished_ago(app, first.id, timedelta(hours=23))
    assert ChargeOrder.trigger(2, key="order-1", key_window="1d").id == first.id
    assert ChargeOrder.trigger(2, key="order-1", key_window=timedelta(days=1)).id == first.id
    assert ChargeOrder.trigger(2, key="order-1", key_window=22 * 3600).id != first.id  # seconds: 22 h ago is enough
    assert _count(app, schema.runs) == 2


def test_a_key_window_on_a_key_no_run_holds_starts_a_run_with_it(app):
    first = ChargeOrder.trigger(1, key="order-1", key_window="1d")
    assert _key_of(app, first.id) == "order-1"
    assert ChargeOrder.trigger(2, key="order-1", key_window="1d").id == first.id  # now it holds it
    assert _count(app, schema.runs) == 1


def test_a_run_in_progress_keeps_its_key_whatever_the_window(app):
    first = ChargeOrder.trigger(1, key="order-1")
    assert ChargeOrder.trigger(2, key="order-1", key_window=1).id == first.id
    assert first.refresh().status == "in_progress"
    assert _count(app, schema.runs) == 1


@pytest.mark.parametrize("expired", [ChargeOrder, RefundOrder])
def test_a_key_window_decides_by_the_holder_in_its_own_pipeline(app, expired):
    """The same key held in two pipelines: the run that finished two days ago gives it to a
    new run of its pipeline; the other pipeline's run, finished just now (and triggered
    first, so a look-up of the holder by the key alone would meet it first), keeps its own
    [INV-TRG-1]."""
    held = RefundOrder if expired is ChargeOrder else ChargeOrder
    recent = held.trigger(2, key="order-1")
    finished = expired.trigger(1, key="order-1")
    drain(app)
    _finished_ago(app, finished.id, timedelta(days=2))
    renewed = expired.trigger(3, key="order-1", key_window="1d")
    assert renewed.id not in (finished.id, recent.id)
    assert _key_of(app, finished.id) is None
    assert held.trigger(4, key="order-1", key_window="1d").id == recent.id
    assert _key_of(app, recent.id) == "order-1"


def test_a_halted_run_finished_a_window_ago_gives_its_key_to_a_new_run(app):
    halted = Fails.trigger(1, key="order-1")
    drain(app)
    assert halted.refresh().status == "halted"
    _finished_ago(app, halted.id, timedelta(minutes=2))
    assert Fails.trigger(1, key="order-1", key_window="1m").id != halted.id


def test_racing_triggers_on_an_expired_key_create_one_run(app):
    first = ChargeOrder.trigger(1, key="order-7")
    drain(app)
    _finished_ago(app, first.id, timedelta(hours=2))
    got = [run.id for run in race([lambda: ChargeOrder.trigger(7, key="order-7", key_window="1h")] * 6)]
    assert len(set(got)) == 1  # [INV-TRG-1] one new run, every caller returned it
    assert got[0] != first.id
    assert _count(app, schema.runs) == 2
    assert _count(app, schema.executions) == 2


def test_a_key_window_in_the_callers_transaction(app):
    first = ChargeOrder.trigger(1, key="order-1")
    drain(app)
    _finished_ago(app, first.id, timedelta(days=2))
    with app.engine.connect() as conn:
        transaction = conn.begin()
        rolled = ChargeOrder.trigger(1, key="order-1", key_window="1d", connection=conn)
        transaction.rollback()
    assert rolled.id != first.id
    assert _key_of(app, first.id) == "order-1"  # [INV-TRG-2] the release rolled back with the run
    with app.engine.connect() as conn:
        transaction = conn.begin()
        second = ChargeOrder.trigger(1, key="order-1", key_window="1d", connection=conn)
        transaction.commit()
    assert second.id != first.id
    assert _key_of(app, first.id) is None
    assert ChargeOrder.trigger(1, key="order-1", key_window="1d").id == second.id


@pytest.mark.parametrize(("window", "key", "reason"), [
    (-1, "order-1", "must be positive"), (0, "order-1", "must be positive"),
    ("garbage", "order-1", "expected whole seconds"), ("1mo", "order-1", "months and years"),
    (True, "order-1", "bool"), ("1d", None, "given without a key"),
])
def test_a_bad_key_window_is_refused_before_anything_is_written(app, window, key, reason):
    with pytest.raises(TriggerKeyWindowError, match=reason) as info:
        ChargeOrder.trigger(1, key=key, key_window=window)
    assert info.value.window == window
    assert repr(window) in str(info.value)
    assert _nothing_written(app)


# --------------------------------------------------------------------------- INV-TRG-2


def test_a_trigger_in_the_callers_transaction_commits_with_it(app):
    with app.engine.connect() as conn, conn.begin():
        conn.execute(orders.insert().values(id=42))
        run = ChargeOrder.trigger(42, connection=conn)
        assert run.status == "in_progress"
        with app.begin(readonly=True) as tx:  # another connection: nothing yet
            assert tx.execute(sa.select(schema.runs.c.id).where(schema.runs.c.id == run.id)).first() is None
    assert _count(app, orders) == 1
    assert _count(app, schema.runs) == 1
    assert _count(app, schema.executions) == 1
    drain(app)
    assert run.refresh().status == "completed"
    assert run.steps()[0].output == 420


def _trigger_then_fail(conn):
    """A caller's transaction that triggers, then fails: the exception rolls it all back."""
    with conn.begin():
        ChargeOrder.trigger(43, key="order-43", connection=conn)
        conn.execute(orders.insert().values(id=1))
        conn.execute(orders.insert().values(id=1))


def test_a_rolled_back_trigger_leaves_nothing(app):
    with app.engine.connect() as conn:
        with conn.begin() as transaction:
            conn.execute(orders.insert().values(id=42))
            ChargeOrder.trigger(42, key="order-42", connection=conn)
            transaction.rollback()
        with pytest.raises(sa.exc.IntegrityError):
            _trigger_then_fail(conn)
    assert _nothing_written(app)
    assert _count(app, orders) == 0
    again = ChargeOrder.trigger(42, key="order-42")  # the key was never taken
    assert _count(app, schema.runs) == 1
    assert again.refresh().status == "in_progress"


def test_a_keyed_trigger_in_the_callers_transaction_returns_the_committed_run(app):
    first = ChargeOrder.trigger(1, key="order-1")
    with app.engine.begin() as conn:
        conn.execute(orders.insert().values(id=1))
        assert ChargeOrder.trigger(1, key="order-1", connection=conn).id == first.id
    assert _count(app, schema.runs) == 1
    assert _count(app, orders) == 1


@needs("notify_channel")
def test_workers_are_notified_at_the_commit_and_not_after_a_rollback(app):
    import psycopg

    from ductwork.db.wakeup import WORKERS

    url = app.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as listener:
        listener.execute(f"LISTEN {WORKERS}")
        with app.engine.connect() as conn:
            with conn.begin() as transaction:
                ChargeOrder.trigger(1, connection=conn)
                transaction.rollback()
            assert list(listener.notifies(timeout=0.2, stop_after=1)) == []  # a rollback sends nothing
            with conn.begin():
                ChargeOrder.trigger(2, connection=conn)
                assert list(listener.notifies(timeout=0.2, stop_after=1)) == []  # not before the commit
        got = wait_for(lambda: list(listener.notifies(timeout=1.0, stop_after=1)), "a NOTIFY at the commit")
        assert got[0].channel == WORKERS


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("key", "reason"), [
    (42, "not a string but int"),
    ("", "empty"),
    ("k" * 256, "256 characters long"),
    (" order-1", "has whitespace around it"),
    ("order-1\n", "has whitespace around it"),
    ("a\x00b", "contains a NUL character"),
], ids=["int", "empty", "too_long", "leading_space", "trailing_newline", "nul"])
def test_a_bad_key_is_refused_before_anything_is_written(app, key, reason):
    with pytest.raises(TriggerKeyError) as info:
        ChargeOrder.trigger(1, key=key)
    assert f": {reason}; a trigger key is a non-empty string of at most 255 characters" in str(info.value)
    assert str(info.value).startswith("ChargeOrder.trigger key=")
    assert _nothing_written(app)


@pytest.mark.usefixtures("app")
def test_the_longest_key_is_accepted():
    key = "k" * 255
    assert ChargeOrder.trigger(1, key=key).id == ChargeOrder.trigger(1, key=key).id


def test_a_connection_that_cannot_be_written_through_is_refused(app):
    from sqlalchemy.orm import Session

    with Session(app.engine) as session, pytest.raises(TriggerConnectionError) as info:
        ChargeOrder.trigger(1, connection=session)
    assert "Session is not a SQLAlchemy Connection (for a Session pass session.connection()" in str(info.value)
    with app.engine.connect() as conn, pytest.raises(TriggerConnectionError) as info:
        ChargeOrder.trigger(1, connection=conn)
    assert str(info.value).startswith("ChargeOrder.trigger(connection=…): the connection has no transaction begun")
    with Session(app.engine) as session, session.begin():  # a Session's connection works
        ChargeOrder.trigger(1, connection=session.connection())
    assert _count(app, schema.runs) == 1


def test_a_connection_to_another_kind_of_database_is_refused():
    """Checked before anything is read or written: the app below has no server at all."""
    app = make_app("postgresql://nobody@127.0.0.1:1/none")
    other = sa.create_engine("sqlite://")
    try:
        with other.begin() as conn, pytest.raises(TriggerConnectionError) as info:
            ChargeOrder.trigger(1, connection=conn, app=app)
        assert "the connection is to sqlite, but the app's database is postgresql (postgresql" in str(info.value)
    finally:
        other.dispose()
        app.dispose()
