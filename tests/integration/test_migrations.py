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

from ductwork.db import dialects, migrate, schema
from tests import databases
from tests.conftest import BACKENDS


def _differences(engine: sa.Engine) -> list:
    """What autogenerate would change to make the database match ``schema.py``."""
    def ours(name, kind, _parents):  # type: ignore[no-untyped-def]
        return not (kind == "table" and name == migrate.VERSION_TABLE)

    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True, "include_name": ours})
        return compare_metadata(context, schema.metadata)


def test_the_migrated_database_matches_schema_py(db_url):
    engine = dialects.create_engine(db_url)
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
    engine = dialects.create_engine(url)
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
