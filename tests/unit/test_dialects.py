"""Database URLs: the spellings ductwork reads as its drivers, the ones it refuses, a
MySQL URL without a database, a driver that is not installed, and a SQLite file that
does not exist (checked without creating it). No database is needed.

Checks: none (configuration errors name the offending URL, password masked).
"""

from __future__ import annotations

import importlib.util

import pytest

from ductwork.app import App
from ductwork.config import Config
from ductwork.db import dialects
from ductwork.errors import DatabaseURLError, MissingDatabaseError, MissingTablesError


@pytest.mark.parametrize(("url", "read_as"), [
    ("postgresql+psycopg2://u:pw@h/db", "postgresql+psycopg://u:***@h/db"),
    ("postgresql+asyncpg://h/db", "postgresql+psycopg://h/db"),
    ("postgresql+pg8000://h:5433/db?sslmode=require", "postgresql+psycopg://h:5433/db?sslmode=require"),
    ("postgres://h/db", "postgresql+psycopg://h/db"),
    ("mysql+mysqldb://root@h/db", "mysql+pymysql://root@h/db?charset=utf8mb4"),
    ("mysql+mysqlconnector://root@h/db", "mysql+pymysql://root@h/db?charset=utf8mb4"),
    ("mariadb://root@h/db", "mariadb+pymysql://root@h/db?charset=utf8mb4"),
    ("mariadb+mariadbconnector://root@h/db", "mariadb+pymysql://root@h/db?charset=utf8mb4"),
    ("sqlite+aiosqlite:///x.sqlite3", "sqlite+pysqlite:///x.sqlite3"),
])
def test_common_driver_spellings_are_read_as_ductworks_driver(url, read_as):
    assert dialects.describe(url) == read_as


@pytest.mark.parametrize(("url", "fragment"), [
    ("postgresql+pygresql://u:secret@h/db",
     "database.url='postgresql+pygresql://u:***@h/db': driver 'pygresql' is not supported; write "
     "postgresql:// or postgresql+psycopg:// (also read as +psycopg: +psycopg2, "),
    ("mysql+oursql://h/db", "pip install 'ductwork[mysql]'"),
    ("postgresql+pygresql://h/db", "pip install 'ductwork[postgres]'"),
])
def test_an_unknown_driver_names_the_url_the_spellings_and_the_extra(url, fragment):
    with pytest.raises(DatabaseURLError) as info:
        dialects.normalize_url(url)
    assert fragment in str(info.value)
    assert "secret" not in str(info.value)


@pytest.mark.parametrize("url", ["mysql://root:pw@127.0.0.1:3306", "mysql://root@h/", "mariadb://h"])
def test_a_mysql_url_without_a_database_is_named(url):
    with pytest.raises(DatabaseURLError, match=r"names no database; add one, e\.g\. m") as info:
        dialects.create_engine(url)
    assert info.value.path == "database.url"
    assert "pw" not in str(info.value)


@pytest.mark.parametrize(("url", "module", "extra"), [
    ("postgresql://u:secret@h/db", "psycopg", "postgres"),
    ("postgresql+psycopg2://h/db", "psycopg", "postgres"),
    ("mysql://h/db", "pymysql", "mysql"),
])
def test_a_driver_that_is_not_installed_is_named_with_its_extra(monkeypatch, url, module, extra):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    with pytest.raises(DatabaseURLError) as info:
        dialects.create_engine(url)
    message = str(info.value)
    assert f"needs the {module} driver, which is not installed: pip install 'ductwork[{extra}]'" in message
    assert message.startswith("database.url='")
    assert "secret" not in message


def test_sqlite_needs_no_driver_beyond_python(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("psycopg", "pymysql") else real(name, *a))
    dialects.create_engine(f"sqlite:///{tmp_path}/x.sqlite3").dispose()


def test_a_missing_sqlite_file_is_reported_not_created(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = App("sqlite:///typo.sqlite3", Config())
    try:
        with pytest.raises(MissingDatabaseError) as info, app.begin():
            pass
    finally:
        app.dispose()
    assert isinstance(info.value, MissingTablesError)
    assert str(info.value) == (f"no database at sqlite+pysqlite:///typo.sqlite3: no file {tmp_path}/typo.sqlite3 "
                               "(run `ductwork db upgrade` to create it)")
    assert list(tmp_path.iterdir()) == []


def test_the_default_database_says_it_is_the_default(tmp_path, monkeypatch):
    from ductwork.app import connect, set_default_app

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DUCTWORK_DATABASE_URL", raising=False)
    monkeypatch.delenv("DUCTWORK_CONFIG", raising=False)
    app = connect()
    try:
        assert app.url_source == "default"
        assert app.database == "sqlite+pysqlite:///ductwork.sqlite3 (ductwork's default: no database URL configured)"
        with pytest.raises(MissingDatabaseError, match=r"ductwork's default"):
            app.check_schema()
    finally:
        app.dispose()
        set_default_app(None)
    assert list(tmp_path.iterdir()) == []
