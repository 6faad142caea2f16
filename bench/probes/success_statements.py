"""The statements of a keyed success's transaction, each timed: a diagnostic of issue 32.

    python bench/probes/success_statements.py [URL] [--runs 60]

Triggers ``--runs`` one-step runs of ``bench.workloads.ConcurrencyNap`` (one 20 ms step on
the ``concurrency: 5`` key) on an emptied bench database (SQLite by default) and drains them
with one ``Worker`` in this process, one at a time, so nothing contends. Every statement
sent inside ``pipelines.outcomes._commit`` (a success's one transaction: what follows the
step, then the lane routine's release and hand-off) is timed from SQLAlchemy's
``before_cursor_execute`` to ``after_cursor_execute``. Prints the transaction's median time
and, per statement, how many each transaction sends and their median time. A probe, no
change to the engine.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time
from typing import Any

import sqlalchemy as sa

from bench.harness import Target
from bench.workloads import ConcurrencyNap
from ductwork.app import set_default_app
from ductwork.fleet.worker import Worker
from ductwork.pipelines import outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?")
    parser.add_argument("--runs", type=int, default=60)
    args = parser.parse_args()
    target = Target.from_url(args.url)
    target.setup()
    target.reset()
    app = target.app()
    set_default_app(app)
    try:
        for _ in range(args.runs):
            ConcurrencyNap.trigger()
        inside, sent, transactions = [False], collections.defaultdict(list), []

        @sa.event.listens_for(app.engine, "before_cursor_execute")
        def _before(conn: Any, *_: Any) -> None:
            conn.info["probe_t0"] = time.perf_counter()

        @sa.event.listens_for(app.engine, "after_cursor_execute")
        def _after(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
            if inside[0]:
                sent[" ".join(statement.split()[:4])].append(1000 * (time.perf_counter() - conn.info["probe_t0"]))

        commit = outcomes._commit

        def timed(*commit_args: Any) -> Any:
            inside[0], started = True, time.perf_counter()
            try:
                return commit(*commit_args)
            finally:
                inside[0] = False
                transactions.append(1000 * (time.perf_counter() - started))

        outcomes._commit = timed
        worker = Worker(app)
        while worker.run_once() is not None:
            pass
        n = len(transactions)
        print(f"{target.name}: {n} success transactions, median {statistics.median(transactions):.2f} ms, "
              f"{sum(len(v) for v in sent.values()) / n:.1f} statements each")
        for statement, times in sorted(sent.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {len(times) / n:4.2f} a transaction, median {statistics.median(times):.3f} ms  {statement}")
    finally:
        app.dispose()
        target.cleanup()


if __name__ == "__main__":
    main()
