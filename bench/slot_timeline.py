"""Where a keyed slot's time goes between one body and the next: a diagnostic of B2.

    python -m bench.slot_timeline [--database-url URL] [--scenario "concurrency 5"] [--threads 5] [--repeats 3]

Runs B2's batch of one scenario (300 bodies of 20 ms through one fleet of 2 worker
processes × ``--threads`` threads, as ``python -m bench --only B2`` runs it) with the
``timeline`` probe of bench/experiments/sitecustomize.py, which changes nothing but
writes when each execution reaches each point in its worker process. Joined with the
execution's ``claimed_at`` and ``completed_at`` (database time, read under the key's
lock: the host's clock, as ``time.time`` is, on this one machine), each execution's slot
splits into:

- *claim → hand-off committed*: from the claim (the time its transaction read once it
  held the key's lock) to the return of the transaction that claimed it: the rest of that
  lock hold, and its commit;
- *committed → body starts*: handing it to a thread (``KeyedCommits``, the inbox) until
  ``Worker._perform`` is entered;
- *body*: ``_perform`` to the end of ``Step.execute`` (20 ms of sleep, and building it);
- *body ends → released*: from there to the release's time, read once the key's lock is
  held, and its three parts: *body ends → its transaction begins* (waiting for the
  process's group commit in progress: ``outcomes._commit`` entered), *the statements
  before the routine* (the outputs and the advance, until ``release_and_claim`` is
  called) and *the routine's call → released* (the round trip to the routine, the wait
  for the key's lock, until the routine reads the clock).
(A body's ``_perform`` returns when its success is queued for the group commit, before its
release: the probe's ``recorded`` point is not a segment's end.)

A slot is busy from its claim to its release, so at concurrency c the key runs at most
c / (claim → released) bodies a second; the first two and the fourth segment are what
separates that from c / 20 ms. Medians, quartiles and the mean of each segment over the
batch's executions; one line per repetition. A diagnostic, not a benchmark of record.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from bench.b2_limits import SCENARIOS, _batch
from bench.harness import ProcessFleet, Target, log
from bench.workloads import NAP_S
from ductwork.db import schema
from ductwork.db.clock import to_us

SEGMENTS = ("claim → hand-off committed", "committed → body starts", "body", "body ends → released",
            "of it: body ends → its transaction begins", "of it: the statements before the routine",
            "of it: the routine's call → released", "claim → released (the slot)")


def _points(fleet: ProcessFleet) -> dict[str, dict[str, float]]:
    """execution id -> {point: wall-clock seconds} from every worker process's timeline file."""
    points: dict[str, dict[str, float]] = {}
    for path in (fleet.dir / "stats").glob("timeline-*.txt"):
        for line in path.read_text().splitlines():
            point, execution_id, at = line.split()
            points.setdefault(execution_id, {})[point] = float(at)
    return points


def segments(points: dict[str, dict[str, float]], rows: Sequence[sa.Row[Any]]) -> dict[str, list[float]]:
    """Each segment's milliseconds, over the executions that reached both of its ends."""
    out: dict[str, list[float]] = {name: [] for name in SEGMENTS}
    for row in rows:
        p = points.get(row.id, {})
        claimed, released = to_us(row.claimed_at) / 1e6, to_us(row.completed_at) / 1e6
        spans = {"claim → hand-off committed": (claimed, p.get("committed")),
                 "committed → body starts": (p.get("committed"), p.get("perform")),
                 "body": (p.get("perform"), p.get("ran")),
                 "body ends → released": (p.get("ran"), released),
                 "of it: body ends → its transaction begins": (p.get("ran"), p.get("transaction")),
                 "of it: the statements before the routine": (p.get("transaction"), p.get("routine")),
                 "of it: the routine's call → released": (p.get("routine"), released),
                 "claim → released (the slot)": (claimed, released)}
        for name, (start, end) in spans.items():
            if start is not None and end is not None:
                out[name].append(1000 * (end - start))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url")
    parser.add_argument("--scenario", default="concurrency 5", choices=sorted(SCENARIOS))
    parser.add_argument("--threads", type=int, default=5, help="worker threads per process (B2: 5)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    target = Target.from_url(args.database_url)
    target.setup()
    pipeline, key = SCENARIOS[args.scenario]
    app = target.app()
    try:
        print(f"\n## {target.name}: {args.scenario}, 2 worker processes × {args.threads} threads, "
              f"{args.n} bodies of {NAP_S * 1000:.0f} ms\n")
        print("| repetition | bodies/s | " + " | ".join(f"{s}: median (p25–p75), ms" for s in SEGMENTS) + " |")
        print("|---:|---:|" + "---:|" * len(SEGMENTS))
        for rep in range(args.repeats):
            app.dispose()
            target.reset()
            fleet = ProcessFleet(target, workers=2, worker_threads=args.threads, label=f"benchtl{rep}",
                                 patches=("timeline",)).start(app)
            try:
                measured = _batch(app, (fleet,), f"t{rep}", pipeline, key, args.n, NAP_S)
                points = _points(fleet)
            finally:
                fleet.stop()
            e = schema.executions
            with app.begin() as tx:
                rows = tx.execute(sa.select(e.c.id, e.c.claimed_at, e.c.completed_at)
                                  .where(e.c.id.like(f"00000000-t{rep}e-%"))).all()
            got = segments(points, rows)
            cells = []
            for name in SEGMENTS:
                values = got[name]
                if len(values) < 4:
                    cells.append("–")
                    continue
                q1, _, q3 = statistics.quantiles(values, n=4)
                cells.append(f"{statistics.median(values):.1f} ({q1:.1f}–{q3:.1f})")
            log(f"slot timeline repetition {rep + 1}: bodies {measured['bodies_per_s']:.0f}/s")
            print(f"| {rep + 1} | {measured['bodies_per_s']:.0f} | " + " | ".join(cells) + " |")
    finally:
        app.dispose()
        target.cleanup()


if __name__ == "__main__":
    main()
