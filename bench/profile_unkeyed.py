"""Where a worker's CPU goes on the unkeyed path (B1): one worker driven in this
process, single-threaded, batches of 64 no-op one-step runs, claim and group commit as
``ductwork start`` makes them (hand-off on, inline advancement).

    python -m bench.profile_unkeyed [--database-url URL] [--n 5000] [--chain] [--statements] [--profile tottime]

Prints executions/s and this process's CPU per execution over the last of three batches
of ``n`` (the first two warm the caches); ``--statements``: each statement's wall time
per execution (SQLAlchemy events, which cost CPU themselves); ``--profile``: a cProfile
of the batch, timed by CPU (``time.process_time``), sorted by ``tottime`` or
``cumulative``. The batch window is 10 s, so a batch is always 64 executions however
loaded the machine is: compare CPU per execution of two trees back to back (the
wall-time figures follow the load).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import re
import time

from sqlalchemy import event

from bench.harness import Target, insert_pending
from bench.workloads import Chain, One
from ductwork.fleet.worker import Worker


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--database-url", default=None)
    p.add_argument("--n", type=int, default=5000)
    p.add_argument("--chain", action="store_true", help="chains of 5 steps (n runs) instead of one-step runs")
    p.add_argument("--statements", action="store_true")
    p.add_argument("--profile", choices=("tottime", "cumulative"), default=None)
    args = p.parse_args()
    target = Target.from_url(args.database_url)
    target.setup()
    target.reset()
    app = target.app()
    worker = Worker(app, process_id=app.process_id(), hand_off=lambda: True, batch_size=64, batch_window=10.0)
    spent: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    if args.statements:
        @event.listens_for(app.engine, "before_cursor_execute")
        def before(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001 - SQLAlchemy's hook
            conn.info["bench_t"] = time.perf_counter()

        @event.listens_for(app.engine, "after_cursor_execute")
        def after(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001 - SQLAlchemy's hook
            text = re.sub(r"\s+", " ", re.sub(r"'[^']*'(, '[^']*')*", "?", statement))[:100]
            entry = spent[("many " if executemany else "") + text]
            entry[0] += 1
            entry[1] += time.perf_counter() - conn.info["bench_t"]
    profiler = cProfile.Profile(time.process_time)
    for rep in range(3):
        insert_pending(app, Chain if args.chain else One, args.n, f"pu{rep}")
        if rep == 2:
            spent.clear()
            if args.profile:
                profiler.enable()
        started, cpu = time.perf_counter(), time.process_time()
        while worker.run_once() is not None:
            pass
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    profiler.disable()
    executions = args.n * (5 if args.chain else 1)
    print(f"{executions} executions in {elapsed:.2f} s ({executions / elapsed:,.0f}/s); "
          f"CPU {cpu / executions * 1e3:.3f} ms per execution (this process)")
    for text, (count, seconds) in sorted(spent.items(), key=lambda kv: -kv[1][1])[:20]:
        print(f"{seconds / executions * 1e3:8.4f} ms/execution {count:6d}× {text}")
    if args.profile:
        pstats.Stats(profiler).sort_stats(args.profile).print_stats(40)
    app.dispose()


if __name__ == "__main__":
    main()
