"""What one ``Pipeline.trigger`` costs its caller: wall time, CPU and statements per run.

    python -m bench.trigger_cost [--database-url URL] [--runs 500] [--repeats 3] [--json PATH]

An application triggers runs one at a time, from a request handler or a consumer, while
the fleet works (issue 32: "runs triggered one at a time"). This measures the caller's
side of that alone, with no fleet: ``--runs`` runs of ``One`` (one no-op step) triggered
one after another by one thread through ``trigger_run`` (each its own transaction,
returning its ``Run`` handle), on an emptied database, ``--repeats`` times. Reported per
trigger, the median of the repeats: wall milliseconds, this process's CPU milliseconds
(user + system) and the statements SQLAlchemy sent (``before_cursor_execute``).

To compare two versions, run each tree's copy of this file side by side (A, B, A, B…)
against the same database: the figures depend on the machine and the server's load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import sqlalchemy as sa

from bench.harness import Target, log
from bench.workloads import One
from ductwork.pipelines.runs import trigger_run


def measure(target: Target, runs: int) -> dict[str, float]:
    """One repetition: ``runs`` triggers, one at a time, on an emptied database."""
    target.reset()
    app = target.app()
    sent = 0

    def capture(*_: Any) -> None:
        nonlocal sent
        sent += 1

    try:
        trigger_run(app, One, [-1])  # the App's first transaction checks the schema: not counted
        sa.event.listen(app.engine, "before_cursor_execute", capture)
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(runs):
            trigger_run(app, One, [i])
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        sa.event.remove(app.engine, "before_cursor_execute", capture)
    finally:
        app.dispose()
    return {"wall_ms": 1000 * wall / runs, "cpu_ms": 1000 * cpu / runs, "statements": sent / runs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.trigger_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=None, help="default: a temporary SQLite file")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    target = Target.from_url(args.database_url)
    try:
        target.setup()
        log(f"trigger_cost on {target.name}, {args.runs} runs × {args.repeats} (pid {os.getpid()})")
        repeats = [measure(target, args.runs) for _ in range(args.repeats)]
    finally:
        target.cleanup()
    result = {"database": target.name, "runs": args.runs, "repeats": repeats,
              "median": {k: statistics.median(r[k] for r in repeats) for k in repeats[0]}}
    m = result["median"]
    print(f"{target.name}: per trigger {m['wall_ms']:.3f} ms wall, {m['cpu_ms']:.3f} ms CPU, "
          f"{m['statements']:.2f} statements (medians of {args.repeats})")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
