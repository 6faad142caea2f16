"""B7 many async steps per worker thread: 1,000 ``asyncio.sleep(0.1)`` one-step runs.

    python -m bench --only B7 [--database-url URL] [--quick] [--pgqueuer-python PATH]
    python -m bench.b7_async_steps [--database-url URL] [--quick] [--pgqueuer-python PATH]

A real ``ductwork start --role worker`` (1 worker process × 5 threads, the default
``batch_size`` of 64, no advancer: a one-step run completes in its step's commit)
drains 1,000 pending one-step runs of ``bench.workloads:AsyncNaps`` inserted in bulk, three
times. Reported, as a user sees it: runs completed per second, from the insert to the
last run completed, and the same as a multiple of what plain (synchronous) steps could
do at best on those threads (5 threads / 0.1 s = 50 per second). Beside it in each
repetition (PostgreSQL, with ``--pgqueuer-python``), pgqueuer 1.6.0 drains as many jobs
whose body is ``await asyncio.sleep(0.1)`` with one ``QueueManager`` (its defaults, no
concurrency limit): ratio ductwork / pgqueuer per repetition. CPU per completed step
(the worker process tree) is a diagnostic.
"""

from __future__ import annotations

from bench.b1_throughput import pgqueuer, runs_batch, with_pgqueuer
from bench.harness import Metric, ProcessFleet, Sizes, Target, log, ratio
from bench.workloads import AsyncNaps

SLEEP_S = 0.1
THREADS = 5


def async_steps(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B7 async one-step runs, 0.1 s each, 1 worker process × 5 threads"""
    n = 200 if sizes.quick else 1000
    got: dict[str, list[float]] = {"runs_per_s": [], "cpu_ms_per_step": []}
    pgq: list[float] = []
    version = "1.6.0"
    fleet = ProcessFleet(target, role="worker", workers=1, worker_threads=THREADS, label="bench7").start(app)
    try:
        for rep in range(sizes.repeats):
            measured = runs_batch(app, (fleet,), AsyncNaps, f"a{rep}", n, 1, timeout=600)
            got["runs_per_s"].append(measured["runs_per_s"])
            got["cpu_ms_per_step"].append(measured["cpu_ms_per_step"])
            log(f"B7 repetition {rep + 1}: {measured['runs_per_s']:.0f} runs/s")
            if with_pgqueuer(target, sizes):
                line = pgqueuer(sizes, target, "--jobs", str(n), "--sleep", str(SLEEP_S))
                version = line["version"]
                pgq.append(line["jobs_per_s"])
                log(f"pgqueuer {version} repetition {rep + 1}: {line['jobs_per_s']:.0f} jobs/s")
    finally:
        fleet.stop()
    plain = THREADS / SLEEP_S
    out = {
        "async runs completed/s (insert to last run completed)": Metric.of(got["runs_per_s"], "runs/s"),
        f"the same / plain steps at best ({plain:.0f}/s on {THREADS} threads)": Metric.of(
            [v / plain for v in got["runs_per_s"]], "×"),
    }
    if pgq:
        out["ductwork / pgqueuer (per repetition)"] = Metric.of(ratio(got["runs_per_s"], pgq), "×")
        out[f"pgqueuer {version} (1 manager, no limit): jobs/s, same run"] = Metric.of(pgq, "jobs/s")
    out["CPU per completed step (worker process tree)"] = Metric.of(got["cpu_ms_per_step"], "ms",
                                                                   diagnostic=True)
    return out


BENCHES = [async_steps]


def main() -> None:
    from bench.__main__ import run_standalone

    run_standalone("B7", __doc__)


if __name__ == "__main__":
    main()
