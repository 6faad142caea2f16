"""B5 a rate-blocked key holding 10⁵ pending jobs does not slow unkeyed work.

    python -m bench --only B5 [--database-url URL] [--quick]
    python -m bench.b5_blocked_key [--database-url URL] [--quick]

Two measurements, each taken without ("none") and then with ("blocked") the blocked
backlog, in the same run:

- *drain*: batches of one-step unkeyed no-op runs drained by the default worker fleet
  (1 worker process × 5 threads, real ``ductwork start --role worker``), timed from
  rows like B1;
- *latency*: ``claim_next`` in this process, one call after another, on an unkeyed
  backlog of 500.

The blocked backlog: 10⁵ pending executions (10⁴ with ``--quick``) of key
``bench_blocked`` (``rate: {limit: 1, per: 1h}``), inserted in bulk; one ``claim_next``
then finds the key's (empty) bucket short and stamps ``blocked_until`` an hour ahead,
as a real fleet would. Figures are blocked / none (goal: 1.0) and the number of
blocked-key claims (must be 0).
"""

from __future__ import annotations

import statistics
import time

import sqlalchemy as sa

from bench.b1_throughput import _drain_batch, drain_jobs
from bench.harness import Metric, ProcessFleet, Sizes, Target, insert_pending, log, ratio
from bench.workloads import BLOCKED_KEY, Blocked, One
from ductwork.db import schema
from ductwork.fleet.processes import register
from ductwork.limits.claims import claim


def _drains(target: Target, app, sizes: Sizes, tag: str) -> list[float]:
    n = drain_jobs(sizes)
    fleet = ProcessFleet(target, role="worker", workers=1, label=f"bench{tag}").start(app)
    try:
        out = []
        for rep in range(sizes.repeats):
            out.append(_drain_batch(app, f"{tag}{rep}", n, timeout=600))
            log(f"B5 {tag}: drain repetition {rep + 1}: {out[-1]:.0f}/s")
        return out
    finally:
        fleet.stop()


def _latencies(app, tag: str, calls: int) -> float:
    e = schema.executions
    process_id = register(app, role="inline", label=f"bench-b5-{tag}")
    insert_pending(app, One, 500, f"{tag}lat", one_run=True)
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        claimed = claim(app, process_id)
        samples.append(time.perf_counter() - start)
        assert claimed is not None
        assert claimed.limit_key is None, claimed
    with app.begin() as tx:  # take the rest of this backlog out of the way of later drains
        tx.execute(e.update().where(e.c.id.like(f"00000000-{tag}late-%"), e.c.completed_at.is_(None))
                   .values(claimed_at=tx.now, completed_at=tx.now, outcome="success", updated_at=tx.now))
    return statistics.median(samples) * 1000


def blocked_key(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B5 unkeyed work beside a rate-blocked key's backlog (blocked / none)"""
    backlog = 10_000 if sizes.quick else 100_000
    calls = 50 if sizes.quick else 200
    none_drain = _drains(target, app, sizes, "n")
    none_latency = [_latencies(app, f"n{i}", calls) for i in range(sizes.repeats)]
    t0 = time.perf_counter()
    insert_pending(app, Blocked, backlog, "blk", one_run=True)
    target.analyze(app)
    assert claim(app, register(app, role="inline", label="bench-b5-stamp")) is None
    k = schema.limit_keys
    with app.begin() as tx:
        blocked_until, now = tx.execute(sa.select(k.c.blocked_until).where(k.c.key == BLOCKED_KEY)).scalar(), tx.now
    assert blocked_until is not None, "the key is rate-blocked"
    assert blocked_until > now, "the key is rate-blocked"
    log(f"B5: {backlog:,} blocked pending (inserted in {time.perf_counter() - t0:.1f} s), "
        f"blocked for {(blocked_until - now).total_seconds():.0f} s")
    blocked_latency = [_latencies(app, f"b{i}", calls) for i in range(sizes.repeats)]
    blocked_drain = _drains(target, app, sizes, "b")
    e = schema.executions
    with app.begin() as tx:
        leaked = tx.execute(sa.select(sa.func.count()).where(e.c.limit_key == BLOCKED_KEY,
                                                             e.c.claimed_at.is_not(None))).scalar_one()
    return {
        "drain claims/s, none (1 wrk×5)": Metric.of(none_drain, "claims/s"),
        f"drain claims/s, {backlog:,} blocked pending": Metric.of(blocked_drain, "claims/s"),
        "drain blocked / none": Metric.of(ratio(blocked_drain, none_drain), "×"),
        "claim_next latency, none": Metric.of(none_latency, "ms"),
        f"claim_next latency, {backlog:,} blocked pending": Metric.of(blocked_latency, "ms"),
        "latency blocked / none": Metric.of(ratio(blocked_latency, none_latency), "×"),
        "claims of the blocked key": Metric(leaked),
    }


BENCHES = [blocked_key]


def main() -> None:
    from bench.__main__ import run_standalone

    run_standalone("B5", __doc__)


if __name__ == "__main__":
    main()
