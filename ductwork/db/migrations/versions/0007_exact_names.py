"""MySQL/MariaDB: limit keys, pipeline names and context keys compared exactly

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02

MySQL and MariaDB compare strings by the column's collation, and their default
(``utf8mb4_general_ci``; MySQL 8: ``utf8mb4_0900_ai_ci``) ignores case and accents. So
``vendor_api`` and ``Vendor_API`` were one limit key there: one header row, one lock, one
in-flight count and one set of buckets, for two keys with two configs. The limits held
(each key's count included the other's executions: stricter, never looser), but neither
key ran at its own limit, as it does on PostgreSQL and SQLite. Two pipelines whose names
differ only in case shared each trigger key (``uq_run_trigger_key``), and a run's context
keys ``Total`` and ``total`` were one key (``uq_context_run_key``).

This revision gives the columns that hold those names the binary collation
(``utf8mb4_bin``, ``schema.ExactKey``, as revision 0005 gave ``trigger_key``):
``ductwork_runs.pipeline_klass``; ``ductwork_steps.limit_key``;
``ductwork_executions.limit_key`` and the two columns generated from it, ``pending_lane``
and ``inflight_key``; ``ductwork_limit_keys.key`` and ``ductwork_limit_buckets.key``;
``ductwork_context.key``. Indexes on them are rebuilt by the ``ALTER``.

A key spelled two ways had one header row, under the first spelling that was used. Each
other spelling that a step or an execution names gets a header row of its own, with the
sequence number of the row it shared (so its later claims and releases stay after the
ones it took there), no stamp and no config digest: its next claim applies its own
config. The buckets stay with the first spelling.

PostgreSQL and SQLite already compare exactly: nothing changes there. Downgrading gives
the columns the table's default collation back; it fails if two rows of
``ductwork_limit_keys`` (or two context keys of a run) then collide: delete one first.
"""
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

#: (table, column, its definition without the collation): every column the revision changes
_COLUMNS = (
    ("ductwork_runs", "pipeline_klass", "VARCHAR(255) {collate} NOT NULL"),
    ("ductwork_steps", "limit_key", "VARCHAR(255) {collate} NULL"),
    ("ductwork_executions", "limit_key", "VARCHAR(255) {collate} NULL"),
    ("ductwork_executions", "pending_lane",
     "VARCHAR(255) {collate} GENERATED ALWAYS AS "
     "(CASE WHEN claimed_at IS NULL THEN COALESCE(limit_key, '') END) STORED"),
    ("ductwork_executions", "inflight_key",
     "VARCHAR(255) {collate} GENERATED ALWAYS AS "
     "(CASE WHEN claimed_at IS NOT NULL AND completed_at IS NULL THEN limit_key END) STORED"),
    ("ductwork_limit_keys", "key", "VARCHAR(255) {collate} NOT NULL"),
    ("ductwork_limit_buckets", "key", "VARCHAR(255) {collate} NOT NULL"),
    ("ductwork_context", "key", "VARCHAR(255) {collate} NOT NULL"),
)

#: a header row for each spelling of a key that steps or executions name and that has
#: none of its own (after the columns compare exactly), with the shared row's sequence
_SPELLINGS = """
INSERT INTO ductwork_limit_keys (`key`, blocked_until, config_digest, seq, created_at, updated_at)
SELECT named.limit_key,
       NULL,
       NULL,
       COALESCE((SELECT MAX(shared.seq) FROM ductwork_limit_keys shared
                 WHERE shared.`key` COLLATE utf8mb4_general_ci = named.limit_key COLLATE utf8mb4_general_ci), 0),
       UTC_TIMESTAMP(6),
       UTC_TIMESTAMP(6)
FROM (SELECT limit_key FROM ductwork_executions WHERE limit_key IS NOT NULL
      UNION SELECT limit_key FROM ductwork_steps WHERE limit_key IS NOT NULL) named
WHERE NOT EXISTS (SELECT 1 FROM ductwork_limit_keys own WHERE own.`key` = named.limit_key)
"""


def _modify(collate: str) -> None:
    # limit_buckets.key references limit_keys.key, and MySQL refuses to change a column a
    # foreign key joins (error 1833), even with FOREIGN_KEY_CHECKS = 0: the key is dropped
    # and added back, under the name the server gave it
    name = op.get_bind().exec_driver_sql(
        "SELECT constraint_name FROM information_schema.key_column_usage WHERE table_schema = DATABASE() "
        "AND table_name = 'ductwork_limit_buckets' AND referenced_table_name = 'ductwork_limit_keys'").scalar()
    if name is not None:
        op.execute(f"ALTER TABLE ductwork_limit_buckets DROP FOREIGN KEY `{name}`")
    for table, column, definition in _COLUMNS:
        op.execute(f"ALTER TABLE {table} MODIFY `{column}` {definition.format(collate=collate)}")
    op.execute(f"ALTER TABLE ductwork_limit_buckets ADD CONSTRAINT `{name or 'ductwork_limit_buckets_ibfk_1'}` "
               "FOREIGN KEY (`key`) REFERENCES ductwork_limit_keys (`key`)")


def upgrade() -> None:
    if op.get_bind().dialect.name not in ("mysql", "mariadb"):
        return
    _modify("CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    op.execute(_SPELLINGS)


#: names the default collation would make one: a downgrade would fail half-way on them
_COLLIDING = """
SELECT 'ductwork_limit_keys', MIN(`key`), MAX(`key`) FROM ductwork_limit_keys
GROUP BY `key` COLLATE utf8mb4_general_ci HAVING COUNT(*) > 1
UNION ALL
SELECT 'ductwork_context', MIN(`key`), MAX(`key`) FROM ductwork_context
GROUP BY run_id, `key` COLLATE utf8mb4_general_ci HAVING COUNT(*) > 1
"""


def downgrade() -> None:
    if op.get_bind().dialect.name not in ("mysql", "mariadb"):
        return
    colliding = op.get_bind().exec_driver_sql(_COLLIDING).all()
    if colliding:  # refused before any ALTER: MySQL's DDL is not transactional
        raise RuntimeError("cannot downgrade below 0007: these names differ only in case or accents and "
                           "would be one under the default collation; delete one of each first: "
                           + "; ".join(f"{table}: {a!r} and {b!r}" for table, a, b in colliding))
    _modify("")
