"""a process row names its OS process for ever: when that process started

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03

``ductwork_processes.os_start_ticks`` is when the row's OS process started, in clock
ticks after boot (Linux ``/proc/PID/stat``, field 22). With ``machine_identifier``, which
now also names the boot and the pid namespace, it tells a supervisor on the same machine
that a row's process is gone (its pid is free, or reused by a later process), so it
reaps the row at once instead of waiting ``reaper_timeout`` for its heartbeat to go
stale (``ductwork.fleet.reaper.reap_dead``). NULL: not known (not Linux, or a row written
before this revision): such a row is reaped only when its heartbeat is stale, as before.
No data changes: rows of running processes keep NULL until their processes restart.
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('ductwork_processes', sa.Column('os_start_ticks', sa.BigInteger, nullable=True))


def downgrade() -> None:
    op.drop_column('ductwork_processes', 'os_start_ticks')
