"""Every transition kind and error path, end to end, on SQLite, PostgreSQL and MySQL.

Checks: INV-ADV-1 (each successor created once), INV-ADV-3 (fan-in fires once with
all outputs, in fan-out order), INV-ADV-4 (batched expand yields N children),
INV-EXE-3 (idempotency keys), INV-EXE-4 (retry and crash budgets, halt reasons),
INV-RUN-1 (terminal states), INV-CTX-1 (context set once).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from datetime import timedelta

import pytest
import sqlalchemy as sa

from ductwork import Pipeline, Step
from ductwork.db import schema
from ductwork.errors import RunStateError, UnknownRunError
from ductwork.pipelines import runs as runs_module
from ductwork.pipelines.payloads import MAX_PAYLOAD_BYTES
from ductwork.pipelines.runs import Run, StepError
from ductwork.pipelines.snapshot import Definition
from ductwork.testing import drain
from tests.conftest import make_app
from tests.factories import executions_of
from tests.workloads import (
    Add1,
    Boom,
    Crashes,
    Echo,
    FailsLater,
    FailsOnce,
    Gather,
    Items,
    NotJson,
    Sum,
    Takes,
    Times10,
    TwoStep,
)

# --------------------------------------------------------------------------- steps


class Tag(Takes):
    """Returns its input wrapped with its class name."""

    def execute(self):
        return [type(self).__name__, self.value]


class TagB(Tag):
    pass


class TagC(Tag):
    pass


class NotAList(Step):
    def __init__(self, value):
        pass

    def execute(self):
        return 5


# --------------------------------------------------------------------------- pipelines


class ChainP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Add1).chain(to=Add1).chain(to=Times10)


class ExpandP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Times10).collapse(into=Sum)


class DivideP(Pipeline):
    @classmethod
    def define(cls, p):
        b, c = p.start(Echo).divide(to=[Tag, TagB])
        b.chain(to=TagC)
        b.combine(c, into=Gather)


class DivertP(Pipeline):
    @classmethod
    def define(cls, p):
        (p.start(Echo)
         .divert(to={True: Tag, None: TagB, 3: TagC, "otherwise": Echo})
         .converge(into=Gather))


class DampenP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Add1).dampen(before=Times10).chain(to=Add1)


class NotAListP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(NotAList).expand(to=Echo)


class HaltedSiblingP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Boom).collapse(into=Sum)


class NestedP(Pipeline):
    """expand → each child divides → combine → collapse: fan-ins nested in fan-outs."""

    @classmethod
    def define(cls, p):
        (p.start(Items).expand(to=Echo)
         .divide(to=[Add1, Times10]).combine(into=Sum)
         .collapse(into=Gather))


class DelayedP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Echo).chain(to=Add1, delay=timedelta(minutes=5))


class HaltsThirdP(Pipeline):
    """Two steps that succeed, then one that always fails: the run halts at its third step."""

    @classmethod
    def define(cls, p):
        p.start(Echo).chain(to=Echo).chain(to=Boom)


class RetriedFirstP(Pipeline):
    """Two branches started together, the first one's step failing once."""

    @classmethod
    def define(cls, p):
        b, c = p.start(Echo).divide(to=[FailsOnce, Tag])
        b.combine(c, into=Gather)


def nodes(run):
    return Counter((s.klass.rsplit(":", 1)[1], s.status) for s in run.steps())


# --------------------------------------------------------------------------- transitions


def test_chain_passes_each_output_on(app):
    run = ChainP.trigger(1)
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    steps = run.steps()
    assert [(s.node, s.input, s.output) for s in steps] == [
        ("Add1#0", [1], 2), ("Add1#1", [2], 3), ("Times10#2", [3], 30)]
    assert {s.status for s in steps} == {"completed"}
    assert {s.to_transition for s in steps} == {"start", "chain"}


def test_expand_collapse_in_batches_keeps_item_order(app):
    run = ExpandP.trigger(10)  # expand_batch is 4 in the test config: 3 batches
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    steps = run.steps()
    children = [s for s in steps if s.node == "Times10#1"]
    assert sorted(s.input[0] for s in children) == list(range(10))
    (merge,) = [s for s in steps if s.node == "Sum#2"]
    assert merge.input == [[i * 10 for i in range(10)]]  # ordered by fan-out index
    assert merge.output == 450
    (source,) = [s for s in steps if s.node == "Items#0"]
    assert source.output == list(range(10))  # the list it returned, not the storage envelope


def test_empty_expand_is_a_leaf(app):
    run = ExpandP.trigger(0)
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    assert [(s.node, s.output) for s in run.steps()] == [("Items#0", [])]  # collapse never fires


def test_divide_combine_with_branch_builders(app):
    run = DivideP.trigger("x")
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    steps = {s.node: s for s in run.steps()}
    assert steps["Gather#4"].input == [[["TagC", ["Tag", "x"]], ["TagB", "x"]]]
    assert len({s.branch_id for s in run.steps()}) == 4  # start, two children, merge


@pytest.mark.parametrize(("value", "taken"), [
    (True, "Tag"), (None, "TagB"), (3, "TagC"), ("true", "Tag"), ("3", "TagC"), (False, "Echo"),
    ([1], "Echo"), (3.0, "Echo"),
])
def test_divert_renders_keys_like_ruby(app, value, taken):
    run = DivertP.trigger(value)
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    klasses = [s.klass.rsplit(":", 1)[1] for s in run.steps()]
    assert klasses[1] == taken
    assert klasses[-1] == "Gather"
    assert len({s.branch_id for s in run.steps()}) == 1  # divert never creates a branch


def test_dampen_holds_no_worker_and_resume_continues(app):
    run = DampenP.trigger(1)
    drain(app, timeout=30)
    assert run.refresh().status == "dampened"
    assert [s.node for s in run.steps()] == ["Add1#0"]
    run.resume(input=7)
    assert run.status == "in_progress"
    with pytest.raises(RunStateError, match="nothing to resume"):
        run.resume()
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    assert [(s.node, s.input, s.output) for s in run.steps()] == [
        ("Add1#0", [1], 2), ("Times10#1", [7], 70), ("Add1#2", [70], 71)]


def test_resume_with_none_passes_none(app):
    run = DampenP.trigger(1)
    drain(app, timeout=30)
    run.resume(input=None)
    assert [s.input for s in run.steps()][1] == [None]


def test_resume_without_input_passes_the_previous_output(app):
    run = DampenP.trigger(1)
    drain(app, timeout=30)
    run.resume()
    drain(app, timeout=30)
    assert [s.output for s in run.steps()] == [2, 20, 21]


def test_nested_fan_in_inside_fan_out(app):
    run = NestedP.trigger(3)
    drain(app, timeout=60)
    assert run.refresh().status == "completed"
    (final,) = [s for s in run.steps() if s.node.startswith("Gather")]
    assert final.input == [[i + 1 + i * 10 for i in range(3)]]


def test_a_fan_in_measures_only_its_own_siblings_outputs(app):
    """A run whose two steps each return 60 % of the payload maximum completes first; then
    a divide/combine of small values completes too: the fan-in's size check sums only the
    outputs of the merging barrier's arrived siblings, never every step in the database
    (which together are above the maximum)."""
    big = "x" * (MAX_PAYLOAD_BYTES * 6 // 10)
    first = TwoStep.trigger(big)
    drain(app, timeout=120)
    assert first.refresh().status == "completed"
    run = DivideP.trigger(1)
    drain(app, timeout=30)
    assert run.refresh().status == "completed", run.halt_reasons
    (final,) = [s for s in run.steps() if s.node.startswith("Gather")]
    assert final.output == [["TagC", ["Tag", 1]], ["TagB", 1]]


class Repeat(Takes):
    """Returns a str of ``n`` x's."""

    def execute(self):
        return "x" * self.value


class RepeatsP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Echo).expand(to=Repeat).collapse(into=Gather)


def test_a_fan_in_too_large_halts_with_its_last_arrival_completed(app):
    """Three children each return 40 % of the payload maximum: the collapse's list would
    be above it, so the last arrival halts its branch ``payload_too_large`` at once; its
    step is completed with that halt like its siblings' (no step is left advancing) and
    the merge never fires."""
    n = MAX_PAYLOAD_BYTES * 4 // 10
    run = RepeatsP.trigger([n, n, n])
    drain(app, timeout=120)
    assert run.refresh().status == "halted"
    assert run.halt_reasons == ["payload_too_large"]
    assert Counter((s.node, s.status) for s in run.steps()) == {("Echo#0", "completed"): 1,
                                                                ("Repeat#1", "completed"): 3}


def test_a_fan_in_whose_barrier_ran_another_node_halts_transition_invalid(app):
    """A run whose stored snapshot names, for its combine, a barrier node other than the
    one its fan-out branch ran (a snapshot edited by hand): each arriving sibling's fan-in
    raises, so each halts ``transition_invalid`` and the merge never fires."""
    run = DivideP.trigger(1)
    r = schema.runs
    with app.begin() as tx:
        data = json.loads(tx.execute(sa.select(r.c.definition).where(r.c.id == run.id)).scalar_one())
        for source in ("TagB#2", "TagC#3"):
            assert data["edges"][source]["barrier"] == ["Echo#0"]
            data["edges"][source]["barrier"] = ["Tag#1"]
        text = json.dumps(data, sort_keys=True)
        tx.execute(r.update().where(r.c.id == run.id).values(
            definition=text, definition_sha1=hashlib.sha1(text.encode()).hexdigest()))
    drain(app, timeout=30)
    assert run.refresh().status == "halted"
    assert run.halt_reasons == ["transition_invalid"] * 2
    assert not [s for s in run.steps() if s.node.startswith("Gather")]


def test_many_runs_in_parallel_do_not_mix(app):
    runs = [ChainP.trigger(i) for i in range(5)]
    drain(app, timeout=60)
    assert [r.refresh().status for r in runs] == ["completed"] * 5
    assert [r.steps()[-1].output for r in runs] == [(i + 2) * 10 for i in range(5)]


# --------------------------------------------------------------------------- errors


def _halt_reasons(run):
    return run.refresh().halt_reasons  # the public attribute, read from the branch rows


def test_failures_retry_within_budget_then_halt(app):
    run = FailsLater.trigger("x")
    drain(app, timeout=30)
    assert run.refresh().status == "halted"
    rows = [r for r in executions_of(app, run.id) if r.node == "Boom#1"]
    assert [(r.outcome, r.retry_count) for r in rows] == [("failure", 0), ("failure", 1), ("failure", 2)]
    assert rows[0].error_klass.endswith("ValueError")
    assert rows[0].error_message == "boom x"
    assert _halt_reasons(run) == ["job_retries_exhausted"]
    assert nodes(run)[("Boom", "failed")] == 1


def test_constructor_errors_spend_the_crash_budget(manual_app):
    app = manual_app  # crash back-off is 10 s per crash after the first third: drain moves the clock
    run = Crashes.trigger("x")
    drain(app, timeout=60)
    assert run.refresh().status == "halted"
    rows = executions_of(app, run.id)
    assert [r.crash_count for r in rows] == [0, 1, 2, 3, 4]  # max_crash 4: five crashes
    assert {r.outcome for r in rows} == {"process_crashed"}
    assert _halt_reasons(run) == ["job_crashes_exhausted"]


def test_non_json_return_fails_the_execution_naming_step_and_type(app):
    run = NotJson.trigger(1)
    drain(app, timeout=30)
    assert run.refresh().status == "halted"
    rows = executions_of(app, run.id)
    assert [r.outcome for r in rows] == ["invalid"]  # it would recur: not retried (max_retry 2)
    assert rows[0].error_klass == "ductwork.errors.NotJSONError"
    assert "tests.workloads:ReturnsSet returned set: not JSON-serialisable" in rows[0].error_message
    assert _halt_reasons(run) == ["step_return_invalid"]


def test_expand_of_a_non_list_fails_the_step(app):
    run = NotAListP.trigger(1)
    drain(app, timeout=30)
    assert run.refresh().status == "halted"
    rows = executions_of(app, run.id)
    assert [(r.outcome, r.error_klass) for r in rows] == [("invalid", "ductwork.errors.StepReturnError")]
    assert "must return a list" in rows[0].error_message
    assert _halt_reasons(run) == ["step_return_invalid"]


def test_halted_sibling_means_the_merge_never_fires(app):
    run = HaltedSiblingP.trigger(3)  # three children, each failing
    drain(app, timeout=60)
    assert run.refresh().status == "halted"
    assert _halt_reasons(run) == ["job_retries_exhausted"] * 3
    assert not [s for s in run.steps() if s.node.startswith("Sum")]


def test_terminal_runs_stay_terminal(app):
    run = ChainP.trigger(1)
    drain(app, timeout=30)
    with pytest.raises(RunStateError):
        run.resume(input=1)
    assert run.refresh().status == "completed"


# --------------------------------------------------------------------------- time


def test_delay_is_not_eligible_before_its_time(manual_app):
    from ductwork.fleet.worker import Worker
    from ductwork.pipelines.advance import Advancer

    app = manual_app
    run = DelayedP.trigger(1)
    worker, advancer = Worker(app), Advancer(app)
    assert worker.run_once().outcome == "success"  # advances the chain inline: step 2 is queued
    assert advancer.run_once() == "idle"
    assert worker.run_once() is None  # delayed five minutes: holds no worker
    app.clock.advance(timedelta(minutes=5) - timedelta(microseconds=1))
    assert worker.run_once() is None
    app.clock.advance(microseconds=1)
    assert worker.run_once().outcome == "success"
    drain(app, timeout=30)
    assert run.refresh().status == "completed"


# --------------------------------------------------------------------------- definitions


def test_an_app_reads_a_runs_definition_by_digest_or_takes_the_given_text(app):
    """``App.definition``: on an App that has run no transaction yet, the schema is checked,
    then the snapshot read by its digest; with the text given, nothing is read. Either is
    cached: the same object for the digest afterwards."""
    import json

    import sqlalchemy as sa

    from ductwork.db import schema
    from tests.conftest import make_app

    run = ChainP.trigger(1)
    with app.begin(readonly=True) as tx:
        sha1, text = tx.execute(sa.select(schema.runs.c.definition_sha1, schema.runs.c.definition)
                                .where(schema.runs.c.id == run.id)).one()
    fresh = make_app(app.url)
    try:
        assert not fresh._schema_checked
        read = fresh.definition(sha1)
        assert fresh._schema_checked
        assert read == ChainP.definition
        assert fresh.definition(sha1) is read
    finally:
        fresh.dispose()
    given = make_app(app.url)
    try:
        parsed = given.definition("not-stored", text)  # the text given: no database read at all
        assert parsed == Definition.from_json(json.loads(text)) == ChainP.definition
        assert not given._schema_checked
        assert given.definition("not-stored") is parsed
    finally:
        given.dispose()


# --------------------------------------------------------------------------- run handles


def test_a_run_handle_takes_the_app_and_a_run_id(app):
    """``Run(app)`` without a run id, and ``Run(id, id)`` without the App, each raise
    TypeError saying to use ``app.run(...)``, before reading anything."""
    with pytest.raises(TypeError, match=r"takes the App first; for a handle on run RUN_ID use app\.run\(RUN_ID\)$"):
        Run(app)
    with pytest.raises(TypeError, match=r"takes the App first; for a handle on run 'r1' use app\.run\('r1'\)$"):
        Run("r1", "r2")


def test_a_keyed_trigger_is_repeated_after_a_lost_connection_an_unkeyed_one_is_not(app):
    """The trigger's transaction loses its connection at its first statement, once (a
    DBAPIError marked ``connection_invalidated``, as a server restart leaves it): with a key
    the trigger runs again and returns its run; without one it raises and has written nothing
    (run again, a trigger whose commit was lost unacknowledged would start a second run)."""
    from sqlalchemy import event

    app.now()  # the schema checked: the next statement is the trigger's
    armed: list[int] = []

    def lose(_conn, _cursor, statement, parameters, _context, _many):
        if armed:
            armed.pop()
            raise sa.exc.OperationalError(statement, parameters, Exception("connection lost"),
                                          connection_invalidated=True)

    event.listen(app.engine, "before_cursor_execute", lose)
    try:
        armed.append(1)
        keyed = ChainP.trigger(1, key="k1")
        assert not armed
        armed.append(1)
        with pytest.raises(sa.exc.OperationalError, match="connection lost"):
            ChainP.trigger(2)
        assert not armed
    finally:
        event.remove(app.engine, "before_cursor_execute", lose)
    with app.begin(readonly=True) as tx:
        rows = tx.execute(sa.select(schema.runs.c.id, schema.runs.c.trigger_key)).all()
    assert [tuple(row) for row in rows] == [(keyed.id, "k1")]


class _Clock:
    """Stands in for ``ductwork.pipelines.runs``'s ``time`` module: a monotonic clock that
    moves only while ``sleep`` is called, by what it was asked to sleep."""

    def __init__(self):
        self.now, self.sleeps = 100.0, []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_wait_returns_a_settled_run_and_gives_up_when_the_clock_reads_its_deadline(app, monkeypatch):
    """``Run.wait`` returns a completed or dampened run at its first read, without sleeping;
    on a run in progress (no worker here) it reads it every ``poll`` s and raises TimeoutError
    as soon as the clock reads the deadline, not a poll later: with a clock that moves only
    while wait sleeps, a 0.5 s timeout polled every 0.25 s is two sleeps."""
    settled = [ChainP.trigger(1), DampenP.trigger(1)]
    drain(app, timeout=30)
    waiting = ChainP.trigger(2)
    clock = _Clock()
    monkeypatch.setattr(runs_module, "time", clock)
    assert [run.wait(timeout=0.5, poll=0.25).status for run in settled] == ["completed", "dampened"]
    assert clock.sleeps == []
    with pytest.raises(TimeoutError, match=rf"^run {waiting.id} still in_progress after 0\.5 s$"):
        waiting.wait(timeout=0.5, poll=0.25)
    assert clock.sleeps == [0.25, 0.25]


def test_a_runs_definition_is_its_own_snapshot_and_the_schema_is_checked_once(app):
    """``Run.definition()`` of two runs of different pipelines, each read by an App that has
    cached neither snapshot: each is its own pipeline's; a handle on no run raises
    UnknownRunError. An App checks the schema before its first transaction only: the reads
    of a second digest and of no run do not check it again."""
    chain, expand = ChainP.trigger(1), ExpandP.trigger(2)
    for run, pipeline in ((expand, ExpandP), (chain, ChainP)):
        fresh = make_app(app.url)
        try:
            assert Run(fresh, run.id, _read=False).definition() == pipeline.definition
        finally:
            fresh.dispose()
    fresh = make_app(app.url)
    checks: list[int] = []
    check = fresh.check_schema

    def counted():
        checks.append(1)
        check()

    fresh.check_schema = counted
    try:
        assert [Run(fresh, run.id, _read=False).definition() for run in (chain, expand)] == [
            ChainP.definition, ExpandP.definition]
        with pytest.raises(UnknownRunError, match="no-such-run"):
            Run(fresh, "no-such-run", _read=False).definition()
    finally:
        fresh.dispose()
    assert checks == [1]


# --------------------------------------------------------------------------- step info


def test_steps_report_each_steps_attempts_times_and_latest_error(app):
    """``Run.steps()`` of a run that halted at its third step, beside a completed run: each
    succeeded step was claimed once, shows no error and finished when it completed; the
    failed step shows its three claims, the error of its last execution (class, message,
    outcome), and finished when that execution ended; each step started at its first claim.
    Each run shows only its own halt reasons. The run's revival lists its steps in start
    order, whatever their last update (the carried-over steps were written by the revive, the
    re-enqueued one was last updated when it failed)."""
    halting, other = HaltsThirdP.trigger("x"), ChainP.trigger(1)
    drain(app, timeout=30)
    assert [(run.refresh().status, run.halt_reasons) for run in (halting, other)] == [
        ("halted", ["job_retries_exhausted"]), ("completed", [])]
    s, e = schema.steps, schema.executions
    with app.begin(readonly=True) as tx:
        rows = tx.execute(sa.select(s.c.id, s.c.completed_at, e.c.claimed_at, e.c.completed_at.label("ended_at"))
                          .join(e, e.c.step_id == s.c.id).where(s.c.run_id == halting.id)
                          .order_by(e.c.created_at, e.c.id)).all()
    claims: dict[str, list] = {}
    finished: dict[str, object] = {}
    for row in rows:
        claims.setdefault(row.id, []).append(row.claimed_at)
        finished[row.id] = row.completed_at or row.ended_at  # a failed step: its last execution's end
    steps = halting.steps()
    assert [(step.node, step.status, step.attempts) for step in steps] == [
        ("Echo#0", "completed", 1), ("Echo#1", "completed", 1), ("Boom#2", "failed", 3)]
    assert [step.error for step in steps] == [
        None, None, StepError(klass="builtins.ValueError", message="boom x", outcome="failure")]
    assert [step.started_at for step in steps] == [min(claims[step.id]) for step in steps]
    assert [step.finished_at for step in steps] == [finished[step.id] for step in steps]
    assert None not in [step.finished_at for step in steps]
    assert [(step.attempts, step.error) for step in other.steps()] == [(1, None)] * 3
    revived = halting.revive()  # its copies were written now, the re-enqueued one keeps its last update
    assert [(step.node, step.status) for step in revived.steps()] == [
        ("Echo#0", "completed"), ("Echo#1", "completed"), ("Boom#2", "in_progress")]


def test_a_step_waiting_for_its_retry_has_not_finished(manual_app):
    """A step whose first execution failed and whose retry is not due yet (the clock does
    not move) is in progress: ``Run.steps()`` shows its attempt and that attempt's error,
    and no finish time (only a step that failed for good finished when its last execution
    ended)."""
    from ductwork.fleet.worker import Worker
    from ductwork.pipelines.advance import Advancer

    run = RetriedFirstP.trigger("v")
    worker, advancer = Worker(manual_app), Advancer(manual_app)
    while worker.run_once() is not None or advancer.run_once() != "idle":
        pass  # (each turn makes progress; the retry waits for the clock, so this ends)
    [waiting] = [step for step in run.steps() if step.node == "FailsOnce#1"]
    assert (waiting.status, waiting.attempts, waiting.error.klass) == ("in_progress", 1, "builtins.ValueError")
    assert waiting.finished_at is None


def test_a_retried_step_shows_its_attempts_and_no_error_once_its_retry_succeeded(app):
    """Two branches start together, the first one's step failing once: ``Run.steps()`` lists
    the steps in start order, the retried one with two attempts and no error (the latest of
    its executions succeeded)."""
    run = RetriedFirstP.trigger("v")
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    assert [(step.node, step.attempts, step.error) for step in run.steps()] == [
        ("Echo#0", 1, None), ("FailsOnce#1", 2, None), ("Tag#2", 1, None), ("Gather#3", 1, None)]


def test_two_expanding_runs_each_read_their_own_items(app):
    """Two runs expand and collapse at once: each completes, its source step's output is the
    list it returned and its merge the sum of its own children's outputs (the advancer's
    run lock and ``Run.steps()``'s read of the expand items are each run's own)."""
    runs = {n: ExpandP.trigger(n) for n in (3, 5)}
    drain(app, timeout=60)
    for n, run in runs.items():
        assert run.refresh().status == "completed"
        steps = {step.node: step for step in run.steps() if step.node != "Times10#1"}
        assert (steps["Items#0"].output, steps["Sum#2"].output) == (list(range(n)), 10 * sum(range(n)))
