"""MySQL/MariaDB: a process's label compared exactly, case and trailing spaces included

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-08

Several process identities may live in one OS process (embedded use: ``register``'s
``label``), told apart by ``ductwork_processes.label``. The column had the table's default
collation, which on MySQL-family ignores case and accents and, like ``utf8mb4_bin``, pads
with spaces (PAD SPACE: ``'worker' = 'worker '``). So ``register(label='Worker')`` found the
live ``worker`` of the same pid as its previous incarnation, reaped it and recovered its
claims as crashed while it ran; and ``uq_process_host_pid_label`` held one of the two.

This revision gives the column the binary NO PAD collation, which compares as PostgreSQL
and SQLite do: ``utf8mb4_nopad_bin`` on MariaDB, ``utf8mb4_0900_bin`` on MySQL 8.0.17 and
later (``schema.no_pad_bin``); an older MySQL has no binary NO PAD collation and gets
``utf8mb4_bin``, exact for case and accents, still padded.
The unique index is rebuilt by the ``ALTER``. The processes table holds one row per live
process (a fleet's workers, advancers and supervisors), so the copy is cheap: upgrade with
the fleet running or stopped. PostgreSQL and SQLite already compare exactly: nothing
changes there.

Downgrading gives the column the table's default collation back; it is refused, before
the ``ALTER``, while two labels of one OS process would then collide (stop those
processes first).
"""
from alembic import op

from ductwork.db.schema import no_pad_bin

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None

_MODIFY = "ALTER TABLE ductwork_processes MODIFY label VARCHAR(100) {collate} NOT NULL"


def _mysql_family() -> bool:
    return op.get_bind().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    if not _mysql_family():
        return
    op.execute(_MODIFY.format(collate=f"CHARACTER SET utf8mb4 COLLATE {no_pad_bin(op.get_bind().dialect)}"))


def downgrade() -> None:
    if not _mysql_family():
        return
    bind = op.get_bind()
    default = bind.exec_driver_sql(
        "SELECT table_collation FROM information_schema.tables WHERE table_schema = DATABASE() "
        "AND table_name = 'ductwork_processes'").scalar_one()
    colliding = bind.exec_driver_sql(
        f"SELECT pid, MIN(label), MAX(label) FROM ductwork_processes GROUP BY machine_identifier, pid, "
        f"label COLLATE {default} HAVING COUNT(*) > 1").all()
    if colliding:
        raise RuntimeError("cannot downgrade below 0016: these process labels differ only in case, accents or "
                           f"trailing spaces and would be one under {default}; stop those processes first: "
                           + "; ".join(f"pid {pid}: {a!r} and {b!r}" for pid, a, b in colliding))
    op.execute(_MODIFY.format(collate=""))
