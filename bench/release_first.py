"""When should a full key's success be released first? ``job_worker.release_first_after`` A/B.

    python -m bench.release_first [--database-url URL] [--repeats 3] [--b6-runs 1000] [--b2-bodies 300]

The same code, two configs, measured in alternation within one run so that both see the
same machine: *always* (``release_first_after: 0``: every success whose claim filled its
key is released first, its step advanced in a second transaction, as issue 15's fourth
pass did) and *paced* (the default, 5 ms: only after a body that slow). Per repetition
and mode, a fresh default ``ductwork start`` with that config runs:

- B6's keyed batch: one-step no-op runs of one ``concurrency: 50`` key, trigger to run
  completed (what a user sees), with the fleet's CPU and statements per step;
- B2's ``concurrency: 5`` batch: 20 ms bodies on a two-worker-process fleet, bodies/s as
  witnessed by the bodies, over the ideal 250/s, and mean bodies running (of 5).

Prints per-repetition figures and the medians; ``paced / always`` is taken per repetition.
Not a product benchmark (``python -m bench`` is): the evidence for the default.
"""

from __future__ import annotations

import argparse
import json
import statistics

from bench.b1_throughput import runs_batch
from bench.b2_limits import _batch
from bench.harness import ProcessFleet, Target, log
from bench.workloads import NAP_S, WideNoop

MODES = {"always": {"job_worker": {"release_first_after": 0}}, "paced": {}}


def main() -> None:
    from bench.b2_limits import SCENARIOS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=None, help="default: a fresh SQLite file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--b6-runs", type=int, default=1000)
    parser.add_argument("--b2-bodies", type=int, default=300)
    parser.add_argument("--json", default=None, help="write every sample to this file")
    args = parser.parse_args()
    target = Target.from_url(args.database_url)
    target.setup()
    target.reset()
    pipeline, key = SCENARIOS["concurrency 5"]
    got: dict[str, dict[str, list[float]]] = {mode: {} for mode in MODES}
    app = target.app()
    try:
        for rep in range(args.repeats):
            for mode, overrides in MODES.items():
                app.dispose()
                target.reset()
                fleet = ProcessFleet(target, label=f"rf{rep}{mode[0]}", overrides=overrides).start(app)
                try:
                    b6 = runs_batch(app, (fleet,), WideNoop, f"r{rep}{mode[0]}", args.b6_runs, 1, timeout=900)
                finally:
                    fleet.stop()
                fleet = ProcessFleet(target, workers=2, label=f"rf{rep}{mode[0]}2", overrides=overrides).start(app)
                try:
                    b2 = _batch(app, (fleet,), f"c{rep}{mode[0]}", pipeline, key, args.b2_bodies, NAP_S)
                finally:
                    fleet.stop()
                row = got[mode]
                for name, value in (("B6 keyed runs/s", b6["runs_per_s"]),
                                    ("B6 CPU ms per keyed step", b6["cpu_ms_per_step"]),
                                    ("B6 statements per keyed step", b6["statements_per_step"]),
                                    ("B2 c5 bodies/s / 250", b2["bodies_per_s"] / (5 / NAP_S)),
                                    ("B2 c5 mean bodies running", b2["running"]),
                                    ("B2 c5 CPU ms per step", b2["cpu_ms_per_step"])):
                    row.setdefault(name, []).append(value)
                log(f"{target.kind} {mode} repetition {rep + 1}: B6 {b6['runs_per_s']:.0f} runs/s, "
                    f"{b6['cpu_ms_per_step']:.2f} ms, {b6['statements_per_step']:.2f} statements per step; "
                    f"B2 c5 {b2['bodies_per_s'] / (5 / NAP_S):.3f} of ideal, {b2['running']:.2f} running")
    finally:
        app.dispose()
    print(f"\n{target.kind}: medians of {args.repeats}")
    print("| measure | always (0) | paced (5 ms) | paced / always (per repetition) |")
    print("|---|---:|---:|---:|")
    for name in got["always"]:
        a, p = got["always"][name], got["paced"][name]
        ratios = [y / x for x, y in zip(a, p, strict=True) if x]
        print(f"| {name} | {statistics.median(a):.3g} | {statistics.median(p):.3g} | "
              f"{statistics.median(ratios):.3f}× |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"database": target.kind, "repeats": args.repeats, "samples": got}, out, indent=1)


if __name__ == "__main__":
    main()
