"""A pytest plugin for testing your own pipelines: a fresh database per test, and drain.

    def test_sync(ductwork_app, ductwork_drain):
        run = SyncOrders.trigger("2026-01-01")
        ductwork_drain(skip_delays=True)
        assert run.refresh().status == "completed"

Installing ductwork registers this plugin with pytest (the ``pytest11`` entry point
named ``ductwork.pytest_plugin``, the module's own name, so that a conftest's
``pytest_plugins = ["ductwork.pytest_plugin"]`` finds it loaded and does not load it
twice). ``-p no:ductwork.pytest_plugin`` turns it off. Every fixture and option it adds
starts with ``ductwork``, so it does not collide with a project's own ``app`` or
``db_url`` fixtures; nothing happens in a test that does not ask for one.

Fixtures:

- ``ductwork_database_url``: the database of this test, migrated and empty. By default
  a new SQLite file under the test's ``tmp_path`` (copied from one migrated once per
  session). With ``--ductwork-database-url URL`` (or ``DUCTWORK_TEST_DATABASE_URL``) the
  tests share that PostgreSQL or MySQL database: it is migrated once per session and
  every ductwork table is emptied before each test. Never point it at a database whose
  rows you want to keep.
- ``ductwork_config``: what ``ductwork.connect`` gets as ``config`` (default None:
  ``./ductwork.yml`` if present, else defaults). Override it in your conftest to return a
  mapping, a path or a ``Config``.
- ``ductwork_app``: an App on that database with that config, made the default app (so
  ``Pipeline.trigger`` uses it), on an :class:`~ductwork.db.clock.OffsetClock` so that
  ``drain(skip_delays=True)`` can skip back-offs. Disposed after the test.
- ``ductwork_drain``: ``ductwork.testing.drain`` bound to ``ductwork_app``:
  ``ductwork_drain(timeout=30, skip_delays=False)``.

Not done: starting database servers, or running a fleet (``drain`` does the work in the
test's thread; use ``ductwork start`` in a separate process to test a real fleet).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import pytest

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ductwork.app import App
    from ductwork.config import Config

ENV_URL = "DUCTWORK_TEST_DATABASE_URL"


class Drain(Protocol):
    """``ductwork_drain``: :func:`ductwork.testing.drain` with the app bound."""

    def __call__(self, timeout: float = 30.0, *, skip_delays: bool = False) -> None: ...


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ductwork", "ductwork: testing your pipelines")
    group.addoption("--ductwork-database-url", default=None, metavar="URL",
                    help=f"the PostgreSQL or MySQL database the ductwork_* fixtures use, emptied before "
                         f"each test (default: ${ENV_URL}, else a fresh SQLite file per test)")


def _on_database(url: str, action: Callable[[Engine], None]) -> None:
    """``action(engine)`` with an engine of its own, disposed of after."""
    from ductwork.db import engines

    engine = engines.create_engine(url)
    try:
        action(engine)
    finally:
        engine.dispose()


def _migrate(engine: Engine) -> None:
    from ductwork.db import migrate

    migrate.upgrade(engine)


def _empty_tables(engine: Engine) -> None:
    """Delete every ductwork row, children first."""
    from ductwork.db import dialects, schema

    with engine.begin() as conn:
        dialects.delete_all_rows(conn, list(reversed(schema.metadata.sorted_tables)))


@pytest.fixture(scope="session")
def _ductwork_session_database(request: pytest.FixtureRequest,
                               tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bool]:
    """(url, shared): the server database given, migrated once; else a migrated SQLite
    file that each test gets a copy of."""
    url = request.config.getoption("ductwork_database_url") or os.environ.get(ENV_URL)
    if url:
        _on_database(url, _migrate)
        return url, True
    template = tmp_path_factory.mktemp("ductwork") / "template.sqlite3"
    _on_database(f"sqlite:///{template}", _migrate)
    return str(template), False


@pytest.fixture
def ductwork_database_url(_ductwork_session_database: tuple[str, bool], tmp_path: os.PathLike[str]) -> str:
    """A migrated ductwork database with no rows, for this test only."""
    target, shared = _ductwork_session_database
    if shared:
        _on_database(target, _empty_tables)
        return target
    path = os.path.join(tmp_path, "ductwork.sqlite3")
    shutil.copyfile(target, path)
    return f"sqlite:///{path}"


@pytest.fixture
def ductwork_config() -> Config | dict[str, object] | str | None:
    """The ``config`` given to ``ductwork.connect``; override it to change settings."""
    return None


@pytest.fixture
def ductwork_app(ductwork_database_url: str,
                 ductwork_config: Config | dict[str, object] | str | None) -> Iterator[App]:
    """An App on this test's database, the default app while the test runs."""
    from ductwork.app import connect, set_default_app
    from ductwork.db.clock import OffsetClock

    app = connect(ductwork_database_url, ductwork_config, clock=OffsetClock())
    try:
        yield app
    finally:
        set_default_app(None)
        app.dispose()


@pytest.fixture
def ductwork_drain(ductwork_app: App) -> Drain:
    """Run every run of ``ductwork_app`` to completion in this thread."""
    from ductwork.testing import drain

    def bound(timeout: float = 30.0, *, skip_delays: bool = False) -> None:
        drain(ductwork_app, timeout, skip_delays=skip_delays)

    return bound
