"""The migrations create exactly ``schema.py``'s tables, on every database.

``schema.py`` is what the engine's statements are built from and the migrations are
what ``ductwork db upgrade`` applies; a column type that differs between the two
(MySQL's 64 KB ``TEXT`` where ``schema.py`` says ``LONGTEXT``) only shows as a
``DataError`` on a large value, long after the upgrade.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from ductwork.db import engines, migrate, schema
from ductwork.db.ids import new_id
from tests import databases
from tests.conftest import BACKENDS


def _schema_on(dialect: str) -> sa.MetaData:
    """``schema.py``'s tables as ``dialect`` creates them: an object declared with
    ``ddl_if(dialect=…)`` for other dialects left out (autogenerate does not read ddl_if;
    revision 0006's partial unique indexes are PostgreSQL's, the constraints the others')."""
    def elsewhere(obj: object) -> bool:
        wanted = getattr(getattr(obj, "_ddl_if", None), "dialect", None)
        return wanted is not None and dialect not in ((wanted,) if isinstance(wanted, str) else wanted)

    def identity(table: sa.Table, obj: sa.Index | sa.Constraint) -> tuple[str, ...]:
        # (by columns too: an index may have one form per dialect under one name)
        return (table.name, type(obj).__name__, str(obj.name), *(c.name for c in obj.columns))

    left_out = {identity(t, o) for t in schema.metadata.sorted_tables
                for o in [*t.indexes, *t.constraints] if elsewhere(o)}
    copied = sa.MetaData()
    for table in schema.metadata.sorted_tables:
        copy = table.to_metadata(copied)
        for index in [i for i in copy.indexes if identity(table, i) in left_out]:
            copy.indexes.discard(index)
        for constraint in [c for c in copy.constraints if identity(table, c) in left_out]:
            copy.constraints.discard(constraint)
    return copied


def _differences(engine: sa.Engine) -> list:
    """What autogenerate would change to make the database match ``schema.py``."""
    def ours(name, kind, _parents):  # type: ignore[no-untyped-def]
        return not (kind == "table" and name == migrate.VERSION_TABLE)

    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": ours})
        return compare_metadata(context, _schema_on(engine.dialect.name))


def test_the_migrated_database_matches_schema_py(db_url):
    engine = engines.create_engine(db_url)
    try:
        assert migrate.current(engine) == migrate.head()
        assert _differences(engine) == []
    finally:
        engine.dispose()


@pytest.fixture(params=BACKENDS)
def empty_engine(request, tmp_path, worker_id):  # type: ignore[no-untyped-def]
    """An engine on an empty database of each backend (nothing migrated yet)."""
    import os

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/empty.sqlite3"
    else:
        server = databases.server_for_session(request.param, worker_id)
        if isinstance(server, str):
            databases.skip_or_fail(server)
        prefix = os.environ.get("DUCTWORK_TEST_DB_PREFIX", "ductwork_test")
        url = databases.fresh_database(server, databases.database_name(worker_id, prefix=prefix + "_mig"))
    engine = engines.create_engine(url)
    yield engine
    engine.dispose()


def test_upgrading_from_0001_keeps_rows_and_stores_values_above_64_kb(empty_engine):
    migrate.upgrade(empty_engine, "0001")
    big = '"' + "x" * 70_000 + '"'  # more than MySQL's TEXT holds (65,535 bytes)
    row = {"created_at": sa.func.current_timestamp(), "updated_at": sa.func.current_timestamp()}
    with empty_engine.begin() as conn:
        conn.execute(schema.runs.insert().values(
            id="r1", pipeline_klass="p", definition="{}", definition_sha1="0" * 40, status="completed",
            triggered_at=sa.func.current_timestamp(), **row))
        conn.execute(schema.context.insert().values(
            id="c1", run_id="r1", key="k", value='{"raw_value": 1}', first_set_at=sa.func.current_timestamp(),
            last_set_at=sa.func.current_timestamp()))
    migrate.upgrade(empty_engine)
    assert migrate.current(empty_engine) == migrate.head()
    assert _differences(empty_engine) == []
    with empty_engine.connect() as conn:  # 0003: a run from before revives existed was triggered
        assert conn.execute(sa.select(schema.runs.c.revived_from)).scalar_one() is None
    with empty_engine.begin() as conn:
        conn.execute(schema.context.insert().values(
            id="c2", run_id="r1", key="big", value=big, first_set_at=sa.func.current_timestamp(),
            last_set_at=sa.func.current_timestamp()))
        values = dict(conn.execute(sa.select(schema.context.c.key, schema.context.c.value)).all())
    assert values == {"k": '{"raw_value": 1}', "big": big}


def test_downgrading_to_base_drops_every_table_and_upgrading_again_matches_schema_py(empty_engine):
    """``migrate.downgrade`` runs each revision's ``downgrade`` in turn: base leaves none of
    ductwork's tables, one revision down leaves the database at the one before head, and a
    second upgrade restores exactly ``schema.py``'s tables."""
    migrate.upgrade(empty_engine)
    migrate.downgrade(empty_engine)
    assert migrate.current(empty_engine) is None
    assert migrate.missing_tables(empty_engine) == sorted(schema.metadata.tables)
    migrate.upgrade(empty_engine)
    migrate.downgrade(empty_engine, "-1")
    assert migrate.current(empty_engine) not in (None, migrate.head())
    migrate.upgrade(empty_engine)
    assert migrate.current(empty_engine) == migrate.head()
    assert _differences(empty_engine) == []


#: revision 0006: on PostgreSQL, indexes on mostly-NULL columns hold only non-NULL rows
PARTIAL_ON_POSTGRESQL = {
    "ix_execution_pending_lane": ("ductwork_executions", "pending_lane"),
    "ix_execution_inflight_key": ("ductwork_executions", "inflight_key"),
    "ix_branch_barrier": ("ductwork_branches", "barrier_id"),
    "uq_run_revived_from": ("ductwork_runs", "revived_from"),
    "uq_run_trigger_key": ("ductwork_runs", "trigger_key"),
    "uq_execution_open_per_job": ("ductwork_executions", "open_job_id"),
    "uq_advancement_open_per_branch": ("ductwork_advancements", "open_branch_id"),
    "uq_branch_child_index": ("ductwork_branches", "parent_id"),
    "uq_branch_merge_per_barrier": ("ductwork_branches", "merged_barrier_id"),
}


def test_revision_0006_partial_indexes_serve_look_ups_and_updated_tables_keep_room(empty_engine):
    """autogenerate compares neither an index's predicate nor a table's storage parameters,
    so this reads them: after the upgrade each of these indexes is ``WHERE col IS NOT NULL``
    on PostgreSQL (and a look-up by value is planned on it), a full index elsewhere, and the
    tables updated in place have ``fillfactor=80``; one revision down undoes both. (Up to
    0006 only: revision 0011 renames ``uq_execution_open_per_job`` and drops ``ductwork_jobs``.)"""
    migrate.upgrade(empty_engine, "0006")
    with empty_engine.connect() as conn:
        if empty_engine.dialect.name != "postgresql":
            inspector = sa.inspect(conn)
            names = {i["name"] for t in {t for t, _ in PARTIAL_ON_POSTGRESQL.values()}
                     for i in [*inspector.get_indexes(t), *inspector.get_unique_constraints(t)]}
            assert set(PARTIAL_ON_POSTGRESQL) <= names
            return
        defs = dict(conn.execute(sa.text("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = "
                                         "current_schema()")).all())
        for name, (table, column) in PARTIAL_ON_POSTGRESQL.items():
            assert defs[name].endswith(f"WHERE ({column} IS NOT NULL)"), defs[name]
            conn.exec_driver_sql("SET enable_seqscan = off")  # empty tables: else any plan is a scan
            plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN SELECT 1 FROM {table} WHERE {column} = 'x'").scalars())
            assert f"using {name} on {table}" in plan, plan
        assert _fillfactors(conn) == {table: ["fillfactor=80"] for table in UPDATED_IN_PLACE}
    migrate.downgrade(empty_engine, "0005")
    with empty_engine.connect() as conn:
        defs = dict(conn.execute(sa.text("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = "
                                         "current_schema()")).all())
        assert _fillfactors(conn) == dict.fromkeys(UPDATED_IN_PLACE, None)
    assert all("WHERE" not in defs[name] for name in PARTIAL_ON_POSTGRESQL)


#: revision 0006: tables whose rows are updated soon after their insert keep room for it
UPDATED_IN_PLACE = ("ductwork_branches", "ductwork_executions", "ductwork_jobs", "ductwork_runs", "ductwork_steps")


def _fillfactors(conn: sa.Connection) -> dict[str, list[str] | None]:
    return dict(conn.exec_driver_sql(
        "SELECT relname, reloptions FROM pg_class WHERE relkind = 'r' AND relname IN ("
        + ", ".join(f"'{t}'" for t in UPDATED_IN_PLACE) + ") ORDER BY relname").all())


def test_revision_0007_gives_each_spelling_of_a_shared_key_its_own_header_row(empty_engine):
    """MySQL/MariaDB: a key spelled two ways shared one header row before 0007 (the default
    collation made them equal). The upgrade gives the other spelling a row of its own, with
    the shared row's sequence number (its later claims and releases stay after the ones it
    took there) and no config digest (its next claim applies its own config); names are
    compared exactly from then on. On PostgreSQL and SQLite, which compared exactly all
    along, 0007 changes nothing."""
    migrate.upgrade(empty_engine, "0006")
    now = sa.func.current_timestamp()
    mysql = empty_engine.dialect.name in ("mysql", "mariadb")
    with empty_engine.begin() as conn:
        conn.execute(schema.limit_keys.insert().values(key="api", seq=7, config_digest="0" * 16, created_at=now,
                                                       updated_at=now))
        if mysql:  # an execution of the other spelling, alone (its job and step left out)
            conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS = 0")
            conn.exec_driver_sql(  # (0006's columns: schema.py's executions name a step since 0011)
                "INSERT INTO ductwork_executions (id, job_id, limit_key, eligible_at, retry_count, crash_count, "
                "created_at, updated_at) VALUES ('e1', 'j1', 'API', NOW(6), 0, 0, NOW(6), NOW(6))")
            conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS = 1")
    migrate.upgrade(empty_engine, "0007")  # its own revision: 0011 fills executions.step_id from their jobs
    k = schema.limit_keys
    with empty_engine.connect() as conn:
        rows = sorted(tuple(r) for r in conn.execute(sa.select(k.c.key, k.c.seq, k.c.config_digest)))
        exact = conn.execute(sa.select(k.c.key).where(k.c.key == "API")).scalars().all()
    if mysql:
        assert rows == [("API", 7, None), ("api", 7, "0" * 16)]
        assert exact == ["API"]  # compared exactly: 'api' no longer matches
    else:
        assert rows == [("api", 7, "0" * 16)]
        assert exact == []


#: revision 0010's rows of a one-step run whose step succeeded and expanded, and a retry
#: pending: what 0011 folds (timestamps are filled in)
_BEFORE_0011 = {
    "ductwork_runs": "(id, pipeline_klass, definition, definition_sha1, status, triggered_at, created_at, updated_at)"
                     " VALUES ('r1', 'p', '{{}}', 'x', 'in_progress', {now}, {now}, {now})",
    "ductwork_branches": "(id, run_id, status, fanin_arrivals, last_advanced_at, started_at, created_at, updated_at)"
                         " VALUES ('b1', 'r1', 'in_progress', 0, {now}, {now}, {now}, {now})",
    "ductwork_steps": "(id, run_id, branch_id, node, klass, to_transition, status, started_at, created_at, updated_at)"
                      " VALUES ('s1', 'r1', 'b1', 'A#0', 'k', 'start', 'advancing', {now}, {now}, {now})",
    "ductwork_jobs": "(id, step_id, klass, input_args, output_payload, started_at, completed_at, created_at, "
                     "updated_at) VALUES ('j1', 's1', 'k', '[1]', '{{\"expand_items\": 1}}', {now}, {now}, {now}, "
                     "{now})",
    "ductwork_executions": "(id, job_id, eligible_at, claimed_at, completed_at, outcome, retry_count, crash_count, "
                           "created_at, updated_at) VALUES ('e1', 'j1', {now}, {now}, {now}, 'success', 0, 0, {now}, "
                           "{now}), ('e2', 'j1', {now}, NULL, NULL, NULL, 1, 0, {now}, {now})",
    "ductwork_expand_items": "(job_id, item_index, value) VALUES ('j1', 0, '5')",
}


def test_revision_0011_folds_each_job_into_its_step_and_back(empty_engine):
    """A database with rows at 0010 upgraded through 0011: the step holds its job's input
    and output, its executions and expand items name it, ``ductwork_jobs`` is gone, and
    the schema is ``schema.py``'s (on PostgreSQL ``uq_execution_open_per_step`` is a
    partial unique index, as 0006 made the one it replaces, and the tables updated in
    place keep their room). The downgrade gives each step its job back (the job's id is
    the step's, its completion its successful execution's)."""
    migrate.upgrade(empty_engine, "0010")
    now = "CURRENT_TIMESTAMP"
    with empty_engine.begin() as conn:
        for table, values in _BEFORE_0011.items():
            conn.exec_driver_sql(f"INSERT INTO {table} " + values.format(now=now))
    migrate.upgrade(empty_engine, "0011")
    with empty_engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT id, input_args, output_payload FROM ductwork_steps").all() == [
            ("s1", "[1]", '{"expand_items": 1}')]
        assert conn.exec_driver_sql("SELECT id, step_id, open_step_id FROM ductwork_executions ORDER BY id").all() \
            == [("e1", "s1", None), ("e2", "s1", "s1")]
        assert conn.exec_driver_sql("SELECT step_id, item_index, value FROM ductwork_expand_items").all() == [
            ("s1", 0, "5")]
        assert "ductwork_jobs" not in sa.inspect(conn).get_table_names()
    migrate.upgrade(empty_engine)
    assert _differences(empty_engine) == []
    if empty_engine.dialect.name == "postgresql":
        with empty_engine.connect() as conn:
            defs = dict(conn.execute(sa.text("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = "
                                             "current_schema()")).all())
            assert defs["uq_execution_open_per_step"].endswith("WHERE (open_step_id IS NOT NULL)")
            kept = [t for t in UPDATED_IN_PLACE if t != "ductwork_jobs"]
            assert _fillfactors(conn) == {t: ["fillfactor=80"] for t in kept}
    migrate.downgrade(empty_engine, "0010")
    with empty_engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT id, step_id, klass, input_args, output_payload, completed_at IS NOT NULL "
                                    "FROM ductwork_jobs").all() == [("s1", "s1", "k", "[1]", '{"expand_items": 1}', 1)]
        assert conn.exec_driver_sql("SELECT id, job_id, open_job_id FROM ductwork_executions ORDER BY id").all() == [
            ("e1", "s1", None), ("e2", "s1", "s1")]
        assert conn.exec_driver_sql("SELECT job_id, item_index, value FROM ductwork_expand_items").all() == [
            ("s1", 0, "5")]
        assert {c["name"] for c in sa.inspect(conn).get_columns("ductwork_steps")}.isdisjoint(
            {"input_args", "output_payload"})
    migrate.upgrade(empty_engine)
    assert _differences(empty_engine) == []


def test_revision_0015_widens_a_refusals_reason_to_hold_family_concurrency_and_back(empty_engine):
    """At 0014 a refusal's reason holds 16 characters (PostgreSQL and MySQL-family refuse
    ``family_concurrency``, 18; SQLite does not check); 0015 widens it to 32, keeping the
    counts there; the downgrade deletes the counts whose reason does not fit 16 and keeps
    the others."""
    refusals = sa.table("ductwork_key_refusals", sa.column("key"), sa.column("reason"), sa.column("refusals"))
    rows = sa.select(refusals.c.reason, refusals.c.refusals).order_by(refusals.c.reason)
    migrate.upgrade(empty_engine, "0014")
    with empty_engine.begin() as conn:
        conn.execute(refusals.insert().values(key="k", reason="rate", refusals=3))
    if empty_engine.dialect.name != "sqlite":
        with pytest.raises(sa.exc.DBAPIError), empty_engine.begin() as conn:
            conn.execute(refusals.insert().values(key="k", reason="family_concurrency", refusals=3))
    migrate.upgrade(empty_engine, "0015")
    with empty_engine.begin() as conn:
        conn.execute(refusals.insert().values(key="k", reason="family_concurrency", refusals=3))
    assert _differences(empty_engine) == []
    with empty_engine.connect() as conn:
        assert conn.execute(rows).all() == [("family_concurrency", 3), ("rate", 3)]
    migrate.downgrade(empty_engine, "0014")
    with empty_engine.connect() as conn:
        assert conn.execute(rows).all() == [("rate", 3)]


def test_revision_0016_tells_process_labels_apart_by_case_and_trailing_spaces_and_back(empty_engine):
    """At 0015 MySQL-family compares ``ductwork_processes.label`` by the table's default
    collation (case-insensitive, PAD SPACE): a look-up of ``Worker `` finds ``worker``, and
    ``uq_process_host_pid_label`` refuses ``Worker`` beside it in one OS process. 0016 gives
    the column the binary NO PAD collation: the three labels are three rows, each found by
    its own spelling only, as on PostgreSQL and SQLite all along. A downgrade is refused
    while they would collide again, before anything is altered, and goes once they are gone."""
    p = schema.processes
    mysql = empty_engine.dialect.name in ("mysql", "mariadb")
    now = sa.func.current_timestamp()

    def add(label: str) -> None:
        with empty_engine.begin() as conn:
            conn.execute(p.insert().values(id=new_id(), pid=1, machine_identifier="m", label=label,
                                           role="job_worker", last_heartbeat_at=now, created_at=now, updated_at=now))

    def found(label: str) -> list[str]:
        with empty_engine.connect() as conn:
            return conn.execute(sa.select(p.c.label).where(p.c.label == label)).scalars().all()

    migrate.upgrade(empty_engine, "0015")
    add("worker")
    assert found("Worker ") == (["worker"] if mysql else [])
    if mysql:
        with pytest.raises(sa.exc.IntegrityError):
            add("Worker")
    migrate.upgrade(empty_engine, "0016")
    assert _differences(empty_engine) == []
    add("Worker")
    add("worker ")
    assert [found(label) for label in ("worker", "Worker", "worker ", "WORKER")] == [
        ["worker"], ["Worker"], ["worker "], []]
    if mysql:
        with pytest.raises(RuntimeError, match=r"cannot downgrade below 0016: .*pid 1: "):
            migrate.downgrade(empty_engine, "0015")
        assert migrate.current(empty_engine) == "0016"
        with empty_engine.begin() as conn:
            conn.execute(p.delete().where(p.c.label != "worker"))
    migrate.downgrade(empty_engine, "0015")
    assert found("worker") == ["worker"]
    migrate.upgrade(empty_engine)
    assert _differences(empty_engine) == []
