"""Alembic environment for ductwork's own tables (version table: ductwork_alembic_version)."""

from alembic import context
from sqlalchemy.engine import Connection

from ductwork.db.schema import metadata

VERSION_TABLE = "ductwork_alembic_version"


def run() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        from ductwork.db.dialects import create_engine

        url = context.config.get_main_option("sqlalchemy.url")
        assert url is not None, "alembic.ini or the caller sets sqlalchemy.url"
        engine = create_engine(url)
        with engine.begin() as connection:
            _configure_and_run(connection)
        engine.dispose()
    else:
        _configure_and_run(connection)


def _configure_and_run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE,
                      compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


run()
