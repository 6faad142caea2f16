"""A typed user's code, checked by mypy (tests/lint/test_static_checks.py), never run by pytest.

Each ``assert_type`` fails the check if the public API loses its type: ``trigger()``
typed ``-> Any`` would make ``assert_type(run, Run)`` an error, and so on.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import assert_type

import ductwork
from ductwork import App, Context, Pipeline, PipelineBuilder, Run, Step, StepError, StepInfo
from ductwork.db.clock import OffsetClock
from ductwork.errors import DrainTimeout, DuctworkError
from ductwork.pytest_plugin import Drain
from ductwork.testing import drain, waiting_for


class Fetch(Step):
    def __init__(self, since: str) -> None:
        self.since = since

    def execute(self) -> list[int]:
        assert_type(self.context, Context)
        assert_type(self.idempotency_key, str)
        return [1, 2, 3]


class Push(Step):
    def __init__(self, order: int) -> None:
        self.order = order

    def execute(self) -> int:
        return self.order * 2


class Record(Step):
    def __init__(self, results: list[int]) -> None:
        self.results = results

    def execute(self) -> int:
        return sum(self.results)


class Sync(Pipeline):
    @classmethod
    def define(cls, pipeline: PipelineBuilder) -> None:
        pipeline.start(Fetch).expand(to=Push).collapse(into=Record)


def use(url: str) -> None:
    app = ductwork.connect(url, {"default": {"job_worker": {"retry_delay": 0.1}}}, clock=OffsetClock())
    assert_type(app, App)
    run = Sync.trigger("2026-01-01")
    assert_type(run, Run)
    assert_type(Sync.trigger("2026-01-02", app=app), Run)
    assert_type(run.id, str)
    assert_type(run.pipeline, str)
    assert_type(run.triggered_at, datetime)
    assert_type(run.halt_reasons, list[str])
    try:
        drain(app, 30, skip_delays=True)
    except DrainTimeout as timeout:
        assert_type(timeout, DrainTimeout)
        assert_type(waiting_for(app), list[str])
        raise
    assert_type(run.refresh(), Run)
    assert_type(run.wait(timeout=1), Run)
    if run.status == "completed":
        pass
    elif run.status == "dampened":
        assert_type(run.resume(), Run)
        assert_type(run.resume(input={"approved": True}), Run)
    steps = run.steps()
    assert_type(steps, list[StepInfo])
    for step in steps:
        assert_type(step.klass, str)
        assert_type(step.node, str)
        assert_type(step.attempts, int)
        assert_type(step.created_at, datetime)
        assert_type(step.started_at, datetime | None)
        assert_type(step.finished_at, datetime | None)
        assert_type(step.error, StepError | None)
        if step.error is not None:
            assert_type(step.error.klass, str)
            assert_type(step.error.message, str)
        assert_type(step.idempotency_key, str)
    context = Context(app, run.id)
    assert_type(context.set("charged", True), bool)
    history = run.history(backtraces=True)
    assert_type(history, ductwork.RunHistory)
    assert_type(history.run, ductwork.RunRecord)
    assert_type(history.run.finished_at, datetime | None)
    assert_type(history.run.revived_from, str | None)
    assert_type(history.run.halt_reasons, tuple[str, ...])
    for branch in history.branches:
        assert_type(branch, ductwork.BranchRecord)
        assert_type(branch.halt_reason, str | None)
        assert_type(branch.wait, ductwork.Wait | None)
    for record in history.steps:
        assert_type(record, ductwork.StepRecord)
        assert_type(record.wait, ductwork.Wait | None)
        for execution in record.executions:
            assert_type(execution, ductwork.ExecutionRecord)
            assert_type(execution.error, ductwork.ErrorRecord | None)
            assert_type(execution.claimed_at, datetime | None)
    assert_type(history.hook, ductwork.HookRecord | None)
    if history.hook is not None:
        assert_type(history.hook.status, str)
        assert_type(history.hook.error, ductwork.ErrorRecord | None)
    revived = run.revive(duplicate_context=True)
    assert_type(revived, ductwork.Run)
    listed = ductwork.list_runs(app, status="halted", pipeline="Sync", since="1d", limit=10)
    assert_type(listed, list[ductwork.RunRecord])
    pruned = ductwork.prune(app, timedelta(days=30), batch_size=50, dry_run=True)
    assert_type(pruned, ductwork.PruneResult)
    assert_type(pruned.rows, dict[str, int])


def in_a_test(ductwork_app: App, ductwork_drain: Drain) -> None:
    run = Sync.trigger("2026-01-01", app=ductwork_app)
    ductwork_drain(skip_delays=True)
    ductwork_drain(timeout=5)
    assert_type(run.refresh().status == "halted", bool)


def errors() -> None:
    try:
        ductwork.connect("sqlite://")
    except DuctworkError as error:
        assert_type(error, DuctworkError)
