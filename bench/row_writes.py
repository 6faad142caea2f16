"""Why B1 is server-bound: the rows and index entries each drained run writes, beside pgqueuer.

    python -m bench.row_writes [--database-url postgresql://…/ductwork_bench] [--runs 3000]
                               [--pgqueuer-python /tmp/pgqvenv/bin/python]
    python -m bench.row_writes --ab [--repeats 3]    # 0006's indexes full (as 0005 left them), then partial
    python -m bench.row_writes --waldump /usr/lib/postgresql/15/bin/pg_waldump   # the drain's WAL, by record

PostgreSQL only. B1's batch (one-step no-op runs inserted as ``trigger`` writes them, then
drained by a default ``ductwork start``) is run once to warm up and once measured; the
server's own per-table counters (``pg_stat_user_tables``: rows inserted, updated, updated
HOT, deleted) are read before the measured batch is inserted and after its last run
completed, so a run's figures are its trigger's writes (one insert each into runs,
branches, steps and executions; before revision 0011, jobs too) and its drain's
(everything else). Beside it, with ``--pgqueuer-python``, pgqueuer 1.6.0's drain of as
many no-op jobs
(bench/pgqueuer_drain.py, its own database), counted the same way: its script creates its
tables afresh (their counters start at 0), enqueues (one insert per job into ``pgqueuer``)
and drains in one run.

Each non-HOT update writes a new entry in every full index of its table (a HOT update
writes none: it needs no indexed column changed and room in the page); the "index entries"
column is that count for full indexes (the table's index count times its inserts and
non-HOT updates: an upper bound once some are partial). Row counts do not depend on the
machine's load; the WAL bytes per run (``pg_current_wal_lsn()`` before and after, the
server's whole write volume, index entries included) do only if nothing else writes to the
cluster meanwhile: measure them on a quiet server. PostgreSQL flushes the table counters
at most about once a second per backend, so the script waits for them to stop moving.

``--ab``: the same batch with revision 0006's nine indexes rebuilt full and its tables'
fillfactor reset (as revision 0005 left them), and as 0006 makes them, in place, alternating, ``--repeats`` times, a
fresh default fleet each time; per shape the one-step runs completed/s, WAL bytes, CPU
and statements per run, then B1's chains of 5 (100 runs) completed/s, their medians, and
0006 / 0005 per repetition: the evidence for revision 0006.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import time
from pathlib import Path

import sqlalchemy as sa

from bench.b1_throughput import pgqueuer_dsn, runs_batch
from bench.harness import ProcessFleet, Target, insert_pending, log, wait_until
from bench.workloads import CHAIN_LENGTH, Chain, One
from ductwork.db import engines, migrate, schema

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


def _wal(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").scalar_one())


def _measure(target: Target, runs: int, label: str) -> tuple[dict[str, float], dict[str, tuple[int, ...]],
                                                               dict[str, tuple[int, ...]], dict[str, int]]:
    """One warm-up and one measured batch on a fresh default fleet: B1's figures, WAL bytes
    per run, and the table counters before and after the measured batch."""
    target.reset()
    app = target.app()
    fleet = ProcessFleet(target, label=label).start(app)
    try:
        runs_batch(app, (fleet,), One, "w", 200, 1, timeout=300)  # warm-up
        before, _ = _settled(app.engine)
        wal = _wal(app.engine)
        measured = runs_batch(app, (fleet,), One, "m", runs, 1, timeout=900)
        measured["wal_bytes_per_run"] = (_wal(app.engine) - wal) / runs
        after, indexes = _settled(app.engine)
        chains = runs_batch(app, (fleet,), Chain, "c", CHAIN_RUNS, CHAIN_LENGTH, timeout=900)
        measured["chain_runs_per_s"] = chains["runs_per_s"]
    finally:
        fleet.stop()
        app.dispose()
    return measured, before, after, indexes


#: what the A/B compares: B1's one-step batch (runs/s, WAL, fleet CPU and statements per
#: run), then B1's chain batch on the same fleet (runs of 5 steps completed/s)
MEASURES = ("runs_per_s", "wal_bytes_per_run", "cpu_ms_per_step", "statements_per_step", "chain_runs_per_s")
CHAIN_RUNS = 100


def _shape(engine: sa.Engine, *, partial: bool) -> None:
    """Rebuild revision 0006's nine indexes partial (as it leaves them) or full (as 0005
    left them: five full indexes, four unique constraints), and set or reset its fillfactor,
    in place: the schema's revision stays head, so today's fleet runs on both (the bench's
    reset truncates the tables, so every page is new)."""
    path = Path(migrate.__file__).with_name("migrations") / "versions" / "0006_partial_indexes.py"
    spec = importlib.util.spec_from_file_location("ductwork_revision_0006", path)
    assert spec is not None
    assert spec.loader is not None
    revision = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(revision)
    with engine.begin() as conn:
        constraints = set(conn.exec_driver_sql("SELECT conname FROM pg_constraint WHERE contype = 'u'").scalars())
        for table in revision.UPDATED_IN_PLACE:
            conn.exec_driver_sql(f"ALTER TABLE {table} SET (fillfactor = {revision.FILLFACTOR})" if partial
                                 else f"ALTER TABLE {table} RESET (fillfactor)")
        for name, table, columns, unique, column in revision.PARTIAL:
            conn.exec_driver_sql(f"DROP INDEX {name}")
            conn.exec_driver_sql(f"CREATE {'UNIQUE ' if unique else ''}INDEX {name} ON {table} ({', '.join(columns)})"
                                 + (f" WHERE {column} IS NOT NULL" if partial else ""))
        for name, table, columns, column in revision.UNIQUE:
            if name in constraints:
                conn.exec_driver_sql(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
            else:
                conn.exec_driver_sql(f"DROP INDEX {name}")
            if partial:
                conn.exec_driver_sql(f"CREATE UNIQUE INDEX {name} ON {table} ({', '.join(columns)}) "
                                     f"WHERE {column} IS NOT NULL")
            else:
                conn.exec_driver_sql(f"ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE ({', '.join(columns)})")


def _ab(target: Target, runs: int, repeats: int) -> None:
    engine = engines.create_engine(target.url)
    got: dict[str, dict[str, list[float]]] = {"full": {}, "partial": {}}
    try:
        for rep in range(repeats):
            for shape in ("full", "partial"):
                _shape(engine, partial=shape == "partial")
                measured, *_ = _measure(target, runs, f"rw{rep}{shape[0]}")
                for key in MEASURES:
                    got[shape].setdefault(key, []).append(measured[key])
                log(f"repetition {rep + 1}, {shape} indexes: {measured['runs_per_s']:.0f} runs/s, "
                    f"{measured['wal_bytes_per_run']:.0f} WAL bytes per run")
    finally:
        _shape(engine, partial=True)
        engine.dispose()
    print(f"| measure (median of {repeats}) | as 0005 left it | as 0006 makes it | 0006 / 0005 (per repetition) |")
    print("|---|---:|---:|---:|")
    for key in MEASURES:
        a, b = got["full"][key], got["partial"][key]
        ratios = [y / x for x, y in zip(a, b, strict=True)]
        print(f"| {key} | {statistics.median(a):.3f} | {statistics.median(b):.3f} | {statistics.median(ratios):.3f} |")


def _lsn(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        return str(conn.exec_driver_sql("SELECT pg_current_wal_insert_lsn()").scalar_one())


def _waldump(target: Target, runs: int, pg_waldump: str) -> None:
    """The drain's WAL records per run, by kind and relation: pg_waldump over the LSNs from
    just after the batch's insert committed to its last run completed, this database's
    records only (other databases of the cluster may write meanwhile; their records are
    left out, but run it on a quiet server all the same)."""
    r = schema.runs
    target.reset()
    app = target.app()
    fleet = ProcessFleet(target, label="waldump").start(app)
    try:
        runs_batch(app, (fleet,), One, "w", 200, 1, timeout=300)  # warm-up
        insert_pending(app, One, runs, "m")
        start = _lsn(app.engine)  # (the fleet may have begun: a few of its records come before)

        def done() -> bool:
            with app.begin() as tx:
                return tx.execute(sa.select(sa.func.count()).where(r.c.status != "completed")).scalar_one() == 0

        wait_until(done, f"{runs} runs completed", 900, interval=0.1)
        end = _lsn(app.engine)
        with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            wal_dir = str(conn.exec_driver_sql("SHOW data_directory").scalar_one()) + "/pg_wal"
            database = str(conn.exec_driver_sql("SELECT oid FROM pg_database WHERE datname = current_database()")
                           .scalar_one())
            names = {str(n): name for n, name in conn.exec_driver_sql(
                "SELECT relfilenode, relname FROM pg_class WHERE relkind IN ('r', 'i')")}
            conn.exec_driver_sql("SELECT pg_switch_wal()")  # the last segment complete for pg_waldump
    finally:
        fleet.stop()
        app.dispose()
    dump = subprocess.run([pg_waldump, "-p", wal_dir, "-s", start, "-e", end], capture_output=True, text=True)
    counts: dict[tuple[str, str, str], int] = {}
    record = re.compile(r"rmgr: (\w+)\s.*?desc: (\w+)(?: .*?flags \S+ (.*?) ,)?.*?blkref #0: rel \d+/(\d+)/(\d+)")
    for line in dump.stdout.splitlines():
        m = record.search(line)
        if m is None or m.group(4) != database:
            continue
        rmgr, desc, lock, _, rel = m.groups()
        kind = f"{rmgr}/{desc}" + (f" ({lock.removeprefix('LOCK_ONLY ')})" if lock else "")
        key = (kind, names.get(rel, rel), "")
        counts[key] = counts.get(key, 0) + 1
    print(f"WAL records of this database per run, {runs} one-step runs drained ({start} to {end}):")
    print("| record | relation | per run |\n|---|---|---:|")
    for (kind, rel, _), n in sorted(counts.items(), key=lambda kv: -kv[1]):
        if n / runs >= 0.05:
            print(f"| {kind} | `{rel}` | {n / runs:.2f} |")
    totals: dict[str, int] = {}
    for (kind, _, _), n in counts.items():
        totals[kind.split(" ")[0]] = totals.get(kind.split(" ")[0], 0) + n
    print("\nby kind: " + ", ".join(f"{k} {n / runs:.2f}" for k, n in sorted(totals.items(), key=lambda kv: -kv[1])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="postgresql://postgres@127.0.0.1:5432/ductwork_bench")
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--pgqueuer-python", default=None)
    parser.add_argument("--ab", action="store_true", help="revision 0006's indexes full, then partial, alternating")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--waldump", metavar="PG_WALDUMP", default=None,
                        help="instead: the drain's WAL records per run by kind and table (pg_waldump's path; "
                             "the server's data directory must be readable here)")
    args = parser.parse_args()
    target = Target.from_url(args.database_url)
    if target.kind != "postgresql":
        raise SystemExit("bench.row_writes: PostgreSQL only (it reads pg_stat_user_tables)")
    target.setup()
    if args.ab:
        _ab(target, args.runs, args.repeats)
        return
    if args.waldump:
        _waldump(target, args.runs, args.waldump)
        return
    measured, before, after, indexes = _measure(target, args.runs, "rowwrites")
    log(f"ductwork: {measured['runs_per_s']:.0f} runs/s, {measured['wal_bytes_per_run']:.0f} WAL bytes per run "
        "(times and WAL: only on a quiet server)")
    print("\n".join(_table(f"ductwork, {args.runs} one-step runs drained", "run", args.runs, before, after,
                           indexes)))
    if args.pgqueuer_python:
        dsn = pgqueuer_dsn(target)
        engine = sa.create_engine(dsn.replace("postgresql://", "postgresql+psycopg://", 1),
                                  isolation_level="AUTOCOMMIT")
        script = str(Path(__file__).with_name("pgqueuer_drain.py"))
        # its script drops and recreates pgqueuer's tables: their counters start at 0
        wal = _wal(engine)
        out = subprocess.run([args.pgqueuer_python, script, "--dsn", dsn, "--jobs", str(args.runs)], check=True,
                             capture_output=True, text=True).stdout
        wal = (_wal(engine) - wal) / args.runs
        after, indexes = _settled(engine)
        engine.dispose()
        log(f"pgqueuer: {json.loads(out.strip().splitlines()[-1])['jobs_per_s']:.0f} jobs/s, {wal:.0f} WAL bytes "
            "per job (its schema's creation and the enqueue included)")
        print()
        print("\n".join(_table(f"pgqueuer 1.6.0, {args.runs} no-op jobs enqueued and drained", "job", args.runs,
                               {}, after, indexes)))


if __name__ == "__main__":
    main()
