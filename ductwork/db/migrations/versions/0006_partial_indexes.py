"""PostgreSQL: indexes on mostly-NULL columns hold only their non-NULL rows; room for updates

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

Nine indexes serve a look-up by value or a uniqueness on a column that is NULL for most
rows most of the time:

- look-ups: a pending execution's lane (``ix_execution_pending_lane``: NULL once claimed),
  an in-flight execution's key (``ix_execution_inflight_key``: NULL unless keyed and
  claimed), a branch's barrier (``ix_branch_barrier``), a revived run's origin
  (``uq_run_revived_from``) and a run's trigger key (``uq_run_trigger_key``);
- uniquenesses (revision 0001's unique constraints): an execution's open job
  (``uq_execution_open_per_job``: NULL once completed), an advancement's open branch
  (``uq_advancement_open_per_branch``: NULL once closed; a worker's inline advancement
  inserts it closed), a branch's parent (``uq_branch_child_index``) and its fan-in barrier
  (``uq_branch_merge_per_barrier``).

A full index writes an entry for every row inserted and every update that cannot be HOT
(every update of these rows changes an indexed column), NULL or not; a partial index
(``WHERE col IS NOT NULL``) writes only the rows a look-up can find. Every query on these
columns compares them with ``=`` or ``IN``, which implies ``IS NOT NULL``, so PostgreSQL's
planner uses the partial index for each. A constraint cannot be partial, so each of the
four becomes a partial unique index of the same name (``schema._unique_where_not_null``):
NULLs never collided, so the same rows are refused, and the error names the same object
(``schema.CONSTRAINT_COLUMNS``). Measured with ``python -m bench.row_writes --ab``:
bench/RESULTS.md.

The five tables whose rows are updated soon after their insert (a run, a branch, a step,
a job once each, an execution twice) get ``fillfactor = 80``: a fifth of each new page
is left free, so an update's new row version fits on its page. Without the room
PostgreSQL moves the row to another page and first writes a lock record for the old one
(and an update that changes no indexed column, a job's output, cannot be HOT). Existing
pages are not rewritten; ``ductwork_advancements`` and the rest are left as they are.

PostgreSQL only (the seam is this file and ``schema.py``'s ``postgresql_where``,
``postgresql_with`` and ``ddl_if``): MariaDB and MySQL have no partial indexes, and SQLite, in-process, is not
bound by a server's writes.

Upgrading rebuilds the nine (``DROP INDEX`` or ``DROP CONSTRAINT``, then ``CREATE
INDEX``, each blocking writes to its table while it builds): on large tables, run it
while the fleet is stopped or quiet.
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


#: (unique constraint of revision 0001, table, columns, the mostly-NULL column): a partial
#: unique index of the same name instead
UNIQUE = (
    ("uq_execution_open_per_job", "ductwork_executions", ["open_job_id"], "open_job_id"),
    ("uq_advancement_open_per_branch", "ductwork_advancements", ["open_branch_id"], "open_branch_id"),
    ("uq_branch_child_index", "ductwork_branches", ["parent_id", "barrier_index"], "parent_id"),
    ("uq_branch_merge_per_barrier", "ductwork_branches", ["merged_barrier_id"], "merged_barrier_id"),
)


#: tables whose rows are updated a few times each soon after their insert: pages kept 20 %
#: free (new pages only; existing rows are not moved)
FILLFACTOR = 80
UPDATED_IN_PLACE = ("ductwork_runs", "ductwork_branches", "ductwork_steps", "ductwork_jobs", "ductwork_executions")


def _rebuild(*, partial: bool) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in UPDATED_IN_PLACE:
        op.execute(f"ALTER TABLE {table} SET (fillfactor = {FILLFACTOR})" if partial
                   else f"ALTER TABLE {table} RESET (fillfactor)")
    for name, table, columns, unique, column in PARTIAL:
        op.drop_index(name, table_name=table)
        where = sa.text(f"{column} IS NOT NULL") if partial else None
        op.create_index(name, table, columns, unique=unique, postgresql_where=where)
    for name, table, columns, column in UNIQUE:
        if partial:
            op.drop_constraint(name, table, type_="unique")
            op.create_index(name, table, columns, unique=True, postgresql_where=sa.text(f"{column} IS NOT NULL"))
        else:
            op.drop_index(name, table_name=table)
            op.create_unique_constraint(name, table, columns)


def upgrade() -> None:
    _rebuild(partial=True)


def downgrade() -> None:
    _rebuild(partial=False)
