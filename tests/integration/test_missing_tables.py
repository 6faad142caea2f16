"""A database without ductwork's tables, of each backend: every entry point (trigger,
a run handle's refresh, wait and resume, drain, a worker, an advancer, a runner
process, ``ductwork check``, ``status`` and ``start``) raises MissingTablesError naming
the database (password masked) and ``ductwork db upgrade``, never the driver's "no such
table"; and ``ductwork db upgrade`` then makes the same App usable.

Checks: none (the error boundary of an unmigrated database).
"""

from __future__ import annotations

import os
import sqlite3

import pytest
from sqlalchemy.engine import make_url

from ductwork.cli import main
from ductwork.db import migrate
from ductwork.errors import MissingTablesError
from ductwork.fleet.supervisor import Runner
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer
from ductwork.testing import drain
from tests.conftest import BACKENDS, make_app
from tests.workloads import Unkeyed


@pytest.fixture(params=BACKENDS)
def empty_url(request, tmp_path, worker_id):
    """An existing database of each backend with no tables in it."""
    if request.param == "sqlite":
        path = tmp_path / "empty.sqlite3"
        sqlite3.connect(path).close()
        yield f"sqlite:///{path}"
        return
    from tests import databases

    server = databases.server_for_session(request.param, worker_id)
    if isinstance(server, str):
        databases.skip_or_fail(server)
    prefix = os.environ.get("DUCTWORK_TEST_DB_PREFIX", "ductwork_test")
    name = databases.database_name(worker_id, prefix=prefix) + "_empty"
    url = databases.fresh_database(server, name)
    yield url
    databases.drop_database(server, name)


def _names_the_database(error: MissingTablesError, url: str) -> None:
    shown = make_url(url)
    assert str(error).startswith("no ductwork tables in ")
    assert str(error).endswith(" (run `ductwork db upgrade` to create them)")
    assert f"{shown.host or ''}" in str(error)
    assert str(shown.database) in str(error)
    if shown.password:
        assert shown.password not in str(error)


def test_every_entry_point_raises_missing_tables_naming_the_database(empty_url):
    app = make_app(empty_url)
    try:
        entry_points = {
            "trigger": lambda: Unkeyed.trigger(1, app=app),
            "refresh": lambda: app.run("r1").refresh(),
            "wait": lambda: app.run("r1").wait(timeout=5),
            "resume": lambda: app.run("r1").resume(),
            "drain": lambda: drain(app, timeout=5),
            "worker": lambda: Worker(app, process_id="p1").run_once(),
            "advancer": lambda: Advancer(app, process_id="p1").run_once(),
            "runner": lambda: Runner(app, "job_worker", 1, "test").run(),
            "now": app.now,
        }
        for name, call in entry_points.items():
            with pytest.raises(MissingTablesError) as info:
                call()
            _names_the_database(info.value, empty_url)
            assert info.value.tables == sorted(migrate.schema.metadata.tables), name
        migrate.upgrade(app.engine)  # the check passes once the tables exist
        assert Unkeyed.trigger(1, app=app).status == "in_progress"
    finally:
        app.dispose()


@pytest.mark.parametrize("command", [["check"], ["status"], ["start"]])
def test_commands_raise_missing_tables_naming_the_database(empty_url, command, capsys):
    code = main([*command, "--database-url", empty_url, "-c", "/dev/null"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"ductwork {command[0]}: MissingTablesError: no ductwork tables in "), err
    assert err.count("\n") == 1
