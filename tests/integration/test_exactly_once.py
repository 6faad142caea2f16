"""Each exactly-once guard, attacked by real threads on separate connections.

Checks: INV-ADV-1 (successors created once), INV-ADV-2 (a stale claim token commits
nothing; the claim re-asserts the candidate predicate), INV-ADV-3 (the fan-in
counter fires once), INV-EXE-1 (a live process recovers claims no thread of it
holds), INV-EXE-2 (an outcome is recorded at most once; a reaped owner's commit is
rejected), INV-RUN-1 (siblings ending at once still settle their run), and that
every named unique constraint exists on each database.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from datetime import datetime

import pytest
import sqlalchemy as sa

from ductwork import Pipeline
from ductwork.db import schema
from ductwork.db.dialects import violated_constraint
from ductwork.errors import CommitFailed
from ductwork.fleet.execute import make_output
from ductwork.fleet.processes import register
from ductwork.fleet.reaper import reap
from ductwork.fleet.worker import Worker
from ductwork.limits.claims import claim
from ductwork.pipelines.advance import Advancer
from ductwork.pipelines.branches import (
    candidates,
    claim_branch,
    claim_branches,
    release_advancement,
)
from ductwork.pipelines.outcomes import record_crash, record_failure, record_invalid, record_success
from ductwork.pipelines.runs import cached_definition
from ductwork.testing import drain
from tests.conftest import race
from tests.factories import make_executions, make_run
from tests.workloads import Echo, Fan, OnKey, Takes, TwoStep, Unkeyed

RACERS = 4


def _default_app(db_url, **section):
    """A fresh app on empty tables, made the default for the test (a fixture's body)."""
    from tests.conftest import installed, make_app

    yield from installed(make_app(db_url, **section))


@pytest.fixture
def app(db_url):
    """The conftest app, but every edge goes through an advancer (these tests race the
    advancer's claim protocol on chains, which workers would otherwise advance inline)."""
    yield from _default_app(db_url, pipeline_advancer={"inline_linear": False})


class KeyedEcho(OnKey):
    key = "in_a_row"


#: what :class:`ReapsItsWorker` does while it runs (set by the test)
WHILE_RUNNING: list = []


class ReapsItsWorker(Takes):
    """Returns its argument after the test's callback ran (the reaper taking its claim)."""

    def execute(self):
        WHILE_RUNNING[0]()
        return self.value


class ReapedUnderItsStep(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(ReapsItsWorker)


@pytest.fixture
def manual_advancer_app(db_url):
    """As ``app`` (every edge through an advancer), on a ManualClock that only the test moves."""
    from datetime import datetime

    from ductwork.db.clock import ManualClock

    yield from _default_app(db_url, clock=ManualClock(datetime(2026, 1, 1, 12, 0, 0)),
                            pipeline_advancer={"inline_linear": False})


@pytest.fixture
def in_a_row_app(db_url):
    """The conftest app with a key whose concurrency lets one thread run 4 in a row."""
    yield from _default_app(db_url, job_worker={"limits": {"in_a_row": {"concurrency": 8}}})


@pytest.fixture
def app_inline(db_url):
    """The conftest app as configured by default: workers advance simple edges inline."""
    yield from _default_app(db_url)


def processes(app, n):
    return [register(app, role="test", label=f"racer-{i}") for i in range(n)]


def step_nodes(app, run_id):
    with app.begin() as tx:
        return Counter(tx.execute(
            sa.select(schema.steps.c.node).where(schema.steps.c.run_id == run_id)).scalars())


def advancement_column(app, column: str) -> list:
    """One column of every advancement (``error_klass``, ``error_message``), oldest first."""
    a = schema.advancements
    with app.begin() as tx:
        return list(tx.execute(sa.select(a.c[column]).order_by(a.c.started_at, a.c.id)).scalars())


def ready_branch(app, pipeline, arg):
    """Trigger and run the first step, leaving its branch ready to advance."""
    run = pipeline.trigger(arg)
    assert Worker(app).run_once().outcome == "success"
    with app.begin() as tx:
        (branch_id,) = candidates(tx, 10)
    return run, branch_id


def test_racing_claims_on_one_branch_have_one_winner(app):
    pids = processes(app, RACERS)
    for _ in range(10):
        run, branch_id = ready_branch(app, TwoStep, 1)
        claims = race([lambda p=p, b=branch_id: claim_branch(app, b, p) for p in pids])
        winners = [c for c in claims if c is not None]
        assert len(winners) == 1  # [INV-ADV-2] one token
        assert Advancer(app, process_id=winners[0].token and pids[claims.index(winners[0])]).advance(
            winners[0]) == "advanced"
        assert step_nodes(app, run.id) == {"Echo#0": 1, "Echo#1": 1}  # [INV-ADV-1]
        drain(app, timeout=30)


def test_racing_advancers_on_fan_out_and_fan_in_create_each_successor_once(app):
    pids = processes(app, RACERS)
    runs = [Fan.trigger(6) for _ in range(3)]
    stop = threading.Event()

    def advance_loop(pid):
        advancer, worker = Advancer(app, process_id=pid), Worker(app, process_id=pid)
        while not stop.is_set():
            if (advancer.run_once() == "idle" and worker.run_once() is None
                    and all(r.refresh().status != "in_progress" for r in runs)):
                return

    race([lambda p=p: advance_loop(p) for p in pids])
    for run in runs:
        assert run.refresh().status == "completed"
        assert step_nodes(app, run.id) == {"Items#0": 1, "Times10#1": 6, "Gather#2": 1}
        assert run.steps()[-1].output == [i * 10 for i in range(6)]
    errors = [klass for klass in advancement_column(app, "error_klass") if klass is not None]
    assert errors == []  # no advancement hit a constraint or a stale fence error


def test_stale_token_commits_nothing(app):
    pa, pb = processes(app, 2)
    run, branch_id = ready_branch(app, TwoStep, 1)
    stale = claim_branch(app, branch_id, pa)
    assert reap(app, pa, force=True)  # the reaper releases A's claim
    fresh = claim_branch(app, branch_id, pb)
    assert fresh is not None
    assert fresh.token != stale.token
    assert Advancer(app, process_id=pb).advance(fresh) == "advanced"
    assert Advancer(app, process_id=pa).advance(stale) == "stale"  # [INV-ADV-2]
    assert step_nodes(app, run.id) == {"Echo#0": 1, "Echo#1": 1}
    assert advancement_column(app, "error_klass") == ["ductwork.ProcessCrash", None]


def test_a_stale_token_in_a_batch_commits_nothing_for_its_branch_only(app):
    """An advancer's batch holds two claims, one of them lost meanwhile (released and
    re-claimed by another process): the batch advances the live one and refuses only the
    stale one, which the new holder then advances once [INV-ADV-2]."""
    pa, pb = processes(app, 2)
    run1, branch1 = ready_branch(app, TwoStep, 1)
    run2 = TwoStep.trigger(2)
    assert Worker(app).run_once().outcome == "success"
    with app.begin() as tx:
        branch2 = next(b for b in candidates(tx, 10) if b != branch1)
    claims = {c.branch_id: c for c in claim_branches(app, [branch1, branch2], pa)}
    assert set(claims) == {branch1, branch2}
    lost = claims[branch1]
    with app.begin() as tx:  # A's claim on branch 1 is released (as the reaper would) ...
        release_advancement(tx, lost.advancement_id, branch1, lost.token, "released by the test")
    fresh = claim_branch(app, branch1, pb)  # ... and B claims it
    assert fresh is not None
    results = Advancer(app, process_id=pa).advance_batch([claims[branch1], claims[branch2]])
    assert results == ["stale", "advanced"]  # [INV-ADV-2] only the stale branch is refused
    assert step_nodes(app, run1.id) == {"Echo#0": 1}
    assert step_nodes(app, run2.id) == {"Echo#0": 1, "Echo#1": 1}
    assert Advancer(app, process_id=pb).advance(fresh) == "advanced"
    assert step_nodes(app, run1.id) == {"Echo#0": 1, "Echo#1": 1}  # [INV-ADV-1]


def test_a_success_leaves_a_held_branch_to_its_advancer(app_inline):
    """A success whose branch an advancer holds is not advanced inline: the step is left
    ``advancing`` and the branch and its run untouched [INV-ADV-2]."""
    run = Unkeyed.trigger(1)
    b = schema.branches
    with app_inline.begin() as tx:
        tx.execute(b.update().where(b.c.run_id == run.id).values(status="advancing", claim_token="held-elsewhere"))
    assert Worker(app_inline).run_once().outcome == "success"
    with app_inline.begin() as tx:
        branch = tx.execute(sa.select(b.c.status, b.c.claim_token).where(b.c.run_id == run.id)).one()
        step = tx.execute(sa.select(schema.steps.c.status).where(schema.steps.c.run_id == run.id)).scalar_one()
    assert (tuple(branch), step, run.refresh().status) == (("advancing", "held-elsewhere"), "advancing",
                                                          "in_progress")


def test_a_group_commit_completes_one_step_runs_without_an_advancer(app_inline):
    """One-step runs: the worker's group commit completes each step, ends each branch and
    completes each run in the transaction that records the successes, writing four rows a
    run in all."""
    runs = [Unkeyed.trigger(i) for i in range(6)]
    worker = Worker(app_inline)
    while worker.run_once() is not None:
        pass
    assert {r.refresh().status for r in runs} == {"completed"}
    with app_inline.begin() as tx:
        assert candidates(tx, 10) == []
        assert set(tx.execute(sa.select(schema.branches.c.status)).scalars()) == {"completed"}
        # four rows a run (run, branch, step, execution): a worker's move holds no claim, so
        # it writes no advancement row (an advancer's claim is one)
        rows = {t.name: tx.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                for t in (schema.runs, schema.branches, schema.steps, schema.executions, schema.advancements)}
    assert rows == {"ductwork_runs": 6, "ductwork_branches": 6, "ductwork_steps": 6, "ductwork_executions": 6,
                    "ductwork_advancements": 0}


class KeyedChain(Pipeline):
    """Two keyed steps: the first's success is a release, then an advancement."""

    @classmethod
    def define(cls, p):
        p.start(Echo, limit_by="released").chain(to=Echo, limit_by="released")


@pytest.fixture
def keyed_app(db_url):
    """Keys ``released`` (concurrency 1: every claim fills it) and ``roomy`` (2)."""
    limits = {"released": {"concurrency": 1}, "roomy": {"concurrency": 2}}
    yield from _default_app(db_url, job_worker={"limits": limits})


def _nodes(run) -> Counter:
    return Counter((s.node, s.status) for s in run.steps())


class RoomyChain(Pipeline):
    """Two keyed steps on a key with room for both."""

    @classmethod
    def define(cls, p):
        p.start(Echo, limit_by="roomy").chain(to=Echo, limit_by="roomy")


@pytest.mark.parametrize("pipeline", [KeyedChain, RoomyChain], ids=["a key its claim filled", "a key with room"])
def test_a_keyed_success_advances_its_branch_in_the_transaction_that_records_it(keyed_app, pipeline):
    """Full or not, a keyed success writes what follows it in the transaction that records
    it, before the routine takes the key's lock: the successor exists, no advancer ran,
    nothing is left for one."""
    run = pipeline.trigger(1)
    pid = register(keyed_app, role="test", label="keyed")
    claimed = claim(keyed_app, pid)
    definition = cached_definition(keyed_app, claimed.definition_sha1)
    output = make_output(claimed.klass, definition, claimed.node, 1)
    assert record_success(keyed_app, claimed, output) == []
    assert _nodes(run) == Counter({("Echo#0", "completed"): 1, ("Echo#1", "in_progress"): 1})
    with keyed_app.begin() as tx:
        assert candidates(tx, 10) == []


def test_a_worker_alone_advances_a_keyed_success_without_an_advancer(keyed_app):
    """A worker alone runs the first keyed step: what follows is there when its
    ``run_once`` returns, and no advancer has anything to do."""
    run = KeyedChain.trigger(1)
    assert Worker(keyed_app).run_once().outcome == "success"
    assert _nodes(run) == Counter({("Echo#0", "completed"): 1, ("Echo#1", "in_progress"): 1})
    with keyed_app.begin() as tx:
        assert candidates(tx, 10) == []


def test_stale_candidate_is_not_claimed_off_its_new_step(app):
    (pid,) = processes(app, 1)
    run, branch_id = ready_branch(app, TwoStep, 1)
    with app.begin() as tx:
        assert candidates(tx, 10) == [branch_id]  # read by a slow advancer...
    assert Advancer(app).run_once() == "advanced"  # ...while another advances and releases it
    assert claim_branch(app, branch_id, pid) is None  # the re-asserted predicate refuses
    assert step_nodes(app, run.id) == {"Echo#0": 1, "Echo#1": 1}


def test_fan_in_counter_fires_once_when_siblings_race(app):
    pids = processes(app, RACERS)
    run = Fan.trigger(RACERS)
    drain_first = Worker(app)
    assert drain_first.run_once().outcome == "success"
    assert Advancer(app).run_once() == "advanced"  # expands into RACERS children
    while drain_first.run_once() is not None:
        pass
    with app.begin() as tx:
        children = candidates(tx, 10)
    assert len(children) == RACERS
    claims = [claim_branch(app, b, p) for b, p in zip(children, pids, strict=True)]
    results = race([lambda c=c, p=p: Advancer(app, process_id=p).advance(c)
                    for c, p in zip(claims, pids, strict=True)])
    assert results == ["advanced"] * RACERS
    assert step_nodes(app, run.id)["Gather#2"] == 1  # [INV-ADV-3]
    drain(app, timeout=30)
    assert run.refresh().steps()[-1].output == [i * 10 for i in range(RACERS)]


def test_workers_racing_for_one_execution(app):
    pids = processes(app, RACERS)
    TwoStep.trigger(1)
    claims = race([lambda p=p: claim(app, p) for p in pids])
    assert sum(c is not None for c in claims) == 1


def test_reaped_owner_cannot_commit_and_the_step_runs_again(app):
    (pid,) = processes(app, 1)
    run = TwoStep.trigger(5)
    claimed = claim(app, pid)
    assert reap(app, pid, force=True)  # crashed: a re-run execution is queued
    output = make_output(claimed.klass, app.definition(claimed.definition_sha1), claimed.node, 5)
    with pytest.raises(CommitFailed):
        record_success(app, claimed, output)  # [INV-EXE-2]
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    e = schema.executions
    with app.begin() as tx:
        outcomes = tx.execute(sa.select(e.c.outcome).order_by(e.c.created_at, e.c.id)).scalars().all()
    assert outcomes[:2] == ["process_crashed", "success"]


def test_a_reaped_owners_success_after_its_re_run_moved_the_step_on_is_refused(app_inline):
    """A step's owner is reaped; the re-run succeeds and its worker moves the step on
    inline (completed, its successor created). The first owner's success arrives after:
    its step is no longer in progress, so it is refused as taken (CommitFailed, not a
    second completion) and writes nothing: every row of the run is as the re-run left it
    [INV-EXE-2, INV-ADV-1]."""
    from tests.factories import run_rows

    app = app_inline
    (pid,) = processes(app, 1)
    run = TwoStep.trigger(5)
    claimed = claim(app, pid)
    assert reap(app, pid, force=True)  # crashed: a re-run execution is queued
    assert Worker(app).run_once().outcome == "success"  # the re-run, moved on inline
    assert _nodes(run) == Counter({("Echo#0", "completed"): 1, ("Echo#1", "in_progress"): 1})
    before = run_rows(app, run.id)
    output = make_output(claimed.klass, app.definition(claimed.definition_sha1), claimed.node, 5)
    with pytest.raises(CommitFailed):
        record_success(app, claimed, output)  # [INV-EXE-2] the step's status guard refuses it
    assert run_rows(app, run.id) == before


def test_a_reaped_owner_cannot_record_its_execution_invalid(app):
    """An owner that lost its claim to the reaper cannot fail the step as invalid either: the
    commit matches nothing, the step stays in progress and its re-run completes it [INV-EXE-2]."""
    from ductwork.pipelines.outcomes import record_invalid

    (pid,) = processes(app, 1)
    run = TwoStep.trigger(5)
    claimed = claim(app, pid)
    assert reap(app, pid, force=True)
    with pytest.raises(CommitFailed):
        record_invalid(app, claimed, TypeError("cannot bind"))
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    e = schema.executions
    with app.begin() as tx:
        outcomes = tx.execute(sa.select(e.c.outcome).order_by(e.c.created_at, e.c.id)).scalars().all()
    assert "invalid" not in outcomes


def test_a_late_crash_of_a_pruned_execution_crashes_nothing(app):
    """A sweep that read an execution's id, then crashes it after its run ended and was
    pruned (the sweep reads its ids in one transaction, crashes each in its own), finds no
    row: False, nothing written."""
    from datetime import timedelta

    from ductwork.pipelines.outcomes import record_crash
    from ductwork.pipelines.prune import prune

    run = TwoStep.trigger(1)
    with app.begin(readonly=True) as tx:
        (execution_id,) = tx.execute(sa.select(schema.executions.c.id)).scalars().all()
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    assert prune(app, timedelta(0)).runs == 1
    assert record_crash(app, execution_id, None, "ductwork.OrphanedClaim", "swept") is False
    with app.begin(readonly=True) as tx:
        assert tx.execute(sa.select(sa.func.count()).select_from(schema.executions)).scalar_one() == 0


def test_racing_reapers_crash_an_execution_once(app):
    pids = processes(app, 1)
    TwoStep.trigger(1)
    assert claim(app, pids[0]) is not None
    results = race([lambda: reap(app, pids[0], force=True) for _ in range(RACERS)])
    assert sorted(results) == [False] * (RACERS - 1) + [True]
    with app.begin() as tx:
        count = tx.execute(sa.select(sa.func.count()).select_from(schema.executions)).scalar_one()
    assert count == 2  # the crashed one and exactly one re-run


@pytest.mark.parametrize("constraint", [
    "uq_step_branch_node", "uq_execution_open_per_step", "uq_context_run_key",
])
def test_named_unique_constraints_exist_on_every_database(app, constraint):
    run = TwoStep.trigger(1)
    s, e, c = schema.steps, schema.executions, schema.context
    with app.begin() as tx:
        step = tx.execute(sa.select(s).where(s.c.run_id == run.id)).mappings().one()
        execution = tx.execute(sa.select(e).where(e.c.step_id == step["id"])).mappings().one()
    copies = {
        "uq_step_branch_node": (s, {**step, "id": "dup-step"}),
        "uq_execution_open_per_step": (e, {k: v for k, v in execution.items()
                                           if k not in ("pending_lane", "inflight_key", "open_step_id")}
                                       | {"id": "dup-exec"}),
        "uq_context_run_key": (c, {"id": "ctx", "run_id": run.id, "key": "k", "value": "1",
                                   "first_set_at": step["started_at"], "last_set_at": step["started_at"]}),
    }
    table, row = copies[constraint]
    if constraint == "uq_context_run_key":
        with app.begin() as tx:
            tx.execute(table.insert().values(**{**row, "id": "ctx-first"}))
    with pytest.raises(sa.exc.IntegrityError) as info, app.begin() as tx:
        tx.execute(table.insert().values(**row))
    assert violated_constraint(info.value) == constraint


def test_a_live_process_recovers_claims_no_thread_holds(manual_app):
    """An acknowledgement lost with a killed connection leaves a claim in a live process's
    name that none of its threads knows: reconciliation recovers it, after a grace period,
    and leaves held claims alone."""
    from datetime import timedelta

    from ductwork.fleet.reaper import RECONCILE_GRACE_S, reconcile

    app = manual_app
    (pid,) = processes(app, 1)
    TwoStep.trigger(1)
    TwoStep.trigger(2)
    orphan, held = claim(app, pid), claim(app, pid)
    assert reconcile(app, pid, {held.execution_id}) == 0  # too young: its thread may be registering it
    app.clock.advance(timedelta(seconds=RECONCILE_GRACE_S))
    assert reconcile(app, pid, {held.execution_id}) == 1
    e = schema.executions
    with app.begin() as tx:
        rows = dict(tx.execute(sa.select(e.c.id, e.c.outcome)
                               .where(e.c.id.in_([orphan.execution_id, held.execution_id]))).all())
    assert rows == {orphan.execution_id: "process_crashed", held.execution_id: None}
    with app.begin() as tx:  # the orphan's step runs again; the held one is still its thread's
        rerun = tx.execute(sa.select(e.c.crash_count).where(e.c.step_id == orphan.step_id,
                                                            e.c.completed_at.is_(None))).scalar_one()
    assert rerun == 1


def test_a_live_process_recovers_an_advancement_no_thread_holds(manual_advancer_app):
    """A branch claim recorded under a live process that none of its threads holds (its
    acknowledgement was lost) is released by the process's reconciliation after the grace
    period; another process then advances the branch once, and the lost claim's token
    commits nothing [INV-ADV-1, INV-ADV-2]."""
    from datetime import timedelta

    from ductwork.fleet.reaper import RECONCILE_GRACE_S, reconcile

    app = manual_advancer_app
    pa, pb = processes(app, 2)
    run, branch_id = ready_branch(app, TwoStep, 1)
    lost = claim_branch(app, branch_id, pa)
    assert lost is not None
    assert reconcile(app, pa, set()) == 0  # too young: its thread may be registering it
    app.clock.advance(timedelta(seconds=RECONCILE_GRACE_S))
    assert reconcile(app, pa, {lost.advancement_id}) == 0  # a thread holds it: left alone
    assert reconcile(app, pa, set()) == 1
    fresh = claim_branch(app, branch_id, pb)
    assert fresh is not None
    assert Advancer(app, process_id=pa).advance(lost) == "stale"
    assert Advancer(app, process_id=pb).advance(fresh) == "advanced"
    assert step_nodes(app, run.id) == {"Echo#0": 1, "Echo#1": 1}
    assert advancement_column(app, "error_message") == ["Claim held by no thread of its process", None]


def test_an_orphaned_advancement_is_swept(manual_advancer_app):
    """A branch claim whose process row vanished (a reap that raced the claim) is released by
    the orphan sweep three reaper timeouts after it was made, and advanced once."""
    from datetime import timedelta

    from ductwork.fleet.reaper import sweep_orphans

    app = manual_advancer_app
    ghost, live = processes(app, 2)
    run, branch_id = ready_branch(app, TwoStep, 1)
    orphan = claim_branch(app, branch_id, ghost)
    assert orphan is not None
    with app.begin() as tx:
        tx.execute(schema.processes.delete().where(schema.processes.c.id == ghost))
        assert tx.execute(sa.select(schema.advancements.c.process_id)).scalar_one() is None
    assert sweep_orphans(app) == 0  # not three reaper timeouts old yet
    app.clock.advance(timedelta(seconds=3 * app.config.supervisor.reaper_timeout + 1))
    assert sweep_orphans(app) == 1
    fresh = claim_branch(app, branch_id, live)
    assert fresh is not None
    assert Advancer(app, process_id=live).advance(fresh) == "advanced"
    assert step_nodes(app, run.id) == {"Echo#0": 1, "Echo#1": 1}


def test_a_batched_success_reaped_under_its_step_is_the_reapers(app, caplog):
    """A batching worker's success waits for the group commit; its claim was reaped while the
    step ran (the worker looked dead): the group commit records nothing for it
    (CommitFailed, logged) and the reaper's re-run is the live execution [INV-EXE-2]."""
    import logging

    (pid,) = processes(app, 1)
    run = ReapedUnderItsStep.trigger(3)
    WHILE_RUNNING[:] = [lambda: reap(app, pid, force=True)]
    worker = Worker(app, process_id=pid, batch_size=4, batch_window=60)
    with caplog.at_level(logging.WARNING, logger="ductwork.worker"):
        assert worker.run_once().outcome == "success"  # ran; its record is the group commit's
    assert "its outcome was not recorded" in caplog.text
    e = schema.executions
    with app.begin() as tx:
        rows = tx.execute(sa.select(e.c.outcome, e.c.crash_count).order_by(e.c.created_at, e.c.id)).all()
    assert [tuple(r) for r in rows] == [("process_crashed", 0), (None, 1)]
    WHILE_RUNNING[:] = [lambda: None]
    drain(app, timeout=30)
    assert run.refresh().status == "completed"


def test_a_threads_keyed_batch_goes_on_through_its_own_hand_off(in_a_row_app):
    """A worker thread claims a keyed batch it runs in a row; its group commit hands the
    key's next executions to the same thread, which runs them in a row too: one call runs
    all 8, recorded by two group commits (one clock read each)."""
    app = in_a_row_app
    (pid,) = processes(app, 1)
    runs = [KeyedEcho.trigger(i) for i in range(8)]
    worker = Worker(app, process_id=pid, hand_off=lambda: True, batch_size=4, batch_window=60)
    worker.batch = 4  # paced as fast steps are (a new worker starts at 1)
    assert worker.run_once().outcome == "success"
    e = schema.executions
    with app.begin() as tx:
        rows = tx.execute(sa.select(e.c.outcome, e.c.completed_at)).all()
    assert [r.outcome for r in rows] == ["success"] * 8
    assert len({r.completed_at for r in rows}) == 2  # two group commits of 4, not 4 + one per hand-off
    assert [r.refresh().status for r in runs] == ["completed"] * 8


@pytest.fixture
def no_budget_app(db_url):
    """The conftest app with no retry and no re-run left for any step."""
    yield from _default_app(db_url, job_worker={"max_retry": 0, "max_crash": 0})


def _chained_error() -> RuntimeError:
    """A raised error with a cause: its whole text has two tracebacks."""
    try:
        try:
            raise KeyError("the cause")
        except KeyError as cause:
            raise RuntimeError("the error") from cause
    except RuntimeError as error:
        return error


def test_a_terminal_outcome_fails_its_own_step_only_and_logs_its_own_traceback(no_budget_app, caplog):
    """Three runs of two in-flight steps each, and a pending step of a fourth run; no budget
    left. The first step of each of the three ends for good: a failure (record_failure
    returns False: no retry), an invalid result, a crash. Each fails its own step, in
    progress until then, and leaves every other step row (its sibling's, the other runs')
    and every other execution exactly as it was [INV-EXE-4]. Each is logged once with the
    traceback it has: a failure's or an invalid's whole text (its cause's traceback too),
    a crash's recorded backtrace as a traceback."""
    app = no_budget_app
    e, s = schema.executions, schema.steps

    def rows():
        with app.begin(readonly=True) as tx:
            return ({row.id: tuple(row) for row in tx.execute(sa.select(s))},
                    {row.id: tuple(row) for row in tx.execute(sa.select(e))})

    (pid,) = processes(app, 1)
    runs = [make_run(app) for _ in range(4)]
    for run_id, branch_id in runs[:3]:
        make_executions(app, run_id, branch_id, None, datetime(2000, 1, 1), 2)
    make_executions(app, *runs[3], None, datetime(2000, 1, 1))
    held = [claim(app, pid) for _ in range(6)]
    failing, invalid, crashing = held[0], held[2], held[4]
    assert [c.run_id for c in (failing, invalid, crashing)] == [r for r, _ in runs[:3]]
    backtrace = '  File "step.py", line 3, in execute\n    boom()\n'
    caplog.set_level(logging.WARNING, logger="ductwork.executions")
    outcomes = (
        (failing, lambda: record_failure(app, failing, _chained_error()), False),
        (invalid, lambda: record_invalid(app, invalid, _chained_error()), None),
        (crashing, lambda: record_crash(app, crashing.execution_id, pid, "ductwork.ProcessCrash", "boom",
                                        backtrace=backtrace), True),
    )
    for ended, record, returned in outcomes:
        steps, executions = rows()
        assert steps[ended.step_id][list(s.c.keys()).index("status")] == "in_progress"
        caplog.clear()
        assert record() is returned
        steps_after, executions_after = rows()
        assert steps_after[ended.step_id][list(s.c.keys()).index("status")] == "failed"
        assert {k: v for k, v in steps_after.items() if k != ended.step_id} == {
            k: v for k, v in steps.items() if k != ended.step_id}
        assert {k: v for k, v in executions_after.items() if k != ended.execution_id} == {
            k: v for k, v in executions.items() if k != ended.execution_id}
        (logged,) = [r for r in caplog.records if r.name == "ductwork.executions"]
        if ended is crashing:
            assert logged.exc_text == (
                f"Traceback (most recent call last):\n{backtrace}ductwork.ProcessCrash: boom")
        else:
            assert "The above exception was the direct cause of the following exception" in logged.exc_text
            assert logged.exc_text.endswith("RuntimeError: the error")


def test_each_failed_step_halts_its_branch_by_its_own_last_execution(no_budget_app):
    """Three runs of one step each, no budget left: the first step fails, the second is
    invalid, the third crashes, in that order, so the crash is the latest execution of
    all. The advancer then halts each branch for the reason its own step's last execution
    gives (retries, the invalid result, crashes): never by another step's execution."""
    app = no_budget_app
    (pid,) = processes(app, 1)
    runs = [make_run(app) for _ in range(3)]
    for run_id, branch_id in runs:
        make_executions(app, run_id, branch_id, None, datetime(2000, 1, 1))
    failing, invalid, crashing = (claim(app, pid) for _ in range(3))
    assert [c.run_id for c in (failing, invalid, crashing)] == [r for r, _ in runs]
    assert record_failure(app, failing, _chained_error()) is False
    assert record_invalid(app, invalid, _chained_error()) is None
    assert record_crash(app, crashing.execution_id, pid, "ductwork.ProcessCrash", "boom") is True
    advancer = Advancer(app)
    deadline = datetime.now().timestamp() + 30
    while advancer.run_once() != "idle":
        assert datetime.now().timestamp() < deadline, "the advancer never ran out of branches"
    b = schema.branches
    with app.begin(readonly=True) as tx:
        reasons = dict(tx.execute(sa.select(b.c.run_id, b.c.halt_reason).where(b.c.halt_reason.is_not(None))).all())
    assert [reasons.get(r) for r, _ in runs] == ["job_retries_exhausted", "job_invalid", "job_crashes_exhausted"]
