"""B2 limits as a user sees them: step bodies running under a key, from the bodies' own witness.

    python -m bench --only B2 [--database-url URL] [--quick] [--pgqueuer-python PATH]
    python -m bench.b2_limits [--database-url URL] [--quick]

Every body (``bench.workloads.Nap``) appends one line ``tag start end`` (wall-clock
seconds, ``time.time``) to a file of its own process: one ``write`` to an ``O_APPEND``
file, a few microseconds, no database round trip, so what is recorded is the body's own
interval and the database carries no extra load; the bench merges every process's file.
From a batch's witness lines, over the window from its 10 % to its 90 % body start (no
first wake-up, no tail):

- *bodies/s / ideal*: body starts in the window / its length / the ideal rate;
- *mean bodies running*: the time-integral of running bodies over the window / its length.

Scenarios (real ``ductwork start`` fleets, ductwork's defaults but for the counts given):

- one fleet of 1 advancer process × 3 threads + 2 worker processes × 5 threads, fed in
  turn ``concurrency: 5`` with 20 ms bodies (ideal 5 running, 250/s), ``rate: {limit:
  200, per: 1s}`` with 20 ms bodies (ideal 200/s; default burst) and the same with
  ``burst: 1`` (nothing banked). Before each rate batch the key's bucket is emptied (the
  state right after a spent burst), so "ideal" is exactly the refill rate; a rate batch
  is 1,200 bodies and its window opens after its first ``burst`` bodies (``RATE_SKIP``),
  so tokens banked while the fleet wakes up are not counted as rate. Beside them in
  each repetition (PostgreSQL, with ``--pgqueuer-python``), pgqueuer 1.6.0 drains as many
  20 ms bodies with two ``QueueManager`` processes and ``concurrency_limit=5``: ratio
  ductwork / pgqueuer of bodies/s per repetition. The rate scenarios have no pgqueuer
  peer: 1.6.0's ``entrypoint`` takes a ``concurrency_limit`` but no rate (no
  ``requests_per_second``);
- ``concurrency: 3`` with 50 ms bodies and TWO default ``ductwork start`` fleets (1
  advancer × 3 + 1 worker × 5 each; ideal 3 running, 60/s), beside pgqueuer 1.6.0 in the
  same repetition: two ``QueueManager`` processes, the entrypoint registered with
  ``concurrency_limit=3``, 50 ms ``asyncio.sleep`` bodies timed the same way
  (bench/pgqueuer_drain.py); ratio ductwork / pgqueuer of mean bodies running per
  repetition.

Fleet shapes (issue 32: the shapes users build, and runs triggered while the fleet
works). ``bench.harness.SHAPES`` is the one table of the shapes: 1 worker process × 5
threads (``ductwork start`` as installed), 1 × 10 (``job_worker.count: 10``) and 2 × 5
(``job_worker.processes: 2``), each with the default advancer (1 process × 3 threads);
``SHAPE_SCENARIOS`` below says which scenario runs on which. Each shape's fleet is
started once and serves all its repetitions, then stopped before the next shape's:

- *limits by fleet shape* (``limits_by_shape``): ``concurrency: 5`` with 20 ms bodies
  on one fleet of each shape in turn, fed first, 300 bodies a batch (bodies/s / 250 and
  mean bodies running, of 5); and ``rate: 200/s, burst: 1`` on the 1 × 10 fleet (1,200
  bodies, its window opening after the first, as above). The 2 × 5 row measures again
  what limit_precision measures, so the three shapes' rows come from one bench, the same
  batches one after the other; limit_precision and limit3_two_fleets keep their labels,
  so earlier results stay comparable;
- *limit 3 by fleet shape* (``limit3_by_shape``): ``concurrency: 3`` with 50 ms bodies
  and TWO fleets of the shape (1 × 5, the default, and 1 × 10), each repetition a batch
  *fed first* (``insert_pending`` of the whole batch, as everywhere else in B2) and then
  a batch *triggered one at a time while the fleets run*: a thread of the bench process
  calls the public ``Limit3Nap.trigger(tag, 0.05, app=app)`` for each run, one after the
  other, at a steady ``TRIGGER_PACE`` = 1.2 × the ideal 60 runs/s = 72 runs/s (a pacing
  sleep in that thread until each call's time; a late call is made at once:
  ``bench.harness.Triggered``). Above the ideal rate the key's backlog grows by at least
  12 runs/s, so it never runs dry while the loop keeps its pace, and it stays small (a
  300-run batch ends with about 50 or more waiting); far above it, a triggered batch
  would be a fed-first one with extra load. Same window rule (10 %–90 % body starts);
  ratio triggered / fed first of mean bodies running per repetition. Two diagnostics
  say whether the feed did what it should: the pace held (calls / s, first call to
  last) and the share of the body window with no run waiting (triggered, its body not
  started; a run waits from its trigger's return, so this errs towards "ran dry"). The
  trigger thread's CPU is the bench process's, not counted in the fleets' CPU per step:
  a third diagnostic gives it per call. On a 2-core host the trigger thread, the
  database server and the fleets share the cores, so the loop may not hold 72/s (the
  first quick run on PostgreSQL held 36-51/s; alone it does about 170/s there): it
  then goes as fast as it can, and the backlog stays non-empty as long as the fleets
  run the bodies slower still, which the share of the window says.

With ``--quick`` every new batch is 60 bodies (the rate one too), one repetition. Full
size (3 repetitions) the new benches should add about 2.5 minutes per database to B2 on
a 2-core machine (an estimate from the quick run's fleet starts and the last full run's
batch times: seven fleet starts and stops of about 3 s, 9 + 3 batches of
``concurrency: 5`` and the rate, 12 of ``concurrency: 3`` at about 5 s each), B2 about
4-5.5 minutes in all: no batch is cut.

*Violations* count from database rows over every claim the key ever had (must be 0;
for the shapes, over every claim of the key with that shape's fleets):
for concurrency, a sweep of the key's ``claim_seq`` / ``release_seq`` events counting
claims that made more than the limit in flight; for rates, the exact token-bucket bound
over every pair of claims i ≤ j: ``(j − i + 1) ≤ burst + limit × (t_j − t_i) / per``, in
integer microseconds.

Diagnostics (engine-internal, below the headlines): claims/s from ``claimed_at`` over
the same kind of window and mean *slots in use* (claimed-not-completed executions: a
slot is held from claim to completion, bookkeeping included), CPU per completed step
(user + system CPU of the fleets' whole process trees from the insert, or the first
trigger, until every run of the batch completed / steps) and SQL statements per step, for
each shape.
"""

from __future__ import annotations

import sqlalchemy as sa

from bench.b1_throughput import pgqueuer, with_pgqueuer
from bench.harness import (
    SHAPES,
    FedFirst,
    Meter,
    Metric,
    ProcessFleet,
    Sizes,
    Target,
    Triggered,
    bodies,
    body_window,
    log,
    per_step,
    ratio,
    wait_until,
)
from bench.workloads import (
    CONCURRENCY_KEY,
    LIMIT3_KEY,
    LIMITS,
    NAP3_S,
    NAP_S,
    RATE_BURST1_KEY,
    RATE_KEY,
    ConcurrencyNap,
    Limit3Nap,
    RateBurst1Nap,
    RateNap,
)
from ductwork.db import schema
from ductwork.db.clock import to_us
from ductwork.limit_entries import parse_limits

SCENARIOS = {
    "concurrency 5": (ConcurrencyNap, CONCURRENCY_KEY),
    "rate 200/s": (RateNap, RATE_KEY),
    "rate 200/s, burst 1": (RateBurst1Nap, RATE_BURST1_KEY),
}


def _empty_bucket(app, key: str) -> None:
    """The key's buckets at zero as of now (a burst just spent); no-op before its first claim."""
    with app.begin() as tx:
        now_us = tx.now_us
        tx.execute(schema.limit_buckets.update().where(schema.limit_buckets.c.key == key)
                   .values(level_units=0, refilled_at_us=now_us, updated_at=tx.now))
        tx.execute(schema.limit_keys.update().where(schema.limit_keys.c.key == key).values(blocked_until=None))


def concurrency_violations(events: list[tuple[int | None, int | None]], limit: int) -> tuple[int, int]:
    """(violations, peak in flight) from (claim_seq, release_seq) pairs of one key."""
    sweep = sorted([(c, 1) for c, _ in events if c is not None] + [(r, -1) for _, r in events if r is not None])
    in_flight = peak = violations = 0
    for _, delta in sweep:
        in_flight += delta
        peak = max(peak, in_flight)
        if delta > 0 and in_flight > limit:
            violations += 1
    return violations, peak


def rate_violations(claim_us: list[int], limit: int, per_s: int, burst: int) -> int:
    """Claims j for which some i <= j has (j-i+1)·P·10⁶ > B·P·10⁶ + L·(t_j − t_i): O(n)."""
    unit = per_s * 1_000_000
    lowest = None
    violations = 0
    for k, t in enumerate(sorted(claim_us)):
        g_prev = (k - 1) * unit - limit * t  # g(i-1) form: i = k counts claim k itself
        lowest = g_prev if lowest is None else min(lowest, g_prev)
        if k * unit - limit * t - lowest > burst * unit:
            violations += 1
    return violations


#: a rate batch is long enough for a window of several seconds (at 200/s: 1,200 bodies)
RATE_N = {RATE_KEY: 1200, RATE_BURST1_KEY: 1200}
#: bodies left out before a rate window opens: the tokens a bucket can bank (its burst)
#: while the fleet wakes up for a batch are spent before the window, so a short window
#: does not count a banked burst as rate (the first run of this bench measured 1.1-1.5x
#: of 200/s over 1.2 s windows with 0 violations: banked tokens, not a faster refill)
RATE_SKIP = {RATE_KEY: 200, RATE_BURST1_KEY: 1}


def _batch(app, fleets: tuple[ProcessFleet, ...], prefix: str, pipeline, key: str, n: int,
           body_s: float, skip: int = 0, feed: FedFirst | Triggered | None = None) -> dict[str, float]:
    """One batch of ``n`` keyed bodies through running fleets: witness, row and meter figures
    (the window opens at the 10 % body start, or after the first ``skip`` bodies if later).

    ``feed``: how the batch reaches the fleets, ``FedFirst()`` (the default: inserted whole
    before anything is measured) or ``Triggered(per_s)`` (one trigger at a time while the
    fleets work, bench.harness); the caller keeps it to name the batch's rows afterwards.
    """
    e, r = schema.executions, schema.runs
    feed = feed if feed is not None else FedFirst()
    if key in (RATE_KEY, RATE_BURST1_KEY):
        _empty_bucket(app, key)
    meter = Meter(*fleets).start()
    try:
        feed.start(app, pipeline, n, prefix, [prefix, body_s])

        def done() -> bool:
            if not feed.visible():
                return False
            with app.begin() as tx:
                return tx.execute(sa.select(sa.func.count()).where(feed.runs(), r.c.status != "completed")
                                  ).scalar_one() == 0

        wait_until(done, f"{n} runs of {key} ({feed.name}) completed", timeout=max(120.0, n / 2))
    finally:
        feed.stop()
    used = meter.stop()
    with app.begin() as tx:
        rows = tx.execute(sa.select(e.c.claimed_at, e.c.completed_at).where(feed.executions())).all()
    assert len(rows) == n, f"{len(rows)} executions for {n} runs"
    witnessed = [i for fleet in fleets for i in fleet.witnesses(prefix)]
    assert len(witnessed) == n, f"{len(witnessed)} witness lines for {n} bodies"
    claims = sorted(to_us(c) for c, _ in rows)
    a, b = claims[max(len(claims) // 10, skip)], claims[(len(claims) * 9) // 10]
    in_window = sum(1 for c in claims if a <= c <= b)
    busy_us = sum(max(0, min(to_us(d), b) - max(to_us(c), a)) for c, d in rows)
    seen = bodies(witnessed, skip=skip)
    starts = sorted(s for s, _ in witnessed)
    return {"bodies_per_s": seen["per_s"], "running": seen["running"],
            "claims_per_s": in_window / ((b - a) / 1e6), "slots": busy_us / (b - a), **per_step(used, n),
            **feed.figures(starts, body_window(starts, skip))}


def _violations(app, key: str, where: sa.ColumnElement[bool] | None = None) -> int:
    """Violations over every claim of ``key`` (or of its executions that ``where`` selects:
    batches that ran one after the other, so no claim outside them overlapped theirs)."""
    e = schema.executions
    with app.begin() as tx:
        rows = tx.execute(sa.select(e.c.claim_seq, e.c.release_seq, e.c.claimed_at)
                          .where(e.c.limit_key == key, e.c.claimed_at.is_not(None),
                                 where if where is not None else sa.true())).all()
    entry = parse_limits(LIMITS)[key]
    count = 0
    if entry.concurrency is not None:
        count += concurrency_violations([(c, r) for c, r, _ in rows], entry.concurrency)[0]
    for rate in entry.rates:
        count += rate_violations([to_us(t) for _, _, t in rows], rate.limit, rate.per_s, rate.burst)
    return count


def _diagnostics(name: str, got: dict[str, list[float]], ideal: float, slots_label: str) -> dict[str, Metric]:
    return {
        f"{name}: claims/s / ideal (from claimed_at)": Metric.of(
            [v / ideal for v in got["claims_per_s"]], "×", diagnostic=True),
        f"{name}: mean slots in use ({slots_label}; claim to completion)": Metric.of(
            got["slots"], "", diagnostic=True),
        f"{name}: CPU per completed step (fleet process trees)": Metric.of(got["cpu_ms_per_step"], "ms",
                                                                          diagnostic=True),
        f"{name}: SQL statements per step": Metric.of(got["statements_per_step"], "", diagnostic=True),
    }


def limit_precision(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B2 limits, 20 ms bodies, one fleet (1 adv×3 + 2 wrk×5): bodies as witnessed"""
    n = 60 if sizes.quick else 300
    got: dict[str, dict[str, list[float]]] = {name: {} for name in SCENARIOS}
    pgq: dict[str, list[float]] = {"per_s": [], "running": []}
    version = "1.6.0"
    fleet = ProcessFleet(target, workers=2, label="benchlim").start(app)
    log(f"B2: {fleet.describe()} up")
    try:
        for rep in range(sizes.repeats):
            for i, (name, (pipeline, key)) in enumerate(SCENARIOS.items()):
                measured = _batch(app, (fleet,), f"l{rep}{i}", pipeline, key, RATE_N.get(key, n), NAP_S,
                                  skip=RATE_SKIP.get(key, 0))
                log(f"B2: {name} repetition {rep + 1}: bodies {measured['bodies_per_s']:.0f}/s, "
                    f"{measured['running']:.2f} running; {measured['slots']:.2f} slots in use")
                for k, v in measured.items():
                    got[name].setdefault(k, []).append(v)
            if with_pgqueuer(target, sizes):  # the concurrency-5 peer, in the same repetition
                line = pgqueuer(sizes, target, "--jobs", str(n), "--concurrency-limit", "5",
                                "--sleep", str(NAP_S), "--managers", "2")
                version = line["version"]
                seen = bodies([tuple(i) for i in line["intervals"]])
                pgq["per_s"].append(seen["per_s"])
                pgq["running"].append(seen["running"])
                log(f"pgqueuer {version} concurrency 5 repetition {rep + 1}: bodies {seen['per_s']:.0f}/s, "
                    f"{seen['running']:.2f} running")
    finally:
        fleet.stop()
    out: dict[str, Metric] = {}
    ideal = {"concurrency 5": 5 / NAP_S, "rate 200/s": 200.0, "rate 200/s, burst 1": 200.0}
    ideal_slots = {"concurrency 5": "of 5", "rate 200/s": "4 needed", "rate 200/s, burst 1": "4 needed"}
    diagnostics: dict[str, Metric] = {}
    for name, (_, key) in SCENARIOS.items():
        out[f"{name}: bodies/s / ideal ({ideal[name]:.0f}/s)"] = Metric.of(
            [r / ideal[name] for r in got[name]["bodies_per_s"]], "×")
        out[f"{name}: mean bodies running ({ideal_slots[name]})"] = Metric.of(got[name]["running"], "")
        out[f"{name}: violations"] = Metric(_violations(app, key), "", note="over every claim of the key")
        diagnostics.update(_diagnostics(name, got[name], ideal[name], ideal_slots[name]))
    if pgq["running"]:
        c5 = got["concurrency 5"]
        out[f"pgqueuer {version} (2 managers, concurrency_limit=5): concurrency 5: bodies/s / ideal (250/s)"] = (
            Metric.of([v / ideal["concurrency 5"] for v in pgq["per_s"]], "×"))
        out[f"pgqueuer {version}: concurrency 5: mean bodies running (of 5)"] = Metric.of(pgq["running"], "")
        out["concurrency 5: bodies/s, ductwork / pgqueuer (per repetition)"] = Metric.of(
            ratio(c5["bodies_per_s"], pgq["per_s"]), "×")
    return {**out, **diagnostics}


def limit3_two_fleets(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B2 `concurrency: 3`, 50 ms bodies, two `ductwork start` fleets, beside pgqueuer"""
    n = 60 if sizes.quick else 300
    got: dict[str, list[float]] = {}
    pgq: dict[str, list[float]] = {"per_s": [], "running": []}
    version = "1.6.0"
    fleets = (ProcessFleet(target, label="benchl3a"), ProcessFleet(target, label="benchl3b"))
    try:
        for fleet in fleets:
            fleet.start(app)
        log(f"B2 limit 3: two fleets of {fleets[0].describe()} up")
        for rep in range(sizes.repeats):
            measured = _batch(app, fleets, f"m{rep}", Limit3Nap, LIMIT3_KEY, n, NAP3_S)
            for k, v in measured.items():
                got.setdefault(k, []).append(v)
            log(f"B2 limit 3 repetition {rep + 1}: {measured['running']:.2f} bodies running")
            if with_pgqueuer(target, sizes):
                line = pgqueuer(sizes, target, "--jobs", str(n), "--concurrency-limit", "3",
                                "--sleep", str(NAP3_S), "--managers", "2")
                version = line["version"]
                seen = bodies([tuple(i) for i in line["intervals"]])
                pgq["per_s"].append(seen["per_s"])
                pgq["running"].append(seen["running"])
                log(f"pgqueuer {version} limit 3 repetition {rep + 1}: {seen['running']:.2f} bodies running")
    finally:
        for fleet in fleets:
            fleet.stop()
    ideal = 3 / NAP3_S
    out = {
        "mean bodies running (of 3)": Metric.of(got["running"], ""),
        f"bodies/s / ideal ({ideal:.0f}/s)": Metric.of([v / ideal for v in got["bodies_per_s"]], "×"),
    }
    if pgq["running"]:
        out[f"pgqueuer {version} (2 managers, concurrency_limit=3): mean bodies running (of 3)"] = Metric.of(
            pgq["running"], "")
        out["mean bodies running: ductwork / pgqueuer (per repetition)"] = Metric.of(
            ratio(got["running"], pgq["running"]), "×")
    out["violations"] = Metric(_violations(app, LIMIT3_KEY), "", note="over every claim of the key")
    out.update(_diagnostics("limit 3", got, ideal, "of 3"))
    return out


#: issue 32: which B2 scenario is measured on which fleet shape (keys of
#: bench.harness.SHAPES, the one table of the shapes), besides limit_precision's 2×5 and
#: limit3_two_fleets's two 1×5 fleets fed first, which keep their labels
SHAPE_SCENARIOS = {
    "concurrency 5": ("1×5", "1×10", "2×5"),      # one fleet, fed first
    "rate 200/s, burst 1": ("1×10",),              # one fleet, fed first
    "limit 3, two fleets": ("1×5", "1×10"),        # two fleets, fed first and triggered
}
#: the pace of a triggered batch, × the key's ideal rate: above 1 the backlog grows, by at
#: least (pace − 1) × ideal runs/s, so it never runs dry while the trigger loop keeps up
#: (the ``unwaited`` diagnostic says whether it did); near 1 it stays small (at 1.2 and
#: `concurrency: 3`, 72 runs/s against 60/s ideal: a 300-run batch ends with ≥ 50 waiting)
TRIGGER_PACE = 1.2
#: the shapes' `rate: 200/s, burst: 1` batch (RATE_N's 1,200, or 60 with --quick)
SHAPE_RATE_N = 1200


def _shape_batches(app, fleets: tuple[ProcessFleet, ...], sizes: Sizes, tag: str,
                   scenarios: list[tuple[str, type, str, int, float, int, float | None]]
                   ) -> tuple[dict[str, dict[str, list[float]]], dict[str, list[sa.ColumnElement[bool]]]]:
    """Every repetition of each scenario (name, pipeline, key, n, body seconds, skip,
    trigger pace in runs/s or None for fed first) through the same running fleets, in
    turn within a repetition; returns the figures per scenario and the row filters of its
    executions (for its violations)."""
    got: dict[str, dict[str, list[float]]] = {name: {} for name, *_ in scenarios}
    mine: dict[str, list[sa.ColumnElement[bool]]] = {name: [] for name, *_ in scenarios}
    for rep in range(sizes.repeats):
        for j, (name, pipeline, key, n, body_s, skip, per_s) in enumerate(scenarios):
            feed = FedFirst() if per_s is None else Triggered(per_s)
            measured = _batch(app, fleets, f"{tag}{rep}{j}", pipeline, key, n, body_s, skip=skip, feed=feed)
            mine[name].append(feed.executions())
            for k, v in measured.items():
                got[name].setdefault(k, []).append(v)
            paced = f"; {measured['triggers_per_s']:.0f} triggers/s, " \
                    f"{100 * measured['unwaited']:.0f} % of the window with none waiting" if per_s else ""
            log(f"B2 {name} repetition {rep + 1}: bodies {measured['bodies_per_s']:.0f}/s, "
                f"{measured['running']:.2f} running; {measured['slots']:.2f} slots in use{paced}")
    return got, mine


def _trigger_diagnostics(name: str, got: dict[str, list[float]], per_s: float) -> dict[str, Metric]:
    return {
        f"{name}: triggers/s held (paced at {per_s:.0f}/s)": Metric.of(got["triggers_per_s"], "/s",
                                                                      diagnostic=True),
        f"{name}: CPU per trigger call (the bench process's trigger thread)": Metric.of(
            got["trigger_cpu_ms"], "ms", diagnostic=True),
        f"{name}: share of the window with no run waiting (triggered, body not started)": Metric.of(
            [100 * v for v in got["unwaited"]], "%", diagnostic=True),
    }


def limits_by_shape(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B2 limits by fleet shape, 20 ms bodies, fed first: one fleet of each shape in turn"""
    n = 60 if sizes.quick else 300
    rate_n = 60 if sizes.quick else SHAPE_RATE_N
    ideal = {"concurrency 5": 5 / NAP_S, "rate 200/s, burst 1": 200.0}
    of = {"concurrency 5": "of 5", "rate 200/s, burst 1": "4 needed"}
    out: dict[str, Metric] = {}
    diagnostics: dict[str, Metric] = {}
    for i, (shape_key, shape) in enumerate(SHAPES.items()):
        scenarios = []
        if shape_key in SHAPE_SCENARIOS["concurrency 5"]:
            scenarios.append(("concurrency 5", ConcurrencyNap, CONCURRENCY_KEY, n, NAP_S, 0, None))
        if shape_key in SHAPE_SCENARIOS["rate 200/s, burst 1"]:
            scenarios.append(("rate 200/s, burst 1", RateBurst1Nap, RATE_BURST1_KEY, rate_n, NAP_S,
                              RATE_SKIP[RATE_BURST1_KEY], None))
        if not scenarios:
            continue
        fleet = shape.fleet(target, f"bench2s{i}").start(app)
        log(f"B2 shape {shape.name}: {fleet.describe()} × {shape.threads} threads up")
        try:
            got, mine = _shape_batches(app, (fleet,), sizes, f"s{i}", scenarios)
        finally:
            fleet.stop()
        for name, _, key, *_ in scenarios:
            row = f"{name}, {shape.name}"
            out[f"{row}: bodies/s / ideal ({ideal[name]:.0f}/s)"] = Metric.of(
                [v / ideal[name] for v in got[name]["bodies_per_s"]], "×")
            out[f"{row}: mean bodies running ({of[name]})"] = Metric.of(got[name]["running"], "")
            out[f"{row}: violations"] = Metric(_violations(app, key, sa.or_(*mine[name])), "",
                                               note="over every claim of the key with this shape")
            diagnostics.update(_diagnostics(row, got[name], ideal[name], of[name]))
    return {**out, **diagnostics}


def limit3_by_shape(target: Target, app, sizes: Sizes) -> dict[str, Metric]:
    """B2 `concurrency: 3`, 50 ms bodies, two fleets of each shape: fed first, and triggered one at a time"""
    n = 60 if sizes.quick else 300
    ideal = 3 / NAP3_S
    per_s = TRIGGER_PACE * ideal
    out: dict[str, Metric] = {}
    diagnostics: dict[str, Metric] = {}
    for i, (shape_key, shape) in enumerate(SHAPES.items()):
        if shape_key not in SHAPE_SCENARIOS["limit 3, two fleets"]:
            continue
        fed, triggered = f"two fleets of {shape.name}, fed first", f"two fleets of {shape.name}, triggered"
        scenarios = [(fed, Limit3Nap, LIMIT3_KEY, n, NAP3_S, 0, None),
                     (triggered, Limit3Nap, LIMIT3_KEY, n, NAP3_S, 0, per_s)]
        fleets = (shape.fleet(target, f"bench3s{i}a"), shape.fleet(target, f"bench3s{i}b"))
        try:
            for fleet in fleets:
                fleet.start(app)
            log(f"B2 limit 3: two fleets of {shape.name} up")
            got, mine = _shape_batches(app, fleets, sizes, f"t{i}", scenarios)
        finally:
            for fleet in fleets:
                fleet.stop()
        for name in (fed, triggered):
            shown = name if name == fed else f"{name} at {per_s:.0f}/s"
            out[f"{shown}: mean bodies running (of 3)"] = Metric.of(got[name]["running"], "")
            out[f"{shown}: bodies/s / ideal ({ideal:.0f}/s)"] = Metric.of(
                [v / ideal for v in got[name]["bodies_per_s"]], "×")
            diagnostics.update(_diagnostics(f"limit 3, {name}", got[name], ideal, "of 3"))
        out[f"two fleets of {shape.name}: mean bodies running, triggered / fed first (per repetition)"] = (
            Metric.of(ratio(got[triggered]["running"], got[fed]["running"]), "×"))
        out[f"two fleets of {shape.name}: violations"] = Metric(
            _violations(app, LIMIT3_KEY, sa.or_(*mine[fed], *mine[triggered])), "",
            note="over every claim of the key with this shape")
        diagnostics.update(_trigger_diagnostics(f"limit 3, {triggered}", got[triggered], per_s))
    return {**out, **diagnostics}


BENCHES = [limit_precision, limit3_two_fleets, limits_by_shape, limit3_by_shape]


def main() -> None:
    from bench.__main__ import run_standalone

    run_standalone("B2", __doc__)


if __name__ == "__main__":
    main()
