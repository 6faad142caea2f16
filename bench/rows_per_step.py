"""Rows and statements per one-step run and per keyed step, on any of the three databases.

    python -m bench.rows_per_step [--runs 200] [--database-url URL] [--json PATH]

Two batches, each on an emptied database and a default App: ``--runs`` runs of ``One``
(one unkeyed no-op step), then as many of ``WideNoop`` (one no-op step keyed by
``bench_wide``, whose concurrency never binds). Each batch is triggered through
``trigger_run`` (one run, one transaction, as ``Pipeline.trigger`` writes it) and drained
in this process (``ductwork.testing.drain``: an advancer and a worker in turn, the worker
claiming, running and recording in batches, a simple leaf ended inline).

Per run of the batch:

- **rows**: the rows the run leaves in each ductwork table once completed (all of them the
  run's own: ``ductwork prune`` deletes exactly these). A key's header row and the drain's
  process row are not the run's and are not counted;
- **statements**: what SQLAlchemy sent (``before_cursor_execute``; an ``executemany`` is
  one), by verb, for the trigger and for the drain apart. The drain's figures include its
  idle polls and the last empty claim, spread over the batch; on PostgreSQL and
  MySQL/MariaDB the lane routine's writes (the executions' claim and release, the key's
  header) happen inside its one call, counted as one statement.

Row counts do not depend on the machine; statement counts do not either, but for the
drain's idle polls (a few per batch). Compare two versions with the same ``--runs``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

import sqlalchemy as sa

from bench.harness import Target, log
from bench.workloads import One, WideNoop
from ductwork.db import schema
from ductwork.pipelines.runs import trigger_run
from ductwork.testing import drain

#: tables whose rows are not a run's (a key's header, a process, refusal counters)
NOT_THE_RUNS = ("ductwork_processes", "ductwork_limit_keys", "ductwork_limit_buckets", "ductwork_key_refusals")
VERBS = ("INSERT", "UPDATE", "DELETE", "SELECT", "CALL")


def _verb(statement: str) -> str:
    word = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else ""
    return word if word in VERBS else "other"


def _rows(app: Any) -> dict[str, int]:
    with app.begin(readonly=True) as tx:
        return {t.name: tx.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                for t in schema.metadata.sorted_tables if t.name not in NOT_THE_RUNS}


def measure(target: Target, pipeline: type, runs: int) -> dict[str, Any]:
    """One batch of ``runs`` runs of ``pipeline``: rows and statements per run."""
    target.reset()
    app = target.app()
    sent: Counter[str] = Counter()

    def capture(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001 - SQLAlchemy's hook
        sent[_verb(statement)] += 1

    try:
        app.process_id()  # the drain's process row, registered before counting
        sa.event.listen(app.engine, "before_cursor_execute", capture)
        for i in range(runs):
            trigger_run(app, pipeline, [i])
        triggered, trigger_statements = _rows(app), dict(sent)
        sent.clear()
        drain(app, timeout=600)
        drain_statements = dict(sent)
        sa.event.remove(app.engine, "before_cursor_execute", capture)
        rows = _rows(app)
    finally:
        app.dispose()
    return {
        "pipeline": pipeline.__name__, "runs": runs,
        "rows_per_run": {t: n / runs for t, n in rows.items() if n},
        "rows_after_trigger_per_run": {t: n / runs for t, n in triggered.items() if n},
        "statements_per_run": {
            "trigger": {v: n / runs for v, n in sorted(trigger_statements.items())},
            "drain": {v: n / runs for v, n in sorted(drain_statements.items())},
        },
    }


def _report(result: dict[str, Any]) -> list[str]:
    rows = result["rows_per_run"]
    statements = result["statements_per_run"]
    tables = ", ".join(f"{t.removeprefix('ductwork_')} {n:g}" for t, n in sorted(rows.items()))
    lines = [f"{result['pipeline']} ({result['runs']} runs): rows per run {sum(rows.values()):.2f} ({tables})"]
    for phase in ("trigger", "drain"):
        counts = statements[phase]
        lines.append(f"  statements per run, {phase}: {sum(counts.values()):.2f} "
                     f"({', '.join(f'{v} {n:.2f}' for v, n in counts.items())})")
    total = sum(sum(c.values()) for c in statements.values())
    lines.append(f"  statements per run, total: {total:.2f}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rows_per_step", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    target = Target.from_url(args.database_url)
    try:
        target.setup()
        log(f"rows_per_step on {target.describe()}")
        results = [measure(target, pipeline, args.runs) for pipeline in (One, WideNoop)]
    finally:
        target.cleanup()
    for result in results:
        print("\n".join(_report(result)))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"database": target.name, "results": results}, out, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
