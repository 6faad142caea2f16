"""Run ductwork's benchmarks and print one table (and optionally JSON).

    python -m bench                                        # SQLite (fresh temp file), B1-B8
    python -m bench --all --json bench/results/NAME.json   # SQLite + PostgreSQL + MariaDB on this host
    python -m bench --quick                                # the smoke run: everything sized down (< 60 s)
    python -m bench --only B2,B5 --database-url postgresql://postgres@127.0.0.1:5432/ductwork_bench
    python -m bench --full --only B3,B4                    # adds the 10⁶ sizes (minutes per database)

``--database-url`` may be repeated; ``--all`` means SQLite plus
``postgresql://postgres@127.0.0.1:5432/ductwork_bench`` and
``mysql://root@127.0.0.1:3306/ductwork_bench``. A database the bench uses is created if
missing, migrated, and emptied of ductwork rows between benchmarks: never point it at a
database whose rows you want (the test suite's ``test`` and ``ductwork_test_*`` are
refused).

Each row of the table is a bench function's docstring (its label) and one of its
metrics; each cell is the median of the repetitions (3, or 1 with ``--quick``). The
user-visible figures (runs completed, bodies running, violations, ratios to pgqueuer
measured in the same repetitions) come first; the engine's own figures (claims/s, slots
in use, CPU and statements per step) follow under "engine diagnostics". The JSON has
every sample, the machine, the date, the command and the git commit; runs kept as
evidence go to ``bench/results/`` (bench/RESULTS.md cites each).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import traceback
from datetime import UTC, datetime
from typing import Any

from bench import (
    b1_throughput,
    b2_limits,
    b3_claim_cost,
    b4_expand,
    b5_blocked_key,
    b6_keyed,
    b7_async_steps,
    b8_partitions,
)
from bench.harness import DEFAULT_SERVERS, Metric, Sizes, Target, git_commit, label, log, machine

MODULES = {"B1": b1_throughput, "B2": b2_limits, "B3": b3_claim_cost, "B4": b4_expand, "B5": b5_blocked_key,
           "B6": b6_keyed, "B7": b7_async_steps, "B8": b8_partitions}


def parser(doc: str | None = None, prog: str = "python -m bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=(doc or __doc__).split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", action="append", default=None,
                   help="a database the bench may own (repeatable; default: a fresh SQLite file)")
    p.add_argument("--all", action="store_true", help="SQLite + the PostgreSQL and MariaDB on this host")
    p.add_argument("--quick", action="store_true", help="smoke sizes, one repetition (< 60 s in all)")
    p.add_argument("--full", action="store_true",
                   help="include the 10⁶ sizes of B3 and B4, and B8's 10⁴-partition drain and fairness")
    p.add_argument("--only", default=None, help="comma-separated subset of B1,B2,B3,B4,B5,B6,B7,B8")
    p.add_argument("--json", default=None, help="write every measurement to this file")
    p.add_argument("--pgqueuer-python", default=None,
                   help="an interpreter with pgqueuer[asyncpg] installed: on PostgreSQL, B1 and B2 also "
                        "run pgqueuer in the same repetitions (bench/pgqueuer_drain.py)")
    return p


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, int) or (abs(value) >= 100 and float(value).is_integer()):
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def table(results: dict[str, dict[str, dict[str, dict[str, Metric]]]]) -> str:
    """Markdown: one row per (bench label, metric), one column per database.

    Every user-visible figure comes first (runs completed, bodies running, violations,
    the same-run ratios to pgqueuer); the engine's own figures (claims/s, slots in use,
    CPU and statements per step) follow under "engine diagnostics".
    """
    names = list(results)
    rows: list[tuple[bool, str, str, list[str]]] = []
    seen: dict[tuple[str, str], int] = {}
    for db, per_bench in results.items():
        for bench_label, metrics in per_bench.items():
            for metric_name, metric in metrics.items():
                key = (bench_label, metric_name)
                if key not in seen:
                    seen[key] = len(rows)
                    rows.append((metric.diagnostic, bench_label, metric_name, ["" for _ in names]))
                cell = _fmt(metric.value)
                if metric.unit and metric.unit not in ("×",):
                    cell += f" {metric.unit}"
                elif metric.unit == "×" and metric.value is not None:
                    cell += "×"
                rows[seen[key]][3][names.index(db)] = cell
    lines = ["| benchmark | measure | " + " | ".join(names) + " |",
             "|---|---|" + "---:|" * len(names)]
    for diagnostic in (False, True):
        if diagnostic and any(r[0] for r in rows):
            lines.append("| **engine diagnostics** | |" + " |" * len(names))
        previous = None
        for _, bench_label, metric_name, cells in (r for r in rows if r[0] == diagnostic):
            shown = bench_label if bench_label != previous else ""
            previous = bench_label
            lines.append(f"| {shown} | {metric_name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args: argparse.Namespace, only: list[str] | None = None) -> dict[str, Any]:
    sizes = Sizes(quick=args.quick, full=args.full, pgqueuer_python=args.pgqueuer_python)
    urls: list[str | None] = list(args.database_url or [])
    if args.all:
        urls = [None, DEFAULT_SERVERS["postgresql"], DEFAULT_SERVERS["mariadb"], *urls]
    if not urls:
        urls = [None]
    wanted = only or ([s.strip().upper() for s in args.only.split(",")] if args.only else list(MODULES))
    unknown = [w for w in wanted if w not in MODULES]
    if unknown:
        raise SystemExit(f"bench: unknown benchmark(s) {unknown}; choose from {list(MODULES)}")
    started = time.monotonic()
    report: dict[str, Any] = {
        "command": "python -m bench " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(), "machine": machine(),
        "sizes": {"quick": sizes.quick, "full": sizes.full, "repeats": sizes.repeats},
        "databases": {},
    }
    results: dict[str, dict[str, dict[str, Metric]]] = {}
    for url in urls:
        target = Target.from_url(url)
        target.setup()
        db_started = time.monotonic()
        log(f"{target.name}: {target.describe()}")
        per_bench: dict[str, dict[str, Metric]] = {}
        entry: dict[str, Any] = {"version": target.describe(), "benchmarks": {}, "errors": {}}
        for bench_id in wanted:
            for fn in MODULES[bench_id].BENCHES:
                target.reset()
                app = target.app()
                t0 = time.monotonic()
                log(f"{target.name}: {label(fn)}")
                try:
                    metrics = fn(target, app, sizes)
                except Exception as error:  # noqa: BLE001 - one failed bench must not lose the rest
                    traceback.print_exc()
                    entry["errors"][label(fn)] = f"{type(error).__name__}: {error}"
                    metrics = {"error": Metric(None, note=str(error))}
                finally:
                    app.dispose()
                per_bench[label(fn)] = metrics
                entry["benchmarks"][label(fn)] = {
                    "id": bench_id, "seconds": round(time.monotonic() - t0, 1),
                    "metrics": {k: m.to_json() for k, m in metrics.items()},
                }
        entry["seconds"] = round(time.monotonic() - db_started, 1)
        results[target.name] = per_bench
        report["databases"][target.name] = entry
        target.reset()
        target.cleanup()
    report["seconds"] = round(time.monotonic() - started, 1)
    report["table"] = table(results)
    print(report["table"])
    print(f"\n{len(urls)} database(s), {report['seconds']:.0f} s; machine: {report['machine'].get('cpu')}, "
          f"{report['machine'].get('cpus')} CPUs, load {report['machine'].get('load_average')}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2, default=str)
        print(f"JSON written to {args.json}")
    return report


def run_standalone(bench_id: str, doc: str | None) -> None:
    """``python -m bench.bN_…``: the same options, this benchmark only."""
    module = MODULES[bench_id].__name__
    run(parser(doc, prog=f"python -m {module}").parse_args(), only=[bench_id])


def main() -> None:
    run(parser().parse_args())


if __name__ == "__main__":
    main()
