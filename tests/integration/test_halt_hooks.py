"""``on_halt`` hooks end to end on SQLite, PostgreSQL and MySQL: a halted run owes one hook,
written by the halt's own transaction, claimed and run by a worker, fenced by its claim
token, retried and re-run within the step budgets, recovered from a dead worker, and
its outcome recorded once; a run that does not halt owes none.

Checks: INV-HLT-1 (one hook per run by ``uq_halt_hook_run``; a stale claim records
nothing), INV-HLT-2 (the halt owes the hook; failures retried, crashes re-run, budgets
end it ``failed``; the reaper re-runs a dead worker's hook).
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
import sqlalchemy as sa

from ductwork import Pipeline, Step
from ductwork.db import schema
from ductwork.db.ids import new_id
from ductwork.errors import DefinitionError
from ductwork.fleet.hooks import run_due_hook
from ductwork.fleet.processes import register
from ductwork.fleet.reaper import reap
from ductwork.limits.executions import ErrorInfo
from ductwork.pipelines.hooks import HookClaimLost, claim_hook, record_hook
from ductwork.pipelines.snapshot import Definition
from ductwork.testing import drain
from tests.workloads import Boom, Echo, Fails
from tests.workloads.hooks import HOOK_LOG_ENV, HaltingPipeline, HaltRecorder, halted_with_owed_hook

SEEN: dict[str, list[dict]] = {}
FAILS: dict[str, int] = {}


class Remember(Step):
    """Records what it was told, by idempotency key."""

    def __init__(self, halt):
        self.halt = halt

    def execute(self):
        SEEN.setdefault(self.idempotency_key, []).append(self.halt)


class FlakyTwice(Remember):
    """Fails its first two attempts, then records."""

    def execute(self):
        FAILS[self.idempotency_key] = FAILS.get(self.idempotency_key, 0) + 1
        if FAILS[self.idempotency_key] <= 2:
            raise ConnectionError(f"pager unreachable (attempt {FAILS[self.idempotency_key]})")
        super().execute()


class AlwaysFails(Remember):
    def execute(self):
        raise ConnectionError("pager down")


class BuiltPastItsBudget(BaseException):
    """Raised by :class:`BrokenInit` once built more often than its crash budget allows: a
    BaseException, so it leaves the worker and ``drain`` at once (no waiting out a deadline)."""


class BrokenInit(Step):
    #: builds so far, and the most the crash budget allows (set by the test)
    builds = 0
    allowed = 0

    def __init__(self, halt):  # noqa: ARG002 - takes the halt, and fails to build
        BrokenInit.builds += 1
        if BrokenInit.builds > BrokenInit.allowed:
            raise BuiltPastItsBudget(f"built {BrokenInit.builds} times; the budget allows {BrokenInit.allowed}")
        raise KeyError("cannot build")

    def execute(self):  # pragma: no cover - never reached
        return None


#: what a handler below calls while it runs (the test sets it): the reaper taking its claim
UNDER: list = []


class ReapedUnderIt(Remember):
    """Runs while the reaper takes its claim, then returns."""

    def execute(self):
        UNDER[0]()
        super().execute()


class LeavesItsThread(BaseException):
    """Raised by :class:`LeavesAfterItsReap`: the worker thread leaves (as on SystemExit)."""


class LeavesAfterItsReap(Remember):
    """Runs while the reaper takes its claim, then leaves the worker's thread."""

    def execute(self):
        UNDER[0]()
        raise LeavesItsThread


class TakesNoHalt(Step):
    """A handler whose ``__init__`` cannot take the halt it is given."""

    def __init__(self):
        pass

    def execute(self):  # pragma: no cover - never built
        return None


def halting(handler):
    class Halting(Pipeline):
        @classmethod
        def define(cls, p):
            p.start(Boom).on_halt(handler)

    return Halting


class Completes(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Echo).on_halt(Remember)


class HaltsAlwaysFails(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Boom).on_halt(AlwaysFails)


def hooks(app, run_id=None):
    h = schema.halt_hooks
    with app.begin() as tx:
        stmt = sa.select(h)
        if run_id is not None:
            stmt = stmt.where(h.c.run_id == run_id)
        return tx.execute(stmt).all()


@pytest.fixture(autouse=True)
def _clear():
    SEEN.clear()
    FAILS.clear()
    UNDER.clear()


def test_a_halted_run_gets_one_hook_with_its_halt(manual_app):
    run = halting(Remember).trigger(7)
    drain(manual_app, timeout=60)
    assert run.refresh().status == "halted"
    [hook] = hooks(manual_app, run.id)
    assert (hook.status, hook.retry_count, hook.crash_count, hook.last_outcome) == ("succeeded", 0, 0, "success")
    assert hook.completed_at is not None
    assert hook.claim_token is None
    [halt] = SEEN[hook.id]  # the idempotency key is the hook's id [INV-HLT-1]
    assert halt["run_id"] == run.id
    assert halt["pipeline"].endswith("Halting")
    assert [(r["node"], r["reason"]) for r in halt["halt_reasons"]] == [("Boom#0", "job_retries_exhausted")]
    assert halt["errors"] == [{"node": "Boom#0", "klass": "builtins.ValueError", "message": "boom 7"}]


class EchoThenHalts(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Echo).chain(to=Boom).on_halt(Remember)


def test_the_halt_names_the_branchs_last_step_not_an_earlier_completed_one(manual_app):
    """A branch that completed Echo and halted in Boom: the handler is told Boom, its last
    step, which failed and never completed (its completion time is NULL), not Echo, the last
    step that completed (``steps.latest_step``: start order, not another time column)."""
    run = EchoThenHalts.trigger(7)
    drain(manual_app, timeout=60)
    assert run.refresh().status == "halted"
    [hook] = hooks(manual_app, run.id)
    [halt] = SEEN[hook.id]
    assert [(r["node"], r["reason"]) for r in halt["halt_reasons"]] == [("Boom#1", "job_retries_exhausted")]
    assert halt["errors"] == [{"node": "Boom#1", "klass": "builtins.ValueError", "message": "boom 7"}]


def test_runs_that_do_not_halt_or_declare_no_handler_owe_nothing(manual_app):
    done, plain = Completes.trigger(1), Fails.trigger(2)
    drain(manual_app, timeout=60)
    assert (done.refresh().status, plain.refresh().status) == ("completed", "halted")
    assert hooks(manual_app) == []
    assert SEEN == {}


def test_a_failing_handler_is_retried_and_its_failures_logged(manual_app, caplog):
    run = halting(FlakyTwice).trigger(1)
    with caplog.at_level(logging.WARNING, logger="ductwork.hooks"):
        drain(manual_app, timeout=60)
    [hook] = hooks(manual_app, run.id)
    assert (hook.status, hook.retry_count, hook.crash_count) == ("succeeded", 2, 0)
    assert FAILS[hook.id] == 3
    assert len(SEEN[hook.id]) == 1
    assert hook.error_klass == "builtins.ConnectionError"  # the last failure stays visible
    warnings = [r for r in caplog.records if r.name == "ductwork.hooks"]
    assert [r.attempt for r in warnings] == [0, 1]
    for record in warnings:
        assert record.levelno == logging.WARNING
        assert record.run_id == run.id
        assert record.hook.endswith("FlakyTwice")
        assert record.pipeline.endswith("Halting")
        assert "pager unreachable" in record.getMessage()
        assert record.exc_text
        assert "Traceback" in record.exc_text


def test_a_handler_that_always_fails_ends_failed_after_its_budget(manual_app, caplog):
    run = halting(AlwaysFails).trigger(1)
    with caplog.at_level(logging.WARNING, logger="ductwork.hooks"):
        drain(manual_app, timeout=60)
    [hook] = hooks(manual_app, run.id)
    budget = manual_app.config.job_worker.max_retry
    assert (hook.status, hook.retry_count, hook.last_outcome) == ("failed", budget, "failure")
    assert "no retry left" in caplog.records[-1].getMessage()
    from ductwork.status import render, snapshot

    shown = render(snapshot(manual_app))  # what `ductwork status` prints
    assert "on_halt hooks:" in shown
    assert f"failed: run {run.id} {hook.klass}: builtins.ConnectionError: pager down" in shown


def test_a_handler_that_cannot_be_built_is_re_run_then_fails(manual_app):
    """A handler whose build crashes runs once and is re-run ``max_crash`` times, then its
    hook fails; one build more ends the test at once [INV-HLT-2]."""
    budget = manual_app.config.job_worker.max_crash
    BrokenInit.builds, BrokenInit.allowed = 0, budget + 1
    run = halting(BrokenInit).trigger(1)
    drain(manual_app, timeout=60)
    assert BrokenInit.builds == budget + 1
    [hook] = hooks(manual_app, run.id)
    assert (hook.status, hook.crash_count, hook.last_outcome) == ("failed", budget, "process_crashed")
    assert hook.error_klass == "builtins.KeyError"


def test_budgets_are_configurable_per_pipeline_and_handler(db_url):
    from ductwork.app import set_default_app
    from tests.conftest import make_app, reset_tables

    pipeline = HaltsAlwaysFails
    from datetime import datetime

    from ductwork.db.clock import ManualClock

    app = make_app(db_url, clock=ManualClock(datetime(2026, 1, 1)),
                   job_worker={"max_retry": {"default": 2, "HaltsAlwaysFails": {"AlwaysFails": 0}}})
    reset_tables(app.engine)
    set_default_app(app)
    try:
        run = pipeline.trigger(1)
        drain(app, timeout=60)
        [hook] = hooks(app, run.id)
        assert (hook.status, hook.retry_count) == ("failed", 0)
    finally:
        set_default_app(None)
        app.dispose()


def test_a_halt_that_recorded_no_error_tells_the_handler_none(db_url):
    """``pipeline_advancer.max_crash: 0`` (honoured) halts a branch at its first advancement,
    ``advancer_crashes_exhausted``, before anything failed (advanced by an advancer: not
    ``inline_linear``): the handler is told the halt
    with no error (neither an execution's nor an advancement's)."""
    from datetime import datetime

    from ductwork.app import set_default_app
    from ductwork.db.clock import ManualClock
    from tests.conftest import make_app, reset_tables

    app = make_app(db_url, clock=ManualClock(datetime(2026, 1, 1)),
                   pipeline_advancer={"max_crash": 0, "inline_linear": False})
    reset_tables(app.engine)
    set_default_app(app)
    try:
        run = Completes.trigger(3)
        drain(app, timeout=60)
        assert run.refresh().status == "halted"
        _told_advancer_crashes_and_no_error(app, run)
    finally:
        set_default_app(None)
        app.dispose()


def _told_advancer_crashes_and_no_error(app, run):
    """The run's one hook was told its branch halted ``advancer_crashes_exhausted``, and no error."""
    [hook] = hooks(app, run.id)
    [halt] = SEEN[hook.id]
    assert [(r["node"], r["reason"]) for r in halt["halt_reasons"]] == [("Echo#0", "advancer_crashes_exhausted")]
    assert halt["errors"] == []


def test_one_hook_per_run_is_a_named_constraint(manual_app):
    run = halting(Remember).trigger(1)
    drain(manual_app, timeout=60)
    with pytest.raises(sa.exc.IntegrityError, match=r"uq_halt_hook_run|UNIQUE|Duplicate"), \
            manual_app.begin() as tx:  # [INV-HLT-1]
        tx.execute(schema.halt_hooks.insert().values(
            id=new_id(), run_id=run.id, klass="x:Y", status="pending", eligible_at=tx.now, retry_count=0,
            crash_count=0, created_at=tx.now, updated_at=tx.now))
    assert len(hooks(manual_app, run.id)) == 1


def test_a_stale_claim_records_nothing_and_the_reaper_re_runs_the_hook(manual_app):
    run = halted_with_owed_hook(manual_app, 3)
    ghost = register(manual_app, role="ghost", label="ghost")
    claimed = claim_hook(manual_app, ghost)
    assert claimed is not None
    assert claimed.run_id == run.id
    assert claim_hook(manual_app, ghost) is None
    assert reap(manual_app, ghost, force=True)  # the ghost died holding it: crashed, re-run at once
    [hook] = hooks(manual_app, run.id)
    assert (hook.status, hook.crash_count, hook.claim_token) == ("pending", 1, None)
    live = register(manual_app, role="live", label="live")
    again = claim_hook(manual_app, live)
    assert again is not None
    assert again.claim_token != claimed.claim_token
    with pytest.raises(HookClaimLost):  # [INV-HLT-1] the ghost's late record is fenced off
        record_hook(manual_app, claimed, "success")
    assert hooks(manual_app, run.id)[0].status == "running"
    assert record_hook(manual_app, again, "success") == "succeeded"
    with pytest.raises(HookClaimLost):  # recorded once: a repeat matches nothing
        record_hook(manual_app, again, "success")


def test_the_worker_runs_a_due_hook_with_its_idempotency_key(manual_app, tmp_path, monkeypatch):
    log_file = tmp_path / "hooks.log"
    monkeypatch.setenv(HOOK_LOG_ENV, str(log_file))
    run = HaltingPipeline.trigger(4)
    drain(manual_app, timeout=60)
    [hook] = hooks(manual_app, run.id)
    [line] = log_file.read_text().splitlines()
    key, run_id, reasons, halt = line.split(" ", 3)
    assert (key, run_id, reasons) == (hook.id, run.id, "job_retries_exhausted")
    assert json.loads(halt)["pipeline"] == HaltingPipeline.definition.pipeline
    assert run_due_hook(manual_app, register(manual_app, role="w", label="w")) is None  # nothing left


def test_the_snapshot_names_the_handler_only_when_declared():
    plain, hooked = Fails.definition.to_json(), HaltingPipeline.definition.to_json()
    assert "on_halt" not in plain  # a definition without a handler keeps its snapshot and digest
    assert hooked["on_halt"] == "tests.workloads.hooks:HaltRecorder"
    assert Definition.from_json(hooked) == HaltingPipeline.definition
    assert Definition.from_json(plain).on_halt is None
    with pytest.raises(DefinitionError, match=r"on_halt must be 'module:qualname'"):
        Definition.from_json({**hooked, "on_halt": 3})


def test_on_halt_rejects_a_second_handler_and_a_non_step():
    with pytest.raises(DefinitionError, match="on_halt is declared once"):
        class Twice(Pipeline):
            @classmethod
            def define(cls, p):
                p.start(Echo).on_halt(HaltRecorder).on_halt(Remember)

    with pytest.raises(DefinitionError, match="valid step class"):
        class NotAStep(Pipeline):
            @classmethod
            def define(cls, p):
                p.start(Echo).on_halt(object)


def test_a_hook_held_by_no_thread_of_a_live_process_is_reconciled(manual_app):
    from ductwork.fleet.reaper import RECONCILE_GRACE_S, reconcile

    run = halted_with_owed_hook(manual_app)
    live = register(manual_app, role="job_worker", label="w")
    claimed = claim_hook(manual_app, live)
    assert claimed is not None
    assert reconcile(manual_app, live, {claimed.hook_id}) == 0  # a thread holds it: left alone
    manual_app.clock.advance(timedelta(seconds=RECONCILE_GRACE_S + 1))
    assert reconcile(manual_app, live, set()) == 1  # [INV-HLT-2] no thread holds it: crashed, re-run
    [hook] = hooks(manual_app, run.id)
    assert (hook.status, hook.crash_count, hook.process_id) == ("pending", 1, None)


def test_an_orphaned_hook_claim_is_swept(manual_app):
    from ductwork.fleet.reaper import sweep_orphans

    run = halted_with_owed_hook(manual_app)
    ghost = register(manual_app, role="ghost", label="ghost")
    assert claim_hook(manual_app, ghost) is not None
    with manual_app.begin() as tx:  # its row vanished (a reap that raced the claim)
        tx.execute(schema.processes.delete().where(schema.processes.c.id == ghost))
    assert hooks(manual_app, run.id)[0].process_id is None
    assert sweep_orphans(manual_app) == 0  # not three reaper timeouts old yet
    manual_app.clock.advance(timedelta(seconds=3 * manual_app.config.supervisor.reaper_timeout + 1))
    assert sweep_orphans(manual_app) == 1  # [INV-HLT-2]
    assert hooks(manual_app, run.id)[0].status == "pending"


def test_a_hook_reaped_under_its_handler_records_nothing(manual_app, caplog):
    """The reaper takes the claim while the handler runs (its worker looked dead): the
    handler's record matches nothing, and the reaper's re-run is the live attempt
    [INV-HLT-1]. Called as a caller that tracks no held hook (no ``holding``)."""
    run = halted_with_owed_hook(manual_app, pipeline=halting(ReapedUnderIt))
    worker = register(manual_app, role="job_worker", label="w")
    UNDER.append(lambda: reap(manual_app, worker, force=True))
    with caplog.at_level(logging.WARNING, logger="ductwork.hooks"):
        done = run_due_hook(manual_app, worker)
    assert done is not None
    assert (done.outcome, done.status) == ("claim_lost", None)
    assert "this attempt's outcome was not recorded" in caplog.text
    [hook] = hooks(manual_app, run.id)
    assert (hook.status, hook.crash_count, hook.last_outcome, hook.claim_token) == (
        "pending", 1, "process_crashed", None)  # the reaper's crash, and nothing after it
    assert len(SEEN[hook.id]) == 1


def test_a_handler_leaving_its_thread_after_a_reap_leaves_the_reapers_record(manual_app, caplog):
    """The thread leaves the handler (a BaseException) after the reaper took the claim: the
    crash of the abandoned attempt matches nothing, is logged, and the reaper's record
    stands; the caller is told the hook is no longer held."""
    run = halted_with_owed_hook(manual_app, pipeline=halting(LeavesAfterItsReap))
    worker = register(manual_app, role="job_worker", label="w")
    UNDER.append(lambda: reap(manual_app, worker, force=True))
    held = []
    with caplog.at_level(logging.ERROR, logger="ductwork.hooks"), pytest.raises(LeavesItsThread):
        run_due_hook(manual_app, worker, held.append)
    [hook] = hooks(manual_app, run.id)
    assert held == [hook.id, None]
    assert "could not crash the abandoned attempt" in caplog.text
    assert (hook.status, hook.crash_count, hook.last_outcome) == ("pending", 1, "process_crashed")


@pytest.mark.parametrize("case", ["does_not_take_the_halt", "class_gone"])
def test_a_handler_that_cannot_be_built_from_its_halt_fails_at_once(manual_app, caplog, case):
    """A handler whose ``__init__`` does not take the halt, or whose class this process no
    longer has (a deploy renamed it), is ``invalid``: not retried, the hook fails."""
    run = halted_with_owed_hook(manual_app, pipeline=halting(TakesNoHalt if case == "does_not_take_the_halt"
                                                            else Remember))
    if case == "class_gone":
        with manual_app.begin() as tx:
            tx.execute(schema.halt_hooks.update().values(klass=f"{__name__}:RenamedHandler"))
    worker = register(manual_app, role="job_worker", label="w")
    with caplog.at_level(logging.WARNING, logger="ductwork.hooks"):
        done = run_due_hook(manual_app, worker)
    assert done is not None
    assert (done.outcome, done.status) == ("invalid", "failed")
    [hook] = hooks(manual_app, run.id)
    assert (hook.status, hook.retry_count, hook.crash_count, hook.last_outcome) == ("failed", 0, 0, "invalid")
    assert hook.error_klass == ("builtins.TypeError" if case == "does_not_take_the_halt"
                                else "ductwork.errors.UnknownStepClassError")
    assert "not retried (it would end the same way): the hook failed" in caplog.text
    assert SEEN == {}


def test_a_claimed_hook_is_told_its_own_runs_halt_only(manual_app):
    """Two runs halted, each owing a hook: each claimed hook's halt names its own run's
    halted branch and error only, never the other run's [INV-HLT-2]."""
    runs = {n: halted_with_owed_hook(manual_app, n) for n in (1, 2)}
    worker = register(manual_app, role="job_worker", label="w")
    told = {}
    for _ in runs:
        claimed = claim_hook(manual_app, worker)
        assert claimed is not None
        told[claimed.run_id] = claimed.halt
    assert set(told) == {run.id for run in runs.values()}
    b = schema.branches
    for n, run in runs.items():
        with manual_app.begin() as tx:
            halted = tx.execute(sa.select(b.c.id).where(b.c.run_id == run.id, b.c.status == "halted")).scalars().all()
        assert len(halted) == 1
        assert [r["branch_id"] for r in told[run.id]["halt_reasons"]] == halted
        assert [e["message"] for e in told[run.id]["errors"]] == [f"boom {n}"]


def test_each_recorded_attempt_wakes_and_logs_what_follows_it(manual_app, caplog):
    """A failure owes the hook again: it wakes the workers once, and its WARNING names the
    retry's time (the row's ``eligible_at``) and the failure's own traceback text; a crash
    is told against the crash budget (``max_crash``, here unlike ``max_retry``); a success
    is final: it wakes no worker and logs nothing [INV-HLT-2]."""
    app, config = manual_app, manual_app.config.job_worker
    assert config.max_crash != config.max_retry
    run = halted_with_owed_hook(app)
    worker = register(app, role="job_worker", label="w")

    def record(outcome, error=None):
        claimed = claim_hook(app, worker)
        assert claimed is not None
        caplog.clear()
        woken = app.wakeup.generation
        with caplog.at_level(logging.WARNING, logger="ductwork.hooks"):
            status = record_hook(app, claimed, outcome, error)
        return status, app.wakeup.generation - woken, [r for r in caplog.records if r.name == "ductwork.hooks"]

    failure = ErrorInfo(
        "builtins.ConnectionError", "pager down", None, "Traceback (the handler's own)\nConnectionError: pager down"
    )
    status, wakes, [retry] = record("failure", failure)
    assert (status, wakes) == ("pending", 1)
    [hook] = hooks(app, run.id)
    assert retry.next_at == hook.eligible_at.isoformat()
    assert retry.exc_text == failure.text
    app.clock.advance(timedelta(seconds=config.retry_delay))
    status, wakes, [crash] = record("process_crashed", ErrorInfo("ductwork.ProcessCrash", "gone", None))
    assert (status, wakes) == ("pending", 1)
    assert f"re-run 2 of {config.max_crash} at" in crash.getMessage()
    assert crash.exc_text is None
    assert record("success") == ("succeeded", 0, [])  # a crash within the first third re-runs at once


@pytest.fixture
def crash_exhausting_app(db_url):
    """A fresh default app on a stopped clock whose advancer halts a branch at its first crash
    (``max_crash: 0``) and advances nothing inline."""
    from datetime import datetime

    from ductwork.db.clock import ManualClock
    from tests.conftest import installed, make_app

    yield from installed(make_app(db_url, clock=ManualClock(datetime(2026, 1, 1)),
                                  pipeline_advancer={"max_crash": 0, "inline_linear": False}))


def test_a_halt_without_an_error_is_told_none_beside_another_runs_advancement_error(crash_exhausting_app):
    """As above (a branch halted ``advancer_crashes_exhausted`` before anything failed), with
    another run whose advancement ended with an error, recorded after the halt and before the
    hook runs: the handler is told no error still (another step's advancement error is not
    its halt's)."""
    from tests.factories import make_executions, make_run

    app = crash_exhausting_app
    run = halted_with_owed_hook(app, 3, pipeline=Completes)
    other_run, other_branch = make_run(app)
    make_executions(app, other_run, other_branch, None, app.clock.now())
    with app.begin() as tx:
        step_id = tx.execute(sa.select(schema.steps.c.id).where(schema.steps.c.run_id == other_run)).scalar_one()
        tx.execute(schema.advancements.insert().values(
            id=new_id(), branch_id=other_branch, step_id=step_id, claim_token=new_id(), started_at=tx.now,
            completed_at=tx.now, error_klass="builtins.RuntimeError", error_message="routing broke",
            crash_count=0, created_at=tx.now, updated_at=tx.now))
    done = run_due_hook(app, register(app, role="job_worker", label="w"))
    assert done is not None
    assert (done.outcome, done.status) == ("success", "succeeded")
    _told_advancer_crashes_and_no_error(app, run)


def test_the_handler_is_told_the_error_of_the_attempt_that_ended_last(manual_app):
    """A step halted after several failed attempts: the handler is told the error of the one
    that completed last, though an earlier one's other times (eligible, claimed, created,
    updated) are set far later and its id is smaller (the columns the order could confuse
    disagree by far) [INV-HLT-2]."""
    run = halted_with_owed_hook(manual_app, 5)
    e, st = schema.executions, schema.steps
    with manual_app.begin() as tx:
        attempts = tx.execute(sa.select(e.c.id).join(st, st.c.id == e.c.step_id).where(
            st.c.run_id == run.id, e.c.error_klass.is_not(None)).order_by(e.c.id)).scalars().all()
        assert len(attempts) > 1
        now, far = tx.now, timedelta(days=10)
        for execution_id, message, completed, other in (
                (attempts[0], "an earlier attempt", now - timedelta(hours=1), now + far),
                (attempts[-1], "the last attempt", now, now - far)):
            tx.execute(e.update().where(e.c.id == execution_id).values(
                error_message=message, completed_at=completed, eligible_at=other, claimed_at=other, created_at=other,
                updated_at=other))
    claimed = claim_hook(manual_app, register(manual_app, role="job_worker", label="w"))
    assert claimed is not None
    assert claimed.halt["errors"] == [{"node": "Boom#0", "klass": "builtins.ValueError", "message": "the last attempt"}]


def test_the_handler_is_told_the_error_of_the_advancement_that_ended_last(crash_exhausting_app):
    """A halted step with no execution error and two failed advancements: the handler is
    told the error of the one that completed last, though the earlier one's other times
    (started, created, updated) are set far later and its id is smaller [INV-HLT-2]."""
    app = crash_exhausting_app
    run = halted_with_owed_hook(app, 3, pipeline=Completes)
    b = schema.branches
    with app.begin() as tx:
        [branch] = tx.execute(sa.select(b.c.id).where(b.c.run_id == run.id, b.c.status == "halted")).scalars()
        step_id = tx.execute(sa.select(schema.steps.c.id).where(schema.steps.c.branch_id == branch)).scalar_one()
        now, far = tx.now, timedelta(days=10)
        for message, completed, other in (("an earlier attempt", now - timedelta(hours=1), now + far),
                                          ("the last attempt", now, now - far)):
            tx.execute(schema.advancements.insert().values(
                id=new_id(), branch_id=branch, step_id=step_id, claim_token=new_id(), started_at=other,
                completed_at=completed, error_klass="builtins.RuntimeError", error_message=message,
                crash_count=0, created_at=other, updated_at=other))
    claimed = claim_hook(app, register(app, role="job_worker", label="w"))
    assert claimed is not None
    assert claimed.halt["errors"] == [{"node": "Echo#0", "klass": "builtins.RuntimeError",
                                       "message": "the last attempt"}]
