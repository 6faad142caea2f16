"""B1 end-to-end throughput: chains of no-op steps, and unkeyed claims, per fleet size.

    python -m bench --only B1 [--database-url URL] [--quick]
    python -m bench.b1_throughput [--database-url URL] [--quick]

Fleets are real ``ductwork start`` processes with ductwork's default config (polling
1 s), the bench pipelines and limits:

- *default fleet*: one advancer process × 3 threads and one worker process × 5 threads
  (the default counts);
- *more workers*: the same advancer and 2 worker processes × 5 threads;
- *no batches*: the default fleet with ``job_worker.batch_size: 1`` (one execution per
  claim and per commit), to show what batches gain.

Each repetition inserts a fresh batch while the fleet is up and idle (``INSERT …
SELECT``, row for row what ``trigger`` writes) and is timed from database rows: from
the batch's first claim to the moment 90 % of its steps were done (advanced past, for
chains; execution completed, for claims). The last 10 % are left out because a fleet
running dry waits out its 1 s idle polls, which is a latency, not a throughput. Each
figure is the median of the repetitions; each ratio is taken within a repetition pair.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

import sqlalchemy as sa

from bench.harness import (
    Metric,
    ProcessFleet,
    Sizes,
    Target,
    create_database,
    insert_pending,
    log,
    percentile_time,
    ratio,
    seconds,
    wait_until,
)
from bench.workloads import CHAIN_LENGTH, Chain, One
from ductwork.db import dialects, schema

FLEETS = {
    "default fleet": {"workers": 1},
    "more workers": {"workers": 2},
    # the default fleet one execution per claim and per commit: what batches gain
    "no batches": {"workers": 1, "overrides": {"job_worker": {"batch_size": 1}}},
}


def _prefix_like(prefix: str, kind: str) -> str:
    return f"00000000-{prefix}{kind}-%"


def _chain_batch(app, prefix: str, n: int, timeout: float) -> float:
    """One batch of ``n`` chain runs through a running fleet; returns steps/s."""
    r, s, j, e = schema.runs, schema.steps, schema.jobs, schema.executions
    insert_pending(app, Chain, n, prefix)
    mine = r.c.id.like(_prefix_like(prefix, "r"))

    def done() -> bool:
        with app.begin() as tx:
            left = tx.execute(sa.select(sa.func.count()).where(mine, r.c.status != "completed")).scalar_one()
        return left == 0

    wait_until(done, f"{n} chain runs completed", timeout, interval=0.2)
    with app.begin() as tx:
        completed = list(tx.execute(sa.select(s.c.completed_at).where(s.c.run_id.like(_prefix_like(prefix, "r"))))
                         .scalars())
        first_claim = tx.execute(
            sa.select(sa.func.min(e.c.claimed_at)).select_from(e.join(j, j.c.id == e.c.job_id))
            .join(s, s.c.id == j.c.step_id).where(s.c.run_id.like(_prefix_like(prefix, "r")))
        ).scalar_one()
    assert len(completed) == n * CHAIN_LENGTH, (len(completed), n)
    t90 = percentile_time(completed, 0.9)
    return 0.9 * len(completed) / seconds(t90 - first_claim)


def drain_jobs(sizes: Sizes) -> int:
    """Jobs per drained batch: enough that a drain outlasts the fleet's start (each thread
    finds the batch at its next poll, up to ``polling_timeout`` later) many times over."""
    return 150 if sizes.quick else 5000


def _drain_batch(app, prefix: str, n: int, timeout: float) -> float:
    """One batch of ``n`` one-step unkeyed runs drained by a running fleet; returns claims/s."""
    e = schema.executions
    insert_pending(app, One, n, prefix)
    mine = e.c.id.like(_prefix_like(prefix, "e"))

    def done() -> bool:
        with app.begin() as tx:
            left = tx.execute(sa.select(sa.func.count()).where(mine, e.c.completed_at.is_(None))).scalar_one()
        return left == 0

    wait_until(done, f"{n} unkeyed executions completed", timeout, interval=0.2)
    with app.begin() as tx:
        rows = tx.execute(sa.select(e.c.claimed_at, e.c.completed_at, e.c.outcome).where(mine)).all()
    assert all(o == "success" for _, _, o in rows), "every no-op execution succeeds"
    first = min(c for c, _, _ in rows)
    t90 = percentile_time([d for _, d, _ in rows], 0.9)
    return 0.9 * len(rows) / seconds(t90 - first)


def _per_fleet(target: Target, app, sizes: Sizes, role: str, batch, n: int, tag: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for name, kwargs in FLEETS.items():
        fleet = ProcessFleet(target, role=role, label=f"bench{tag}", **kwargs).start(app)
        log(f"{tag}: {name} ({fleet.describe()}) up")
        try:
            out[name] = []
            for rep in range(sizes.repeats):
                value = batch(app, f"{tag}{name[0]}{rep}", n, timeout=600)
                log(f"{tag}: {name} repetition {rep + 1}: {value:.0f}/s")
                out[name].append(value)
        finally:
            fleet.stop()
    return out


def chain_steps(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B1 chains of 5 no-op steps, trigger to done (processes)"""
    n = 20 if sizes.quick else 100
    got = _per_fleet(target, app, sizes, "all", _chain_batch, n, "c")
    return {
        "steps/s, default fleet (1 adv×3 + 1 wrk×5)": Metric.of(got["default fleet"], "steps/s"),
        "steps/s, more workers (1 adv×3 + 2 wrk×5)": Metric.of(got["more workers"], "steps/s"),
        "more workers / default": Metric.of(ratio(got["more workers"], got["default fleet"]), "×"),
        "steps/s, default fleet without batches (batch_size 1)": Metric.of(got["no batches"], "steps/s"),
        "default / without batches": Metric.of(ratio(got["default fleet"], got["no batches"]), "×"),
    }


def pgqueuer_drains(target: Target, sizes: Sizes, jobs: int) -> tuple[str, list[float]]:
    """pgqueuer's no-op drain on the same server (its own database), once per repetition."""
    parsed = dialects.normalize_url(target.url)
    database = f"{parsed.database}_pgq"
    create_database(parsed._replace(database=database), "postgresql")
    dsn = parsed._replace(database=database, drivername="postgresql").render_as_string(hide_password=False)
    got, version = [], "?"
    for rep in range(sizes.repeats):
        done = subprocess.run([sizes.pgqueuer_python, str(Path(__file__).with_name("pgqueuer_drain.py")),
                               "--dsn", dsn, "--jobs", str(jobs)], capture_output=True, text=True, check=True)
        line = json.loads(done.stdout.strip().splitlines()[-1])
        got.append(line["jobs_per_s"])
        version = line["version"]
        log(f"pgqueuer {version}: repetition {rep + 1}: {got[-1]:.0f}/s")
    return version, got


def unkeyed_claims(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B1 unkeyed one-step jobs drained: claim + run + commit (worker processes)"""
    n = drain_jobs(sizes)
    got = _per_fleet(target, app, sizes, "worker", _drain_batch, n, "u")
    compared = {}
    if sizes.pgqueuer_python and target.kind == "postgresql":
        version, pgq = pgqueuer_drains(target, sizes, n)
        compared = {
            f"pgqueuer {version} drain, jobs/s (1 process, its defaults)": Metric.of(pgq, "jobs/s"),
            "default fleet / pgqueuer (medians)": Metric.of(
                [statistics.median(got["default fleet"]) / statistics.median(pgq)], "×"),
            "more workers / pgqueuer (medians)": Metric.of(
                [statistics.median(got["more workers"]) / statistics.median(pgq)], "×"),
        }
    return {
        "claims/s, default fleet (1 wrk×5)": Metric.of(got["default fleet"], "claims/s"),
        "claims/s, more workers (2 wrk×5)": Metric.of(got["more workers"], "claims/s"),
        "more workers / default": Metric.of(ratio(got["more workers"], got["default fleet"]), "×"),
        "claims/s, default fleet without batches (batch_size 1)": Metric.of(got["no batches"], "claims/s"),
        "default / without batches": Metric.of(ratio(got["default fleet"], got["no batches"]), "×"),
        **compared,
    }


BENCHES = [chain_steps, unkeyed_claims]


def main() -> None:
    from bench.__main__ import run_standalone

    run_standalone("B1", __doc__)


if __name__ == "__main__":
    main()
