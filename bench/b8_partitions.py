"""B8 partitioned keys (issue 34): a poll's cost against the number of partitions, drain and fairness.

    python -m bench --only B8 [--database-url URL] [--quick] [--full]
    python -m bench.b8_partitions [--database-url URL] [--quick] [--full]

Every partitioned step here is ``bench.workloads.Tenants``: one no-op step with
``limit_by=("bench_tenant", "tenant")``, configured ``bench_tenant: {per_partition:
{concurrency: 1}}`` (docs/limits.md "Per tenant: partitioned keys"). The family and the
pipeline are added to B8's own app and fleets only (``bench.workloads.TENANT_LIMITS``):
no other bench's lane scan carries them. Rows are made in bulk (``INSERT … SELECT`` over
a numbers CTE, as ``bench.harness.insert_pending``), the i-th step in partition
``bench_tenant[<p(i)>]`` with input ``[p(i)]``, and every partition's header row (and
the family's) written beside them, as ``enqueue`` would.

- *claim latency against partitions*: 10, 10², 10³, 10⁴ partitions each holding k
  pending executions (k = 10; ``--quick``: 10 and 10³ partitions, k = 2), one run
  holding every step (as B3: never executed), statistics refreshed, then in this
  process, one call after another: ``claims.claim`` (a poll: the lane scan, then the
  first lane's routine), the lane scan alone (``lanes.scan_lanes`` in a transaction),
  and a hand-off (``release_and_claim`` ending one claimed execution with ``take=1``:
  the routine's bound, a walk of the executions older than its own, INV-LIM-6). Each
  claimed execution is then marked completed (untimed, as B3) so its partition's slot
  is free again. Figures: the median of the calls per size, and each size / 10 partitions. Goal (issue 34):
  claim at 10⁴ partitions ≤ 1.5× at 10.
- *drain*: a default ``ductwork start`` (1 advancer × 3 threads, 1 worker × 5 threads)
  takes, in each repetition, n one-step no-op runs without a key (``One``), then n
  ``Tenants`` runs spread round-robin over 10 partitions, then over P partitions
  (concurrency 1 each), each timed as B1/B6 (n / (last ``runs.completed_at`` − the batch
  visible)); the ratios to unkeyed, and P / 10 partitions, per repetition. n = 2,000, P =
  10³ (``--quick`` 200 and 10²; ``--full`` 2·10⁴ and 10⁴, i.e. 10⁴ × 2: the issue's 10⁴ ×
  10 is 10⁵ runs a batch, hours per database at the rates measured, so it is not
  offered). Goal: P partitions ≥ 0.5× unkeyed.
- *fairness*: one partition with B pending (inserted first: every one of them older
  than any other's) and 99 partitions with 10 each, through the same fleet; the time
  (database, from the batch visible) at which the 99 small partitions' executions are
  all completed, against the big one's last; and how many of the big one's had
  completed by then. B = 10³ (``--quick`` 10², ``--full`` 10⁴). Goal: the small ones
  finish first (the big one, concurrency 1, can only go one at a time).

Profile (PostgreSQL only, at the largest size of the claim bench): ``EXPLAIN (ANALYZE,
BUFFERS)`` of the lane scan's first page, and the routine's bound walk in a hand-off
(auto_explain); printed to stderr and kept in the JSON as metric notes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import sqlalchemy as sa

from bench.b1_throughput import _prefix_like
from bench.harness import (
    Meter,
    Metric,
    ProcessFleet,
    Sizes,
    Target,
    _numbers,
    insert_pending,
    log,
    per_step,
    percentile_time,
    ratio,
    seconds,
    wait_until,
)
from bench.workloads import LIMITS, PIPELINES, TENANT_FAMILY, TENANT_LIMITS, One, Tenants
from ductwork.app import App
from ductwork.config import Config
from ductwork.db import dialects, schema
from ductwork.fleet.processes import register
from ductwork.limits import lanes
from ductwork.limits.claims import ROUTINE, _routine_args, claim, release_and_claim
from ductwork.limits.executions import Ending

B8_PIPELINES = [*PIPELINES, "bench.workloads:Tenants"]
B8_LIMITS = {**LIMITS, **TENANT_LIMITS}


# --------------------------------------------------------------------------- the app, fleets and rows


def b8_app(target: Target) -> App:
    """An app with the bench's pipelines and limits plus ``Tenants`` and its family."""
    config = Config.from_section({"pipelines": B8_PIPELINES, "job_worker": {"limits": B8_LIMITS}},
                                 source="<bench B8>")
    return App(target.url, config, pool_size=10)


def b8_fleet(target: Target, label: str) -> ProcessFleet:
    """The default fleet shape (``ProcessFleet``'s), its config with ``Tenants`` and its family."""
    import yaml

    fleet = ProcessFleet(target, label=label)
    config = yaml.safe_load(fleet.config.read_text())
    config["default"]["pipelines"] = B8_PIPELINES
    config["default"]["job_worker"]["limits"] = B8_LIMITS
    fleet.config.write_text(yaml.safe_dump(config))
    return fleet


def _key(partition: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """``bench_tenant[<p>]``: ``limit_entries.partition_key`` of an integer value, in SQL."""
    return sa.literal(TENANT_FAMILY + "[", sa.String) + sa.cast(partition, sa.String) + sa.literal("]", sa.String)


def insert_partitioned(app: App, n: int, prefix: str, partitions: int, partition_of, *,
                       one_run: bool = False) -> None:
    """Insert ``n`` pending ``Tenants`` start steps, the i-th in partition
    ``partition_of(i)`` (a SQL expression of i, from 0 to ``partitions`` − 1), with
    the header rows of every partition and of the family; in one transaction
    (``harness.insert_pending`` with the key and input of each step's partition).

    ``one_run``: one run and branch hold every step (node names made unique), as
    ``insert_pending(one_run=True)``: for claim benches whose jobs are never run.
    Ids sort in i order, every eligible time is the same: the poll order is i's.
    """
    k = schema.limit_keys

    def key_rows(tx, now) -> None:  # the family's row, then every partition's not written yet
        t = sa.literal(now, schema.Timestamp)
        if tx.execute(sa.select(k.c.key).where(k.c.key == TENANT_FAMILY)).first() is None:
            tx.execute(k.insert().values(key=TENANT_FAMILY, seq=0, created_at=now, updated_at=now))
        pnums, p = _numbers(partitions)
        tx.execute(k.insert().from_select(
            ["key", "seq", "created_at", "updated_at"],
            sa.select(_key(p), sa.literal_column("0"), t, t).select_from(pnums)
            .where(_key(p).not_in(sa.select(k.c.key)))))

    def keyed(i):
        part = partition_of(i)
        return _key(part), sa.literal("[", sa.String) + sa.cast(part, sa.String) + sa.literal("]", sa.String)

    insert_pending(app, Tenants, n, prefix, one_run=one_run, keyed=keyed, before=key_rows)


def round_robin(partitions: int):
    """The i-th step in partition i mod ``partitions``: every partition k of the first k·P."""
    return lambda i: i % sa.literal_column(str(partitions))


# --------------------------------------------------------------------------- 1. claim latency


def _claim_sizes(sizes: Sizes) -> tuple[list[int], int]:
    if sizes.quick:
        return [10, 1_000], 2
    return [10, 100, 1_000, 10_000], 10


def _complete(app: App, execution_id: str) -> None:
    e = schema.executions
    with app.begin() as tx:
        tx.execute(e.update().where(e.c.id == execution_id, e.c.completed_at.is_(None))
                   .values(completed_at=tx.now, outcome="success", updated_at=tx.now))


def _timed(fn) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def _poll_latencies(app: App, process_id: str, calls: int) -> dict[str, list[float]]:
    """``calls`` polls, scans and hand-offs, one after another; each claimed execution
    completed after it (untimed)."""
    got: dict[str, list[float]] = {"claim": [], "scan": [], "hand-off": []}

    def scan() -> list:
        with app.begin() as tx:
            return lanes.scan_lanes(app, tx)

    for _ in range(calls):
        seconds_, claimed = _timed(lambda: claim(app, process_id))
        assert claimed is not None, "B8: nothing claimed"
        got["claim"].append(seconds_)
        _complete(app, claimed.execution_id)
        seconds_, found = _timed(scan)
        assert found, "B8: the lane scan found no lane"
        got["scan"].append(seconds_)
        held = claim(app, process_id)
        assert held is not None

        def hand_off(held=held) -> list:
            with app.begin() as tx:
                taken = release_and_claim(app, tx, held.limit_key, process_id, [Ending(held.execution_id)], 1)
                assert taken.ended
                return taken.claimed

        seconds_, handed = _timed(hand_off)
        got["hand-off"].append(seconds_)
        for c in handed:
            _complete(app, c.execution_id)
    return got


def claim_latency(target: Target, app: App, sizes: Sizes) -> dict[str, Metric]:
    """B8 claim latency against partitions (each `concurrency: 1`, k pending), this process"""
    partition_sizes, per = _claim_sizes(sizes)
    out: dict[str, Metric] = {}
    medians: dict[str, dict[int, float]] = {"claim": {}, "scan": {}, "hand-off": {}}
    app.dispose()
    for partitions in partition_sizes:
        app.dispose()  # no pooled connection may outlive the reset (SQLite swaps the file)
        target.reset()
        mine = b8_app(target)
        try:
            n = partitions * per
            calls = min(30 if sizes.quick or partitions >= 10_000 else 100, n // 4)  # (10⁴: 0.2–0.5 s a call)
            t0 = time.perf_counter()
            insert_partitioned(mine, n, f"c{partitions}", partitions, round_robin(partitions), one_run=True)
            target.analyze(mine)
            log(f"B8: {partitions:,} partitions × {per} pending inserted in {time.perf_counter() - t0:.1f} s")
            process_id = register(mine, role="inline", label=f"bench-b8-{partitions}")
            for _ in range(3):  # warm-up: statements prepared, caches filled
                warm = claim(mine, process_id)
                if warm is not None:
                    _complete(mine, warm.execution_id)
            got = _poll_latencies(mine, process_id, calls)
            for what, samples in got.items():
                medians[what][partitions] = statistics.median(samples) * 1000
                out[f"{what}: median, {partitions:,} partitions"] = Metric(
                    medians[what][partitions], "ms", samples=[s * 1000 for s in samples],
                    note=f"median of {calls} calls; {per} pending per partition",
                    diagnostic=what != "claim")
            log(f"B8: {partitions:,} partitions: claim {medians['claim'][partitions]:.2f} ms, "
                f"scan {medians['scan'][partitions]:.2f} ms, hand-off {medians['hand-off'][partitions]:.2f} ms")
            if partitions == partition_sizes[-1]:
                out.update(_profile(target, mine, partitions))
        finally:
            mine.dispose()
    lo, hi = partition_sizes[0], partition_sizes[-1]
    for what in medians:
        out[f"{what}: {hi:,} / {lo:,} partitions"] = Metric(
            medians[what][hi] / medians[what][lo], "×",
            note="goal (issue 34): claim ≤ 1.5×" if what == "claim" else "", diagnostic=what != "claim")
    return out


def _profile(target: Target, app: App, partitions: int) -> dict[str, Metric]:
    """(PostgreSQL) the EXPLAIN ANALYZE of the lane scan's first page (``lanes.scan_lanes``:
    the pending executions in poll order, with their keys' rows), and the routine's bound."""
    out: dict[str, Metric] = {}
    if target.kind != "postgresql":
        return out
    statement = lanes._walk_statement()
    with app.engine.connect() as conn:
        now = conn.exec_driver_sql("select (now() at time zone 'utc')").scalar_one()
        compiled = statement.compile(dialect=conn.dialect)
        expanded = compiled.construct_expanded_state({"w_upto": now, "w_passed": []})
        compiled, params = expanded.statement, expanded.parameters
        plan = "\n".join(row[0] for row in conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS) " + str(compiled), params))
        conn.rollback()
    log(f"B8 profile: EXPLAIN ANALYZE of the lane scan at {partitions:,} partitions:\n{plan}")
    total = next((line for line in plan.splitlines() if line.startswith("Execution Time")), "")
    ms = float(total.split(":")[1].split()[0]) if total else None
    out[f"lane scan EXPLAIN ANALYZE execution time, {partitions:,} partitions"] = Metric(
        ms, "ms", note=plan, diagnostic=True)
    bound = _bound_scan_plan(app)
    if bound is not None:
        log(f"B8 profile: the routine's bound scan in a hand-off at {partitions:,} partitions (auto_explain):\n{bound}")
        duration = next((line for line in bound.splitlines() if line.startswith("duration:")), "")
        out[f"hand-off's bound scan (auto_explain) duration, {partitions:,} partitions"] = Metric(
            float(duration.split()[1]) if duration else None, "ms", note=bound, diagnostic=True)
    return out


def _bound_scan_plan(app: App) -> str | None:
    """PostgreSQL: the plans of the routine's bound walk (``release_and_claim_3.postgresql.sql``,
    INV-LIM-6: its probes of ``ix_execution_pending_order``) in one hand-off, from
    ``auto_explain`` (nested statements, ANALYZE, sent to this session as notices); rolled
    back, then the held execution completed as the others are."""
    process_id = register(app, role="inline", label="bench-b8-profile")
    held = claim(app, process_id)
    if held is None:
        return None
    notices: list[str] = []
    try:
        with app.engine.connect() as conn:
            driver = conn.connection.driver_connection
            def handler(diagnostic) -> None:
                notices.append(diagnostic.message_primary or "")

            driver.add_notice_handler(handler)
            for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                            "SET auto_explain.log_analyze = on", "SET auto_explain.log_buffers = on",
                            "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_level = notice"):
                conn.exec_driver_sql(setting)
            dialects.call_routine(conn, ROUTINE, _routine_args(app, held.limit_key, process_id,
                                                                [Ending(held.execution_id)], 1, False))
            conn.rollback()
            driver.remove_notice_handler(handler)
            conn.invalidate()  # the session's auto_explain settings must not return to the pool
    finally:
        _complete(app, held.execution_id)
    plans = [n for n in notices if "claimed_at IS NULL" in n]  # the walk's probes
    return max(plans, key=len) if plans else "\n\n".join(notices)


# --------------------------------------------------------------------------- 2. drain


def _drain_sizes(sizes: Sizes) -> tuple[list[int], int]:
    """(the partition counts, runs a batch): the same runs spread over few, then many partitions"""
    if sizes.quick:
        return [10, 100], 200
    return ([10, 10_000], 20_000) if sizes.full else ([10, 1_000], 2_000)


def _batch(app: App, fleet: ProcessFleet, prefix: str, n: int, insert, timeout: float) -> dict[str, float]:
    """One batch of ``n`` one-step runs (``insert(prefix)``) through the running fleet,
    timed to each run's completion (as ``b1_throughput.runs_batch``)."""
    r = schema.runs
    meter = Meter(fleet).start()
    insert(prefix)
    with app.begin() as tx:
        visible = tx.now
    mine = r.c.id.like(_prefix_like(prefix, "r"))

    def done() -> bool:
        with app.begin() as tx:
            return tx.execute(sa.select(sa.func.count()).where(mine, r.c.status != "completed")).scalar_one() == 0

    wait_until(done, f"{n} runs {prefix} completed", timeout, interval=0.2)
    used = meter.stop()
    with app.begin() as tx:
        runs_done = list(tx.execute(sa.select(r.c.completed_at).where(mine)).scalars())
        e = schema.executions
        held = tx.execute(sa.select(e.c.claimed_at, e.c.completed_at)
                          .where(e.c.id.like(_prefix_like(prefix, "e")))).all()
    assert len(runs_done) == n, (len(runs_done), n)
    span = seconds(max(c for _, c in held) - visible)
    return {"runs_per_s": n / seconds(max(runs_done) - visible),
            "runs_per_s_90": 0.9 * n / seconds(percentile_time(runs_done, 0.9) - visible),
            # executions held (claimed, not yet completed), averaged over the batch: of 5 threads
            "in_flight": sum(seconds(c - a) for a, c in held) / span if span > 0 else float("nan"),
            "held_ms": 1000 * statistics.median(seconds(c - a) for a, c in held),
            **per_step(used, n)}


def drain(target: Target, app: App, sizes: Sizes) -> dict[str, Metric]:
    """B8 drain: runs over few and many partitions (`concurrency: 1` each) against the same runs unkeyed"""
    counts, n = _drain_sizes(sizes)
    app.dispose()
    mine = b8_app(target)
    fleet = b8_fleet(target, "bench8d").start(mine)
    log(f"B8 drain: {fleet.describe()} up; {n:,} runs a batch, unkeyed then over {counts} partitions")
    kinds = ["unkeyed", *(f"{p:,} partitions" for p in counts)]
    got: dict[str, dict[str, list[float]]] = {kind: {} for kind in kinds}

    def inserter(partitions: int | None):
        if partitions is None:
            return lambda prefix: insert_pending(mine, One, n, prefix)
        return lambda prefix: insert_partitioned(mine, n, prefix, partitions, round_robin(partitions))

    try:
        for rep in range(sizes.repeats):
            for j, (kind, partitions) in enumerate(zip(kinds, [None, *counts], strict=True)):
                measured = _batch(mine, fleet, f"d{j}x{rep}", n, inserter(partitions), timeout=3600)
                for key, value in measured.items():
                    got[kind].setdefault(key, []).append(value)
                log(f"B8 drain {kind} repetition {rep + 1}: {measured['runs_per_s']:.0f} runs/s")
    finally:
        fleet.stop()
        mine.dispose()
    few, many = kinds[1], kinds[-1]
    out = {
        f"{many} / unkeyed runs completed/s, {n:,} runs (per repetition)": Metric.of(
            ratio(got[many]["runs_per_s"], got["unkeyed"]["runs_per_s"]), "×", note="goal (issue 34): ≥ 0.5×"),
        f"{few} / unkeyed runs completed/s (per repetition)": Metric.of(
            ratio(got[few]["runs_per_s"], got["unkeyed"]["runs_per_s"]), "×"),
        f"{many} / {few} runs completed/s (per repetition)": Metric.of(
            ratio(got[many]["runs_per_s"], got[few]["runs_per_s"]), "×"),
        **{f"{kind}: runs completed/s": Metric.of(got[kind]["runs_per_s"], "runs/s") for kind in kinds},
    }
    for kind in kinds:
        out[f"{kind}: CPU per completed step (fleet process tree)"] = Metric.of(
            got[kind]["cpu_ms_per_step"], "ms", diagnostic=True)
        out[f"{kind}: SQL statements per step"] = Metric.of(got[kind]["statements_per_step"], "", diagnostic=True)
        out[f"{kind}: executions held (claimed, not completed), mean over the batch"] = Metric.of(
            got[kind]["in_flight"], "", note="the fleet has 5 worker threads", diagnostic=True)
        out[f"{kind}: claim to completion, median per execution"] = Metric.of(got[kind]["held_ms"], "ms",
                                                                              diagnostic=True)
    return out


# --------------------------------------------------------------------------- 3. fairness

SMALL_PARTITIONS = 99
SMALL_EACH = 10


def _big(sizes: Sizes) -> int:
    if sizes.quick:
        return 100
    return 10_000 if sizes.full else 1_000


def fairness(target: Target, app: App, sizes: Sizes) -> dict[str, Metric]:
    """B8 fairness: one partition with many pending (oldest), 99 with 10 each, `concurrency: 1`"""
    big = _big(sizes)
    n = big + SMALL_PARTITIONS * SMALL_EACH

    def partition_of(i):
        return sa.case((i < big, sa.literal_column("0")),
                       else_=sa.literal_column("1") + (i - sa.literal_column(str(big))) % sa.literal_column(
                           str(SMALL_PARTITIONS)))

    e = schema.executions
    app.dispose()
    mine = b8_app(target)
    fleet = b8_fleet(target, "bench8f").start(mine)
    got: dict[str, list[float]] = {}
    try:
        for rep in range(sizes.repeats):
            prefix = f"f{rep}"
            insert_partitioned(mine, n, prefix, 1 + SMALL_PARTITIONS, partition_of)
            with mine.begin() as tx:
                visible = tx.now
            mine_e = e.c.id.like(_prefix_like(prefix, "e"))

            def done(mine_e=mine_e) -> bool:
                with mine.begin() as tx:
                    return tx.execute(sa.select(sa.func.count()).where(
                        mine_e, e.c.completed_at.is_(None))).scalar_one() == 0

            wait_until(done, f"{n} executions of the fairness batch completed", 3600, interval=0.2)
            with mine.begin() as tx:
                rows = tx.execute(sa.select(e.c.limit_key, e.c.completed_at).where(mine_e)).all()
            big_key = f"{TENANT_FAMILY}[0]"
            big_done = sorted(c for key, c in rows if key == big_key)
            small_done = [c for key, c in rows if key != big_key]
            assert len(big_done) == big, (len(big_done), big)
            assert len(small_done) == SMALL_PARTITIONS * SMALL_EACH, len(small_done)
            small_last, big_last = max(small_done), max(big_done)
            sample = {
                "small_done_s": seconds(small_last - visible),
                "big_done_s": seconds(big_last - visible),
                "big_share_at_small_done": sum(1 for c in big_done if c <= small_last) / big,
                "big_per_s": big / seconds(big_last - visible),
            }
            for key, value in sample.items():
                got.setdefault(key, []).append(value)
            log(f"B8 fairness repetition {rep + 1}: 99 small partitions done at {sample['small_done_s']:.2f} s, "
                f"the big one at {sample['big_done_s']:.2f} s ({sample['big_share_at_small_done']:.1%} of it "
                f"done by then)")
    finally:
        fleet.stop()
        mine.dispose()
    return {
        f"99 partitions × {SMALL_EACH}: all completed at (from the batch visible)": Metric.of(
            got["small_done_s"], "s"),
        f"1 partition × {big:,} (older): all completed at": Metric.of(got["big_done_s"], "s"),
        "small done / big done (per repetition)": Metric.of(
            ratio(got["small_done_s"], got["big_done_s"]), "×", note="goal (issue 34): < 1, small work first"),
        "big partition's share completed when the small ones were all done": Metric.of(
            got["big_share_at_small_done"], "", diagnostic=True),
        "big partition: executions completed/s (concurrency 1)": Metric.of(got["big_per_s"], "/s", diagnostic=True),
    }


BENCHES = [claim_latency, drain, fairness]


def main() -> None:
    from bench.__main__ import run_standalone

    run_standalone("B8", __doc__)


if __name__ == "__main__":
    main()
