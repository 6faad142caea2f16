"""Every transition kind and error path, end to end, on SQLite, PostgreSQL and MySQL.

Checks: INV-ADV-1 (each successor created once), INV-ADV-3 (fan-in fires once with
all outputs, in fan-out order), INV-ADV-4 (batched expand yields N children),
INV-EXE-3 (idempotency keys), INV-EXE-4 (retry and crash budgets, halt reasons),
INV-RUN-1 (terminal states), INV-CTX-1 (context set once).
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from ductwork import Pipeline, Step
from ductwork.errors import RunStateError
from ductwork.pipelines.snapshot import Definition
from ductwork.testing import drain
from tests.factories import executions_of
from tests.workloads import Add1, Boom, Crashes, Echo, FailsLater, Gather, Items, NotJson, Sum, Takes, Times10

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
