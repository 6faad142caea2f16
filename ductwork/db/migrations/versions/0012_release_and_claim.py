"""the lane routine: one round trip that releases a lane's executions and claims its next

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06

On PostgreSQL the function ``ductwork_release_and_claim_1`` (PL/pgSQL, with its key
decision ``ductwork_decide_1``), on MySQL-family the stored procedures of the same names:
``ductwork/limits/claims.py::release_and_claim``, which every release and claim of an
execution calls (issue 32). Their source is
``ductwork/db/migrations/routines/release_and_claim_1.*.sql`` (kept there as history once
version 2 replaced it in ``ductwork/limits/sql/``), read here: a change to a routine is a new
version of it (a new name, new files) installed by a new migration, never an edit of these.
SQLite has no server-side routines (nothing is installed; the engine runs the same steps in
Python).

No table changes. A fleet of an older version keeps working beside the routine (it does not
call it); a fleet of this version needs it: upgrade before deploying.
"""
from pathlib import Path

from alembic import op

from ductwork.db import dialects

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

SOURCE = Path(__file__).resolve().parents[1] / "routines"
#: each backend's routines (dropped by the downgrade)
ROUTINES = {"postgresql": ("FUNCTION ductwork_release_and_claim_1", "FUNCTION ductwork_decide_1"),
            "mysql": ("PROCEDURE ductwork_release_and_claim_1", "PROCEDURE ductwork_decide_1")}


def upgrade() -> None:
    bind = op.get_bind()
    backend = dialects.backend(bind)
    if backend in ROUTINES:
        dialects.install_routine(bind, (SOURCE / f"release_and_claim_1.{backend}.sql").read_text())


def downgrade() -> None:
    bind = op.get_bind()
    for routine in ROUTINES.get(dialects.backend(bind), ()):
        op.execute(f"DROP {routine}")
