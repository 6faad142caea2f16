"""B6 keyed work: one key that never binds, against unkeyed work; and an idle fleet beside a saturated key.

    python -m bench --only B6 [--database-url URL] [--quick]
    python -m bench.b6_keyed [--database-url URL] [--quick]

- *keyed / unkeyed*: one default ``ductwork start`` (1 advancer process × 3 threads + 1
  worker process × 5 threads) takes, in each repetition, a batch of one-step no-op runs
  without a key, then as many of one key with ``concurrency: 50`` (more than the fleet's
  threads: the limit never binds, so what is measured is the keyed path's own cost). Each
  is timed like B1, trigger to run completed (n / (last ``runs.completed_at`` − the
  moment the batch was visible)); the ratio keyed / unkeyed is taken per repetition.
  Beside it in each repetition (PostgreSQL, with ``--pgqueuer-python``), pgqueuer 1.6.0
  drains as many no-op jobs with one ``QueueManager``, without a limit and then with the
  entrypoint's ``concurrency_limit=50`` (bench/pgqueuer_drain.py): its own limited /
  unlimited ratio, the same question asked of the peer, and ductwork's keyed runs/s over
  pgqueuer's limited jobs/s;
- *idle beside a saturated key*: the same fleet shape with a ``concurrency: 2`` key whose
  two slots are held by long bodies while a backlog of that key waits: nothing can be
  claimed, so whatever CPU the fleet uses is the cost of waiting (polls, wake-ups). CPU
  per second of the fleet's whole process tree (user + system, ``/proc``) and statements
  per second, over consecutive windows, beside the same fleet with nothing to do at all;
- the same with a 1 × 10 fleet (``job_worker.count: 10``, ``bench.harness.SHAPES``),
  its own bench after the default one's (its rows say "1×10 threads"): whether adding
  threads costs anything while a key is saturated. Not a same-run ratio: each fleet
  needs the key saturated by its own long bodies, so the two figures are medians of
  consecutive benches; compare them over several runs.

Diagnostics: executions completed/s, CPU per completed step and statements per step of
each batch (see B1).
"""

from __future__ import annotations

import json
import time

import sqlalchemy as sa

from bench.b1_throughput import pgqueuer, runs_batch, with_pgqueuer
from bench.harness import (
    SHAPES,
    FleetShape,
    Meter,
    Metric,
    ProcessFleet,
    Sizes,
    Target,
    insert_pending,
    log,
    ratio,
    wait_until,
)
from bench.workloads import SATURATED_KEY, WIDE_LIMIT, One, SaturatedNap, WideNoop
from ductwork.db import schema


def keyed_vs_unkeyed(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B6 one key `concurrency: 50`, one-step no-op runs, trigger to run completed: keyed / unkeyed"""
    n = 100 if sizes.quick else 1000
    got: dict[str, dict[str, list[float]]] = {"unkeyed": {}, "keyed": {}}
    pgq: dict[str, list[float]] = {"unlimited": [], "limited": []}
    version = "1.6.0"
    fleet = ProcessFleet(target, label="bench6").start(app)
    log(f"B6: {fleet.describe()} up")
    try:
        for rep in range(sizes.repeats):
            for kind, pipeline in (("unkeyed", One), ("keyed", WideNoop)):
                measured = runs_batch(app, (fleet,), pipeline, f"k{kind[0]}{rep}", n, 1, timeout=900)
                for k, v in measured.items():
                    got[kind].setdefault(k, []).append(v)
                log(f"B6 {kind} repetition {rep + 1}: {measured['runs_per_s']:.0f} runs/s "
                    f"(executions {measured['executions_per_s']:.0f}/s)")
            if with_pgqueuer(target, sizes):  # the peer, same repetition: what its own limit costs it
                for kind, args in (("unlimited", ()), ("limited", ("--concurrency-limit", str(WIDE_LIMIT)))):
                    line = pgqueuer(sizes, target, "--jobs", str(n), *args)
                    version = line["version"]
                    pgq[kind].append(line["jobs_per_s"])
                    log(f"pgqueuer {version} {kind} repetition {rep + 1}: {line['jobs_per_s']:.0f} jobs/s")
    finally:
        fleet.stop()
    out = {
        "keyed / unkeyed runs completed/s (per repetition)": Metric.of(
            ratio(got["keyed"]["runs_per_s"], got["unkeyed"]["runs_per_s"]), "×"),
        "keyed runs completed/s": Metric.of(got["keyed"]["runs_per_s"], "runs/s"),
        "unkeyed runs completed/s": Metric.of(got["unkeyed"]["runs_per_s"], "runs/s"),
    }
    if pgq["limited"]:
        out.update({
            f"pgqueuer {version} (1 manager): concurrency_limit={WIDE_LIMIT} / no limit, jobs/s (per repetition)":
                Metric.of(ratio(pgq["limited"], pgq["unlimited"]), "×"),
            f"pgqueuer {version}: jobs/s with concurrency_limit={WIDE_LIMIT}": Metric.of(pgq["limited"], "jobs/s"),
            f"pgqueuer {version}: jobs/s without a limit": Metric.of(pgq["unlimited"], "jobs/s"),
            "keyed: ductwork runs completed/s / pgqueuer limited jobs/s (per repetition)": Metric.of(
                ratio(got["keyed"]["runs_per_s"], pgq["limited"]), "×"),
        })
    for kind in ("keyed", "unkeyed"):
        out.update({
            f"{kind}: executions completed/s (to the last)": Metric.of(
                got[kind]["executions_per_s"], "/s", diagnostic=True),
            f"{kind}: CPU per completed step (fleet process tree)": Metric.of(
                got[kind]["cpu_ms_per_step"], "ms", diagnostic=True),
            f"{kind}: SQL statements per step": Metric.of(got[kind]["statements_per_step"], "", diagnostic=True),
        })
    out["executions completed/s: keyed / unkeyed"] = Metric.of(
        ratio(got["keyed"]["executions_per_s"], got["unkeyed"]["executions_per_s"]), "×", diagnostic=True)
    return out


def saturated_idle(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B6 idle CPU: default fleet, a `concurrency: 2` key held by long bodies, its backlog waiting"""
    return _saturated_idle(target, app, sizes, SHAPES["1×5"], "", "bench6i")


def saturated_idle_1x10(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B6 idle CPU: 1×10 fleet, a `concurrency: 2` key held by long bodies, its backlog waiting

    The same as saturated_idle with ``job_worker.count: 10``: what adding threads costs
    while a key is saturated."""
    shape = SHAPES["1×10"]
    return _saturated_idle(target, app, sizes, shape, f", {shape.name}", "bench6j")


def _saturated_idle(target: Target, app, sizes: Sizes, shape: FleetShape, suffix: str,
                    fleet_label: str) -> dict[str, Metric]:
    """One fleet of ``shape``: idle, then beside the saturated key; rows named ``kind + suffix``."""
    window = 0.5 if sizes.quick else 3.0
    # the two bodies outlast every window after their claim (settling 1 s, each window
    # plus the meter's 0.3 s) with a margin, so nothing else can be claimed meanwhile
    body_s = 1.0 + sizes.repeats * (window + 0.3) + (2.0 if sizes.quick else 4.0)
    backlog = 50 if sizes.quick else 200
    fleet = shape.fleet(target, fleet_label).start(app)
    e = schema.executions
    got: dict[str, dict[str, list[float]]] = {"nothing to do": {}, "saturated key": {}}

    def measure(kind: str) -> None:
        for _ in range(sizes.repeats):
            used = Meter(fleet).start()
            time.sleep(window)
            used = used.stop()
            got[kind].setdefault("cpu", []).append(1000 * used["cpu_s"] / used["seconds"])
            got[kind].setdefault("statements", []).append(used["statements"] / used["seconds"])
        log(f"B6 idle, {kind}{suffix}: {got[kind]['cpu'][-1]:.1f} ms CPU/s, "
            f"{got[kind]['statements'][-1]:.1f} statements/s")

    try:
        time.sleep(1.0)  # start-up settled
        measure("nothing to do")
        insert_pending(app, SaturatedNap, backlog, "sat", input_json=json.dumps(["sat", body_s]))

        def held() -> bool:
            with app.begin() as tx:
                return tx.execute(sa.select(sa.func.count()).where(
                    e.c.limit_key == SATURATED_KEY, e.c.claimed_at.is_not(None))).scalar_one() >= 2

        wait_until(held, "both slots of the saturated key held", 60)
        time.sleep(1.0)  # the other threads' failed attempts and the wake-ups of the insert settle
        measure("saturated key")
        with app.begin() as tx:
            claimed = tx.execute(sa.select(sa.func.count()).where(
                e.c.limit_key == SATURATED_KEY, e.c.claimed_at.is_not(None))).scalar_one()
        assert claimed == 2, f"{claimed} claims of a key whose two slots were held by {body_s:.0f} s bodies"
    finally:
        fleet.stop(timeout=body_s + 40)
    out = {}
    for kind in got:
        out[f"{kind}{suffix}: fleet CPU, ms per second"] = Metric.of(got[kind]["cpu"], "ms/s",
                                                                     diagnostic=kind != "saturated key")
        out[f"{kind}{suffix}: SQL statements per second"] = Metric.of(got[kind]["statements"], "/s",
                                                                      diagnostic=True)
    return out


BENCHES = [keyed_vs_unkeyed, saturated_idle, saturated_idle_1x10]


def main() -> None:
    from bench.__main__ import run_standalone

    run_standalone("B6", __doc__)


if __name__ == "__main__":
    main()
