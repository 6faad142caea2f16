"""Alembic environment for ductwork's own tables (version table: ductwork_alembic_version).

Run only through :mod:`ductwork.db.migrate` (``ductwork db upgrade``, ``migrate.upgrade``),
which passes its connection in ``config.attributes["connection"]``: ductwork ships no
``alembic.ini``, so the ``alembic`` command has no URL to connect with.
"""

from alembic import context
from sqlalchemy.engine import Connection

from ductwork.db.schema import metadata

VERSION_TABLE = "ductwork_alembic_version"


def run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, version_table=VERSION_TABLE,
                      compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


run(context.config.attributes["connection"])
