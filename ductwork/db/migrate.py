"""Schema migrations: ``ductwork db upgrade`` and the same from code.

    >>> upgrade(ductwork.connect("postgresql://localhost/shop").engine)

Runs Alembic with ductwork's own script directory and version table
(``ductwork_alembic_version``), so it never touches an application's own
Alembic history. Each upgrade runs in one transaction where the database
supports transactional DDL (PostgreSQL, SQLite); on MySQL each DDL statement
commits on its own, so a failed upgrade may need the failing revision re-run.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from ductwork.db import schema

MIGRATIONS = Path(__file__).parent / "migrations"
VERSION_TABLE = "ductwork_alembic_version"


def _alembic_config(connection: sa.Connection | None = None) -> AlembicConfig:
    """The script directory's config; ``connection``: the one env.py migrates (None for
    :func:`head`, which runs no migration)."""
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision``."""
    with engine.begin() as connection:
        command.upgrade(_alembic_config(connection), revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    with engine.begin() as connection:
        command.downgrade(_alembic_config(connection), revision)


def current(engine: Engine) -> str | None:
    """The applied revision, or None for a database ductwork never migrated."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE}).get_current_revision()


def head() -> str:
    revision = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert revision is not None, "the migrations have a head"  # one linear history, never empty
    return revision


def missing_tables(engine: Engine | sa.Connection) -> list[str]:
    """Which of ductwork's tables the database lacks."""
    present = set(sa.inspect(engine).get_table_names())
    return sorted(t for t in schema.metadata.tables if t not in present)
