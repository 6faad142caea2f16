"""Why B1 is server-bound: the rows and index entries each drained run writes, beside pgqueuer.

    python -m bench.row_writes [--database-url postgresql://…/ductwork_bench] [--runs 3000]
                               [--pgqueuer-python /tmp/pgqvenv/bin/python]

PostgreSQL only. B1's batch (one-step no-op runs inserted as ``trigger`` writes them, then
drained by a default ``ductwork start``) is run once to warm up and once measured; the
server's own per-table counters (``pg_stat_user_tables``: rows inserted, updated, updated
HOT, deleted) are read before the measured batch is inserted and after its last run
completed, so a run's figures are its trigger's writes (one insert each into runs,
branches, steps, jobs and executions) and its drain's (everything else). Beside it, with
``--pgqueuer-python``, pgqueuer 1.6.0's drain of as many no-op jobs
(bench/pgqueuer_drain.py, its own database), counted the same way: its script creates its
tables afresh (their counters start at 0), enqueues (one insert per job into ``pgqueuer``)
and drains in one run.

Each non-HOT update writes a new entry in every index of its table (a HOT update writes
none: it needs no indexed column changed and room in the page); the index column is the
table's index count times its inserts and non-HOT updates. Counts, not times: the figures
do not depend on the machine's load. PostgreSQL flushes these counters at most about once
a second per backend, so the script waits for the counts to stop moving before reading.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import time
from pathlib import Path

import sqlalchemy as sa

from bench.b1_throughput import pgqueuer_dsn, runs_batch
from bench.harness import ProcessFleet, Target, log
from bench.workloads import One

_STATS = sa.text("select relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del from pg_stat_user_tables")
_INDEXES = sa.text("select tablename, count(*) from pg_indexes where schemaname = current_schema() "
                   "group by tablename")


def _read(engine: sa.Engine) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    with engine.connect() as conn:
        conn.exec_driver_sql("select pg_stat_clear_snapshot()")
        counts = {row[0]: tuple(row[1:]) for row in conn.execute(_STATS)}
        indexes = {row[0]: row[1] for row in conn.execute(_INDEXES)}
    return counts, indexes


def _settled(engine: sa.Engine, deadline_s: float = 10.0) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """The counters once two reads 1.5 s apart agree (backends flush them lazily)."""
    last = _read(engine)
    stop = time.monotonic() + deadline_s
    while time.monotonic() < stop:
        time.sleep(1.5)
        now = _read(engine)
        if now[0] == last[0]:
            return now
        last = now
    return last


def _table(title: str, per: str, n: int, before: dict[str, tuple[int, ...]],
           after: dict[str, tuple[int, ...]], indexes: dict[str, int]) -> list[str]:
    lines = [f"{title}", f"| table | indexes | inserts/{per} | updates/{per} | of them HOT | deletes/{per} "
             f"| index entries/{per} |", "|---|---:|---:|---:|---:|---:|---:|"]
    total = [0.0] * 5
    for table in sorted(after):
        ins, upd, hot, dele = (a - b for a, b in zip(after[table], before.get(table, (0, 0, 0, 0)), strict=True))
        if not (ins or upd or dele):
            continue
        entries = indexes.get(table, 0) * (ins + upd - hot)
        row = [ins / n, upd / n, hot / n, dele / n, entries / n]
        total = [t + r for t, r in zip(total, row, strict=True)]
        lines.append(f"| `{table}` | {indexes.get(table, 0)} | " + " | ".join(f"{x:.2f}" for x in row) + " |")
    lines.append("| **total** | | " + " | ".join(f"**{x:.2f}**" for x in total) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/ductwork_bench")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--pgqueuer-python", default=None)
    args = parser.parse_args()
    target = Target.from_url(args.database_url)
    if target.kind != "postgresql":
        raise SystemExit("bench.row_writes: PostgreSQL only (it reads pg_stat_user_tables)")
    target.setup()
    target.reset()
    app = target.app()
    fleet = ProcessFleet(target, label="rowwrites").start(app)
    try:
        runs_batch(app, (fleet,), One, "w", 200, 1, timeout=300)  # warm-up
        before, _ = _settled(app.engine)
        measured = runs_batch(app, (fleet,), One, "m", args.runs, 1, timeout=900)
        after, indexes = _settled(app.engine)
    finally:
        fleet.stop()
        app.dispose()
    log(f"ductwork: {measured['runs_per_s']:.0f} runs/s (under whatever load the machine had)")
    print("\n".join(_table(f"ductwork, {args.runs} one-step runs drained", "run", args.runs, before, after,
                           indexes)))
    if args.pgqueuer_python:
        dsn = pgqueuer_dsn(target)
        engine = sa.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1),
                                  isolation_level="AUTOCOMMIT")
        script = str(Path(__file__).with_name("pgqueuer_drain.py"))
        # its script drops and recreates pgqueuer's tables: their counters start at 0
        out = subprocess.run([args.pgqueuer_python, script, "--dsn", dsn, "--jobs", str(args.runs)], check=True,
                             capture_output=True, text=True).stdout
        after, indexes = _settled(engine)
        engine.dispose()
        log(f"pgqueuer: {json.loads(out.strip().splitlines()[-1])['jobs_per_s']:.0f} jobs/s")
        print()
        print("\n".join(_table(f"pgqueuer 1.6.0, {args.runs} no-op jobs enqueued and drained", "job", args.runs,
                               {}, after, indexes)))


if __name__ == "__main__":
    main()
