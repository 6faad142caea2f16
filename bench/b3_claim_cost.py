"""B3 claim cost against backlog: ``claim_next`` latency with 10³ … 10⁶ pending jobs.

    python -m bench --only B3 [--database-url URL] [--quick] [--full]
    python -m bench.b3_claim_cost [--database-url URL] [--quick] [--full]

One lane at a time: the backlog is grown in place (``INSERT … SELECT``, one run holding
every pending step, jobs never executed) to 10³, 10⁴, 10⁵ pending executions (10⁶ with
``--full``: minutes of inserting per database), statistics are refreshed (``ANALYZE``,
what autovacuum or InnoDB's auto-stats would do), and ``ductwork.limits.claims.claim`` is
timed in this process, one call after another, on one connection pool: the unkeyed
lane, then a keyed lane (``bench_backlog``: concurrency 10⁶ and rate 10⁶/s, so every
decision admits and the bucket arithmetic still runs). Claimed executions are marked
completed after each size so the key's in-flight count stays small.

Figures: the median latency per size, and largest / smallest (the goal is 1.0: flat).
"""

from __future__ import annotations

import statistics
import time

from bench.harness import Metric, Sizes, Target, insert_pending, log
from bench.workloads import Backlog, One
from ductwork.db import schema
from ductwork.fleet.processes import register
from ductwork.limits.claims import claim


def _sizes(sizes: Sizes) -> list[int]:
    if sizes.quick:
        return [1_000, 10_000]
    return [1_000, 10_000, 100_000] + ([1_000_000] if sizes.full else [])


def _complete_claimed(app, process_id: str) -> None:
    e = schema.executions
    with app.begin() as tx:
        tx.execute(e.update().where(e.c.process_id == process_id, e.c.completed_at.is_(None))
                   .values(completed_at=tx.now, outcome="success", updated_at=tx.now))


def _lane(target: Target, app, sizes: Sizes, pipeline, tag: str, calls: int) -> dict[int, float]:
    process_id = register(app, role="inline", label=f"bench-b3-{tag}")
    medians: dict[int, float] = {}
    have = 0
    for size in _sizes(sizes):
        t0 = time.perf_counter()
        insert_pending(app, pipeline, size - have, f"{tag}{size}", one_run=True)
        have = size
        target.analyze(app)
        log(f"B3 {tag}: {size:,} pending (inserted in {time.perf_counter() - t0:.1f} s)")
        # A keyed lane's bucket is created empty by its first decision (semantics §5), so
        # the very first claim of the key is refused for a microsecond: warm up first.
        for _ in range(10):
            if claim(app, process_id) is not None:
                break
        latencies = []
        for _ in range(calls):
            start = time.perf_counter()
            claimed = claim(app, process_id)
            latencies.append(time.perf_counter() - start)
            assert claimed is not None, f"B3 {tag}: nothing claimed with {size} pending"
        _complete_claimed(app, process_id)
        medians[size] = statistics.median(latencies) * 1000
        log(f"B3 {tag}: median claim_next {medians[size]:.2f} ms")
    return medians


def claim_latency(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B3 claim_next latency against the backlog (this process, sequential calls)"""
    calls = 50 if sizes.quick else 200
    out: dict[str, Metric] = {}
    for lane, pipeline, tag in (("unkeyed", One, "u"), ("keyed", Backlog, "k")):
        app.dispose()  # no pooled connection may outlive the reset (SQLite swaps the file)
        target.reset()
        medians = _lane(target, app, sizes, pipeline, tag, calls)
        for size, ms in medians.items():
            out[f"{lane}: median latency, {size:,} pending"] = Metric(ms, "ms", note=f"median of {calls} calls")
        lo, hi = min(medians), max(medians)
        out[f"{lane}: {hi:,} / {lo:,} pending"] = Metric(medians[hi] / medians[lo], "×")
    return out


BENCHES = [claim_latency]


def main() -> None:
    from bench.__main__ import run_standalone

    run_standalone("B3", __doc__)


if __name__ == "__main__":
    main()
