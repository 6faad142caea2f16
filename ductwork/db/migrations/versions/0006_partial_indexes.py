"""PostgreSQL: indexes on mostly-NULL columns hold only their non-NULL rows

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

Five indexes exist for look-ups by a value: a pending execution's lane
(``ix_execution_pending_lane``), an in-flight execution's key
(``ix_execution_inflight_key``), a branch's barrier (``ix_branch_barrier``), a revived
run's origin (``uq_run_revived_from``) and a run's trigger key (``uq_run_trigger_key``).
Their column is NULL for most rows most of the time: an execution leaves its lane when
claimed and is in flight on a key only while claimed, most branches are not split, most
runs are neither revived nor keyed. A full index writes an entry for every row inserted
and every update that cannot be HOT (and every update of these rows changes an indexed
column), NULL or not; a partial index (``WHERE col IS NOT NULL``) writes only the rows a
look-up can find. Every query on these columns compares them with ``=`` or ``IN``, which
implies ``IS NOT NULL``, so PostgreSQL's planner uses the partial index for each. Measured
with ``python -m bench.row_writes``: bench/RESULTS.md.

PostgreSQL only (the seam is this file and ``schema.py``'s ``postgresql_where``):
MariaDB and MySQL have no partial indexes, and SQLite is not server-bound. The unique
indexes keep their meaning: NULLs never collided. Other indexes on mostly-NULL columns
are unique constraints (``uq_execution_open_per_job`` and the like), which PostgreSQL
cannot make partial; they are left as they are.

Upgrading rebuilds the five indexes (``DROP INDEX``, ``CREATE INDEX``, each locking its
table against writes while it builds): run it while the fleet is stopped or quiet.
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

#: (index, table, columns, unique, the mostly-NULL column)
PARTIAL = (
    ("ix_execution_pending_lane", "ductwork_executions", ["pending_lane", "eligible_at", "id"], False, "pending_lane"),
    ("ix_execution_inflight_key", "ductwork_executions", ["inflight_key"], False, "inflight_key"),
    ("ix_branch_barrier", "ductwork_branches", ["barrier_id"], False, "barrier_id"),
    ("uq_run_revived_from", "ductwork_runs", ["revived_from"], True, "revived_from"),
    ("uq_run_trigger_key", "ductwork_runs", ["pipeline_klass", "trigger_key"], True, "trigger_key"),
)


def _rebuild(*, partial: bool) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for name, table, columns, unique, column in PARTIAL:
        op.drop_index(name, table_name=table)
        where = sa.text(f"{column} IS NOT NULL") if partial else None
        op.create_index(name, table, columns, unique=unique, postgresql_where=where)


def upgrade() -> None:
    _rebuild(partial=True)


def downgrade() -> None:
    _rebuild(partial=False)
