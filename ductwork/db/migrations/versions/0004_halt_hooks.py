"""the on_halt hook a halted run owes, one per run

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

``ductwork_halt_hooks`` holds the hook a halted run owes its definition's ``on_halt``
handler: created in the transaction that halts the run, then claimed and run by a
worker like an execution (fenced by ``claim_token``, retried and re-run within the
step budgets, recovered by the reaper). The unique constraint ``uq_halt_hook_run``
makes the hook, and so its recorded outcome, exactly once per halted run.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        'ductwork_halt_hooks',
        sa.Column('id', sa.String(36), primary_key=True),
        sa.Column('run_id', sa.String(36), sa.ForeignKey('ductwork_runs.id'), nullable=False),
        sa.Column('klass', sa.String(255), nullable=False),
        sa.Column('status', sa.String(16), nullable=False),
        sa.Column('eligible_at', Timestamp, nullable=False),
        sa.Column('claim_token', sa.String(36), nullable=True),
        sa.Column('claimed_at', Timestamp, nullable=True),
        sa.Column('process_id', sa.String(36), sa.ForeignKey('ductwork_processes.id', ondelete='SET NULL'),
                  nullable=True),
        sa.Column('retry_count', sa.Integer, nullable=False),
        sa.Column('crash_count', sa.Integer, nullable=False),
        sa.Column('last_outcome', sa.String(16), nullable=True),
        sa.Column('error_klass', sa.String(255), nullable=True),
        sa.Column('error_message', sa.String(255), nullable=True),
        sa.Column('error_backtrace', LongText, nullable=True),
        sa.Column('completed_at', Timestamp, nullable=True),
        sa.Column('created_at', Timestamp, nullable=False),
        sa.Column('updated_at', Timestamp, nullable=False),
        sa.UniqueConstraint('run_id', name='uq_halt_hook_run'),
    )
    op.create_index('ix_halt_hook_due', 'ductwork_halt_hooks', ['status', 'eligible_at'])
    op.create_index('ix_halt_hook_process', 'ductwork_halt_hooks', ['process_id'])


def downgrade() -> None:
    # The table's indexes go with it. Dropped first, ix_halt_hook_process failed on
    # MySQL/MariaDB (error 1553): the process_id foreign key needs an index on its column.
    op.drop_table('ductwork_halt_hooks')
