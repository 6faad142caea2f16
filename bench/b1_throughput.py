"""B1 runs completed per second, trigger to run completed, beside pgqueuer's drain.

    python -m bench --only B1 [--database-url URL] [--quick] [--pgqueuer-python PATH]
    python -m bench.b1_throughput [--database-url URL] [--quick]

What a user sees: a batch of runs triggered, and the moment each run is *completed*
(``runs.completed_at``). Fleets are real ``ductwork start`` processes with ductwork's
default config (1 advancer process × 3 threads, 1 worker process × 5 threads, polling
1 s), the bench pipelines and limits.

Headline figures (each repetition inserts a fresh batch while the fleet is up and idle,
``INSERT … SELECT``, row for row what ``trigger`` writes, which wakes the fleet as
``trigger`` does; times are database times):

- *one-step runs*: 5,000 one-step no-op runs; runs completed/s = n / (last
  ``runs.completed_at`` − the moment the batch was visible, read in a transaction right
  after the insert committed). Beside it, in the same repetition, pgqueuer 1.6.0 drains
  5,000 no-op jobs (bench/pgqueuer_drain.py, its own database on the same server, one
  ``QueueManager`` with its defaults, timed from ``run()`` to an empty queue), and the
  ratio ductwork / pgqueuer is taken per repetition;
- *chains*: 100 runs of a 5-step no-op chain; runs completed/s the same way.

Diagnostics (engine-internal, listed below the headlines): the same batch's executions
completed/s (to its last execution: the gap to the runs' figure is the time spent
completing runs after their work was done), the figures to 90 % of the batch (no tail),
CPU per completed step (user + system CPU of the fleet's whole process tree over the
batch / steps) and SQL statements per step (bench/probes/sitecustomize.py), and the
unkeyed claim drain of worker-only fleets (first claim → 90 % of executions completed).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import sqlalchemy as sa

from bench.harness import (
    Meter,
    Metric,
    ProcessFleet,
    Sizes,
    Target,
    create_database,
    insert_pending,
    log,
    per_step,
    percentile_time,
    ratio,
    seconds,
    wait_until,
)
from bench.workloads import CHAIN_LENGTH, Chain, One
from ductwork.db import engines, schema

#: worker-only fleets of the claim-drain diagnostic
CLAIM_FLEETS = {
    "default fleet": {"workers": 1},
    "more workers": {"workers": 2},
}


def _prefix_like(prefix: str, kind: str) -> str:
    return f"00000000-{prefix}{kind}-%"


def drain_jobs(sizes: Sizes) -> int:
    """Jobs per drained batch: enough that a drain outlasts the fleet's start (each thread
    finds the batch at its next poll, up to ``polling_timeout`` later) many times over."""
    return 150 if sizes.quick else 5000


def runs_batch(app, fleets: tuple[ProcessFleet, ...], pipeline, prefix: str, n: int, steps_per_run: int,
               timeout: float, input_json: str = "[0]") -> dict[str, float]:
    """One batch of ``n`` runs through running fleets, timed to each run's completion.

    Returns runs/s and executions/s (to the last, and to 90 %), CPU ms and statements per
    step over the batch (from just before the insert to its last run completed).
    """
    r, s, e = schema.runs, schema.steps, schema.executions
    meter = Meter(*fleets).start()
    insert_pending(app, pipeline, n, prefix, input_json=input_json)
    with app.begin() as tx:
        visible = tx.now
    mine = r.c.id.like(_prefix_like(prefix, "r"))

    def done() -> bool:
        with app.begin() as tx:
            return tx.execute(sa.select(sa.func.count()).where(mine, r.c.status != "completed")).scalar_one() == 0

    wait_until(done, f"{n} runs of {pipeline.__name__} completed", timeout, interval=0.1)
    used = meter.stop()
    with app.begin() as tx:
        runs_done = list(tx.execute(sa.select(r.c.completed_at).where(mine)).scalars())
        executions_done = list(tx.execute(
            sa.select(e.c.completed_at).select_from(e.join(s, s.c.id == e.c.step_id))
            .where(s.c.run_id.like(_prefix_like(prefix, "r")))).scalars())
    assert len(runs_done) == n, (len(runs_done), n)
    assert len(executions_done) == n * steps_per_run, (len(executions_done), n)
    last_run, last_execution = max(runs_done), max(executions_done)
    return {
        "runs_per_s": n / seconds(last_run - visible),
        "runs_per_s_90": 0.9 * n / seconds(percentile_time(runs_done, 0.9) - visible),
        "executions_per_s": len(executions_done) / seconds(last_execution - visible),
        "completion_lag_s": seconds(last_run - last_execution),
        **per_step(used, n * steps_per_run),
    }


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


def pgqueuer_dsn(target: Target) -> str:
    """pgqueuer's own database on the same server (``<bench database>_pgq``), created if missing."""
    parsed = engines.normalize_url(target.url)
    database = f"{parsed.database}_pgq"
    create_database(parsed._replace(database=database), "postgresql")
    return parsed._replace(database=database, drivername="postgresql").render_as_string(hide_password=False)


def pgqueuer(sizes: Sizes, target: Target, *args: str, timeout: float = 900) -> dict:
    """Run bench/pgqueuer_drain.py once in pgqueuer's interpreter; its JSON line."""
    done = subprocess.run([sizes.pgqueuer_python, str(Path(__file__).with_name("pgqueuer_drain.py")),
                           "--dsn", pgqueuer_dsn(target), *args],
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"pgqueuer_drain.py failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def with_pgqueuer(target: Target, sizes: Sizes) -> bool:
    return bool(sizes.pgqueuer_python) and target.kind == "postgresql"


def one_step_runs(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B1 one-step no-op runs, trigger to run completed (default `ductwork start`)"""
    n = drain_jobs(sizes)
    got: dict[str, list[float]] = {}
    pgq: dict[str, list[float]] = {"per_s": [], "per_s_90": []}
    version = "1.6.0"
    fleet = ProcessFleet(target, label="bench1r").start(app)
    log(f"B1 runs: {fleet.describe()} up")
    try:
        for rep in range(sizes.repeats):
            measured = runs_batch(app, (fleet,), One, f"r{rep}", n, 1, timeout=900)
            for k, v in measured.items():
                got.setdefault(k, []).append(v)
            log(f"B1 runs repetition {rep + 1}: {measured['runs_per_s']:.0f} runs/s "
                f"(executions {measured['executions_per_s']:.0f}/s, runs completed "
                f"{measured['completion_lag_s']:.1f} s after the last execution)")
            if with_pgqueuer(target, sizes):
                line = pgqueuer(sizes, target, "--jobs", str(n))
                version = line["version"]
                pgq["per_s"].append(line["jobs_per_s"])
                pgq["per_s_90"].append(line["jobs_per_s_90"])
                log(f"pgqueuer {version} repetition {rep + 1}: {line['jobs_per_s']:.0f} jobs/s")
    finally:
        fleet.stop()
    out = {"runs completed/s": Metric.of(got["runs_per_s"], "runs/s")}
    if pgq["per_s"]:
        out[f"pgqueuer {version} drain of as many no-op jobs, jobs/s (same run)"] = Metric.of(pgq["per_s"], "jobs/s")
        out["ductwork / pgqueuer (per repetition)"] = Metric.of(ratio(got["runs_per_s"], pgq["per_s"]), "×")
        out["to 90 % of the batch: ductwork / pgqueuer"] = Metric.of(
            ratio(got["runs_per_s_90"], pgq["per_s_90"]), "×", diagnostic=True)
    out.update({
        "executions completed/s, same batch (to its last execution)": Metric.of(
            got["executions_per_s"], "/s", diagnostic=True),
        "runs completed after the last execution, s": Metric.of(got["completion_lag_s"], "s", diagnostic=True),
        "runs completed/s to 90 % of the batch": Metric.of(got["runs_per_s_90"], "runs/s", diagnostic=True),
        "CPU per completed step (fleet process tree)": Metric.of(got["cpu_ms_per_step"], "ms", diagnostic=True),
        "SQL statements per step": Metric.of(got["statements_per_step"], "", diagnostic=True),
    })
    return out


def chain_runs(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B1 chains of 5 no-op steps, trigger to run completed (default `ductwork start`)"""
    n = 20 if sizes.quick else 100
    got: dict[str, list[float]] = {}
    fleet = ProcessFleet(target, label="bench1c").start(app)
    log(f"B1 chains: {fleet.describe()} up")
    try:
        for rep in range(sizes.repeats):
            measured = runs_batch(app, (fleet,), Chain, f"c{rep}", n, CHAIN_LENGTH, timeout=900)
            for k, v in measured.items():
                got.setdefault(k, []).append(v)
            log(f"B1 chains repetition {rep + 1}: {measured['runs_per_s']:.1f} runs/s")
    finally:
        fleet.stop()
    return {
        "runs completed/s": Metric.of(got["runs_per_s"], "runs/s"),
        "steps completed/s (runs/s × 5)": Metric.of([v * CHAIN_LENGTH for v in got["runs_per_s"]], "steps/s"),
        "CPU per completed step (fleet process tree)": Metric.of(got["cpu_ms_per_step"], "ms", diagnostic=True),
        "SQL statements per step": Metric.of(got["statements_per_step"], "", diagnostic=True),
    }


def unkeyed_claims(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B1 unkeyed executions drained by worker-only fleets: claim + run + commit"""
    n = drain_jobs(sizes)
    got: dict[str, list[float]] = {}
    fleets = {"default fleet": CLAIM_FLEETS["default fleet"]} if sizes.quick else CLAIM_FLEETS  # smoke: one
    for name, kwargs in fleets.items():
        fleet = ProcessFleet(target, role="worker", label="bench1u", **kwargs).start(app)
        log(f"B1 claims: {name} ({fleet.describe()}) up")
        try:
            got[name] = []
            for rep in range(sizes.repeats):
                got[name].append(_drain_batch(app, f"u{name[0]}{rep}", n, timeout=600))
                log(f"B1 claims: {name} repetition {rep + 1}: {got[name][-1]:.0f}/s")
        finally:
            fleet.stop()
    out = {"claims/s, default fleet (1 wrk×5), first claim → 90 % executed": Metric.of(
        got["default fleet"], "claims/s", diagnostic=True)}
    if "more workers" in got:
        out["claims/s, more workers (2 wrk×5)"] = Metric.of(got["more workers"], "claims/s", diagnostic=True)
        out["more workers / default"] = Metric.of(ratio(got["more workers"], got["default fleet"]), "×",
                                                  diagnostic=True)
    return out


BENCHES = [one_step_runs, chain_runs, unkeyed_claims]


def main() -> None:
    from bench.__main__ import run_standalone

    run_standalone("B1", __doc__)


if __name__ == "__main__":
    main()
