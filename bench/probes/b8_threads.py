"""B8's drain by worker threads of one process, with what their polls cost: a diagnostic of issue 34.

    python -m bench.probes.b8_threads [URL] [--runs 2000] [--partitions 1000] [--threads 5]

Empties the bench database (SQLite by default), inserts ``--runs`` one-step ``Tenants`` runs
round-robin over ``--partitions`` partitions of ``bench_tenant`` (``concurrency: 1`` each,
``bench.b8_partitions.insert_partitioned``), registers one process and drains them with
``--threads`` ``Worker`` threads in this process (``batch_size`` 64, hand-offs on), each
polling until three polls in a row find nothing. Prints steps per second over the drain,
this process's CPU per step, SQL statements per step (the most frequent, by kind), and what
each lane's claim (``claims._claim_lane``) took: executions, or nothing (refused for
concurrency, counted by the refusal callback, or gone). A probe, no change to the engine.
"""

from __future__ import annotations

import argparse
import collections
import threading
import time

from sqlalchemy import event

from bench import b8_partitions as b8
from bench.harness import Target
from ductwork.fleet.processes import register
from ductwork.fleet.worker import Worker
from ductwork.limits import claims


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.b8_threads", description=__doc__.split("\n")[0])
    parser.add_argument("url", nargs="?", default=None, help="a database URL (default: a SQLite file)")
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=5)
    args = parser.parse_args()
    target = Target.from_url(args.url)
    target.setup()
    target.reset()
    app = b8.b8_app(target)
    b8.insert_partitioned(app, args.runs, "p", args.partitions, b8.round_robin(args.partitions))
    process = register(app, role="worker")
    statements: collections.Counter[str] = collections.Counter()
    event.listen(app.engine, "before_cursor_execute",
                 lambda _c, _cur, text, *_: statements.update([" ".join(text.split())[:60]]))
    refusals: collections.Counter[str] = collections.Counter()
    sizes: collections.Counter[int] = collections.Counter()
    claim_lane = claims._claim_lane

    def counted(*a, **k):
        got = claim_lane(*a, **k)
        sizes[len(got[0])] += 1  # (what it claimed, whether that filled the key)
        return got

    claims._claim_lane = counted

    def work() -> None:
        worker = Worker(app, process_id=process, hand_off=lambda: True, batch_size=64, threads=args.threads,
                        refused=lambda r: refusals.update([r.reason]))
        idle = 0
        while idle < 3:
            if worker.run_once() is None:
                idle += 1
                time.sleep(0.01)
            else:
                idle = 0

    start, cpu = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=work) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    n = args.runs
    print(f"{args.threads} threads: {n / wall:.0f} steps/s, {1000 * cpu / n:.2f} ms CPU a step, "
          f"{sum(statements.values()) / n:.2f} statements a step")
    print(f"lane claims by executions taken: {dict(sorted(sizes.items()))}; refusals: {dict(refusals)}")
    for text, count in statements.most_common(6):
        print(f"{count / n:6.2f}  {text}")
    app.dispose()


if __name__ == "__main__":
    main()
