"""B7 many async steps per worker thread: 1,000 ``asyncio.sleep(0.1)`` steps on the unkeyed lane.

    python -m bench.b7_async_steps [--database-url URL] [--steps 1000] [--threads 5] [--batch-size 64]

A real ``ductwork start --role worker`` (1 worker process, ``--threads`` threads, the
default ``batch_size`` of 64) drains ``--steps`` pending one-step runs of
``bench.workloads:AsyncNaps`` inserted in bulk. Reported: the wall time from the first
claim to the last completion, what plain steps would need at best (steps × 0.1 s /
threads) and the ratio; the goal is the time of a few claims (steps / (threads ×
batch_size) rounds of 0.1 s each, plus the database's work), not steps × 0.1 s / threads.
"""

from __future__ import annotations

import argparse

import sqlalchemy as sa

from bench.harness import ProcessFleet, Target, insert_pending, seconds, wait_until
from bench.workloads import AsyncNaps
from ductwork.db import schema

SLEEP_S = 0.1


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.b7_async_steps", description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=None, help="a bench database (default: a SQLite file)")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    target = Target.from_url(args.database_url)
    target.setup()
    target.reset()
    app = target.app()
    fleet = ProcessFleet(target, role="worker", workers=1, worker_threads=args.threads, label="benchasync",
                         overrides={"job_worker": {"batch_size": args.batch_size}}).start(app)
    try:
        insert_pending(app, AsyncNaps, args.steps, "as")
        e = schema.executions

        def done() -> bool:
            with app.begin() as tx:
                return tx.execute(sa.select(sa.func.count()).where(e.c.completed_at.is_(None))).scalar_one() == 0

        wait_until(done, f"{args.steps} async steps completed", timeout=600, interval=0.1)
        with app.begin() as tx:
            rows = tx.execute(sa.select(e.c.claimed_at, e.c.completed_at, e.c.outcome)).all()
    finally:
        fleet.stop()
        app.dispose()
        target.cleanup()
    assert all(outcome == "success" for _, _, outcome in rows), "every async step succeeds"
    wall = seconds(max(d for _, d, _ in rows) - min(c for c, _, _ in rows))
    plain = args.steps * SLEEP_S / args.threads
    rounds = -(-args.steps // (args.threads * args.batch_size))
    print(f"B7 {target.name}: {args.steps} async steps of asyncio.sleep({SLEEP_S}) on 1 worker process × "
          f"{args.threads} threads (batch_size {args.batch_size}): {wall:.2f} s first claim to last completion; "
          f"plain steps at best {plain:.1f} s ({plain / wall:.0f}× longer); {rounds} rounds of claims "
          f"would take {rounds * SLEEP_S:.1f} s of sleeping")


if __name__ == "__main__":
    main()
