"""The dashboard's pages and ``/metrics`` with 10⁶ runs and 10⁴ limit keys (issue 35).

    python -m bench.web_dashboard --database-url postgresql://postgres@127.0.0.1:5432/ductwork_bench_web \\
        [--runs 1000000] [--keys 10000] [--repeats 3] [--json bench/results/web-dashboard.json] [--keep]

PostgreSQL only (the issue asks for it; the rows are made by ``generate_series``). The
database is the bench's alone (its ductwork rows are deleted first; the test suite's
databases are refused); ``--keep`` measures the rows a previous run left instead of
inserting them again.

The rows, in bulk (``INSERT … SELECT``), as a fleet leaves them after a month: runs
triggered 2.5 s apart, each with its branch, step, job and execution: 97 % completed
(an execution that succeeded), 1 % halted (``job_retries_exhausted``, a failed
execution and one context value), 1 % dampened, 1 % in progress (half of those in
flight, half pending); every step on one of the keys ``key-00000`` … (round robin);
each key's header with its ``seq`` (two per finished claim, one per claim in flight),
every other key rated with a bucket; each key's refusal counts (``ductwork_key_refusals``:
concurrency for every key, rate for the rated ones, as the workers' heartbeats leave
them); six process rows. Then ``VACUUM ANALYZE``, as autovacuum would leave the tables.

Each page is fetched through the dashboard's ASGI app in this process (Starlette's
TestClient: no network, no server): one warm-up, then ``--repeats`` timed fetches; the
figure is their median in milliseconds, with the response's size. ``status.snapshot``,
``status.execution_outcomes`` and ``status.key_refusals`` are timed alone too (what
``/metrics`` and the key pages spend in the database).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from bench.harness import Target, definition_row, git_commit, log, machine
from bench.workloads import WebMonthly as Monthly
from ductwork.app import App
from ductwork.config import Config

PERIOD_S = 2.5
TAIL = "00000000-webr-"


def _config(keys: int) -> Config:
    limits: dict[str, Any] = {}
    for i in range(keys):
        entry: dict[str, Any] = {"concurrency": 5}
        if i % 2:
            entry["rate"] = {"limit": 10, "per": "1s"}
        limits[f"key-{i:05}"] = entry
    return Config.from_section({"job_worker": {"limits": limits}, "pipelines": [Monthly.definition.pipeline]},
                               source="<bench web>")


#: the run's status by ``g % 100``; the rest completed
_STATUS = "CASE g % 100 WHEN 0 THEN 'halted' WHEN 1 THEN 'dampened' WHEN 2 THEN 'in_progress' ELSE 'completed' END"


def fill(app: App, runs: int, keys: int, start: datetime) -> None:
    """The rows described in the module's docstring, in one transaction per table."""
    name, snapshot, sha1 = definition_row(Monthly)
    params = {"n": runs, "k": keys, "t0": start, "name": name, "snapshot": snapshot, "sha1": sha1,
              "p": PERIOD_S, "klass": Monthly.definition.nodes["WebWork#0"].klass}
    statements = {
        "runs": f"""
            INSERT INTO ductwork_runs (id, pipeline_klass, definition, definition_sha1, status, triggered_at,
                                       completed_at, halted_at, created_at, updated_at)
            SELECT '{TAIL}' || lpad(g::text, 12, '0'), :name, :snapshot, :sha1, s, t,
                   CASE WHEN s = 'completed' THEN t + interval '1 second' END,
                   CASE WHEN s = 'halted' THEN t + interval '2 seconds' END, t, t
            FROM (SELECT g, {_STATUS} AS s, CAST(:t0 AS timestamp) + g * :p * interval '1 second' AS t
                  FROM generate_series(1, :n) g) x""",
        "branches": f"""
            INSERT INTO ductwork_branches (id, run_id, status, halt_reason, last_advanced_at, started_at,
                                           completed_at, fanin_arrivals, created_at, updated_at)
            SELECT 'b' || substr(id, 2), id, status, CASE WHEN status = 'halted' THEN 'job_retries_exhausted' END,
                   triggered_at, triggered_at, coalesce(completed_at, halted_at), 0, triggered_at, triggered_at
            FROM ductwork_runs WHERE id LIKE '{TAIL}%'""",
        "limit keys": """
            INSERT INTO ductwork_limit_keys (key, blocked_until, seq, created_at, updated_at)
            SELECT 'key-' || lpad(i::text, 5, '0'), NULL, 0, CAST(:t0 AS timestamp), CAST(:t0 AS timestamp)
            FROM generate_series(0, :k - 1) i""",
        "steps": f"""
            INSERT INTO ductwork_steps (id, run_id, branch_id, node, klass, to_transition, status, limit_key,
                                        input_args, output_payload, started_at, completed_at, created_at,
                                        updated_at)
            SELECT 's' || substr(r.id, 2), r.id, 'b' || substr(r.id, 2), 'WebWork#0', :klass, 'start',
                   CASE r.status WHEN 'halted' THEN 'failed' WHEN 'in_progress' THEN 'in_progress'
                                 ELSE 'completed' END,
                   'key-' || lpad((CAST(substr(r.id, {len(TAIL) + 1}) AS bigint) % :k)::text, 5, '0'),
                   '[1]', CASE WHEN r.status IN ('completed', 'dampened') THEN '{{"payload": 1}}' END,
                   r.triggered_at, CASE WHEN r.status IN ('completed', 'dampened') THEN r.triggered_at END,
                   r.triggered_at, r.triggered_at
            FROM ductwork_runs r WHERE r.id LIKE '{TAIL}%'""",
        "executions": f"""
            INSERT INTO ductwork_executions (id, step_id, limit_key, eligible_at, claimed_at, completed_at,
                                             outcome, error_klass, error_message, retry_count, crash_count,
                                             created_at, updated_at)
            SELECT 'e' || substr(s.id, 2), s.id, s.limit_key, s.started_at,
                   CASE WHEN s.status <> 'in_progress' OR CAST(substr(s.id, {len(TAIL) + 1}) AS bigint) % 200 = 2
                        THEN s.started_at END,
                   CASE WHEN s.status <> 'in_progress' THEN s.started_at + interval '1 second' END,
                   CASE s.status WHEN 'completed' THEN 'success' WHEN 'failed' THEN 'failure' END,
                   CASE WHEN s.status = 'failed' THEN 'builtins.RuntimeError' END,
                   CASE WHEN s.status = 'failed' THEN 'vendor said no' END, 0, 0, s.started_at, s.started_at
            FROM ductwork_steps s WHERE s.id LIKE 's{TAIL[1:]}%'""",
        "key seq": """
            UPDATE ductwork_limit_keys k SET seq = c.done * 2 + c.running
            FROM (SELECT limit_key, count(completed_at) AS done,
                         count(*) FILTER (WHERE claimed_at IS NOT NULL AND completed_at IS NULL) AS running
                  FROM ductwork_executions GROUP BY limit_key) c
            WHERE c.limit_key = k.key""",
        "buckets": """
            INSERT INTO ductwork_limit_buckets (key, period_s, level_units, refilled_at_us, updated_at)
            SELECT key, 1, 3000000, 0, CAST(:t0 AS timestamp)
            FROM ductwork_limit_keys WHERE CAST(substr(key, 5) AS int) % 2 = 1""",
        "key refusals": """
            INSERT INTO ductwork_key_refusals (key, reason, refusals)
            SELECT key, reason, 1 + CAST(substr(key, 5) AS int) % 50
            FROM ductwork_limit_keys CROSS JOIN (VALUES ('concurrency'), ('rate')) AS r (reason)
            WHERE reason = 'concurrency' OR CAST(substr(key, 5) AS int) % 2 = 1""",
        "context": f"""
            INSERT INTO ductwork_context (id, run_id, key, value, first_set_at, last_set_at)
            SELECT 'c' || substr(id, 2), id, 'order', '{{"raw_value": {{"id": 1042}}}}', triggered_at, triggered_at
            FROM ductwork_runs WHERE id LIKE '{TAIL}%' AND status = 'halted'""",
        "processes": """
            INSERT INTO ductwork_processes (id, pid, machine_identifier, label, role, last_heartbeat_at,
                                            created_at, updated_at)
            SELECT '00000000-webp-' || i, 1000 + i, 'bench-host', 'bench-' || i,
                   CASE WHEN i = 0 THEN 'supervisor' WHEN i = 1 THEN 'pipeline_advancer' ELSE 'job_worker' END,
                   now() AT TIME ZONE 'UTC', CAST(:t0 AS timestamp), CAST(:t0 AS timestamp)
            FROM generate_series(0, 5) i""",
    }
    for what, statement in statements.items():
        started = time.perf_counter()
        with app.engine.begin() as conn:
            done = conn.execute(sa.text(statement), params).rowcount
        log(f"web bench: {what}: {done} rows in {time.perf_counter() - started:.1f} s")
    started = time.perf_counter()
    with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")
    log(f"web bench: VACUUM ANALYZE in {time.perf_counter() - started:.1f} s")


def _pages(app: App) -> dict[str, str]:
    """What is fetched: name -> path (a deep cursor a third of the way from the oldest run)."""
    with app.engine.connect() as conn:
        r = sa.table("ductwork_runs", sa.column("id"), sa.column("triggered_at"), sa.column("status"))
        count = conn.execute(sa.select(sa.func.count()).select_from(r)).scalar_one()
        deep = conn.execute(sa.select(r.c.id, r.c.triggered_at).order_by(r.c.triggered_at, r.c.id)
                            .offset(count // 3).limit(1)).one()
        halted = conn.execute(sa.select(r.c.id).where(r.c.status == "halted").limit(1)).scalar_one()
    cursor = f"before_at={deep.triggered_at.isoformat()}&before_id={deep.id}"
    return {
        "overview": "/",
        "runs": "/runs",
        "runs, halted": "/runs?status=halted",
        "runs, deep page": f"/runs?{cursor}",
        "runs, halted, deep page": f"/runs?status=halted&{cursor}",
        "runs, one pipeline (module:Class)": f"/runs?pipeline={Monthly.definition.pipeline}",
        "runs, since 1h": "/runs?since=1h",
        "run (halted)": f"/runs/{halted}",
        "keys": "/keys",
        "keys, busy only": "/keys?busy=1",
        "one key": "/keys/key-00042",
        "processes": "/processes",
        "metrics": "/metrics",
    }


def _median_ms(fn: Any, repeats: int) -> tuple[float, list[float]]:
    fn()  # warm-up: connections, templates, the definition cache
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), times


def measure(app: App, repeats: int) -> dict[str, Any]:
    from starlette.testclient import TestClient

    from ductwork.status import execution_outcomes, key_refusals, snapshot
    from ductwork.web import dashboard

    client = TestClient(dashboard(app, refresh_s=0))
    figures: dict[str, Any] = {}
    for name, path in _pages(app).items():
        sizes: list[int] = []

        def fetch(path: str = path, sizes: list[int] = sizes) -> None:
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code, response.text[:500])
            sizes.append(len(response.content))

        median, times = _median_ms(fetch, repeats)
        figures[name] = {"path": path, "median_ms": round(median, 1), "ms": [round(t, 1) for t in times],
                         "bytes": sizes[-1]}
        log(f"web bench: {name:<36} {median:8.1f} ms  {sizes[-1]:>9} bytes  {path}")
    for name, fn in (("status.snapshot", lambda: snapshot(app)),
                     ("status.execution_outcomes", lambda: execution_outcomes(app)),
                     ("status.key_refusals", lambda: key_refusals(app))):
        median, times = _median_ms(fn, repeats)
        figures[name] = {"median_ms": round(median, 1), "ms": [round(t, 1) for t in times]}
        log(f"web bench: {name:<36} {median:8.1f} ms")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.web_dashboard", description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True, help="a PostgreSQL database of the bench's own")
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--keep", action="store_true", help="measure the rows already there")
    args = parser.parse_args(argv)
    target = Target.from_url(args.database_url)
    if target.kind != "postgresql":
        raise SystemExit("bench.web_dashboard: PostgreSQL only (its rows are made with generate_series)")
    target.setup()
    app = App(target.url, _config(args.keys), pool_size=5)
    try:
        if not args.keep:
            target.reset()
            fill(app, args.runs, args.keys, datetime.now(UTC).replace(microsecond=0, tzinfo=None)
                 - timedelta(seconds=args.runs * PERIOD_S))
        figures = measure(app, args.repeats)
    finally:
        app.dispose()
    result = {"benchmark": "web dashboard (issue 35)", "database": target.describe(), "runs": args.runs,
              "keys": args.keys, "repeats": args.repeats, "commit": git_commit(), "machine": machine(),
              "at": datetime.now(UTC).isoformat(timespec="seconds"), "figures": figures}
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
            out.write("\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
