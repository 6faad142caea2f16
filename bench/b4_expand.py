"""B4 an expand of N items: the advancer's time to create every child, and its peak memory.

    python -m bench --only B4 [--database-url URL] [--quick] [--full]
    python -m bench.b4_expand [--database-url URL] [--quick] [--full]

Setup, in this process: trigger one run of ``bench.workloads.Expand`` and record its start
step's success as ``record_success`` would (job output ``{"expand_items": N}``, N rows of
``ductwork_expand_items`` inserted with ``INSERT … SELECT``, step ``advancing``).

Measured in a separate process (``python -m bench.b4_expand --advance-child URL``): a
fresh interpreter builds an App, registers a process row, warms up (one query), notes
its RSS, then times one ``Advancer.run_once()``, which claims the branch and creates the
children in batches of ``expand_batch`` (default 1000) per transaction. It reports the
elapsed time and its peak RSS (``ru_maxrss``). The parent checks that exactly N
children exist.

Sizes: 5·10³ and 2.5·10⁴ (10³ and 5·10³ with ``--quick``); ``--full`` runs 10⁴, 10⁵ and
10⁶ (the 10⁶ case once: tens of minutes per database at the current children/s). Peak-RSS growth
of the largest over the smallest size says
whether memory is flat in N.
"""

from __future__ import annotations

import argparse
import json
import time

import sqlalchemy as sa

from bench.harness import Metric, Sizes, Target, _numbers, log, peak_rss_kib, run_child
from bench.workloads import Expand
from ductwork.db import schema


def _sizes(sizes: Sizes) -> list[int]:
    if sizes.quick:
        return [1_000, 5_000]
    if sizes.full:
        return [10_000, 100_000, 1_000_000]
    return [5_000, 25_000]


def prepare(app, n: int) -> str:
    """A run whose start step succeeded with an N-item list; returns its start branch id."""
    from ductwork.pipelines.runs import trigger_run

    run = trigger_run(app, Expand, [n])
    s, e, x = schema.steps, schema.executions, schema.expand_items
    with app.begin() as tx:
        step_id, branch_id = tx.execute(sa.select(s.c.id, s.c.branch_id).where(s.c.run_id == run.id)).one()
        nums, i = _numbers(n)
        tx.execute(x.insert().from_select(["step_id", "item_index", "value"],
                                          sa.select(sa.literal(step_id, sa.String), i, sa.cast(i, sa.String))
                                          .select_from(nums)))
        tx.execute(e.update().where(e.c.step_id == step_id)
                   .values(claimed_at=tx.now, completed_at=tx.now, outcome="success", updated_at=tx.now))
        tx.execute(s.update().where(s.c.id == step_id).values(
            output_payload=json.dumps({"expand_items": n}), status="advancing", updated_at=tx.now))
    return branch_id


def advance_child(url: str) -> None:
    """The measured process: one run_once of a fresh advancer; prints a JSON line."""
    from bench.harness import bench_config
    from ductwork.app import App
    from ductwork.fleet.processes import register
    from ductwork.pipelines.advance import Advancer

    app = App(url, bench_config())
    process_id = register(app, role="pipeline_advancer", label="bench-b4")
    app.now()
    baseline = peak_rss_kib()
    start = time.perf_counter()
    outcome = Advancer(app, process_id=process_id).run_once()
    elapsed = time.perf_counter() - start
    print(json.dumps({"outcome": outcome, "seconds": elapsed, "peak_rss_kib": peak_rss_kib(),
                      "baseline_rss_kib": baseline}))
    app.dispose()


def expand_advance(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B4 expand: advancer time to create all children, and peak RSS (separate process)"""
    out: dict[str, Metric] = {}
    growth: dict[int, list[float]] = {}
    for n in _sizes(sizes):
        reps = 1 if n >= 1_000_000 else sizes.repeats
        times, peaks = [], []
        growth[n] = []
        for _rep in range(reps):
            app.dispose()
            target.reset()
            t0 = time.perf_counter()
            branch_id = prepare(app, n)
            log(f"B4: {n:,} items prepared in {time.perf_counter() - t0:.1f} s")
            got = run_child("bench.b4_expand", ["--advance-child", target.url], timeout=3600)
            assert got["outcome"] == "advanced", got
            with app.begin() as tx:
                children = tx.execute(sa.select(sa.func.count()).where(schema.branches.c.parent_id == branch_id)
                                      ).scalar_one()
            assert children == n, f"B4: {children} children of {n}"
            log(f"B4: {n:,} children in {got['seconds']:.1f} s, peak RSS {got['peak_rss_kib'] / 1024:.0f} MiB")
            times.append(got["seconds"])
            peaks.append(got["peak_rss_kib"] / 1024)
            growth[n].append((got["peak_rss_kib"] - got["baseline_rss_kib"]) / 1024)
        out[f"{n:,} items: time to create all children"] = Metric.of(times, "s")
        out[f"{n:,} items: children/s"] = Metric.of([n / t for t in times], "/s")
        out[f"{n:,} items: advancer peak RSS"] = Metric.of(peaks, "MiB")
        out[f"{n:,} items: RSS growth during the expand"] = Metric.of(growth[n], "MiB")
    return out


BENCHES = [expand_advance]


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--advance-child", default=None)
    known, _ = parser.parse_known_args()
    if known.advance_child:
        advance_child(known.advance_child)
        return
    from bench.__main__ import run_standalone

    run_standalone("B4", __doc__)


if __name__ == "__main__":
    main()
