"""What the engine logs, on SQLite, PostgreSQL and MySQL, and what ``ductwork`` writes.

Every failure, timeout and crash of a step is one WARNING naming the run, pipeline,
step, execution and attempt, what happens next, and (for an error the step raised)
its traceback; every branch halt is one WARNING; nothing is logged for an outcome
that rolled back. ``ductwork start`` says at INFO what it runs, against which
database (password masked) with which limit keys, writes JSON lines with
``--log-format json``, and ``ductwork db upgrade`` keeps Alembic's INFO quiet.

Checks: none of the invariants; the operator-facing log of docs/operating.md#logs.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from ductwork import Pipeline, Step
from ductwork.errors import CommitFailed
from ductwork.fleet.processes import register
from ductwork.fleet.reaper import reap
from ductwork.limits.claims import claim
from ductwork.testing import drain
from ductwork.version import describe
from ductwork_proof.fleet import Fleet, wait_for, write_config
from tests.conftest import make_app, reset_tables
from tests.workloads import Crashes, Gather, Items, NotJson, Unkeyed


class Decline(Step):
    def __init__(self, order_id):
        self.order_id = order_id

    def execute(self):
        raise RuntimeError(f"card declined for order {self.order_id}")


class DeclineP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Decline)


class KeyedDeclineP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Decline, limit_by="log_key")


class ThreeDeclinesP(Pipeline):
    @classmethod
    def define(cls, p):
        p.start(Items).expand(to=Decline).collapse(into=Gather)


def _warnings(caplog, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno == logging.WARNING]


def test_a_failing_step_logs_a_warning_per_attempt_with_its_traceback(app, caplog):
    caplog.set_level(logging.WARNING, logger="ductwork")
    run = DeclineP.trigger(1042)
    drain(app, timeout=30)
    assert run.refresh().status == "halted"
    failures = _warnings(caplog, "ductwork.executions")
    assert [(r.outcome, r.attempt, r.next) for r in failures] == [
        ("failure", 1, "retry"), ("failure", 2, "retry"), ("failure", 3, "halt")]  # max_retry 2
    pipeline, step = f"{__name__}:DeclineP", f"{__name__}:Decline"
    for record in failures:
        assert (record.run_id, record.pipeline, record.step, record.node) == (run.id, pipeline, step, "Decline#0")
        assert record.error == "builtins.RuntimeError"
        assert f"run_id={run.id} pipeline={pipeline} step={step}" in record.getMessage()
        assert f"attempt={record.attempt}" in record.getMessage()
        assert record.exc_text.startswith("Traceback (most recent call last):")
        assert 'raise RuntimeError(f"card declined for order {self.order_id}")' in record.exc_text
        assert record.exc_text.endswith("RuntimeError: card declined for order 1042")
    assert "; retry 1 of 2 at " in failures[0].getMessage()
    assert failures[0].next_at is not None
    assert failures[2].next_at is None
    assert "no retry left (max_retry 2): the step failed and its branch halts" in failures[2].getMessage()
    (halt,) = _warnings(caplog, "ductwork.advance")
    assert (halt.run_id, halt.pipeline, halt.halt_reason, halt.run_status) == (
        run.id, pipeline, "job_retries_exhausted", "halted")
    assert halt.getMessage().startswith("branch halted: job_retries_exhausted at Decline#0; the run is halted (")


def test_a_step_that_cannot_succeed_logs_one_warning_and_its_halt(app, caplog):
    """An ``invalid`` execution (here a return value that is not JSON) is not retried:
    one WARNING says so, and one for the halt with its reason."""
    caplog.set_level(logging.WARNING, logger="ductwork")
    run = NotJson.trigger(7)
    drain(app, timeout=30)
    assert run.refresh().status == "halted"
    (ended,) = _warnings(caplog, "ductwork.executions")
    assert (ended.run_id, ended.outcome, ended.attempt, ended.next) == (run.id, "invalid", 1, "halt")
    assert ended.error == "ductwork.errors.NotJSONError"
    assert "step cannot succeed: ductwork.errors.NotJSONError: " in ended.getMessage()
    assert "not retried (it would end the same way): the step failed and its branch halts" in ended.getMessage()
    (halt,) = _warnings(caplog, "ductwork.advance")
    assert (halt.run_id, halt.halt_reason) == (run.id, "step_return_invalid")


def test_each_halted_branch_says_whether_its_run_halted(app, caplog):
    caplog.set_level(logging.WARNING, logger="ductwork.advance")
    run = ThreeDeclinesP.trigger(3)
    drain(app, timeout=60)
    halts = _warnings(caplog, "ductwork.advance")
    assert [r.run_status for r in halts] == ["in_progress", "in_progress", "halted"]
    assert "; the run's other branches go on (" in halts[0].getMessage()
    assert "; the run is halted (" in halts[2].getMessage()
    assert len({r.branch_id for r in halts}) == 3
    assert {r.run_id for r in halts} == {run.id}


def test_a_success_is_logged_at_debug_only(app, caplog):
    caplog.set_level(logging.DEBUG, logger="ductwork.executions")
    run = Unkeyed.trigger(1)
    drain(app, timeout=30)
    (success,) = [r for r in caplog.records if r.name == "ductwork.executions"]
    assert (success.levelno, success.outcome, success.run_id) == (logging.DEBUG, "success", run.id)
    assert success.getMessage().startswith("step succeeded: Echo#0 (run_id=")


def test_a_reaped_execution_logs_a_crash_warning(app, caplog):
    caplog.set_level(logging.WARNING, logger="ductwork")
    process = register(app, role="test", label="doomed")
    run = DeclineP.trigger(7)
    claimed = claim(app, process)
    assert reap(app, process, force=True)
    (crash,) = _warnings(caplog, "ductwork.reaper")
    assert (crash.outcome, crash.run_id, crash.execution_id, crash.attempt, crash.next) == (
        "process_crashed", run.id, claimed.execution_id, 1, "re-run")
    assert crash.error == "ductwork.ProcessCrash"
    assert "step crashed: ductwork.ProcessCrash: Reaped from a dead process; re-run 1 of 4 at " in crash.getMessage()
    assert crash.exc_text is None  # a dead process leaves no traceback


def test_a_step_that_cannot_be_built_logs_its_crashes_with_the_traceback(manual_app, caplog):
    app = manual_app  # crash back-off after the first third of the budget: drain moves the clock
    caplog.set_level(logging.WARNING, logger="ductwork")
    run = Crashes.trigger(1)
    drain(app, timeout=60)
    crashes = _warnings(caplog, "ductwork.executions")
    assert [(r.outcome, r.attempt) for r in crashes] == [("process_crashed", n) for n in range(1, 6)]  # max_crash 4
    assert crashes[-1].next == "halt"
    assert "no re-run left (max_crash 4)" in crashes[-1].getMessage()
    assert all(r.run_id == run.id and r.error == "builtins.KeyError" for r in crashes)
    assert 'raise KeyError("constructor fails")' in crashes[0].exc_text
    (halt,) = _warnings(caplog, "ductwork.advance")
    assert halt.halt_reason == "job_crashes_exhausted"


def test_advancement_errors_log_each_retry_and_the_halt_with_the_traceback(db_url, caplog, monkeypatch):
    from ductwork.app import set_default_app
    from ductwork.pipelines import advance

    def broken(*args, **kwargs):  # noqa: ARG001 - stands in for the function it replaces
        raise RuntimeError("routing broke")

    # the leaf goes through an advancer (no inline advance), batched then alone, to the broken move
    app = make_app(db_url, pipeline_advancer={"inline_linear": False})
    reset_tables(app.engine)
    set_default_app(app)
    monkeypatch.setattr(advance, "move_branches", broken)
    caplog.set_level(logging.WARNING, logger="ductwork")
    run = Unkeyed.trigger("b")
    drain(app, timeout=30)
    assert run.refresh().status == "halted"
    *errors, halt = _warnings(caplog, "ductwork.advance")
    assert [(r.run_id, r.next) for r in errors] == [(run.id, "retry")] * 2  # pipeline_advancer.max_retry 2
    assert "advancing past Echo#0 failed: builtins.RuntimeError: routing broke; the branch is released for " \
           "retry 1 of 2 (" in errors[0].getMessage()
    assert (halt.run_id, halt.halt_reason, halt.error) == (run.id, "advancer_retries_exhausted",
                                                           "builtins.RuntimeError")
    assert "branch halted: advancer_retries_exhausted at Echo#0 (builtins.RuntimeError: routing broke); " \
           "the run is halted" in halt.getMessage()
    for record in (*errors, halt):
        assert 'raise RuntimeError("routing broke")' in record.exc_text
    set_default_app(None)
    app.dispose()


@pytest.fixture
def no_retry_app(db_url):
    """The default app, on empty tables, with steps that are not retried."""
    from ductwork.app import set_default_app

    app = make_app(db_url, job_worker={"max_retry": 0})
    reset_tables(app.engine)
    set_default_app(app)
    try:
        yield app
    finally:
        set_default_app(None)
        app.dispose()


def test_a_timed_out_step_logs_a_warning_without_a_traceback(no_retry_app, caplog):
    from tests.workloads.processes import ForeverPipeline

    caplog.set_level(logging.WARNING, logger="ductwork")
    run = ForeverPipeline.trigger("/dev/null")
    drain(no_retry_app, timeout=60)
    (timeout,) = _warnings(caplog, "ductwork.executions")
    assert (timeout.outcome, timeout.run_id, timeout.attempt, timeout.next) == ("timed_out", run.id, 1, "halt")
    assert "step timed out: " in timeout.getMessage()
    assert "ran past its timeout of 1 s" in timeout.getMessage()
    assert timeout.exc_text is None  # the step raised nothing: ductwork killed it


def test_a_step_that_raises_in_its_timeout_child_is_a_failure_with_the_childs_error(no_retry_app, caplog):
    """The worker records the error the child process sent back (ChildStepError's info)."""
    import os

    from tests.workloads.processes import RaisesInChildPipeline

    caplog.set_level(logging.WARNING, logger="ductwork")
    run = RaisesInChildPipeline.trigger(None)
    drain(no_retry_app, timeout=60)
    assert run.refresh().status == "halted"
    (failure,) = _warnings(caplog, "ductwork.executions")
    assert (failure.outcome, failure.run_id, failure.next) == ("failure", run.id, "halt")
    assert failure.error == "builtins.ValueError"
    assert "raised in pid " in failure.getMessage()
    assert f"raised in pid {os.getpid()}" not in failure.getMessage()  # the child's, not ours


def test_an_outcome_that_rolled_back_is_not_logged(app, caplog, monkeypatch):
    import ductwork.pipelines.outcomes as executions

    caplog.set_level(logging.WARNING, logger="ductwork")
    process = register(app, role="test", label="rolls-back")
    DeclineP.trigger(1)
    claimed = claim(app, process)

    def broken(*args, **kwargs):  # noqa: ARG001 - stands in for any call
        raise RuntimeError("the database went away")

    monkeypatch.setattr(executions, "enqueue", broken)  # fails after the outcome is written
    with pytest.raises(RuntimeError):
        executions.record_failure(app, claimed, ValueError("boom"))
    assert _warnings(caplog, "ductwork.executions") == []
    monkeypatch.undo()
    assert reap(app, process, force=True)  # rolled back: the execution is still open, and reaped now
    assert [r.outcome for r in _warnings(caplog, "ductwork.reaper")] == ["process_crashed"]
    with pytest.raises(CommitFailed):  # the reaper took it: this outcome is not recorded, nor logged
        executions.record_failure(app, claimed, ValueError("boom"))
    assert _warnings(caplog, "ductwork.executions") == []


# --------------------------------------------------------------------------- the command


def _masked(url: str) -> str:
    from ductwork.db import engines

    engine = engines.create_engine(url)
    try:
        return engine.url.render_as_string(hide_password=True)
    finally:
        engine.dispose()


def _fleet_failing_run(db_url, tmp_path, args):
    """Start a fleet, let a keyed step fail until its run halts, stop the fleet; its log."""
    config = write_config(tmp_path / "ductwork.yml", pipelines=[f"{__name__}:KeyedDeclineP"],
                          limits={"log_key": {"concurrency": 1, "rate": {"limit": 100, "per": 1}}})
    fleet = Fleet(db_url, config, args=args).start()
    try:
        run = KeyedDeclineP.trigger(1042)
        wait_for(lambda: run.refresh().status == "halted", "the run halted", 60)
        wait_for(lambda: "branch halted" in fleet.log(), "the halt logged", 30)
        assert fleet.terminate(30) == 0, fleet.log()[-3000:]
    finally:
        fleet.kill_host()
    return run, fleet.log()


@pytest.mark.usefixtures("app")  # empty tables on db_url
def test_start_logs_what_it_runs_and_each_failure_with_its_traceback(db_url, tmp_path):
    run, log = _fleet_failing_run(db_url, tmp_path, [])  # no option: INFO, text
    lines = log.splitlines()
    (start,) = [line for line in lines if " ductwork.cli INFO ductwork start: database " in line]
    assert f"database {_masked(db_url)}, config {tmp_path / 'ductwork.yml'}, env 'default', role all" in start
    assert start.endswith(f"role all; {describe()}")  # which ductwork, from which commit
    assert any(line.endswith(f"ductwork.cli INFO pipelines (1): {__name__}:KeyedDeclineP") for line in lines)
    assert any(line.endswith("ductwork.cli INFO processes: 1 advancer process with 1 threads, "
                             "1 worker process with 2 threads each") for line in lines)
    assert any(line.endswith("ductwork.cli INFO limit keys (1): log_key: concurrency 1, rate 100 per 1s (burst 100)")
               for line in lines)
    failed = [i for i, line in enumerate(lines) if " ductwork.executions WARNING step failed: " in line]
    assert len(failed) == 3, log[-3000:]  # max_retry 2
    assert f"run_id={run.id} " in lines[failed[0]]
    assert "attempt=1 " in lines[failed[0]]
    assert lines[failed[0] + 1] == "Traceback (most recent call last):"
    # (other processes' lines may come between a record's lines: each line is written alone)
    assert next(line for line in lines[failed[0]:] if line.startswith("RuntimeError")) == (
        "RuntimeError: card declined for order 1042")
    assert any(" ductwork.advance WARNING branch halted: job_retries_exhausted" in line for line in lines)
    assert lines[-1].endswith("ductwork.cli INFO ductwork start: stopped, exit status 0")
    assert "alembic" not in log


@pytest.mark.usefixtures("app")  # empty tables on db_url
def test_start_with_log_format_json_writes_one_object_per_line(db_url, tmp_path):
    run, log = _fleet_failing_run(db_url, tmp_path, ["--log-format", "json"])
    records = [json.loads(line) for line in log.splitlines()]  # every line parses
    assert {"time", "level", "logger", "process", "message"} <= set(records[0])
    (start,) = [r for r in records if r["message"].startswith("ductwork start: database ")]
    assert (start["level"], start["logger"]) == ("INFO", "ductwork.cli")
    failed = [r for r in records if r["logger"] == "ductwork.executions"]
    assert [(r["level"], r["run_id"], r["attempt"], r["next"]) for r in failed] == [
        ("WARNING", run.id, 1, "retry"), ("WARNING", run.id, 2, "retry"), ("WARNING", run.id, 3, "halt")]
    assert all(r["pipeline"] == f"{__name__}:KeyedDeclineP" and r["step"] == f"{__name__}:Decline" for r in failed)
    assert failed[0]["exc_info"].startswith("Traceback (most recent call last):\n")
    assert failed[0]["exc_info"].endswith("RuntimeError: card declined for order 1042")
    assert [r["halt_reason"] for r in records if r["logger"] == "ductwork.advance"] == ["job_retries_exhausted"]
    assert records[-1]["message"] == "ductwork start: stopped, exit status 0"


@pytest.mark.parametrize(("level", "alembic"), [(None, False), ("INFO", False), ("DEBUG", True)])
def test_db_upgrade_keeps_alembic_quiet_unless_debug(db_url, level, alembic):
    command = [sys.executable, "-m", "ductwork.cli", "db", "upgrade", "--database-url", db_url]
    done = subprocess.run(command + (["--log-level", level] if level else []), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ductwork schema at revision")
    assert ("alembic.runtime.migration INFO Context impl" in done.stderr) is alembic, done.stderr
    if not alembic:
        assert done.stderr == ""

