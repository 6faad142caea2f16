"""B2 limit precision: how much of a limit the fleet uses, and that it never exceeds it.

    python -m bench --only B2 [--database-url URL] [--quick]
    python -m bench.b2_limits [--database-url URL] [--quick]

Three keys, each fed a batch of 20 ms steps (``bench.workloads.Nap``) in turn, drained
by real worker processes (2 processes × 5 threads, ductwork's default polling of 1 s):

- ``concurrency: 5``: ideal 5 slots busy, 5 / 20 ms = 250 steps/s;
- ``rate: {limit: 200, per: 1s}`` (default burst, one second's worth = 200): ideal 200/s;
- ``rate: {limit: 200, per: 1s, burst: 1}``: ideal 200/s with nothing banked, so every
  late claim is throughput lost for good.

Before each rate batch the key's bucket is emptied (the state right after a spent
burst), so "ideal" is exactly the refill rate. Figures come from execution rows, in
database time, over the middle of each batch (from its 10 % to its 90 % claim), which
leaves out the first wake-up and the tail:

- *achieved / ideal*: claims per second in that window over the ideal rate;
- *mean slots in use*: the time-average of claimed-not-completed executions of the key
  (a slot is in use from its claim to its completion, commit included);
- *violations*: for concurrency, a sweep of the key's ``claim_seq`` / ``release_seq``
  events counting claims that made more than 5 in flight; for rates, the exact
  token-bucket bound over every pair of claims i ≤ j: ``(j − i + 1) ≤ burst + limit ×
  (t_j − t_i) / per``, in integer microseconds, over every claim the key ever had. Must be 0.
"""

from __future__ import annotations

import sqlalchemy as sa

from bench.harness import Metric, ProcessFleet, Sizes, Target, insert_pending, log, wait_until
from bench.workloads import (
    CONCURRENCY_KEY,
    LIMITS,
    NAP_S,
    RATE_BURST1_KEY,
    RATE_KEY,
    ConcurrencyNap,
    RateBurst1Nap,
    RateNap,
)
from ductwork.db import schema
from ductwork.db.clock import to_us
from ductwork.limit_entries import parse_limits

SCENARIOS = {
    "concurrency 5": (ConcurrencyNap, CONCURRENCY_KEY),
    "rate 200/s": (RateNap, RATE_KEY),
    "rate 200/s, burst 1": (RateBurst1Nap, RATE_BURST1_KEY),
}


def _empty_bucket(app, key: str) -> None:
    """The key's buckets at zero as of now (a burst just spent); no-op before its first claim."""
    with app.begin() as tx:
        now_us = tx.now_us
        tx.execute(schema.limit_buckets.update().where(schema.limit_buckets.c.key == key)
                   .values(level_units=0, refilled_at_us=now_us, updated_at=tx.now))
        tx.execute(schema.limit_keys.update().where(schema.limit_keys.c.key == key).values(blocked_until=None))


def concurrency_violations(events: list[tuple[int | None, int | None]], limit: int) -> tuple[int, int]:
    """(violations, peak in flight) from (claim_seq, release_seq) pairs of one key."""
    sweep = sorted([(c, 1) for c, _ in events if c is not None] + [(r, -1) for _, r in events if r is not None])
    in_flight = peak = violations = 0
    for _, delta in sweep:
        in_flight += delta
        peak = max(peak, in_flight)
        if delta > 0 and in_flight > limit:
            violations += 1
    return violations, peak


def rate_violations(claim_us: list[int], limit: int, per_s: int, burst: int) -> int:
    """Claims j for which some i <= j has (j-i+1)·P·10⁶ > B·P·10⁶ + L·(t_j − t_i): O(n)."""
    unit = per_s * 1_000_000
    lowest = None
    violations = 0
    for k, t in enumerate(sorted(claim_us)):
        g_prev = (k - 1) * unit - limit * t  # g(i-1) form: i = k counts claim k itself
        lowest = g_prev if lowest is None else min(lowest, g_prev)
        if k * unit - limit * t - lowest > burst * unit:
            violations += 1
    return violations


def _batch(app, prefix: str, pipeline, key: str, n: int) -> dict[str, float]:
    e = schema.executions
    if key != CONCURRENCY_KEY:
        _empty_bucket(app, key)
    insert_pending(app, pipeline, n, prefix)
    mine = e.c.id.like(f"00000000-{prefix}e-%")

    def done() -> bool:
        with app.begin() as tx:
            return tx.execute(sa.select(sa.func.count()).where(mine, e.c.completed_at.is_(None))).scalar_one() == 0

    wait_until(done, f"{n} executions of {key} completed", timeout=max(60.0, n / 20))
    with app.begin() as tx:
        rows = tx.execute(sa.select(e.c.claimed_at, e.c.completed_at).where(mine)).all()
    claims = sorted(to_us(c) for c, _ in rows)
    a, b = claims[len(claims) // 10], claims[(len(claims) * 9) // 10]
    window_s = (b - a) / 1e6
    in_window = sum(1 for c in claims if a <= c <= b)
    busy_us = sum(max(0, min(to_us(d), b) - max(to_us(c), a)) for c, d in rows)
    return {"rate": in_window / window_s, "slots": busy_us / (b - a)}


def _violations(app, key: str) -> int:
    e = schema.executions
    with app.begin() as tx:
        rows = tx.execute(sa.select(e.c.claim_seq, e.c.release_seq, e.c.claimed_at)
                          .where(e.c.limit_key == key, e.c.claimed_at.is_not(None))).all()
    entry = parse_limits(LIMITS)[key]
    count = 0
    if entry.concurrency is not None:
        count += concurrency_violations([(c, r) for c, r, _ in rows], entry.concurrency)[0]
    for rate in entry.rates:
        count += rate_violations([to_us(t) for _, _, t in rows], rate.limit, rate.per_s, rate.burst)
    return count


def limit_precision(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B2 limit precision, 20 ms steps (2 worker processes × 5 threads)"""
    n = 60 if sizes.quick else 300
    got: dict[str, dict[str, list[float]]] = {name: {"rate": [], "slots": []} for name in SCENARIOS}
    fleet = ProcessFleet(target, role="worker", workers=2, label="benchlim").start(app)
    log(f"B2: {fleet.describe()} up")
    try:
        for rep in range(sizes.repeats):
            for i, (name, (pipeline, key)) in enumerate(SCENARIOS.items()):
                measured = _batch(app, f"l{rep}{i}", pipeline, key, n)
                log(f"B2: {name} repetition {rep + 1}: {measured['rate']:.0f}/s, "
                    f"{measured['slots']:.2f} slots in use")
                for k, v in measured.items():
                    got[name][k].append(v)
    finally:
        fleet.stop()
    out: dict[str, Metric] = {}
    ideal = {"concurrency 5": 5 / NAP_S, "rate 200/s": 200.0, "rate 200/s, burst 1": 200.0}
    ideal_slots = {"concurrency 5": "of 5", "rate 200/s": "4 needed", "rate 200/s, burst 1": "4 needed"}
    for name, (_, key) in SCENARIOS.items():
        out[f"{name}: achieved / ideal ({ideal[name]:.0f}/s)"] = Metric.of(
            [r / ideal[name] for r in got[name]["rate"]], "×")
        out[f"{name}: mean slots in use ({ideal_slots[name]})"] = Metric.of(got[name]["slots"], "")
        out[f"{name}: violations"] = Metric(_violations(app, key), "", note="over every claim of the key")
    return out


BENCHES = [limit_precision]


def main() -> None:
    from bench.__main__ import run_standalone

    run_standalone("B2", __doc__)


if __name__ == "__main__":
    main()
