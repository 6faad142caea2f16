"""runs are listed newest first from an index: ``ix_run_triggered (triggered_at, id)``

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03

``ductwork runs``, ``list_runs`` and the dashboard's runs page (issue 35) order runs by
``(triggered_at, id)``, newest first, and page by keyset (``before=``). Filtered by
status or pipeline they range over ``ix_run_status_triggered`` or
``ix_run_pipeline_triggered``; unfiltered, or with only ``--since``, nothing served the
order, and every page sorted the whole table: 320 ms for the first 51 runs of 10⁶ on
PostgreSQL (bench/web_dashboard.py), where this index reads 51 entries.

The cost: one more index entry per run written, and per update of a run that is not
HOT (a status change already is not: ``status`` is indexed). No data changes. Building
it scans the runs table once and blocks writes to it meanwhile: on a large database
upgrade while the fleet is quiet.
"""
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_run_triggered', 'ductwork_runs', ['triggered_at', 'id'])


def downgrade() -> None:
    op.drop_index('ix_run_triggered', table_name='ductwork_runs')
