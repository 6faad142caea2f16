"""The provisioning seam (tests/databases.py): env URLs, containers, faults.

- URL path: runs against DUCTWORK_TEST_POSTGRES_URL / DUCTWORK_TEST_MYSQL_URL
  when set (in a database of its own, dropped afterwards), else skips saying so.
- Container path (``-m containers``): starts one container per kind for this
  module, else skips with the reason (no Docker engine, no image, ...).
- Container faults: pause/unpause (a frozen server with open connections),
  kill/start (a crash; committed data survives), restart.
"""

from __future__ import annotations

import concurrent.futures
import os
import time

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from tests import databases

KINDS = ["postgresql", "mysql"]


# ---------------------------------------------------------------- the seam --


def test_kind_names_and_aliases() -> None:
    assert databases.KINDS == ("postgresql", "mysql")
    for alias, kind in [("postgres", "postgresql"), ("mariadb", "mysql"), ("PostgreSQL", "postgresql")]:
        assert databases._kind(alias).kind == kind
    with pytest.raises(ValueError, match="unknown database kind"):
        databases.provide("oracle")


@pytest.mark.parametrize(
    ("kind", "var", "given", "expected"),
    [
        ("postgresql", "DUCTWORK_TEST_POSTGRES_URL", "postgresql://u:p@h:5/db", "postgresql+psycopg://u:p@h:5/db"),
        ("postgresql", "DUCTWORK_TEST_POSTGRES_URL", "postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
        ("mysql", "DUCTWORK_TEST_MYSQL_URL", "mysql://root@h:3306/test", "mysql+pymysql://root@h:3306/test"),
        ("mysql", "DUCTWORK_TEST_MYSQL_URL", "mariadb://root@h/test", "mysql+pymysql://root@h/test"),
    ],
)
def test_env_url_comes_first_and_is_not_a_container(
    monkeypatch: pytest.MonkeyPatch, kind: str, var: str, given: str, expected: str
) -> None:
    monkeypatch.setenv(var, given)
    server = databases.provide(kind)
    assert isinstance(server, databases.Server)
    assert server.url == expected
    assert server.kind == kind
    assert server.container is None
    assert server.status == "external"
    for fault in (server.kill, server.start, server.restart, server.pause, server.unpause):
        with pytest.raises(databases.NotAContainerError, match="not a container"):
            fault()
    server.stop()  # a no-op for a server this process does not own


def test_no_url_and_no_engine_gives_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("DUCTWORK_TEST_POSTGRES_URL", raising=False)
    dead = f"unix://{tmp_path}/no-docker.sock"
    monkeypatch.setenv("DOCKER_HOST", dead)
    reason = databases.provide("postgresql")
    assert isinstance(reason, str)
    assert "DUCTWORK_TEST_POSTGRES_URL is not set" in reason
    assert f"DOCKER_HOST={dead}" in reason
    assert ".ci/containers" in reason


def test_require_container_ignores_the_env_url(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("DUCTWORK_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    reason = databases.provide("mysql", require_container=True)
    assert isinstance(reason, str)
    assert reason.startswith("a container was required, and no Docker engine answers")


def test_database_names() -> None:
    assert databases.database_name("gw0") == "ductwork_test_gw0"
    assert databases.database_name("master") == "ductwork_test_master"
    unique = databases.database_name("gw1", unique=True)
    assert unique.startswith("ductwork_test_gw1_")
    assert len(unique) <= 63
    server = databases.Server("postgresql+psycopg://u@h/ductwork_test_gw0", "postgresql")
    with pytest.raises(ValueError, match="must match"):
        databases.fresh_database(server, "Robert'); DROP TABLE students;--")
    with pytest.raises(ValueError, match="own database"):
        databases.fresh_database(server, "ductwork_test_gw0")


def test_skip_or_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DUCTWORK_REQUIRE_CONTAINERS", raising=False)
    monkeypatch.delenv("DUCTWORK_REQUIRE_PID_NAMESPACES", raising=False)  # .ci/run sets it
    with pytest.raises(pytest.skip.Exception, match="no engine"):
        databases.skip_or_fail("no engine")
    monkeypatch.setenv("DUCTWORK_REQUIRE_CONTAINERS", "1")
    with pytest.raises(pytest.fail.Exception, match="DUCTWORK_REQUIRE_CONTAINERS is set, but: no engine"):
        databases.skip_or_fail("no engine")
    with pytest.raises(pytest.skip.Exception, match="no unshare"):  # another variable: not required
        databases.skip_or_fail("no unshare", "DUCTWORK_REQUIRE_PID_NAMESPACES")
    monkeypatch.setenv("DUCTWORK_REQUIRE_PID_NAMESPACES", "1")
    with pytest.raises(pytest.fail.Exception, match="DUCTWORK_REQUIRE_PID_NAMESPACES is set, but: no unshare"):
        databases.skip_or_fail("no unshare", "DUCTWORK_REQUIRE_PID_NAMESPACES")


# ----------------------------------------------------------------- URL path --


def _roundtrip(url: str, kind: str) -> None:
    """Create a table, write and read a row in the database at ``url``."""
    engine = sa.create_engine(url, connect_args=databases._connect_args(kind, 10))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE probe (id INTEGER PRIMARY KEY, note VARCHAR(20))"))
            conn.execute(sa.text("INSERT INTO probe VALUES (1, 'here')"))
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT note FROM probe WHERE id = 1")).scalar_one() == "here"
    finally:
        engine.dispose()


@pytest.mark.parametrize("kind", KINDS)
def test_env_url_server(kind: str) -> None:
    var = databases._kind(kind).url_env
    if not os.environ.get(var):
        pytest.skip(f"{var} is not set")
    server = databases.provide(kind)
    assert isinstance(server, databases.Server)
    assert server.container is None
    assert server.wait_ready(10) < 10
    # A database of this test's own (unique per run): the server is shared.
    name = databases.database_name(unique=True, prefix="ductwork_seam")
    url = databases.fresh_database(server, name)
    try:
        assert make_url(url).database == name
        _roundtrip(url, kind)
        # fresh_database drops what was there: the table is gone.
        url = databases.fresh_database(server, name)
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                assert "probe" not in sa.inspect(conn).get_table_names()
        finally:
            engine.dispose()
    finally:
        databases.drop_database(server, name)


# ----------------------------------------------------------- container path --


@pytest.fixture(scope="module", params=KINDS)
def container_server(request: pytest.FixtureRequest):
    with databases.dedicated_server(request.param, label="seam") as server:
        if isinstance(server, str):
            databases.skip_or_fail(server)  # fails instead under DUCTWORK_REQUIRE_CONTAINERS=1
        yield server


@pytest.fixture
def running(container_server: databases.Server):
    """The module's container, running and answering before and after each test."""
    _recover(container_server)
    yield container_server
    _recover(container_server)


def _recover(server: databases.Server) -> None:
    status = server.status
    if status == "paused":
        server.unpause()
    elif status != "running":
        server.start()
    server.wait_ready(60)


@pytest.mark.containers
def test_container_server_answers(running: databases.Server) -> None:
    server = running
    assert server.container is not None
    assert server.owned
    assert server.url.startswith({"postgresql": "postgresql+psycopg://", "mysql": "mysql+pymysql://"}[server.kind])
    assert make_url(server.url).host == "127.0.0.1" or not databases._is_local_engine()
    assert server.startup_s is not None
    assert server.startup_s < 60
    url = databases.fresh_database(server, "ductwork_test_container")
    _roundtrip(url, server.kind)


@pytest.mark.containers
def test_pause_freezes_open_connections_and_unpause_thaws_them(running: databases.Server) -> None:
    server = running
    engine = server.engine(timeout_s=30, pool_size=1, max_overflow=0)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
            server.pause()
            try:
                assert server.status == "paused"
                # A query on the open connection hangs while the server is frozen.
                pending = pool.submit(lambda: conn.execute(sa.text("SELECT 2")).scalar_one())
                with pytest.raises(concurrent.futures.TimeoutError):
                    pending.result(timeout=1.0)
                # A new connection with a short timeout fails.
                t0 = time.monotonic()
                assert not server.answers(timeout_s=2)
                assert time.monotonic() - t0 < 10
            finally:
                server.unpause()
            # Thawed: the query that was in flight completes on the same connection.
            assert pending.result(timeout=30) == 2
            assert conn.execute(sa.text("SELECT 3")).scalar_one() == 3
        assert server.wait_ready(10) < 10
    finally:
        pool.shutdown(wait=True)
        engine.dispose()


@pytest.mark.containers
def test_kill_then_start_keeps_url_and_committed_data(running: databases.Server) -> None:
    server = running
    url_before = server.url
    db_url = databases.fresh_database(server, "ductwork_test_crash")
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool, connect_args=server.connect_args(5))
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE ledger (id INTEGER PRIMARY KEY)"))
            conn.execute(sa.text("INSERT INTO ledger VALUES (1), (2), (3)"))
        server.kill()
        assert server.status == "exited"
        assert not server.answers(timeout_s=2)
        with pytest.raises(TimeoutError, match="did not answer"):
            server.wait_ready(0.5)
        server.start()
        took = server.wait_ready(60)
        assert server.url == url_before  # same host port: a fleet reconnects to the same address
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT COUNT(*) FROM ledger")).scalar_one() == 3
        assert took < 60
    finally:
        engine.dispose()


@pytest.mark.containers
def test_restart_drops_connections_and_comes_back(running: databases.Server) -> None:
    server = running
    engine = server.engine(timeout_s=5, pool_pre_ping=False, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
            server.restart(timeout_s=10)
            assert server.status == "running"
            with pytest.raises(sa.exc.DBAPIError):  # the server closed it
                conn.execute(sa.text("SELECT 1"))
        assert server.wait_ready(60) < 60
        with engine.connect() as conn:  # the pool replaces the dead connection
            assert conn.execute(sa.text("SELECT 4")).scalar_one() == 4
    finally:
        engine.dispose()


@pytest.mark.containers
def test_server_for_session_is_cached_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # An empty cache of our own: another test in this process may already have
    # provided the session's server (named after the real worker, not gw9).
    monkeypatch.setattr(databases, "_SESSION", {})
    first = databases.server_for_session("postgresql", "gw9", require_container=True)
    if isinstance(first, str):
        databases.skip_or_fail(first)
    try:
        assert databases.server_for_session("postgres", "gw9", require_container=True) is first
        assert first.container_name is not None
        assert "-gw9-" in first.container_name
        url = databases.fresh_database(first, databases.database_name("gw9"))
        assert make_url(url).database == "ductwork_test_gw9"
    finally:
        first.stop()
