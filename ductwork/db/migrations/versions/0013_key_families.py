"""the lane routine, version 2: key families (a partition's family lock and ceiling)

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

Installs ``ductwork_release_and_claim_2`` on PostgreSQL (PL/pgSQL) and MySQL-family (a stored
procedure) from ``ductwork/db/migrations/routines/release_and_claim_2.*.sql`` (kept there as
history once version 3 replaced it): version 1 with key
families (docs/semantics.md §5.1, issue 34), which every claim and release of this version
calls, with its key decision ``ductwork_decide_2`` (version 1's, renamed). SQLite has no
server-side routines.

No table changes. Version 1 stays installed, so a fleet of the previous version keeps
working beside this one during a rolling deploy; a fleet of this version needs version 2:
upgrade before deploying.
"""
from pathlib import Path

from alembic import op

from ductwork.db import dialects

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

SOURCE = Path(__file__).resolve().parents[1] / "routines"
#: each backend's routine (dropped by the downgrade)
ROUTINES = {"postgresql": ("FUNCTION ductwork_release_and_claim_2", "FUNCTION ductwork_decide_2"),
            "mysql": ("PROCEDURE ductwork_release_and_claim_2", "PROCEDURE ductwork_decide_2")}


def upgrade() -> None:
    bind = op.get_bind()
    backend = dialects.backend(bind)
    if backend in ROUTINES:
        dialects.install_routine(bind, (SOURCE / f"release_and_claim_2.{backend}.sql").read_text())


def downgrade() -> None:
    bind = op.get_bind()
    for routine in ROUTINES.get(dialects.backend(bind), ()):
        op.execute(f"DROP {routine}")
