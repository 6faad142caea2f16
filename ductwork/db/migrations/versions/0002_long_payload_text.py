"""payload columns hold the documented maximum on MySQL/MariaDB (LONGTEXT)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

Every text column that holds a payload (step inputs and outputs, expand items,
context values), the definition snapshot or a backtrace becomes ``LONGTEXT`` on
MySQL/MariaDB, whose ``TEXT`` holds only 65,535 bytes. PostgreSQL's ``text`` and
SQLite's ``TEXT`` already hold up to 1 GB: nothing changes there.

MySQL/MariaDB rebuild each altered table (one ``ALTER TABLE`` per table, so each is
copied once); writes to it wait meanwhile. The downgrade fails on a value longer
than 65,535 bytes (strict mode), leaving that table as it was.
"""
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

#: table -> (column, NOT NULL?) of every payload-sized text column
COLUMNS = {
    'ductwork_runs': [('definition', True)],
    'ductwork_jobs': [('input_args', True), ('output_payload', False)],
    'ductwork_executions': [('error_backtrace', False)],
    'ductwork_advancements': [('error_backtrace', False)],
    'ductwork_expand_items': [('value', True)],
    'ductwork_context': [('value', True)],
}


def _modify(type_: str) -> None:
    # Differs from PostgreSQL in that only MySQL/MariaDB need the change, because
    # their TEXT is limited to 65,535 bytes; the others' text types are unbounded.
    if op.get_bind().dialect.name not in ('mysql', 'mariadb'):
        return
    for table, columns in COLUMNS.items():
        changes = ', '.join(f"MODIFY `{name}` {type_} {'NOT NULL' if required else 'NULL'}"
                            for name, required in columns)
        op.execute(f'ALTER TABLE `{table}` {changes}')


def upgrade() -> None:
    _modify('LONGTEXT')


def downgrade() -> None:
    _modify('TEXT')
