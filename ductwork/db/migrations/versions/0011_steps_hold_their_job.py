"""a step holds its job: ``ductwork_jobs`` folded into ``ductwork_steps``

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06

A job row was one to one with its step (``uq_job_step``) and written with it: one more
row per step, one more INSERT per step created and one more join on every claim and
read. Its columns move to the step and the executions and expand items reference the
step:

- ``ductwork_steps`` gets ``input_args`` (NOT NULL) and ``output_payload``, copied from
  the step's job. The job's ``klass`` and ``started_at`` were the step's (written
  together, carried together by a revive); its ``completed_at`` was its success, the
  ``completed_at`` of its successful execution (one transaction), and nothing read it
  but a revive copying it: not kept.
- ``ductwork_executions.step_id`` (foreign key to the step, index ``ix_execution_step``)
  replaces ``job_id`` and ``ix_execution_job``; the generated ``open_step_id`` replaces
  ``open_job_id``, and ``uq_execution_open_per_step`` replaces
  ``uq_execution_open_per_job`` [INV-EXE-2] (on PostgreSQL a partial unique index, as
  revision 0006 made it; a unique constraint elsewhere).
- ``ductwork_expand_items.step_id`` replaces ``job_id`` in the primary key
  ``pk_expand_items (step_id, item_index)``.
- ``ductwork_jobs`` is dropped.

Differs from PostgreSQL and MySQL/MariaDB in that SQLite changes a column or a
constraint only by copying the table (Alembic's batch mode): the executions and expand
items are copied. ``ductwork_steps`` is referenced by foreign keys, which SQLite checks
while the migration's transaction runs, so it is not copied: SQLite adds a NOT NULL
column only with a default, and ``input_args`` keeps ``DEFAULT '[]'`` there (every row
copied over it; the engine always writes the column).

Every row of the four tables is rewritten: upgrade with the fleet stopped, and on a large
database expect it to take a while. A fleet of an older version cannot run on the new
tables. The downgrade restores the jobs (each job's id is its step's; its
``completed_at``, its successful execution's) and the references to them.
"""
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

Id = sa.String(36)
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
Timestamp = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

#: a column of the step's job, for each row of ``{table}`` (a correlated subquery: one
#: form on PostgreSQL, MySQL/MariaDB and SQLite)
_OF_JOB = "(SELECT j.{column} FROM ductwork_jobs j WHERE j.{key} = {table}.{ref})"


def _open_per(owner: str) -> sa.Computed:
    return sa.Computed(f"CASE WHEN completed_at IS NULL THEN {owner} END", persisted=True)


#: the executions' other generated columns (SQLite: copied by being generated again)
_GENERATED = (("pending_lane", "CASE WHEN claimed_at IS NULL THEN COALESCE(limit_key, '') END"),
              ("inflight_key", "CASE WHEN claimed_at IS NOT NULL AND completed_at IS NULL THEN limit_key END"))


def _foreign_key(table: str, column: str) -> str | None:
    """The server's name of ``table``'s foreign key on ``column`` (None on SQLite: unnamed)."""
    for key in sa.inspect(op.get_bind()).get_foreign_keys(table):
        if key["constrained_columns"] == [column]:
            return key["name"]
    return None


def _move_executions(old: str, new: str, referenced: str) -> None:
    """``ductwork_executions.{old}`` becomes ``{new}`` (already filled), with its foreign
    key, index, generated ``open_{…}`` column and its uniqueness [INV-EXE-2]."""
    bind = op.get_bind()
    postgresql = bind.dialect.name == "postgresql"
    unique, old_unique = (f"uq_execution_open_per_{name.removesuffix('_id')}" for name in (new, old))
    index, old_index = (f"ix_execution_{name.removesuffix('_id')}" for name in (new, old))
    key = _foreign_key("ductwork_executions", old)
    if postgresql:  # revision 0006: a partial unique index, not a constraint
        op.drop_index(old_unique, table_name="ductwork_executions")
    # SQLite's copy cannot insert into generated columns: there they are dropped and made again
    generated = _GENERATED if bind.dialect.name == "sqlite" else ()
    with op.batch_alter_table("ductwork_executions") as batch:
        if key is not None:
            batch.drop_constraint(key, type_="foreignkey")
        if not postgresql:
            batch.drop_constraint(old_unique, type_="unique")
        batch.drop_index(old_index)
        for column in (*(name for name, _ in generated), f"open_{old}", old):
            batch.drop_column(column)
        batch.alter_column(new, existing_type=Id, nullable=False)
        batch.create_foreign_key(f"ductwork_executions_{new}_fkey", referenced, [new], ["id"])
        for name, expression in generated:
            batch.add_column(sa.Column(name, sa.String(255), sa.Computed(expression, persisted=True), nullable=True))
        batch.add_column(sa.Column(f"open_{new}", Id, _open_per(new), nullable=True))
        batch.create_index(index, [new])
        if not postgresql:
            batch.create_unique_constraint(unique, [f"open_{new}"])
    if postgresql:
        op.create_index(unique, "ductwork_executions", [f"open_{new}"], unique=True,
                        postgresql_where=sa.text(f"open_{new} IS NOT NULL"))


def _move_expand_items(old: str, new: str, referenced: str) -> None:
    """``ductwork_expand_items.{old}`` becomes ``{new}`` (already filled) in its primary key."""
    key = _foreign_key("ductwork_expand_items", old)
    with op.batch_alter_table("ductwork_expand_items") as batch:
        if key is not None:
            batch.drop_constraint(key, type_="foreignkey")
        batch.drop_constraint("pk_expand_items", type_="primary")
        batch.drop_column(old)
        batch.alter_column(new, existing_type=Id, nullable=False)
        batch.create_primary_key("pk_expand_items", [new, "item_index"])
        batch.create_foreign_key(f"ductwork_expand_items_{new}_fkey", referenced, [new], ["id"])


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    op.add_column("ductwork_steps", sa.Column("input_args", LongText, nullable=not sqlite,
                                              server_default="[]" if sqlite else None))
    op.add_column("ductwork_steps", sa.Column("output_payload", LongText, nullable=True))
    op.execute("UPDATE ductwork_steps SET "
               + ", ".join(f"{c} = " + _OF_JOB.format(column=c, key="step_id", table="ductwork_steps", ref="id")
                           for c in ("input_args", "output_payload")))
    if not sqlite:
        op.alter_column("ductwork_steps", "input_args", existing_type=LongText, nullable=False)
    for table in ("ductwork_executions", "ductwork_expand_items"):
        op.add_column(table, sa.Column("step_id", Id, nullable=True))
        op.execute(f"UPDATE {table} SET step_id = "
                   + _OF_JOB.format(column="step_id", key="id", table=table, ref="job_id"))
    _move_executions("job_id", "step_id", "ductwork_steps")
    _move_expand_items("job_id", "step_id", "ductwork_steps")
    op.drop_table("ductwork_jobs")


def downgrade() -> None:
    op.create_table(
        "ductwork_jobs",
        sa.Column("id", Id, nullable=False),
        sa.Column("step_id", Id, nullable=False),
        sa.Column("klass", sa.String(255), nullable=False),
        sa.Column("input_args", LongText, nullable=False),
        sa.Column("output_payload", LongText, nullable=True),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("completed_at", Timestamp, nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.ForeignKeyConstraint(["step_id"], ["ductwork_steps.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("step_id", name="uq_job_step"),
        postgresql_with={"fillfactor": 80},  # revision 0006
    )
    op.execute("INSERT INTO ductwork_jobs (id, step_id, klass, input_args, output_payload, started_at, "
               "completed_at, created_at, updated_at) "
               "SELECT s.id, s.id, s.klass, s.input_args, s.output_payload, s.started_at, "
               "(SELECT MAX(e.completed_at) FROM ductwork_executions e WHERE e.step_id = s.id "
               "AND e.outcome = 'success'), s.created_at, s.updated_at FROM ductwork_steps s")
    for table in ("ductwork_executions", "ductwork_expand_items"):  # a job's id is its step's
        op.add_column(table, sa.Column("job_id", Id, nullable=True))
        op.execute(f"UPDATE {table} SET job_id = step_id")
    _move_executions("step_id", "job_id", "ductwork_jobs")
    _move_expand_items("step_id", "job_id", "ductwork_jobs")
    for column in ("output_payload", "input_args"):  # (SQLite: ALTER TABLE … DROP COLUMN, no copy)
        op.drop_column("ductwork_steps", column)
