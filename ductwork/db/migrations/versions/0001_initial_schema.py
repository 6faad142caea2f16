"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def _datetime() -> sa.DateTime:
    """A timestamp with microseconds on every backend (MySQL's DATETIME keeps none unless told)."""
    return sa.DateTime().with_variant(mysql.DATETIME(fsp=6), 'mariadb').with_variant(mysql.DATETIME(fsp=6), 'mysql')


def upgrade() -> None:
    op.create_table('ductwork_limit_keys',
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('blocked_until', _datetime(), nullable=True),
    sa.Column('config_digest', sa.String(length=16), nullable=True),
    sa.Column('seq', sa.BigInteger(), server_default='0', nullable=False),
    sa.Column('created_at', _datetime(), nullable=False),
    sa.Column('updated_at', _datetime(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('ductwork_processes',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('pid', sa.Integer(), nullable=False),
    sa.Column('machine_identifier', sa.String(length=255), nullable=False),
    sa.Column('label', sa.String(length=100), nullable=False),
    sa.Column('role', sa.String(length=32), nullable=False),
    sa.Column('last_heartbeat_at', _datetime(), nullable=False),
    sa.Column('created_at', _datetime(), nullable=False),
    sa.Column('updated_at', _datetime(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('machine_identifier', 'pid', 'label', name='uq_process_host_pid_label')
    )
    op.create_index('ix_process_heartbeat', 'ductwork_processes', ['last_heartbeat_at'], unique=False)
    op.create_table('ductwork_runs',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('pipeline_klass', sa.String(length=255), nullable=False),
    sa.Column('definition', sa.Text(), nullable=False),
    sa.Column('definition_sha1', sa.String(length=40), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('triggered_at', _datetime(), nullable=False),
    sa.Column('completed_at', _datetime(), nullable=True),
    sa.Column('halted_at', _datetime(), nullable=True),
    sa.Column('created_at', _datetime(), nullable=False),
    sa.Column('updated_at', _datetime(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('ix_run_pipeline_triggered', 'ductwork_runs', ['pipeline_klass', 'triggered_at'], unique=False)
    op.create_index('ix_run_status_triggered', 'ductwork_runs', ['status', 'triggered_at'], unique=False)
    op.create_table('ductwork_branches',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('run_id', sa.String(length=36), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('halt_reason', sa.String(length=40), nullable=True),
    sa.Column('claim_token', sa.String(length=36), nullable=True),
    sa.Column('claimed_at', _datetime(), nullable=True),
    sa.Column('last_advanced_at', _datetime(), nullable=False),
    sa.Column('parent_id', sa.String(length=36), nullable=True),
    sa.Column('barrier_id', sa.String(length=36), nullable=True),
    sa.Column('barrier_index', sa.Integer(), nullable=True),
    sa.Column('fanout_width', sa.Integer(), nullable=True),
    sa.Column('fanout_cursor', sa.Integer(), nullable=True),
    sa.Column('fanin_arrivals', sa.Integer(), server_default='0', nullable=False),
    sa.Column('fanin_arrived_at', _datetime(), nullable=True),
    sa.Column('merged_barrier_id', sa.String(length=36), nullable=True),
    sa.Column('started_at', _datetime(), nullable=False),
    sa.Column('completed_at', _datetime(), nullable=True),
    sa.Column('created_at', _datetime(), nullable=False),
    sa.Column('updated_at', _datetime(), nullable=False),
    sa.ForeignKeyConstraint(['barrier_id'], ['ductwork_branches.id'], ),
    sa.ForeignKeyConstraint(['parent_id'], ['ductwork_branches.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['ductwork_runs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('merged_barrier_id', name='uq_branch_merge_per_barrier'),
    sa.UniqueConstraint('parent_id', 'barrier_index', name='uq_branch_child_index')
    )
    op.create_index('ix_branch_barrier', 'ductwork_branches', ['barrier_id'], unique=False)
    op.create_index('ix_branch_run_status', 'ductwork_branches', ['run_id', 'status'], unique=False)
    op.create_table('ductwork_context',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('run_id', sa.String(length=36), nullable=False),
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.Column('first_set_at', _datetime(), nullable=False),
    sa.Column('last_set_at', _datetime(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['ductwork_runs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'key', name='uq_context_run_key')
    )
    op.create_table('ductwork_limit_buckets',
    sa.Column('key', sa.String(length=255), nullable=False),
    sa.Column('period_s', sa.Integer(), nullable=False),
    sa.Column('level_units', sa.BigInteger(), nullable=False),
    sa.Column('refilled_at_us', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', _datetime(), nullable=False),
    sa.ForeignKeyConstraint(['key'], ['ductwork_limit_keys.key'], ),
    sa.PrimaryKeyConstraint('key', 'period_s', name='pk_limit_bucket')
    )
    op.create_table('ductwork_steps',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('run_id', sa.String(length=36), nullable=False),
    sa.Column('branch_id', sa.String(length=36), nullable=False),
    sa.Column('node', sa.String(length=255), nullable=False),
    sa.Column('klass', sa.String(length=255), nullable=False),
    sa.Column('to_transition', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('limit_key', sa.String(length=255), nullable=True),
    sa.Column('timeout_us', sa.BigInteger(), nullable=True),
    sa.Column('started_at', _datetime(), nullable=False),
    sa.Column('completed_at', _datetime(), nullable=True),
    sa.Column('created_at', _datetime(), nullable=False),
    sa.Column('updated_at', _datetime(), nullable=False),
    sa.ForeignKeyConstraint(['branch_id'], ['ductwork_branches.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['ductwork_runs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('branch_id', 'node', name='uq_step_branch_node')
    )
    op.create_index('ix_step_branch_started', 'ductwork_steps', ['branch_id', 'started_at', 'id'], unique=False)
    op.create_index('ix_step_run', 'ductwork_steps', ['run_id'], unique=False)
    op.create_index('ix_step_status_branch', 'ductwork_steps', ['status', 'branch_id'], unique=False)
    op.create_table('ductwork_advancements',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('branch_id', sa.String(length=36), nullable=False),
    sa.Column('step_id', sa.String(length=36), nullable=False),
    sa.Column('process_id', sa.String(length=36), nullable=True),
    sa.Column('claim_token', sa.String(length=36), nullable=False),
    sa.Column('started_at', _datetime(), nullable=False),
    sa.Column('completed_at', _datetime(), nullable=True),
    sa.Column('error_klass', sa.String(length=255), nullable=True),
    sa.Column('error_message', sa.String(length=255), nullable=True),
    sa.Column('error_backtrace', sa.Text(), nullable=True),
    sa.Column('crash_count', sa.Integer(), nullable=False),
    sa.Column('created_at', _datetime(), nullable=False),
    sa.Column('updated_at', _datetime(), nullable=False),
    sa.Column('open_branch_id', sa.String(length=36),
              sa.Computed('CASE WHEN completed_at IS NULL THEN branch_id END', persisted=True), nullable=True),
    sa.ForeignKeyConstraint(['branch_id'], ['ductwork_branches.id'], ),
    sa.ForeignKeyConstraint(['process_id'], ['ductwork_processes.id'], ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['step_id'], ['ductwork_steps.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('open_branch_id', name='uq_advancement_open_per_branch')
    )
    op.create_index('ix_advancement_process', 'ductwork_advancements', ['process_id'], unique=False)
    op.create_index('ix_advancement_step', 'ductwork_advancements', ['step_id'], unique=False)
    op.create_table('ductwork_jobs',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('step_id', sa.String(length=36), nullable=False),
    sa.Column('klass', sa.String(length=255), nullable=False),
    sa.Column('input_args', sa.Text(), nullable=False),
    sa.Column('output_payload', sa.Text(), nullable=True),
    sa.Column('started_at', _datetime(), nullable=False),
    sa.Column('completed_at', _datetime(), nullable=True),
    sa.Column('created_at', _datetime(), nullable=False),
    sa.Column('updated_at', _datetime(), nullable=False),
    sa.ForeignKeyConstraint(['step_id'], ['ductwork_steps.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('step_id', name='uq_job_step')
    )
    op.create_table('ductwork_executions',
    sa.Column('id', sa.String(length=36), nullable=False),
    sa.Column('job_id', sa.String(length=36), nullable=False),
    sa.Column('limit_key', sa.String(length=255), nullable=True),
    sa.Column('eligible_at', _datetime(), nullable=False),
    sa.Column('claimed_at', _datetime(), nullable=True),
    sa.Column('process_id', sa.String(length=36), nullable=True),
    sa.Column('completed_at', _datetime(), nullable=True),
    sa.Column('outcome', sa.String(length=16), nullable=True),
    sa.Column('error_klass', sa.String(length=255), nullable=True),
    sa.Column('error_message', sa.String(length=255), nullable=True),
    sa.Column('error_backtrace', sa.Text(), nullable=True),
    sa.Column('retry_count', sa.Integer(), nullable=False),
    sa.Column('crash_count', sa.Integer(), nullable=False),
    sa.Column('claim_seq', sa.BigInteger(), nullable=True),
    sa.Column('release_seq', sa.BigInteger(), nullable=True),
    sa.Column('created_at', _datetime(), nullable=False),
    sa.Column('updated_at', _datetime(), nullable=False),
    sa.Column('pending_lane', sa.String(length=255),
              sa.Computed("CASE WHEN claimed_at IS NULL THEN COALESCE(limit_key, '') END", persisted=True),
              nullable=True),
    sa.Column('inflight_key', sa.String(length=255),
              sa.Computed('CASE WHEN claimed_at IS NOT NULL AND completed_at IS NULL THEN limit_key END',
                          persisted=True),
              nullable=True),
    sa.Column('open_job_id', sa.String(length=36),
              sa.Computed('CASE WHEN completed_at IS NULL THEN job_id END', persisted=True), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['ductwork_jobs.id'], ),
    sa.ForeignKeyConstraint(['process_id'], ['ductwork_processes.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('open_job_id', name='uq_execution_open_per_job')
    )
    op.create_index('ix_execution_inflight_key', 'ductwork_executions', ['inflight_key'], unique=False)
    op.create_index('ix_execution_job', 'ductwork_executions', ['job_id'], unique=False)
    op.create_index('ix_execution_pending_lane', 'ductwork_executions', ['pending_lane', 'eligible_at', 'id'],
                    unique=False)
    op.create_index('ix_execution_process', 'ductwork_executions', ['process_id'], unique=False)
    op.create_table('ductwork_expand_items',
    sa.Column('job_id', sa.String(length=36), nullable=False),
    sa.Column('item_index', sa.Integer(), nullable=False),
    sa.Column('value', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['ductwork_jobs.id'], ),
    sa.PrimaryKeyConstraint('job_id', 'item_index', name='pk_expand_items')
    )


def downgrade() -> None:
    # Each table's indexes go with it. Dropped first, an index on a foreign key's column
    # (ix_execution_process) failed on MySQL/MariaDB (error 1553: the key needs it).
    op.drop_table('ductwork_expand_items')
    op.drop_table('ductwork_executions')
    op.drop_table('ductwork_jobs')
    op.drop_table('ductwork_advancements')
    op.drop_table('ductwork_steps')
    op.drop_table('ductwork_limit_buckets')
    op.drop_table('ductwork_context')
    op.drop_table('ductwork_branches')
    op.drop_table('ductwork_runs')
    op.drop_table('ductwork_processes')
    op.drop_table('ductwork_limit_keys')
