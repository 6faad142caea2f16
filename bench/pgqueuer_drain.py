"""pgqueuer's side of B1 and B2, on the same PostgreSQL, for same-run comparisons.

    python bench/pgqueuer_drain.py --dsn postgresql://postgres@127.0.0.1:5432/ductwork_bench_pgq --jobs 5000
    python bench/pgqueuer_drain.py --dsn … --jobs 300 --concurrency-limit 3 --sleep 0.05 --managers 2

Not imported by ductwork or its tests: run with an interpreter where ``pgqueuer[asyncpg]``
is installed (``python -m bench --pgqueuer-python PATH`` runs it that way, e.g. from a
virtualenv made by ``python -m venv /tmp/pgq && /tmp/pgq/bin/pip install
'pgqueuer[asyncpg]==1.6.0'``). Each run starts from a fresh pgqueuer schema in its own
database, enqueues ``--jobs`` jobs in one statement, then runs ``--managers`` processes,
each one ``QueueManager`` with pgqueuer's defaults (batch_size 10) in drain mode, until
the queue is empty. It prints one JSON line:

- ``jobs_per_s``: jobs / (from the first manager's ``run()`` to the last one's return:
  the queue drained and every job acknowledged; interpreter start-up is not timed);
  ``jobs_per_s_90``: 90 % of the jobs / the time the 90 % body finished (no tail);
- ``intervals``: each body's (start, end) wall-clock seconds, which the bench turns into
  bodies/s and mean bodies running exactly as it does for ductwork's witness lines.

With ``--concurrency-limit`` the entrypoint is registered with
``concurrency_limit=N`` (pgqueuer enforces it in SQL across managers); with ``--sleep``
the body is ``await asyncio.sleep(seconds)``, else a no-op.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time


async def _connect(dsn: str):
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(dsn)
    return connection, Queries(AsyncpgDriver(connection))


async def prepare(dsn: str, jobs: int) -> None:
    connection, queries = await _connect(dsn)
    if await queries.schema_is_installed():  # a fresh schema for every run
        await queries.uninstall()
    await queries.install()
    await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
    await connection.close()


async def consume(dsn: str, limit: int, sleep: float) -> dict:
    from pgqueuer import QueueManager
    from pgqueuer.types import QueueExecutionMode

    connection, queries = await _connect(dsn)
    manager = QueueManager(queries)
    intervals: list[tuple[float, float]] = []

    @manager.entrypoint("noop", concurrency_limit=limit)
    async def noop(job) -> None:  # noqa: ARG001 - pgqueuer passes the job
        started = time.time()
        if sleep:
            await asyncio.sleep(sleep)
        intervals.append((started, time.time()))

    started = time.time()
    await manager.run(mode=QueueExecutionMode.drain)
    ended = time.time()
    await connection.close()
    return {"started": started, "ended": ended, "intervals": intervals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--concurrency-limit", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--managers", type=int, default=1)
    parser.add_argument("--consume", action="store_true", help="(internal) one manager process")
    args = parser.parse_args()
    if args.consume:
        print(json.dumps(asyncio.run(consume(args.dsn, args.concurrency_limit, args.sleep))))
        return
    from importlib.metadata import version

    asyncio.run(prepare(args.dsn, args.jobs))
    command = [sys.executable, __file__, "--dsn", args.dsn, "--consume",
               "--concurrency-limit", str(args.concurrency_limit), "--sleep", str(args.sleep)]
    managers = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(args.managers)]
    outputs = [m.communicate()[0] for m in managers]
    if any(m.returncode for m in managers):
        raise SystemExit("a pgqueuer manager failed")
    lines = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    # from the first manager's run() (its imports and connection are not timed) to the last's return
    started = min(line["started"] for line in lines)
    elapsed = max(line["ended"] for line in lines) - started
    intervals = [tuple(i) for line in lines for i in line["intervals"]]
    if len(intervals) != args.jobs:
        raise SystemExit(f"pgqueuer ran {len(intervals)} of {args.jobs} jobs")
    ends = sorted(e for _, e in intervals)
    t90 = ends[round(0.9 * len(ends)) - 1]
    print(json.dumps({"jobs_per_s": args.jobs / elapsed, "jobs_per_s_90": 0.9 * args.jobs / (t90 - started),
                      "intervals": intervals, "version": version("pgqueuer")}))


if __name__ == "__main__":
    main()
