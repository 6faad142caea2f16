"""a refusal's reason up to 32 characters: ``family_concurrency`` did not fit

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07

``ductwork_key_refusals.reason`` was ``VARCHAR(16)`` (revision 0010, when the reasons were
``concurrency`` and ``rate``). Key families (revision 0013) added a poll's refusal at the
family's ceiling, ``family_concurrency``: 18 characters. PostgreSQL and MySQL-family
refused the heartbeat's upsert of that count ("value too long"), so a worker whose polls
met a full family failed every heartbeat after (it keeps its counts for the next one),
until its watchdog stopped it. SQLite does not enforce the length. Now ``VARCHAR(32)``.

Upgrade with the fleet running or stopped: PostgreSQL widens a ``varchar`` without
rewriting the table, MySQL/MariaDB in place (the length still takes one byte), SQLite
copies the table (it holds one row per key and reason). The downgrade deletes the counts
whose reason does not fit 16 characters (observability counters, not state), then
narrows the column.
"""
import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("ductwork_key_refusals") as batch:
        batch.alter_column("reason", existing_type=sa.String(16), type_=sa.String(32), existing_nullable=False)


def downgrade() -> None:
    op.execute("DELETE FROM ductwork_key_refusals WHERE LENGTH(reason) > 16")
    with op.batch_alter_table("ductwork_key_refusals") as batch:
        batch.alter_column("reason", existing_type=sa.String(32), type_=sa.String(16), existing_nullable=False)
