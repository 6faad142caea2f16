"""refused keyed claims counted per key and reason: ``ductwork_key_refusals``

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05

``ductwork_key_refusals (key, reason, refusals)``, primary key ``pk_key_refusal (key,
reason)``: how many claims each key's limits refused, for concurrency or for rate,
fleet-wide (the dashboard's ``ductwork_key_refusals_total``, issue 35). Each worker
process counts the refusals its polls meet in memory and adds them in its heartbeat's
transaction, one upsert per key and reason it counted since the last one; nothing is
written on the claim path. An observability counter, not a guarantee: a process that
dies loses at most what it counted since its last heartbeat.

A new, empty table: upgrade with the fleet running or stopped. A process of an older
version writes nothing to it.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

ExactKey = sa.String(255).with_variant(mysql.VARCHAR(255, collation="utf8mb4_bin"), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        'ductwork_key_refusals',
        sa.Column('key', ExactKey, nullable=False),
        sa.Column('reason', sa.String(16), nullable=False),
        sa.Column('refusals', sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint('key', 'reason', name='pk_key_refusal'),
    )


def downgrade() -> None:
    op.drop_table('ductwork_key_refusals')
