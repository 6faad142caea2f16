"""the lane scan walks the pending executions in poll order: an index and the lane routine, version 3

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06

- ``ix_execution_pending_order``: the pending executions in poll order (``eligible_at``,
  ``id``, and their lane, ``pending_lane``), a partial index of the pending rows on
  PostgreSQL and SQLite; on MySQL/MariaDB (no partial indexes) ``(claimed_at, eligible_at,
  id, pending_lane)``, whose pending rows lead
  (``schema._pending_order`` says why they differ). The lane scan and the routine's bound
  read the lanes' oldest from it in poll order [INV-LIM-6], so a poll's cost does not grow
  with the number of limit keys (partitioned keys: issue 34).
- ``ductwork_release_and_claim_3`` and its key decision ``ductwork_decide_3`` on PostgreSQL
  (PL/pgSQL) and MySQL-family (stored procedures) from
  ``ductwork/limits/sql/release_and_claim_3.*.sql``: version 2 with that walk as its bound.
  Version 2 stays installed, so a fleet of the previous version keeps working beside this
  one during a rolling deploy; a fleet of this version needs version 3: upgrade before
  deploying.

No column changes: the index is built beside the table (on a large database it takes a
while; on MySQL/MariaDB writes go on while it is built).
"""
from pathlib import Path

import sqlalchemy as sa
from alembic import op

from ductwork.db import dialects

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

SOURCE = Path(__file__).resolve().parents[3] / "limits" / "sql"
#: each backend's routine (dropped by the downgrade)
ROUTINES = {"postgresql": ("FUNCTION ductwork_release_and_claim_3", "FUNCTION ductwork_decide_3"),
            "mysql": ("PROCEDURE ductwork_release_and_claim_3", "PROCEDURE ductwork_decide_3")}
INDEX = "ix_execution_pending_order"


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name in ("mysql", "mariadb"):
        op.create_index(INDEX, "ductwork_executions", ["claimed_at", "eligible_at", "id", "pending_lane"])
    else:
        pending = sa.text("claimed_at IS NULL")
        op.create_index(INDEX, "ductwork_executions", ["eligible_at", "id", "pending_lane"], postgresql_where=pending,
                        sqlite_where=pending)
    backend = dialects.backend(bind)
    if backend in ROUTINES:
        dialects.install_routine(bind, (SOURCE / f"release_and_claim_3.{backend}.sql").read_text())


def downgrade() -> None:
    bind = op.get_bind()
    for routine in ROUTINES.get(dialects.backend(bind), ()):
        op.execute(f"DROP {routine}")
    op.drop_index(INDEX, table_name="ductwork_executions")
