"""a run remembers the halted run it revives; one revive per halted run

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

``ductwork_runs.revived_from`` is the id of the halted run a run was revived from
(NULL: triggered, not revived). The unique index ``uq_run_revived_from`` makes a
revive exactly once: two processes reviving the same halted run race on it and one
of them gets the existing run. A unique index rather than a unique constraint
because SQLite cannot add a constraint to an existing table; an index gives the same
guarantee on all three databases. NULLs never collide (every triggered run is NULL).

``ductwork_steps.idempotency_key`` is the key a step's executions get (NULL: the
step's id). A revive sets it on the step it re-enqueues for a failed step: the key
of the step it re-runs, so a side effect made before the halt is not made twice.
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('ductwork_runs', sa.Column('revived_from', sa.String(36), nullable=True))
    op.create_index('uq_run_revived_from', 'ductwork_runs', ['revived_from'], unique=True)
    op.add_column('ductwork_steps', sa.Column('idempotency_key', sa.String(36), nullable=True))


def downgrade() -> None:
    op.drop_column('ductwork_steps', 'idempotency_key')
    op.drop_index('uq_run_revived_from', table_name='ductwork_runs')
    op.drop_column('ductwork_runs', 'revived_from')
