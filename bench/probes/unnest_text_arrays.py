"""insert_rows on PostgreSQL, 64 rows of ductwork_limit_keys: bounded strings cast to
VARCHAR(n)[] (before 2026-12-07) or TEXT[] (after, ``dialects._unnest_insert``), interleaved,
300 repetitions of each; the medians and their ratio.

    python bench/probes/unnest_text_arrays.py postgresql://…/a_scratch_database
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from ductwork.db import engines, schema
from ductwork.db.ids import new_id
from ductwork.db.migrate import upgrade

COLUMNS = ("key", "seq", "created_at", "updated_at")


def statement(table: sa.Table, text_arrays: bool) -> sa.TextClause:
    pg = postgresql.dialect()  # type: ignore[no-untyped-call]

    def array(column: str) -> str:
        kind = table.c[column].type
        if text_arrays and isinstance(kind, sa.String) and kind.length:
            return "TEXT[]"
        return f"{kind.compile(dialect=pg)}[]"

    arrays = ", ".join(f"CAST(:c{i} AS {array(c)})" for i, c in enumerate(COLUMNS))
    return sa.text(f"INSERT INTO {table.name} ({', '.join(COLUMNS)}) SELECT * FROM unnest({arrays})")


def main(url: str) -> None:
    engine = engines.create_engine(url)
    upgrade(engine)
    k = schema.limit_keys
    timings: dict[bool, list[float]] = {False: [], True: []}
    now = datetime(2026, 1, 1)
    for rep in range(300):
        for variant in (False, True) if rep % 2 else (True, False):
            rows = [{"key": new_id(), "seq": 0, "created_at": now, "updated_at": now} for _ in range(64)]
            params = {f"c{i}": [row[c] for row in rows] for i, c in enumerate(COLUMNS)}
            with engine.begin() as conn:
                started = time.perf_counter()
                conn.execute(statement(k, variant), params)
                timings[variant].append(time.perf_counter() - started)
        if rep % 50 == 49:
            with engine.begin() as conn:
                conn.execute(k.delete())
    before, after = (statistics.median(timings[v]) for v in (False, True))
    print(f"VARCHAR(n)[] {before * 1000:.3f} ms, TEXT[] {after * 1000:.3f} ms per 64-row insert; "
          f"after/before {after / before:.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
