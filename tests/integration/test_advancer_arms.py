"""The advancer's rarer arms, on SQLite, PostgreSQL and MySQL: a claim by a reaped
process, a batch whose claims are all stale, a batch whose transaction fails (each
branch then advanced alone: a divert, a dampen, a spent crash budget), a failed step
whose halt keeps failing, an error recorded after the claim was lost, a thread whose
error could not be recorded, a claim of a branch's latest step, a reaper racing a
committing batch; and the columns the claim path reads: candidates in last-advance
order, a claim's re-check of each branch's own status and steps, a claim's latest step
and crash count by start time, a branch's completion time stamped only when it ends
completed or halted; a late release of a claim the reaper took.

Checks: INV-ADV-1 (each step moved past once), INV-ADV-2 (a stale or lost claim commits
nothing; a claim left by its thread is released), INV-RUN-1 (the run settles).
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import sqlalchemy as sa

from ductwork import Pipeline, faults
from ductwork.db import schema
from ductwork.errors import FaultInjection
from ductwork.fleet.processes import register
from ductwork.fleet.reaper import reap
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer
from ductwork.pipelines.branches import (
    THREAD_CRASH,
    candidates,
    claim_branch,
    claim_branches,
    release_advancement,
)
from ductwork_proof.fleet import wait_for
from tests.capabilities import needs
from tests.conftest import installed, make_app
from tests.factories import make_run
from tests.integration.test_lock_races import blocked_on
from tests.workloads import Approval, Echo, Fails, Items, TwoStep

#: far enough that no two times written by a test's own transactions fall between
FAR = timedelta(days=10)


class Alpha(Echo):
    """Echo under a name that sorts before Zed's."""


class Zed(Echo):
    """Echo under a name that sorts after Alpha's."""


class Diverts(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Echo).divert(to={1: Alpha, "otherwise": Zed})


class Expands(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Echo)


class ZedThenAlpha(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Zed).chain(to=Alpha)


class AlphaThenZed(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Alpha).chain(to=Zed)


@pytest.fixture
def app(db_url):
    """Every edge goes through an advancer (workers advance nothing inline), a failing job
    is not retried; the test config's advancer budgets: max_retry 2, max_crash 3, expand_batch 4."""
    yield from installed(make_app(db_url, pipeline_advancer={"inline_linear": False}, job_worker={"max_retry": 0}))


@pytest.fixture(autouse=True)
def _disarmed():
    yield
    faults.disarm()


def _work(app) -> None:
    """Run every job that is ready, leaving their branches to an advancer."""
    worker = Worker(app)
    while worker.run_once() is not None:
        pass


def _branch(app, run_id):
    b = schema.branches
    with app.begin() as tx:
        return tx.execute(sa.select(b.c.id, b.c.status, b.c.halt_reason, b.c.claim_token)
                          .where(b.c.run_id == run_id, b.c.parent_id.is_(None))).one()


def _advancements(app, branch_id):
    a = schema.advancements
    with app.begin() as tx:
        return tx.execute(sa.select(a.c.completed_at, a.c.error_klass, a.c.crash_count)
                          .where(a.c.branch_id == branch_id).order_by(a.c.started_at, a.c.id)).all()


def _set(app, table, row_id, **values) -> None:
    with app.begin() as tx:
        assert tx.execute(table.update().where(table.c.id == row_id).values(**values)).rowcount == 1


def _now(app):
    with app.begin() as tx:
        return tx.now


def _crash(app, branch_id, times):
    """``times`` advancers claim the branch and die (reaped: each a ProcessCrash)."""
    for i in range(times):
        pid = register(app, role="advancer", label=f"doomed-{i}")
        assert claim_branch(app, branch_id, pid) is not None
        assert reap(app, pid, force=True)


def test_a_claim_by_a_reaped_process_is_lost_and_rolls_back(app):
    """The advancement row's process foreign key fails (the row was reaped mid-claim):
    the claim is a lost race, nothing of it is committed, and a live advancer claims."""
    run = TwoStep.trigger(1)
    _work(app)
    gone = register(app, role="advancer", label="gone")
    assert reap(app, gone, force=True)
    assert Advancer(app, process_id=gone).run_once() == "contended"
    branch = _branch(app, run.id)
    assert (branch.status, branch.claim_token) == ("in_progress", None)  # the whole claim rolled back
    assert _advancements(app, branch.id) == []
    assert Advancer(app).run_once() == "advanced"
    _work(app)
    assert Advancer(app).run_once() == "advanced"
    assert run.refresh().status == "completed"


def test_a_batch_whose_every_claim_is_stale_commits_nothing(app):
    """Both claims of a batch lost (released and claimed again elsewhere) before its
    transaction: nothing is committed for either [INV-ADV-2], and the new holders advance
    each once [INV-ADV-1]."""
    runs = [TwoStep.trigger(1), TwoStep.trigger(2)]
    _work(app)
    pa, pb = (register(app, role="advancer", label=name) for name in ("a", "b"))
    with app.begin() as tx:
        ids = candidates(tx, 10)
    lost = claim_branches(app, ids, pa)
    assert len(lost) == 2
    with app.begin() as tx:
        for c in lost:
            release_advancement(tx, c.advancement_id, c.branch_id, c.token, "released by the test")
    fresh = claim_branches(app, ids, pb)
    assert Advancer(app, process_id=pa).advance_batch(lost) == ["stale", "stale"]
    assert all(len(run.steps()) == 1 for run in runs)  # nothing committed
    assert Advancer(app, process_id=pb).advance_batch(fresh) == ["advanced", "advanced"]
    assert [len(run.steps()) for run in runs] == [2, 2]


@pytest.mark.parametrize("batch_fails", [False, True], ids=["batch", "alone"])
def test_a_divert_a_dampen_and_a_spent_crash_budget_in_a_batch_or_each_alone(app, batch_fails):
    """One advancer's batch holds a divert, a dampen and a branch whose advancers crashed
    ``max_crash`` times. They commit together; or, when the batch's transaction fails
    (``inside_advance_batch`` raises), each is advanced alone, to the same end."""
    diverts, dampens, crashed = Diverts.trigger(1), Approval.trigger(2), TwoStep.trigger(3)
    _work(app)
    _crash(app, _branch(app, crashed.id).id, 3)  # the test config's max_crash
    if batch_fails:
        faults.arm(faults.INSIDE_ADVANCE_BATCH, "raise", nth=1)
    assert Advancer(app).run_once() == "advanced"
    assert faults.fired(faults.INSIDE_ADVANCE_BATCH) == (1 if batch_fails else 0)
    assert [s.node for s in diverts.steps()] == ["Echo#0", "Alpha#1"]  # key 1's target
    assert (dampens.refresh().status, [s.status for s in dampens.steps()]) == ("dampened", ["completed"])
    assert (crashed.refresh().status, crashed.refresh().halt_reasons) == ("halted", ["advancer_crashes_exhausted"])
    branch = _branch(app, crashed.id)
    assert (branch.status, branch.claim_token) == ("halted", None)
    assert [(a.error_klass, a.crash_count) for a in _advancements(app, branch.id)] == [
        ("ductwork.ProcessCrash", 0), ("ductwork.ProcessCrash", 1), ("ductwork.ProcessCrash", 2), (None, 3)]
    assert [s.status for s in crashed.steps()] == ["completed"]  # moved past once, into the halt
    _work(app)
    assert Advancer(app).run_once() == "advanced"
    assert diverts.refresh().status == "completed"


def test_a_failed_step_whose_halt_keeps_failing_halts_advancer_retries_exhausted(app):
    """A failed step's halt raises each time (the one move function fails: in its batch and
    then alone): each error is recorded and the branch released, until ``max_retry`` (2)
    errors halt it ``advancer_retries_exhausted``; the step stays failed."""
    run = Fails.trigger(1)
    _work(app)
    assert [s.status for s in run.steps()] == ["failed"]
    branch_id = _branch(app, run.id).id
    for attempt in (1, 2, 3):
        faults.arm(faults.INSIDE_ADVANCE_BATCH, "raise")  # the halt's move, batched or alone; the error's commits
        assert Advancer(app).run_once() == "error", attempt
        faults.disarm()
        expected = "halted" if attempt == 3 else "in_progress"
        assert _branch(app, run.id).status == expected
    assert run.refresh().halt_reasons == ["advancer_retries_exhausted"]
    assert [s.status for s in run.steps()] == ["failed"]
    assert [a.error_klass for a in _advancements(app, branch_id)] == ["ductwork.errors.FaultInjection"] * 3


def test_a_lone_simple_move_that_raises_is_attempted_once_and_its_error_recorded(app):
    """One failed step's halt, the only move of its batch, raises the first time only: it
    is advanced alone (never first as a batch of one, then again), so that one attempt's
    error is recorded and the branch released; the next advancer halts it."""
    run = Fails.trigger(1)
    _work(app)
    branch_id = _branch(app, run.id).id
    faults.arm(faults.INSIDE_ADVANCE_BATCH, "raise", 1)
    assert Advancer(app).run_once() == "error"
    assert faults.fired(faults.INSIDE_ADVANCE_BATCH) == 1
    faults.disarm()
    assert _branch(app, run.id).status == "in_progress"
    assert [a.error_klass for a in _advancements(app, branch_id)] == ["ductwork.errors.FaultInjection"]
    assert Advancer(app).run_once() == "advanced"
    assert run.refresh().halt_reasons == ["job_retries_exhausted"]


def test_a_batch_of_chains_that_raises_once_is_advanced_again_each_alone(app):
    """Two succeeded steps whose edges are chains are one batch; its transaction raises
    the first time only: each is then advanced alone and both advance, with no error
    recorded (the batch was attempted, then each alone: never each alone first)."""
    runs = [TwoStep.trigger(i) for i in (1, 2)]
    _work(app)
    faults.arm(faults.INSIDE_ADVANCE_BATCH, "raise", 1)
    assert Advancer(app).run_once() == "advanced"
    assert faults.fired(faults.INSIDE_ADVANCE_BATCH) == 1
    faults.disarm()
    assert [[s.status for s in run.steps()] for run in runs] == [["completed", "in_progress"]] * 2
    a = schema.advancements
    with app.begin() as tx:
        assert tx.execute(sa.select(a.c.error_klass).where(a.c.error_klass.is_not(None))).all() == []


class SplitsAndJoins(Pipeline):
    @classmethod
    def define(cls, p):
        left, right = p.start(Echo).divide(to=[Alpha, Zed])
        left.combine(right, into=Echo)


@needs("row_lock_waits_observable")
def test_a_fan_ins_fence_waits_for_its_barrier_before_it_locks_or_writes_anything(app):
    """An unrelated run's branch is the oldest row; a divide's barrier row is held by
    another transaction while one of its children arrives: the child's fence waits on the
    barrier (locked with the child, in branch-id order, the barrier first) before it has
    locked its own row or written anything, so a third session takes the child's row at
    once; after the holder commits the child arrives [lock order]."""
    make_run(app)  # the oldest branch row, no barrier, never written again
    run = SplitsAndJoins.trigger(1)
    b = schema.branches
    _work(app)
    root = _branch(app, run.id).id
    assert Advancer(app).run_once() == "advanced"  # the divide
    _work(app)
    with app.begin() as tx:
        child = tx.execute(sa.select(b.c.id).where(b.c.barrier_id == root).order_by(b.c.id).limit(1)).scalar_one()
    pid = register(app, role="advancer", label="arriving")
    held = claim_branch(app, child, pid)
    assert held is not None
    outcome: dict = {}

    def arrive() -> None:
        try:
            outcome["result"] = Advancer(app, process_id=pid).advance(held)
        except BaseException as error:  # noqa: BLE001 - reported below
            outcome["error"] = error

    with app.begin() as tx:
        tx.execute(sa.select(b.c.id).where(b.c.id == root).with_for_update())
        thread = threading.Thread(target=arrive)
        thread.start()
        try:
            wait_for(lambda: blocked_on(app, "%ductwork_branches%") >= 1 or not thread.is_alive(),
                     "the arriving child waits on its barrier", 20)
            assert thread.is_alive(), outcome
            with app.engine.connect() as third:
                assert third.execute(sa.select(b.c.id).where(b.c.id == child).with_for_update(nowait=True)
                                     ).scalar_one() == child  # the child's row is not locked yet
                third.rollback()
        except BaseException:
            tx.conn.invalidate()  # never leave the arriving child blocked behind a failed test
            raise
    thread.join(30)
    assert outcome == {"result": "advanced"}


def test_advancer_retries_count_only_the_steps_own_errors(app):
    """Run A's failed step's halt raises three times: two errors release it, the third
    halts it ``advancer_retries_exhausted``. Then run B's failed step: an advancer that
    claimed it dies (reaped: a crash, not an error), and its halt raises: B is released
    after its first and second errors and halts only at its third, for ``max_retry`` (2)
    counts only B's own step's recorded errors: neither A's errors nor B's crash."""

    def attempt(run):
        faults.arm(faults.INSIDE_ADVANCE_BATCH, "raise")
        assert Advancer(app).run_once() == "error"
        faults.disarm()
        return _branch(app, run.id).status

    first = Fails.trigger(1)
    _work(app)
    assert [attempt(first) for _ in range(3)] == ["in_progress", "in_progress", "halted"]
    second = Fails.trigger(2)
    _work(app)
    branch_id = _branch(app, second.id).id
    _crash(app, branch_id, 1)
    assert [attempt(second) for _ in range(3)] == ["in_progress", "in_progress", "halted"]
    assert [a.error_klass for a in _advancements(app, branch_id)] == (
        ["ductwork.ProcessCrash"] + ["ductwork.errors.FaultInjection"] * 3)
    assert second.refresh().halt_reasons == ["advancer_retries_exhausted"]


@pytest.fixture
def batch_of_five_app(db_url):
    """As ``app``, with ``advance_batch`` 5."""
    yield from installed(make_app(db_url, pipeline_advancer={"inline_linear": False, "advance_batch": 5},
                                  job_worker={"max_retry": 0}))


def test_more_ready_branches_than_a_batch_are_advanced_a_batch_at_a_time(batch_of_five_app):
    """An expand's twelve leaf children, all ready at once, with ``advance_batch`` 5: each
    ``run_once`` picks 5 of the candidates it read at random (the advancer's own
    generator) and advances exactly those; three of them advance all twelve."""
    app = batch_of_five_app
    run = Expands.trigger(12)
    _work(app)
    assert Advancer(app).run_once() == "advanced"  # the expand: twelve children
    _work(app)
    b = schema.branches

    def completed_children():
        with app.begin() as tx:
            return tx.execute(sa.select(sa.func.count()).select_from(b).where(
                b.c.run_id == run.id, b.c.parent_id.is_not(None), b.c.status == "completed")).scalar_one()

    advancer = Advancer(app)
    done = []
    for _ in range(3):
        assert advancer.run_once() == "advanced"
        done.append(completed_children())
    assert done == [5, 10, 12]
    assert advancer.run_once() == "idle"
    assert run.refresh().status == "completed"


def test_an_error_whose_claim_was_lost_is_not_recorded(app, monkeypatch):
    """An expand stopped between batches by an error, its process reaped meanwhile: the
    error is not recorded over the reaper's close (the claim is lost, nothing committed),
    and a fresh advancer resumes at the cursor [INV-ADV-2, INV-ADV-4]."""
    run = Expands.trigger(6)  # expand_batch 4: two batches
    _work(app)
    advancer = Advancer(app, process_id=register(app, role="advancer", label="reaped"))
    real = faults.hit

    def hit(name):
        if name == faults.BETWEEN_EXPAND_BATCHES:
            assert reap(app, advancer.process_id, force=True)  # its claim released, a crash counted
            raise FaultInjection(name)
        real(name)

    monkeypatch.setattr(faults, "hit", hit)
    assert advancer.run_once() == "error"
    monkeypatch.setattr(faults, "hit", real)
    branch = _branch(app, run.id)
    assert (branch.status, branch.claim_token) == ("in_progress", None)
    assert [a.error_klass for a in _advancements(app, branch.id)] == ["ductwork.ProcessCrash"]
    assert Advancer(app).run_once() == "advanced"
    assert sorted(s.input for s in run.steps() if s.node == "Echo#1") == [[i] for i in range(6)]


def test_a_claim_whose_error_could_not_be_recorded_is_released_by_its_thread(app):
    """A fence that fails at its commit, then the recording of that error failing too: the
    error leaves the advancer, and the claim its thread still holds is released as a
    thread crash (not left to the supervisor's sweep); the next advancer advances it once."""
    run = TwoStep.trigger(1)
    _work(app)
    faults.arm(faults.INSIDE_ADVANCE_BATCH, "raise")
    faults.arm(faults.BEFORE_FENCE_COMMIT, "raise")  # the chain's fence, then the error's
    with pytest.raises(FaultInjection):
        Advancer(app).run_once()
    faults.disarm()
    branch = _branch(app, run.id)
    assert (branch.status, branch.claim_token) == ("in_progress", None)
    assert [(a.completed_at is not None, a.error_klass) for a in _advancements(app, branch.id)] == [
        (True, "ductwork.ThreadCrash")]
    assert Advancer(app).run_once() == "advanced"
    assert [(s.node, s.status) for s in run.steps()] == [("Echo#0", "completed"), ("Echo#1", "in_progress")]
    assert [a.crash_count for a in _advancements(app, branch.id)] == [0, 1]


def test_a_claim_takes_its_branchs_latest_step(app):
    """Branches of two steps whose later step's node sorts before, and after, the earlier
    one's (``uq_step_branch_node`` orders them by node): each claim is of the latest step,
    the one ``latest_step`` names."""
    runs = [ZedThenAlpha.trigger(1), AlphaThenZed.trigger(2)]
    _work(app)
    while Advancer(app).run_once() != "idle":
        pass
    _work(app)
    with app.begin() as tx:
        ids = candidates(tx, 10)
    claims = claim_branches(app, ids, register(app, role="advancer", label="reader"))
    assert sorted((c.run_id, c.step.node, c.step.status) for c in claims) == sorted(
        [(runs[0].id, "Alpha#1", "advancing"), (runs[1].id, "Zed#1", "advancing")])


def test_a_reaper_racing_a_committing_batch_leaves_its_advancement_as_committed(app, monkeypatch):
    """The reaper reads a live process's open advancement, then waits for the branch row
    that the process's batch holds; the batch closes the advancement and commits. The
    reaper's release then finds it closed and changes nothing: no crash is recorded over
    the close, the branch is not released again [INV-ADV-2]. (SQLite: the reaper's
    transaction waits for the database's write lock and reads the advancement closed.)"""
    from ductwork_proof.fleet import wait_for

    run = TwoStep.trigger(1)
    _work(app)
    advancer = Advancer(app, process_id=register(app, role="advancer", label="slow"))
    reaped: list[bool] = []
    reaper = threading.Thread(target=lambda: reaped.append(reap(app, advancer.process_id, force=True)))
    real = faults.hit

    def hit(name):
        if name == faults.INSIDE_ADVANCE_BATCH:  # the branch row locked, its advancement open
            reaper.start()
            if app.backend != "sqlite":
                wait_for(lambda: blocked_on(app, "%FROM ductwork_branches%FOR UPDATE%") >= 1,
                         "the reaper waits for the branch row", 20)
        real(name)

    monkeypatch.setattr(faults, "hit", hit)
    assert advancer.run_once() == "advanced"
    reaper.join(30)
    assert reaped == [True]
    branch = _branch(app, run.id)
    assert (branch.status, branch.claim_token) == ("in_progress", None)
    assert [(a.completed_at is not None, a.error_klass) for a in _advancements(app, branch.id)] == [(True, None)]
    assert [(s.node, s.status) for s in run.steps()] == [("Echo#0", "completed"), ("Echo#1", "in_progress")]


def test_candidates_are_read_least_recently_advanced_first_by_that_column_alone(app):
    """Three claimable branches (their first step done) whose last advance is oldest for
    the middle one, then the last one, then the first, while every other time of theirs
    (creation, start, last update) runs the other way and their claim, fan-in and
    completion times are unset: ``candidates`` reads them in last-advance order, and a
    window of one is the middle branch alone."""
    runs = [TwoStep.trigger(i) for i in range(3)]
    _work(app)
    now, b = _now(app), schema.branches
    ids = [_branch(app, run.id).id for run in runs]
    for branch_id, advanced, other in zip(ids, (now, now - FAR, now - FAR / 2), (now - FAR, now, now - FAR / 2),
                                          strict=True):
        _set(app, b, branch_id, last_advanced_at=advanced, created_at=other, started_at=other, updated_at=other)
    with app.begin() as tx:
        assert candidates(tx, 10) == [ids[1], ids[2], ids[0]]
        assert candidates(tx, 1) == [ids[1]]


def test_a_claim_rechecks_each_branchs_own_status_and_steps(app):
    """A branch halted at its failed step (unclaimed, its step ``failed``) and a branch
    whose step is still to run, claimed beside a third branch whose step is done: neither
    is claimed (the first has ended; the second's own steps have none done, however done
    the other branch's is), and both are left as they were [INV-ADV-2]; the third is then
    claimed alone."""
    halted = Fails.trigger(1)
    _work(app)
    assert Advancer(app).run_once() == "advanced"
    done = TwoStep.trigger(2)
    _work(app)
    waiting = TwoStep.trigger(3)  # its job is never run
    assert (halted.refresh().status, [s.status for s in halted.steps()]) == ("halted", ["failed"])
    assert [s.status for s in waiting.steps()] == ["in_progress"]
    before = {run.id: _branch(app, run.id) for run in (halted, waiting)}
    pid = register(app, role="advancer", label="rechecks")
    assert claim_branches(app, [before[halted.id].id, before[waiting.id].id], pid) == []
    assert {run.id: _branch(app, run.id) for run in (halted, waiting)} == before
    assert _advancements(app, before[waiting.id].id) == []
    claim = claim_branch(app, _branch(app, done.id).id, pid)
    assert claim is not None
    assert (claim.run_id, claim.step.status) == (done.id, "advancing")


def test_a_claim_orders_steps_and_advancements_by_their_start_alone(app):
    """A branch at its second step, whose two earlier advancers on it crashed (reaped): its
    first step's creation and last update lie far after the second's, and the first crash's
    advancement was created, updated and closed far after the second's. The claim is of the
    latest step by start (the second) and carries the latest advancement's crash count
    plus one (2, not 1)."""
    run = TwoStep.trigger(1)
    _work(app)
    assert Advancer(app).run_once() == "advanced"
    _work(app)
    branch_id = _branch(app, run.id).id
    _crash(app, branch_id, 2)
    now, s, a = _now(app), schema.steps, schema.advancements
    first, second = sorted(run.steps(), key=lambda step: step.node)
    assert (first.status, second.status) == ("completed", "advancing")
    _set(app, s, first.id, created_at=now + FAR, updated_at=now + FAR)
    _set(app, s, second.id, created_at=now - FAR, updated_at=now - FAR)
    with app.begin() as tx:
        crashed = tx.execute(sa.select(a.c.id).where(a.c.step_id == second.id)
                             .order_by(a.c.started_at, a.c.id)).scalars().all()
    assert [x.crash_count for x in _advancements(app, branch_id)] == [0, 0, 1]  # the first step's, two crashes
    _set(app, a, crashed[0], created_at=now + FAR, updated_at=now + FAR, completed_at=now + FAR)
    _set(app, a, crashed[1], created_at=now - FAR, updated_at=now - FAR, completed_at=now - FAR)
    claim = claim_branch(app, branch_id, register(app, role="advancer", label="third"))
    assert claim is not None
    assert (claim.step.id, claim.step.status, claim.crash_count) == (second.id, "advancing", 2)


@pytest.mark.parametrize("inline", [False, True], ids=["advancer", "inline"])
def test_a_branch_is_stamped_completed_only_when_it_completes_or_halts(db_url, inline):
    """A chain, a leaf, a dampen and a halt, moved by an advancer or (chain and leaf) by the
    worker's success inline: the branch that goes on and the dampened one keep no
    completion time, the completed and the halted ones are stamped with one."""
    def stamped(run):
        b = schema.branches
        with app.begin() as tx:
            row = tx.execute(sa.select(b.c.status, b.c.completed_at).where(b.c.run_id == run.id)).one()
        return row.status, row.completed_at is not None

    for app in installed(make_app(db_url, pipeline_advancer={"inline_linear": inline}, job_worker={"max_retry": 0})):
        chain = TwoStep.trigger(1)
        assert Worker(app).run_once() is not None  # its first step: moved on inline, or left advancing
        if not inline:
            assert Advancer(app).run_once() == "advanced"
        assert stamped(chain) == ("in_progress", False)
        dampens, halts = Approval.trigger(2), Fails.trigger(3)
        _work(app)
        while Advancer(app).run_once() == "advanced":
            pass
        assert [stamped(run) for run in (chain, dampens, halts)] == [
            ("completed", True), ("dampened", False), ("halted", True)]


def test_a_late_release_of_a_reaped_claim_leaves_the_reapers_close_and_the_new_claim(app):
    """An advancer's claim is reaped (its advancement closed as a process crash, the
    branch released) and a second advancer claims the branch; then the first advancer's
    thread releases its claim as well (a thread crash, as ``_abandon`` does): the closed
    advancement keeps the reaper's close (time and error) and the second claim keeps the
    branch [INV-ADV-2]; it then advances it once."""
    run = TwoStep.trigger(1)
    _work(app)
    branch_id = _branch(app, run.id).id
    first = register(app, role="advancer", label="reaped")
    lost = claim_branch(app, branch_id, first)
    assert lost is not None
    assert reap(app, first, force=True)
    closed = _advancements(app, branch_id)
    assert [(a.completed_at is not None, a.error_klass) for a in closed] == [(True, "ductwork.ProcessCrash")]
    second = Advancer(app, process_id=register(app, role="advancer", label="second"))
    (held,) = claim_branches(app, [branch_id], second.process_id)
    with app.begin() as tx:
        release_advancement(tx, lost.advancement_id, branch_id, lost.token, "released by its thread", THREAD_CRASH)
    assert _advancements(app, branch_id)[0] == closed[0]
    assert _advancements(app, branch_id)[1].completed_at is None
    branch = _branch(app, run.id)
    assert (branch.status, branch.claim_token) == ("advancing", held.token)
    assert second.advance_batch([held]) == ["advanced"]
    assert [(s.node, s.status) for s in run.steps()] == [("Echo#0", "completed"), ("Echo#1", "in_progress")]
