"""a run remembers the key it was triggered with; one run per pipeline and key

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

``ductwork_runs.trigger_key`` is the key a caller gave ``Pipeline.trigger(..., key=…)``
(NULL: no key, or a revived run). The unique index ``uq_run_trigger_key`` on
``(pipeline_klass, trigger_key)`` makes a keyed trigger exactly once: callers racing
with one key, from threads or processes, insert one run between them and the others get
it back. A unique index rather than a unique constraint because SQLite cannot add a
constraint to an existing table; NULLs never collide, so runs without a key are
unaffected. Deleting the run (``ductwork prune``) frees its key.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

#: compared exactly: MySQL/MariaDB's default collation would make ``Order-1`` and
#: ``order-1`` one key (schema.ExactKey)
ExactKey = sa.String(255).with_variant(mysql.VARCHAR(255, collation="utf8mb4_bin"), "mysql", "mariadb")


def upgrade() -> None:
    op.add_column('ductwork_runs', sa.Column('trigger_key', ExactKey, nullable=True))
    op.create_index('uq_run_trigger_key', 'ductwork_runs', ['pipeline_klass', 'trigger_key'], unique=True)


def downgrade() -> None:
    op.drop_index('uq_run_trigger_key', table_name='ductwork_runs')
    op.drop_column('ductwork_runs', 'trigger_key')
