"""``ductwork verify``'s environment checks and scratch database, on each database.

The environment checks (``ductwork_proof/environment.py``) all pass on this machine's
databases, each one that does not apply saying why; the scratch database
(``ductwork_proof/scratch.py``) is created beside the given one and is gone afterwards
(kept with ``keep``); a server that refuses ``CREATE DATABASE`` is named with the privilege
and ``--in-place``; in place, a database whose ductwork tables hold rows is refused, naming
them and their counts, unless forced, and what verify created there is removed on exit
while the application's tables and rows stay. The judges are unit-tested with failing
values in ``tests/unit/test_verify_environment_judges.py``.

Checks: none of INVARIANTS.md's (the environment the engine relies on, as ``verify``
reports it to an adopter).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from ductwork.db import engines, migrate, schema
from ductwork_proof.environment import CHECKS, check_environment
from ductwork_proof.scratch import SCRATCH_PREFIX, VerifyError, mask, scratch_database
from ductwork_proof.workload import WITNESS
from tests import databases
from tests.conftest import BACKENDS, migrated

#: the checks that do not apply, per backend (each says why)
NOT_APPLICABLE = {
    "sqlite": {"ENV-SKIP-LOCKED", "ENV-CLOCK", "ENV-PACKET", "ENV-TIMEZONE"},
    "postgresql": {"ENV-PACKET", "ENV-TIMEZONE"},
    "mysql": {"ENV-TIMEZONE"},
}


@pytest.fixture(params=BACKENDS)
def given(request: pytest.FixtureRequest, tmp_path: Path, worker_id: str) -> str:
    """The URL an adopter gives: a SQLite file's, or a test server's own database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/app.sqlite3"
    server = databases.server_for_session(request.param, worker_id)
    if isinstance(server, str):
        databases.skip_or_fail(server)
    return server.url


@contextlib.contextmanager
def _engine(url: str) -> Iterator[sa.Engine]:
    engine = engines.create_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def _exists(given: str, url: str) -> bool:
    """Whether ``url``'s database (a scratch one beside ``given``'s) exists."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return Path(str(parsed.database)).exists()
    with _engine(given) as engine, engine.connect() as conn:
        if parsed.get_backend_name() == "postgresql":
            query = "SELECT count(*) FROM pg_database WHERE datname = :name"
        else:
            query = "SELECT count(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = :name"
        return bool(conn.execute(sa.text(query), {"name": parsed.database}).scalar_one())


def _tables(url: str) -> list[str]:
    with _engine(url) as engine, engine.connect() as conn:
        return sorted(sa.inspect(conn).get_table_names())


def _schema(url: str) -> tuple[str | None, list[str]]:
    """The migrated revision and the ductwork tables missing."""
    with _engine(url) as engine:
        return migrate.current(engine), migrate.missing_tables(engine)


def _routines(url: str) -> list[str]:
    """ductwork's server routines in ``url``'s database (none on SQLite)."""
    with _engine(url) as engine, engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            return []
        if conn.dialect.name == "postgresql":
            query = "SELECT proname FROM pg_proc WHERE proname LIKE 'ductwork%%'"
        else:
            query = ("SELECT ROUTINE_NAME FROM information_schema.ROUTINES "
                     "WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME LIKE 'ductwork%%'")
        return sorted(conn.exec_driver_sql(query).scalars())


def _fill(url: str, processes: int, witnesses: int) -> None:
    """``processes`` rows in ductwork_processes and ``witnesses`` in the witness table
    (created when missing), as a verify run or an application leaves them."""
    now = datetime(2026, 1, 1, 12, 0, 0)
    with _engine(url) as engine, engine.begin() as conn:
        WITNESS.create(conn, checkfirst=True)
        start = conn.execute(sa.select(sa.func.count()).select_from(schema.processes)).scalar_one()
        for n in range(start, start + processes):
            conn.execute(schema.processes.insert().values(
                id=f"p{n}", pid=n, machine_identifier="verify-test", label="worker", role="worker",
                last_heartbeat_at=now, created_at=now, updated_at=now))
        for n in range(witnesses):
            conn.execute(WITNESS.insert().values(step_id=f"s{n}", idempotency_key=f"s{n}", pid=n, started_at=now))


def _count(url: str, table: sa.Table) -> int:
    with _engine(url) as engine, engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_every_environment_check_passes_on_this_machines_database(given: str):
    backend = make_url(given).get_backend_name()
    with scratch_database(given) as url:
        checks, settings, version = check_environment(url)
        assert _tables(url) == []  # the probe table is dropped
    assert [c.id for c in checks] == list(CHECKS)
    assert [(c.id, c.detail) for c in checks if c.passed is False] == []
    assert {c.id for c in checks if c.passed is None} == NOT_APPLICABLE[backend]
    assert all(c.detail for c in checks), checks
    assert all(c.checker == CHECKS[c.id].__name__ for c in checks)
    isolation = {"sqlite": ("journal_mode",), "postgresql": ("transaction_isolation",),
                 "mysql": ("transaction_isolation", "tx_isolation")}[backend]
    assert any(name in settings for name in isolation), settings
    assert version.split()[0] in {"sqlite": {"SQLite"}, "postgresql": {"PostgreSQL"},
                                  "mysql": {"MySQL", "MariaDB"}}[backend], version


def test_a_scratch_database_is_made_beside_the_given_one_and_dropped_on_exit(given: str):
    with scratch_database(given) as url:
        assert url != given
        name = make_url(url).database or ""
        assert _exists(given, url)
        if make_url(given).get_backend_name() == "sqlite":
            directory = Path(name).parent
            assert directory.name.startswith(SCRATCH_PREFIX)
            assert directory.parent == Path(str(make_url(given).database)).parent
        else:
            assert name.startswith(SCRATCH_PREFIX)
        _fill(migrated(url), processes=1, witnesses=1)
        # a session left open in a transaction on the scratch database (a killed fleet's)
        # does not keep it from being dropped
        leftover = engines.create_engine(url)
        open_session = leftover.connect()
        assert open_session.execute(sa.select(sa.func.count()).select_from(schema.processes)).scalar_one() == 1
    assert not _exists(given, url)
    with contextlib.suppress(sa.exc.DBAPIError):  # the server ended it
        open_session.close()
    leftover.dispose()
    if make_url(given).get_backend_name() == "sqlite":
        assert not Path(name).parent.exists()


def test_keep_leaves_the_scratch_database_where_it_is(given: str):
    with scratch_database(given, keep=True) as url:
        migrated(url)
    try:
        assert _exists(given, url)
        assert _schema(url) == (migrate.head(), [])
    finally:
        with scratch_database(url, in_place=True):
            pass  # verify in place on an empty migrated database: nothing more to remove
        _drop_by_hand(given, url)
    assert not _exists(given, url)


def _drop_by_hand(given: str, url: str) -> None:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = Path(str(parsed.database))
        for leftover in path.parent.iterdir():
            leftover.unlink()
        path.parent.rmdir()
        return
    with _engine(given) as engine, engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"DROP DATABASE {conn.dialect.identifier_preparer.quote(str(parsed.database))}")


def test_in_place_refuses_ductwork_tables_with_rows_naming_them_unless_forced(given: str):
    with scratch_database(given) as url:
        _fill(migrated(url), processes=2, witnesses=1)
        with pytest.raises(VerifyError) as refused, scratch_database(url, in_place=True):
            pytest.fail("verify went into a database holding ductwork's rows")
        assert "ductwork_processes (2 rows)" in str(refused.value)
        assert f"{WITNESS.name} (1 row)" in str(refused.value)
        assert "--force" in str(refused.value)
        assert mask(url) in str(refused.value)
        with scratch_database(url, in_place=True, force=True) as same:
            assert same == url
            _fill(url, processes=1, witnesses=0)
        # tables that held rows are left as they are, verify's rows among them
        assert (_count(url, schema.processes), _count(url, WITNESS)) == (3, 1)
        assert _schema(url) == (migrate.head(), [])


def test_in_place_removes_the_tables_and_routines_verify_created_and_keeps_the_applications(given: str):
    application = sa.Table("shop_orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True))
    with scratch_database(given) as url:
        with _engine(url) as engine, engine.begin() as conn:
            application.create(conn)
            conn.execute(application.insert().values(id=7))
        with scratch_database(url, in_place=True) as same:
            _fill(migrated(same), processes=2, witnesses=2)
            assert _routines(same) or make_url(url).get_backend_name() == "sqlite"
        assert _tables(url) == ["shop_orders"]
        assert _routines(url) == []
        assert _count(url, application) == 1


def test_in_place_on_a_migrated_empty_database_keeps_its_schema_and_empties_it(given: str):
    with scratch_database(given) as url:
        migrated(url)
        with scratch_database(url, in_place=True) as same:
            _fill(same, processes=2, witnesses=1)
        assert WITNESS.name not in _tables(url)
        assert _schema(url) == (migrate.head(), [])
        assert _count(url, schema.processes) == 0


def test_in_place_on_a_sqlite_file_that_did_not_exist_removes_the_file(tmp_path: Path):
    path = tmp_path / "new.sqlite3"
    with scratch_database(f"sqlite:///{path}", in_place=True) as url:
        _fill(migrated(url), processes=1, witnesses=1)
        assert path.exists()
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://", "sqlite:///file:verify?mode=memory&uri=true"])
@pytest.mark.parametrize("in_place", [False, True])
def test_an_in_memory_sqlite_database_is_refused_by_name(url: str, in_place: bool):
    refused = pytest.raises(VerifyError, match="in-memory SQLite database: verify runs a fleet of several processes")
    with refused, scratch_database(url, in_place=in_place):
        pytest.fail("verify accepted an in-memory database")


def test_mask_hides_the_password():
    assert mask("postgresql://verify:s3cret@db:5432/shop") == "postgresql://verify:***@db:5432/shop"
    assert mask("mysql://root@db/shop") == "mysql://root@db/shop"


@pytest.mark.parametrize("kind", ["postgresql", "mysql"])
def test_a_server_that_refuses_create_database_names_the_privilege_and_in_place(kind: str, worker_id: str):
    server = databases.server_for_session(kind, worker_id)
    if isinstance(server, str):
        databases.skip_or_fail(server)
    user, password = f"henv_nocreate_{secrets.token_hex(3)}", f"pw{secrets.token_hex(6)}"
    admin = engines.create_engine(server.url)
    given = make_url(server.url)
    create, drop = {
        "postgresql": ([f"CREATE ROLE {user} LOGIN NOCREATEDB PASSWORD '{password}'"], [f"DROP ROLE {user}"]),
        "mysql": ([f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'",
                   f"GRANT SELECT ON `{given.database}`.* TO '{user}'@'%'"], [f"DROP USER '{user}'@'%'"]),
    }[kind]
    try:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for statement in create:
                conn.execute(sa.text(statement))
        limited = given.set(username=user, password=password).render_as_string(hide_password=False)
        with pytest.raises(VerifyError) as refused, scratch_database(limited):
            pytest.fail(f"{user} created a database")
        message = str(refused.value)
        assert {"postgresql": "CREATEDB", "mysql": "CREATE (and DROP)"}[kind] in message
        assert "--in-place" in message
        assert f"{user}:***@" in message
        assert password not in message
    finally:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for statement in drop:
                conn.execute(sa.text(statement))
        admin.dispose()
