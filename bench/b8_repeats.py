"""B8's two headline figures repeated on one database, for the medians of three the goals are judged by.

    python -m bench.b8_repeats [URL]              # claim latency, three runs (URL: a server; none: SQLite)
    python -m bench.b8_repeats [URL] --fairness   # fairness with 10⁴ in the big partition (--full's size)

``python -m bench --only B8`` runs each figure once per size (claim latency: the median of
100 calls per size in one run) with the big partition of 10³; this runs
``b8_partitions.claim_latency`` three times, each on a fresh database, and prints each
10⁴ / 10 ratio and their median, or ``b8_partitions.fairness`` at the issue's size (the big
partition 10⁴, three repetitions, as ``--full`` would). Results of 2026-12-06:
``bench/results/b8-2026-12-06-walk-repeats.txt``.
"""

from __future__ import annotations

import argparse
import statistics

from bench import b8_partitions as b8
from bench.harness import Sizes, Target


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.b8_repeats", description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", default=None, help="a database URL (default: a SQLite file)")
    parser.add_argument("--fairness", action="store_true", help="fairness at 10⁴ instead of claim latency")
    args = parser.parse_args()
    runs = 1 if args.fairness else 3
    figures: dict[str, list[float]] = {}
    for _ in range(runs):
        target = Target.from_url(args.url)
        target.setup()
        target.reset()
        app = target.app()
        try:
            metrics = (b8.fairness(target, app, Sizes(full=True)) if args.fairness
                       else b8.claim_latency(target, app, Sizes()))
        finally:
            app.dispose()
            target.reset()
            target.cleanup()
        for name, metric in metrics.items():
            if metric.value is not None and (args.fairness or "10,000 / 10" in name):
                figures.setdefault(name, []).extend(metric.samples or [metric.value])
    for name, values in figures.items():
        print(f"{name}: median {statistics.median(values):.3g} of {[round(v, 3) for v in values]}")


if __name__ == "__main__":
    main()
