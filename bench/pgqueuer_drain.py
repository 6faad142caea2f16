"""pgqueuer's drain of no-op jobs on the same PostgreSQL, for B1's same-run comparison.

    python bench/pgqueuer_drain.py --dsn postgresql://postgres@127.0.0.1:5432/ductwork_bench_pgq --jobs 5000

Not imported by ductwork or its tests: run with an interpreter where ``pgqueuer[asyncpg]``
is installed (``python -m bench --pgqueuer-python PATH`` runs it that way, e.g. from a
virtualenv made by ``python -m venv /tmp/pgq && /tmp/pgq/bin/pip install
'pgqueuer[asyncpg]==1.6.0'``). It installs pgqueuer's schema in its own database, enqueues
``--jobs`` no-op jobs in one statement, then times one ``QueueManager`` in drain mode
(pgqueuer's defaults: batch_size 10, one process) from start until the queue is empty,
and prints one JSON line ``{"jobs_per_s": …, "version": …}``. Each repetition starts from a fresh schema.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


async def drain_once(dsn: str, jobs: int) -> float:
    import asyncpg
    from pgqueuer import QueueManager
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    connection = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(connection))
    if await queries.schema_is_installed():  # a fresh schema for every repetition
        await queries.uninstall()
    await queries.install()
    await queries.enqueue(["noop"] * jobs, [None] * jobs, [0] * jobs)
    manager = QueueManager(queries)
    done = 0

    @manager.entrypoint("noop")
    async def noop(job) -> None:  # noqa: ARG001 - pgqueuer passes the job
        nonlocal done
        done += 1

    started = time.perf_counter()
    await manager.run(mode=QueueExecutionMode.drain)
    elapsed = time.perf_counter() - started
    await connection.close()
    if done != jobs:
        raise SystemExit(f"pgqueuer drained {done} of {jobs} jobs")
    return jobs / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--jobs", type=int, default=5000)
    args = parser.parse_args()
    from importlib.metadata import version

    print(json.dumps({"jobs_per_s": asyncio.run(drain_once(args.dsn, args.jobs)), "version": version("pgqueuer")}))


if __name__ == "__main__":
    main()
