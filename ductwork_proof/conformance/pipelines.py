"""Random pipelines and step outcomes: the engine ends every run exactly where the model does.

The pipeline conformance hunts, shipped so that ``ductwork verify`` runs them against an
adopter's database (:func:`ductwork_proof.conformance.run_conformance`); the test suite runs
each on its databases with its hypothesis profile's budget
(``tests/properties/test_conformance_pipelines.py``). Each example empties the ductwork
tables first. :data:`HUNTS` names them:

``runs``: hypothesis generates a definition (every transition kind, nested; some fan-ins
deliberately invalid), trigger arguments, budgets and an oracle that decides each
execution's outcome (a value, a failure, a timeout, a crash; sometimes a return
value the step may not return). The model's ``run_to_quiescence`` and the engine
(a real database, a ManualClock, a worker and an advancer driven to quiescence,
resuming a dampened run once) must agree on the run's final state: its status,
the multiset of (node, status) of its steps, each branch's final node, status and
halt reason, and every fan-in's inputs (:func:`check_agreement`).

``batches`` drives both sides with the batched operations (group commits that advance
inline, advancer batches) and compares them the same way; ``keyed`` makes every node keyed
(the lane routine's hand-offs).

``hooks`` gives every definition an ``on_halt`` handler and draws how each of the hook's
attempts ends (success, failure, crash): a halted run owes one hook on both sides, and
it ends with the same status, counters and last outcome (``claim_hook``, ``run_hook``,
``reap_hook`` against the worker's hook runner).

``prune`` triggers a generated pipeline several times an hour apart (the last run left in
progress; some runs dampen), then prunes in batches at a generated cutoff on both sides:
the same runs go, a pruned run leaves no row in any run table, and every kept run is as it
was.

``revives`` revives each halted run (``revive``, with or without its context, twice over to
check the second returns the same run), sometimes with a "fix deployed" (every step
succeeds from then on), and drives the revived run to rest; the engine and the model must
agree on every run of the chain, and the model's invariants hold.

``parked`` holds every expand's advancer between its batches while a second worker and
advancer do a drawn amount of work, so children of the first batches run and arrive at
their fan-in before the later batches exist (``drive`` alone never does: an advancer
commits all of an expand's batches in one ``run_once``); the runs still end where the
model's do.

``triggers`` triggers with drawn keys (or none), in ductwork's own transaction or in a
caller's that commits or rolls back, with prunes in between that free keys: call by call
both sides return the same run or none, and the same runs exist at the end with the same
keys.

Checks: INV-ADV-1, INV-ADV-2, INV-ADV-3, INV-ADV-4, INV-EXE-1, INV-EXE-4, INV-RUN-1,
INV-HLT-1, INV-HLT-2, INV-PRN-1, INV-PRN-2, INV-REV-1, INV-REV-2, INV-REV-3, INV-TRG-1,
INV-TRG-2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as seeded
from hypothesis import strategies as st

from ductwork import faults
from ductwork.app import App
from ductwork.config import Config
from ductwork.db import schema
from ductwork.db.clock import ManualClock
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer
from ductwork.pipelines.runs import trigger_run
from ductwork.pipelines.snapshot import Definition
from ductwork.pipelines.steps import latest_step
from ductwork.testing import _next_wake
from ductwork_model.pipelines import (
    CRASH,
    FAILURE,
    NO_INPUT,
    canonical_json,
    run_and_model,
    run_to_quiescence,
    success,
)
from ductwork_proof.conformance import oracle_steps
from ductwork_proof.conformance.factories import reset_tables
from ductwork_proof.conformance.strategies import pipeline_configs, pipeline_scenarios


def engine_config(config, batch: int | None = None, keyed: bool = False) -> Config:
    """The engine's configuration for the model's ``config``; ``batch``: the size of the
    worker's group commits and of the advancer's batches (default: the engine's);
    ``keyed``: the scenarios' keys ``a`` and ``b`` of concurrency 1, so every keyed claim
    fills its key and every keyed success goes through the lane routine's hand-off."""
    batches = {} if batch is None else {"batch_size": batch}
    limits = {"limits": {"a": {"concurrency": 1}, "b": {"concurrency": 1}}} if keyed else {}
    return Config.from_section({
        "job_worker": {"max_retry": config.max_retry, "max_crash": config.max_crash,
                       "retry_delay": config.retry_delay_us / 1e6, "crash_backoff": config.crash_delay_us / 1e6,
                       **batches, **limits},
        "pipeline_advancer": {"expand_batch": config.expand_batch, "max_retry": config.advancer_max_retry,
                              "max_crash": config.advancer_max_crash,
                              **({} if batch is None else {"advance_batch": batch})},
    }, source="<pipeline conformance>")


def _manual_clock(app: App) -> ManualClock:
    """``app``'s clock, which these hunts move by rule: every app they build has a ManualClock."""
    clock = app.clock
    if not isinstance(clock, ManualClock):
        raise TypeError(f"the pipeline conformance hunts move time themselves: need a ManualClock, app has {clock!r}")
    return clock


def drive(app: App, run_id: str, limit: int = 5000) -> None:
    """Worker and advancer until nothing is left; time jumps to the next eligible moment."""
    worker, advancer = Worker(app), Advancer(app)
    for _ in range(limit):
        if advancer.run_once() != "idle":
            continue
        try:
            if worker.run_once() is not None:
                continue
        except oracle_steps.SimulatedCrash:
            continue
        wake, now = _next_wake(app)
        if wake is None:
            return
        _manual_clock(app).set(max(wake, now))
    raise AssertionError(f"run {run_id} did not settle within {limit} units of work")


def engine_summary(app: App, run_id: str) -> dict:
    s, b, r = schema.steps, schema.branches, schema.runs
    with app.begin() as tx:
        status = tx.execute(sa.select(r.c.status).where(r.c.id == run_id)).scalar_one()
        steps = tx.execute(sa.select(s.c.node, s.c.status, s.c.to_transition, s.c.input_args)
                           .where(s.c.run_id == run_id)).all()
        branches = []
        for branch in tx.execute(sa.select(b.c.id, b.c.status, b.c.halt_reason).where(b.c.run_id == run_id)):
            latest = latest_step(tx, branch.id)
            assert latest is not None, f"branch {branch.id} has no step: a branch is created with its first"
            branches.append((latest.node, branch.status, branch.halt_reason))
    fan_in: dict[str, list] = {}
    for step in steps:
        if step.to_transition in ("combine", "collapse"):
            fan_in.setdefault(step.node, []).append(json.loads(step.input_args))

    def rows(counter: Counter) -> list:
        return sorted(([*key, n] for key, n in counter.items()), key=canonical_json)

    return {
        "status": status,
        "steps": rows(Counter((step.node, step.status) for step in steps)),
        "branches": rows(Counter(branches)),
        "halt_reasons": rows(Counter((node, reason) for node, st_, reason in branches if st_ == "halted")),
        "fan_in_inputs": {n: sorted(v, key=canonical_json) for n, v in sorted(fan_in.items())},
    }


class Generated:
    """Stands in for a Pipeline class: trigger_run only needs ``definition``."""

    definition: Definition


def check_agreement(url: str, engine, scenario, config, batch: int | None = None,
                    parks: list[int] | None = None, keyed: bool = False) -> None:
    """``batch``: the model drives with its batched operations of that size, and the
    engine's worker and advancer batch as much (else each side drives as it does by default).
    ``parks``: the engine does that much work inside each expand's gaps between batches
    (:func:`parked_gaps`). ``keyed``: every node is keyed (``limit_by``)."""
    definition, args, oracle = scenario
    if keyed:
        definition = {**definition, "nodes": {n: {**spec, "limit_by": spec.get("limit_by") or "a"}
                                              for n, spec in definition["nodes"].items()}}
    expected = run_to_quiescence(definition, args, oracle, config, resumes=(NO_INPUT,), batch=batch).as_json()
    reset_tables(engine)
    app = App(url, engine_config(config, batch, keyed), ManualClock(datetime(2026, 1, 1)), engine=engine)
    oracle_steps.install(app, oracle)
    # Steps that declare timeout= run in a child process, where this process's oracle is
    # not installed; routing never depends on it and the oracle produces timeouts itself
    # (the child-process path is tests/integration/test_fleet.py's).
    in_process = {**definition, "nodes": {n: {**spec, "timeout_us": None} for n, spec in definition["nodes"].items()}}
    Generated.definition = Definition.from_json(in_process)
    run = trigger_run(app, Generated, list(args))
    with parked_gaps(app, parks) if parks else contextlib.nullcontext():
        drive(app, run.id)
        if run.refresh().status == "dampened":
            run.resume()
            drive(app, run.id)
    got = engine_summary(app, run.id)
    assert got == expected, (
        f"engine and model disagree\ndefinition: {json.dumps(definition)}\nargs: {args}\n"
        f"oracle: {oracle.to_json()}\nconfig: {config}\nengine: {got}\nmodel:  {expected}")


def hunt(db_url: str, which: Hunt, *, examples: int, seed: int | None = None,
         check: Callable[..., None] | None = None) -> None:
    """Run ``which``'s check, ``check(db_url, engine, scenario, config, **drawn)``, over
    ``examples`` generated scenarios and configs (``which.scenarios``, ``which.configs``;
    default ``pipeline_scenarios()`` and ``pipeline_configs()``) and ``which.strategies``,
    drawn by name, on one engine for the whole hunt. The hypothesis settings are the current
    profile's (the test suite's ``HYPOTHESIS_PROFILE``; ``run_conformance``'s own while it
    runs) but for the budget; ``seed`` seeds the search (same seed, same examples) and
    turns hypothesis's example database off. ``check`` stands in for ``which.check`` (a
    wrapper that records what it is given, then calls it).

    ``agree``'s source, its decorators included, is what ``derandomize`` seeds from: it is
    kept as it was in the test module, so the derandomized examples the engine-mutant hunts
    rely on stay the same."""
    from ductwork.db import engines

    engine = engines.create_engine(db_url)
    check = which.check if check is None else check
    scenarios, configs, strategies = which.scenarios, which.configs, dict(which.strategies)

    @settings(settings(), max_examples=examples, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(scenario=pipeline_scenarios() if scenarios is None else scenarios,
           config=pipeline_configs() if configs is None else configs, **strategies)
    def agree(scenario, config, **drawn):
        check(db_url, engine, scenario, config, **drawn)

    try:
        (agree if seed is None else seeded(seed)(agree))()
    finally:
        engine.dispose()


# --------------------------------------------------------------------------- prune

HOUR_US = 3_600_000_000
#: (runs pruned, live runs kept) per example, printed with ``-s``
PRUNE_COVERAGE: Counter = Counter()


def check_prune_agreement(url: str, engine, scenario, config, runs: int, back_halves: int, batch: int) -> None:
    """``runs`` runs of the scenario an hour apart, each driven to rest but the last; then a
    prune of everything finished more than ``back_halves`` half-hours ago, in batches of
    ``batch``, on both sides. Runs settle within minutes of model time, so a cutoff on a
    half hour never falls inside one run's life and both sides decide alike."""
    from datetime import timedelta

    from ductwork.pipelines import prune as pruning
    from ductwork_model.invariants import check_all
    from ductwork_model.pipelines import PipelinesModel

    definition, args, oracle = scenario
    model = PipelinesModel(config)
    model_runs = []
    reset_tables(engine)
    clock = ManualClock(datetime(2026, 1, 1))
    app = App(url, engine_config(config), clock, engine=engine)
    oracle_steps.install(app, oracle)
    in_process = {**definition, "nodes": {n: {**spec, "timeout_us": None} for n, spec in definition["nodes"].items()}}
    Generated.definition = Definition.from_json(in_process)
    engine_runs = []
    for index in range(runs):
        model_runs.append(model.trigger(definition, args))
        engine_runs.append(trigger_run(app, Generated, list(args)))
        if index < runs - 1:  # the last run stays in progress
            model.drive(oracle)
            drive(app, engine_runs[-1].id)
            model.advance_clock(HOUR_US)
            clock.advance(timedelta(microseconds=HOUR_US))
    kept_before = {run.id: engine_summary(app, run.id) for run in engine_runs}
    back_us = back_halves * HOUR_US // 2
    expected = set(model.prune_all(model.now_us - back_us, batch))
    check_all(model)
    result = pruning.prune(app, timedelta(microseconds=back_us), batch_size=batch)
    by_index = dict(zip(model_runs, engine_runs, strict=True))
    expected_engine = {by_index[run_id].id for run_id in expected}
    with app.begin() as tx:
        present = set(tx.execute(sa.select(schema.runs.c.id)).scalars())
        left = pruning._count(tx, sorted(expected_engine)) if expected_engine else {}
    statuses = [model.runs[r].status for r in model_runs]
    assert present == {run.id for run in engine_runs} - expected_engine, (
        f"engine and model prune different runs\ndefinition: {json.dumps(definition)}\nstatuses: {statuses}\n"
        f"back: {back_halves} half-hours\nmodel pruned: {sorted(model_runs.index(r) for r in expected)}\n"
        f"engine kept: {sorted(i for i, run in enumerate(engine_runs) if run.id in present)}")
    assert result.runs == len(expected)
    PRUNE_COVERAGE[(len(expected), sum(model.runs[r].status not in ('completed', 'halted') for r in model_runs))] += 1
    assert set(left.values()) <= {0}, f"[INV-PRN-2] rows left of pruned runs: {left}"
    for run in engine_runs:
        if run.id in present:
            assert engine_summary(app, run.id) == kept_before[run.id], f"[INV-PRN-1] kept run {run.id} changed"


#: per database: expand gaps reached, and fan-in arrivals made in them, over the hunt
PARKED_COVERAGE: Counter = Counter()


@contextlib.contextmanager
def parked_gaps(app: App, parks: list[int]) -> Iterator[None]:
    """While it is open, an expand's advancer parked between two batches (the
    ``between_expand_batches`` checkpoint, its claim held) waits while a second worker and
    advancer do ``parks[i]`` units of work in its i-th gap (moving the clock as
    :func:`drive` does): children of the batches so far run and arrive at their fan-in
    before the later batches exist. Work in a gap reaching a gap of its own (a nested
    expand) does not park again."""
    real, worker, advancer = faults.hit, Worker(app), Advancer(app)
    inside: list[str] = []

    def arrivals() -> int:
        with app.begin(readonly=True) as tx:
            return int(tx.execute(sa.select(sa.func.count()).select_from(schema.branches)
                                  .where(schema.branches.c.fanin_arrived_at.is_not(None))).scalar_one())

    def hit(name: str) -> None:
        if name == faults.BETWEEN_EXPAND_BATCHES and not inside:
            inside.append(name)
            try:
                before = arrivals()
                for _ in range(parks[PARKED_COVERAGE["gaps"] % len(parks)]):
                    try:
                        ran = worker.run_once() is not None
                    except oracle_steps.SimulatedCrash:
                        ran = True
                    if advancer.run_once() == "idle" and not ran:
                        wake, now = _next_wake(app)  # as drive does: time jumps to the next eligible moment
                        if wake is None:
                            break
                        _manual_clock(app).set(max(wake, now))
                PARKED_COVERAGE["gaps"] += 1
                PARKED_COVERAGE["arrivals in gaps"] += arrivals() - before
            finally:
                inside.clear()
        real(name)

    faults.hit = hit
    try:
        yield
    finally:
        faults.hit = real


def _expands_into_a_fan_in(scenario) -> bool:
    """Whether an expand's children go straight on to a collapse (their arrivals)."""
    edges = scenario[0]["edges"]
    return any(e["type"] == "expand" and edges.get(e["to"][0], {}).get("type") == "collapse" for e in edges.values())


def _wide_expands(scenario):
    """The scenario with every expand returning 1 to 4 items (a gap after each but the last)."""
    definition, args, oracle = scenario
    plans = {node: dataclasses.replace(plan, max_items=4) if plan.kind == "list" else plan
             for node, plan in oracle.plans.items()}
    return definition, args, type(oracle)(plans)


# --------------------------------------------------------------------------- on_halt hooks (issue 16)

HOOK_HANDLER = f"{oracle_steps.__name__}:OnHalt"
HOOK_ATTEMPTS = st.lists(st.sampled_from(["success", "failure", "process_crashed"]), max_size=5)
_HOOK_OUTCOMES = {"success": success(None), "failure": FAILURE, "process_crashed": CRASH}


def engine_hook(app: App, run_id: str) -> dict | None:
    h = schema.halt_hooks
    with app.begin() as tx:
        rows = tx.execute(sa.select(h).where(h.c.run_id == run_id)).all()
    assert len(rows) <= 1, f"[INV-HLT-1] run {run_id} has {len(rows)} hooks"
    if not rows:
        return None
    row = rows[0]
    return {"klass": row.klass, "status": row.status, "retry_count": row.retry_count,
            "crash_count": row.crash_count, "last": row.last_outcome}


def check_hook_agreement(url: str, engine, scenario, config, attempts: list[str]) -> None:
    """The scenario with an on_halt handler whose attempts end as ``attempts`` says: the
    run and its hook end where the model's do."""
    definition, args, oracle = scenario
    definition = {**definition, "on_halt": HOOK_HANDLER}

    def hook_oracle(_run_id, attempt):
        return _HOOK_OUTCOMES[attempts[attempt]] if attempt < len(attempts) else success(None)

    summary, model, model_run = run_and_model(definition, args, oracle, config, resumes=(NO_INPUT,),
                                              hook_oracle=hook_oracle)
    hook = model.hook_summary(model_run)
    expected_hook = None if hook is None else {
        "klass": hook["klass"], "status": hook["status"], "retry_count": hook["retry_count"],
        "crash_count": hook["crash_count"], "last": hook["attempts"][-1] if hook["attempts"] else None}
    reset_tables(engine)
    app = App(url, engine_config(config), ManualClock(datetime(2026, 1, 1)), engine=engine)
    oracle_steps.install(app, oracle)
    oracle_steps.install_hooks(attempts)
    in_process = {**definition, "nodes": {n: {**spec, "timeout_us": None} for n, spec in definition["nodes"].items()}}
    Generated.definition = Definition.from_json(in_process)
    run = trigger_run(app, Generated, list(args))
    drive(app, run.id)
    if run.refresh().status == "dampened":
        run.resume()
        drive(app, run.id)
    got = {"run": engine_summary(app, run.id), "hook": engine_hook(app, run.id)}
    want = {"run": summary.as_json(), "hook": expected_hook}
    assert got == want, (
        f"engine and model disagree\ndefinition: {json.dumps(definition)}\nargs: {args}\n"
        f"oracle: {oracle.to_json()}\nhook attempts: {attempts}\nconfig: {config}\nengine: {got}\nmodel:  {want}")


# --------------------------------------------------------------------------- revive


#: what the revive machine did, printed with ``-s``: examples, revives, revived runs completed
REVIVE_FIGURES: Counter[str] = Counter()


class Fixed:
    """The oracle after a fix is deployed: every attempt is past the planned faults."""

    def __init__(self, oracle):
        self.oracle = oracle

    def __call__(self, node, input_args, attempt):
        return self.oracle(node, input_args, attempt + 1000)

    def to_json(self) -> str:
        return json.dumps({"fixed": json.loads(self.oracle.to_json())})


def model_revives(definition, args, oracle, config, revives) -> tuple[list[str], list[dict], object]:
    """The model's side: trigger, drive, resume once, then for each ``(duplicate_context,
    fixed)`` revive the last run while it is halted and drive the new run to rest."""
    from ductwork_model.invariants import check_all
    from ductwork_model.pipelines import PipelinesModel

    model = PipelinesModel(config)
    runs = [model.trigger(definition, args)]
    model.drive(oracle)
    if model.runs[runs[0]].status == "dampened":
        model.resume(runs[0])
        model.drive(oracle)
    for duplicate_context, fixed in revives:
        if model.runs[runs[-1]].status != "halted":
            break
        new = model.revive(runs[-1], duplicate_context)
        assert model.revive(runs[-1], not duplicate_context) == new  # [INV-REV-1]
        step_oracle = Fixed(oracle) if fixed else oracle
        model.drive(step_oracle)
        if model.runs[new].status == "dampened":
            model.resume(new)
            model.drive(step_oracle)
        runs.append(new)
    check_all(model)
    return runs, [model.summary(r).as_json() for r in runs], model


def check_revives(url: str, engine, scenario, config, revives) -> None:
    from ductwork.pipelines.runs import Run

    definition, args, oracle = scenario
    model_runs, expected, _ = model_revives(definition, args, oracle, config, revives)
    reset_tables(engine)
    app = App(url, engine_config(config), ManualClock(datetime(2026, 1, 1)), engine=engine)
    oracle_steps.install(app, oracle)
    in_process = {**definition, "nodes": {n: {**spec, "timeout_us": None} for n, spec in definition["nodes"].items()}}
    Generated.definition = Definition.from_json(in_process)
    runs = [trigger_run(app, Generated, list(args))]
    drive(app, runs[0].id)
    if runs[0].refresh().status == "dampened":
        runs[0].resume()
        drive(app, runs[0].id)
    for duplicate_context, fixed in revives:
        if runs[-1].refresh().status != "halted":
            break
        new = runs[-1].revive(duplicate_context)
        assert runs[-1].revive(not duplicate_context).id == new.id  # [INV-REV-1]
        oracle_steps.install(app, Fixed(oracle) if fixed else oracle)
        drive(app, new.id)
        if new.refresh().status == "dampened":
            new.resume()
            drive(app, new.id)
        runs.append(new)
    got = [engine_summary(app, run.id) for run in runs]
    assert isinstance(runs[-1], Run)
    REVIVE_FIGURES.update(examples=1, revives=len(runs) - 1,
                          revived_completed=sum(1 for g in got[1:] if g["status"] == "completed"))
    assert got == expected, (
        f"engine and model disagree over a revive chain of {len(model_runs)} runs\n"
        f"definition: {json.dumps(definition)}\nargs: {args}\noracle: {oracle.to_json()}\n"
        f"revives: {revives}\nconfig: {config}\nengine: {got}\nmodel:  {expected}")


# --------------------------------------------------------------------------- triggers

#: calls per way of triggering (own, commit, rollback), runs created, runs returned by key and
#: prunes; printed with ``-s``
TRIGGER_FIGURES: Counter[str] = Counter()


def _released(model) -> int:
    """How many runs gave their key to a windowed trigger."""
    return sum(1 for r in model.runs.values() if r.key_released_at_us is not None)


def check_triggers(url: str, engine, scenario, config, calls) -> None:
    """Each call triggers the scenario with a key (or none) in ductwork's own transaction,
    or in a caller's transaction that commits or rolls back, with or without a key window
    (half an hour, an hour or two); some calls first drive every run to rest and move both
    clocks an hour (``age``), and then may prune what finished more than half an hour ago,
    freeing its key (``prune``). Call by call the engine and the model return the same run (by
    creation order) or none, and in the end the same runs exist, holding the same keys."""
    from datetime import timedelta

    from ductwork.pipelines import prune as pruning
    from ductwork_model.invariants import check_all
    from ductwork_model.pipelines import PipelinesModel

    definition, args, oracle = scenario
    model = PipelinesModel(config)
    reset_tables(engine)
    clock = ManualClock(datetime(2026, 1, 1))
    app = App(url, engine_config(config), clock, engine=engine)
    oracle_steps.install(app, oracle)
    in_process = {**definition, "nodes": {n: {**spec, "timeout_us": None} for n, spec in definition["nodes"].items()}}
    Generated.definition = Definition.from_json(in_process)
    model_order: list[str] = []  # created runs, in order, on each side
    engine_order: list[str] = []
    for key, how, before, window_us in calls:
        window_us = window_us if key is not None else None
        if before in ("prune", "age"):
            model.drive(oracle)
            drive(app, "every run")
            model.advance_clock(HOUR_US)
            clock.advance(timedelta(microseconds=HOUR_US))
        if before == "prune":
            model.prune_all(model.now_us - HOUR_US // 2, 100)
            pruning.prune(app, timedelta(microseconds=HOUR_US // 2), batch_size=100)
            TRIGGER_FIGURES["prunes"] += 1
        window = None if window_us is None else timedelta(microseconds=window_us)
        released = _released(model)
        if how == "own":
            expected = model.trigger(definition, args, key, key_window_us=window_us)
            got: str | None = trigger_run(app, Generated, list(args), key=key, key_window=window).id
        else:
            expected = model.trigger_in(definition, args, key, commit=how == "commit", key_window_us=window_us)
            with engine.connect() as conn:
                transaction = conn.begin()
                got = trigger_run(app, Generated, list(args), key=key, connection=conn, key_window=window).id
                if how == "commit":
                    transaction.commit()
                else:
                    transaction.rollback()
                    got = None
        if expected is not None and expected not in model_order:
            model_order.append(expected)
        if got is not None and got not in engine_order:
            engine_order.append(got)
        TRIGGER_FIGURES[how] += 1
        TRIGGER_FIGURES["released"] += _released(model) - released
        index = None if expected is None else model_order.index(expected)
        assert index == (None if got is None else engine_order.index(got)), (
            f"call {key!r} {how}: the model returned run #{index}, the engine run "
            f"#{None if got is None else engine_order.index(got)}\ncalls: {calls}")
    check_all(model)
    TRIGGER_FIGURES["created"] += len(model_order)
    TRIGGER_FIGURES["returned_by_key"] += sum(1 for t in model.triggers if not t.created)
    with app.begin() as tx:
        rows = {run.id: run.trigger_key for run in tx.execute(sa.select(schema.runs.c.id, schema.runs.c.trigger_key))}
    expected_rows = {engine_order[model_order.index(run_id)]:
                     None if model.runs[run_id].key_released_at_us is not None else model.runs[run_id].trigger_key
                     for run_id in model.live_runs()}
    assert rows == expected_rows, f"runs and keys differ\nengine: {rows}\nmodel: {expected_rows}\ncalls: {calls}"


# --------------------------------------------------------------------------- the hunts


@dataclass(frozen=True)
class Hunt:
    """One pipeline conformance hunt: its check, what it shows, and what it draws besides a
    scenario and a config (``scenarios``/``configs``: other strategies for those;
    ``strategies``: the check's further arguments, drawn by name in this order)."""

    check: Callable[..., None]
    statement: str
    scenarios: st.SearchStrategy[Any] | None = None
    configs: st.SearchStrategy[Any] | None = None
    strategies: Mapping[str, st.SearchStrategy[Any]] = field(default_factory=dict)


#: every pipeline conformance hunt, by name: the test suite runs each on its databases
#: (``tests/properties/test_conformance_pipelines.py``), ``ductwork verify`` all of them
HUNTS: dict[str, Hunt] = {
    "runs": Hunt(check_agreement, "a generated run ends in the engine where it ends in the model"),
    "batches": Hunt(check_agreement, "a run driven by group commits and advancer batches ends where the model's "
                    "batched operations end it", strategies={"batch": st.sampled_from([2, 5, 50])}),
    "keyed": Hunt(check_agreement, "a run of keyed steps (the lane routine's hand-offs) ends where the model ends it",
                  strategies={"batch": st.sampled_from([1, 2, 5]), "keyed": st.just(True)}),
    "parked": Hunt(check_agreement, "children that arrive at their fan-in while their expand is parked between "
                   "batches end where the model ends them",
                   scenarios=pipeline_scenarios().filter(_expands_into_a_fan_in).map(_wide_expands),
                   configs=pipeline_configs().map(lambda c: dataclasses.replace(c, expand_batch=1)),
                   strategies={"parks": st.lists(st.integers(0, 20), min_size=1, max_size=4)}),
    "prune": Hunt(check_prune_agreement, "a prune removes the runs the model prunes, whole, and leaves the others "
                  "as they were", strategies={"runs": st.integers(2, 4), "back_halves": st.sampled_from([0, 1, 3, 5]),
                                              "batch": st.sampled_from([1, 2, 100])}),
    "hooks": Hunt(check_hook_agreement, "a halted run's on_halt hook is owed and delivered as the model's is",
                  strategies={"attempts": HOOK_ATTEMPTS}),
    "revives": Hunt(check_revives, "every run of a revive chain ends where the model's does",
                    strategies={"revives": st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=3)}),
    "triggers": Hunt(check_triggers, "keyed and transactional triggers return the runs the model's do",
                     strategies={"calls": st.lists(
                         st.tuples(st.sampled_from([None, "order-1", "order-1", "order-2"]),
                                   st.sampled_from(["own", "commit", "rollback"]),
                                   st.sampled_from(["none", "age", "age", "prune"]),
                                   st.sampled_from([None, HOUR_US // 2, HOUR_US, 2 * HOUR_US])),
                         min_size=3, max_size=6)}),
}
