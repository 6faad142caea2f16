"""CPU per step of one worker thread: the engine's own cost, without a fleet's contention.

    python -m bench.cpu_drain [--database-url URL] [--n 1000] [--repeats 5]

One in-process ``Worker`` (``batch_size`` 64) and one ``Advancer``, driven in turn by
this thread with ``run_once`` until both are idle, drain ``n`` one-step runs
(``bench.workloads.One``), then ``n`` chains of five steps (``Chain``), inserted first;
prints the median process CPU seconds and wall seconds of ``repeats`` drains of each.
Process CPU of one thread is far steadier than a fleet's throughput on a shared 2-core
machine, so two trees' engines compare on it (issue 31's A/B, bench/RESULTS.md). A
diagnostic, not a benchmark of record.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.harness import Target, insert_pending
from bench.workloads import Chain, One
from ductwork.fleet.processes import register
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    target = Target.from_url(args.database_url)
    target.setup()
    app = target.app()
    try:
        for name, pipeline in (("one-step runs", One), ("chains of 5", Chain)):
            cpus, walls = [], []
            for rep in range(args.repeats):
                target.reset()
                insert_pending(app, pipeline, args.n, f"c{rep}{name[0]}")
                label = f"cpu-drain-{rep}-{time.time()}"
                worker = Worker(app, process_id=register(app, role="job_worker", label=label), batch_size=64)
                advancer = Advancer(app, process_id=register(app, role="pipeline_advancer", label=f"{label}-a"))
                cpu, wall = time.process_time(), time.perf_counter()
                while worker.run_once() is not None or advancer.run_once() != "idle":
                    pass
                cpus.append(time.process_time() - cpu)
                walls.append(time.perf_counter() - wall)
            print(f"{target.name}: {name}: n={args.n} median CPU {statistics.median(cpus):.3f} s, "
                  f"wall {statistics.median(walls):.3f} s ({args.repeats} drains)", flush=True)
    finally:
        app.dispose()


if __name__ == "__main__":
    main()
