"""Fleet experiments: B1's chain and drain throughput with one engine behaviour patched out.

    python -m bench.fleet_experiments [--database-url URL] [--repeats 2] [--patches no_notify,no_fsync]
    python -m bench.fleet_experiments --limits --patches no_fsync,switch_interval
    python -m bench.fleet_experiments --b6 --repeats 3 --patches no_notify

Runs the B1 batches (chains of 5 no-op steps, trigger to run completed; one-step unkeyed
claim drains) through real
``ductwork start`` fleets, the default one and the one with more workers, once per
*mode*: ``baseline`` (the engine as it is) and each patch of
``bench/experiments/sitecustomize.py`` (loaded into the fleet's processes only):
``no_notify`` (no ``pg_notify`` in transactions that create or complete executions)
and ``no_fsync`` (``synchronous_commit = off``). Both patches are PostgreSQL-only; on
other databases only the baseline runs. A mode's ratio to the baseline is what that
behaviour costs. Not a benchmark of the product: an aid for the optimisation proposals
in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics

from bench.b1_throughput import _drain_batch, runs_batch
from bench.harness import ProcessFleet, Target, log
from bench.workloads import CHAIN_LENGTH, NAP_S, Chain

FLEETS = {"default fleet": {"workers": 1}, "more workers": {"workers": 2}}


def _chain_batch(app, fleet: ProcessFleet, prefix: str, n: int, timeout: float) -> float:
    """Chain steps completed/s, trigger to run completed (B1's chain batch)."""
    return runs_batch(app, (fleet,), Chain, prefix, n, CHAIN_LENGTH, timeout)["runs_per_s"] * CHAIN_LENGTH


def _drain(app, _fleet: ProcessFleet, prefix: str, n: int, timeout: float) -> float:
    return _drain_batch(app, prefix, n, timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--patches", default="no_notify,no_fsync")
    parser.add_argument("--chain-runs", type=int, default=100)
    parser.add_argument("--drain-jobs", type=int, default=1000)
    parser.add_argument("--limits", action="store_true",
                        help="instead of B1: B2's concurrency-5 and rate-200/s-burst-1 batches, per patch")
    parser.add_argument("--limit-jobs", type=int, default=300)
    parser.add_argument("--b6", action="store_true",
                        help="instead of B1: B6's keyed / unkeyed batches of one-step no-op runs, per patch")
    parser.add_argument("--b6-runs", type=int, default=1000)
    args = parser.parse_args()
    target = Target.from_url(args.database_url)
    target.setup()
    target.reset()
    pg_only = {"no_notify", "no_fsync", "key_skip_locked"}
    modes = [()] + [tuple(p.split("+")) for p in args.patches.split(",")
                    if p and (target.kind == "postgresql" or not set(p.split("+")) & pg_only)]
    if args.limits:
        return limits(target, args, modes)
    if args.b6:
        return keyed(target, args, modes)
    results: dict[tuple[str, str, str], list[float]] = {}
    app = target.app()
    try:
        for fleet_name, kwargs in FLEETS.items():
            for patches in modes:
                mode = "+".join(patches) or "baseline"
                for what, role, batch, n in (("chain steps/s", "all", _chain_batch, args.chain_runs),
                                             ("drain claims/s", "worker", _drain, args.drain_jobs)):
                    # Empty tables for every fleet: a drain leaves its one-step runs advanceable, and
                    # the next fleet's advancer would spend its first batch completing them.
                    app.dispose()
                    target.reset()
                    fleet = ProcessFleet(target, role=role, label=f"benchx{len(results)}", patches=patches,
                                         **kwargs).start(app)
                    try:
                        got = results.setdefault((fleet_name, mode, what), [])
                        for rep in range(args.repeats):
                            got.append(batch(app, fleet, f"x{len(results)}{rep}", n, timeout=600))
                            log(f"{fleet_name}, {mode}: {what} {got[-1]:.0f}")
                    finally:
                        fleet.stop()
    finally:
        app.dispose()
    print(f"\n## {target.name}: fleet experiments (median of {args.repeats})\n")
    print("| fleet | mode | chain steps/s | × baseline | drain claims/s | × baseline |")
    print("|---|---|---:|---:|---:|---:|")
    for fleet_name in FLEETS:
        base = {w: statistics.median(results[(fleet_name, "baseline", w)]) for w in ("chain steps/s", "drain claims/s")}
        for patches in modes:
            mode = "+".join(patches) or "baseline"
            c = statistics.median(results[(fleet_name, mode, "chain steps/s")])
            d = statistics.median(results[(fleet_name, mode, "drain claims/s")])
            print(f"| {fleet_name} | {mode} | {c:.0f} | {c / base['chain steps/s']:.2f}× | {d:.0f} | "
                  f"{d / base['drain claims/s']:.2f}× |")


def limits(target: Target, args: argparse.Namespace, modes: list[tuple[str, ...]]) -> None:
    from bench.b2_limits import SCENARIOS, _batch

    scenarios = {k: v for k, v in SCENARIOS.items() if k in ("concurrency 5", "rate 200/s, burst 1")}
    ideal = {"concurrency 5": 250.0, "rate 200/s, burst 1": 200.0}
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    app = target.app()
    try:
        for rep in range(args.repeats):
            for patches in modes:
                mode = "+".join(patches) or "baseline"
                app.dispose()
                target.reset()
                fleet = ProcessFleet(target, workers=2, label=f"benchy{rep}{mode}", patches=patches).start(app)
                try:
                    for i, (name, (pipeline, key)) in enumerate(scenarios.items()):
                        got = _batch(app, (fleet,), f"y{rep}{len(results)}{i}", pipeline, key, args.limit_jobs, NAP_S)
                        results.setdefault((mode, name), []).append(
                            (got["bodies_per_s"] / ideal[name], got["running"]))
                        log(f"{mode}: {name}: bodies {got['bodies_per_s'] / ideal[name]:.2f} of ideal, "
                            f"{got['running']:.2f} running")
                finally:
                    fleet.stop()
    finally:
        app.dispose()
    print(f"\n## {target.name}: limit experiments, 1 adv×3 + 2 wrk×5 (median of {args.repeats})\n")
    print("| mode | " + " | ".join(f"{n}: bodies/s / ideal | {n}: bodies running" for n in scenarios) + " |")
    print("|---|" + "---:|---:|" * len(scenarios))
    for patches in modes:
        mode = "+".join(patches) or "baseline"
        cells = []
        for name in scenarios:
            values = results[(mode, name)]
            cells += [f"{statistics.median(v[0] for v in values):.2f}",
                      f"{statistics.median(v[1] for v in values):.2f}"]
        print(f"| {mode} | " + " | ".join(cells) + " |")


def keyed(target: Target, args: argparse.Namespace, modes: list[tuple[str, ...]]) -> None:
    """B6's batches (one-step no-op runs unkeyed, then of one ``concurrency: 50`` key, trigger
    to run completed) on a default fleet per mode and repetition, modes alternating."""
    from bench.workloads import One, WideNoop

    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    app = target.app()
    try:
        for rep in range(args.repeats):
            for patches in modes:
                mode = "+".join(patches) or "baseline"
                app.dispose()
                target.reset()
                fleet = ProcessFleet(target, label=f"benchz{rep}{len(results)}", patches=patches).start(app)
                try:
                    for kind, pipeline in (("unkeyed", One), ("keyed", WideNoop)):
                        got = runs_batch(app, (fleet,), pipeline, f"z{rep}{len(results)}{kind[0]}", args.b6_runs, 1,
                                         timeout=900)
                        results.setdefault((mode, kind), []).append(got)
                        log(f"{mode}: B6 {kind}: {got['runs_per_s']:.0f} runs/s, {got['cpu_ms_per_step']:.2f} ms CPU "
                            f"and {got['statements_per_step']:.2f} statements per step")
                finally:
                    fleet.stop()
    finally:
        app.dispose()
    print(f"\n## {target.name}: B6 experiments, default fleet (median of {args.repeats})\n")
    print("| mode | keyed runs/s | keyed / unkeyed | keyed CPU ms/step | keyed statements/step |")
    print("|---|---:|---:|---:|---:|")
    for patches in modes:
        mode = "+".join(patches) or "baseline"
        k, u = results[(mode, "keyed")], results[(mode, "unkeyed")]
        print(f"| {mode} | {statistics.median(x['runs_per_s'] for x in k):.0f} | "
              f"{statistics.median(a['runs_per_s'] / b['runs_per_s'] for a, b in zip(k, u, strict=True)):.3f} | "
              f"{statistics.median(x['cpu_ms_per_step'] for x in k):.2f} | "
              f"{statistics.median(x['statements_per_step'] for x in k):.2f} |")


if __name__ == "__main__":
    main()
