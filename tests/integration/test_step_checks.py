"""Mistakes that can never succeed halt at once, on SQLite, PostgreSQL and MySQL.

Checks: INV-EXE-4 (an ``invalid`` execution — its class does not resolve, or its
stored input does not bind to ``__init__`` — fails its step at once, whatever budget
is left, and the branch halts ``job_invalid`` after exactly one execution; an error
raised inside ``__init__`` stays a crash: ``test_pipelines.py``). Also: ``trigger`` refuses arguments the
first step cannot take, and classes of ``__main__`` while job workers of another
process are alive, before writing anything. Workers and advancers are driven one
``run_once`` at a time: nothing here waits for a retry or crash delay.
"""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa

from ductwork import Pipeline, Step
from ductwork.db import schema
from ductwork.errors import InputError, MainModuleError
from ductwork.fleet.processes import register
from ductwork.fleet.worker import Worker
from ductwork.pipelines.advance import Advancer
from ductwork.testing import drain
from tests.factories import executions_of
from tests.workloads import Since, SinceP


class NeedsTwo(Step):
    """Named by a step stored with one argument (a class changed by a deploy while its steps
    waited): its input never binds. No definition may chain to it (a step after start
    gets one input: checked when the class is created)."""

    def __init__(self, first, second):
        self.first, self.second = first, second

    def execute(self):  # pragma: no cover - never built
        return self.first


def _counts(app):
    with app.begin() as tx:
        return {table.name: tx.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
                for table in (schema.runs, schema.branches, schema.steps, schema.executions)}


def _retarget(app, run, klass):
    """Make the run's steps name ``klass``, as a definition naming a class that is gone does."""
    with app.begin() as tx:
        tx.execute(schema.steps.update().where(schema.steps.c.run_id == run.id).values(klass=klass))


def _work_once(app):
    """One worker claim (whatever it performs), then the advancer until it is idle."""
    performed = Worker(app).run_once()
    advancer = Advancer(app)
    while advancer.run_once() != "idle":
        pass
    return performed


# --------------------------------------------------------------------------- at trigger


def test_trigger_with_arguments_the_first_step_cannot_take_writes_nothing(app):
    with pytest.raises(InputError) as info:
        SinceP.trigger(1, 2, 3)
    assert str(info.value) == ("SinceP.trigger: Since(since) cannot take the arguments (1, 2, 3): "
                               "too many positional arguments")
    with pytest.raises(InputError, match="missing a required argument: 'since'"):
        SinceP.trigger()
    assert set(_counts(app).values()) == {0}


def test_main_classes_are_refused_while_other_processes_run_job_workers(app):
    script_step = type("ScriptStep", (Since,), {})
    script_step.__module__ = "__main__"  # as if defined in a script run with `python script.py`

    class ScriptP(Pipeline):
        @classmethod
        def define(cls, pipeline):
            pipeline.start(script_step)

    elsewhere = register(app, role="job_worker", label="elsewhere", pid=os.getpid() + 100_000)
    with pytest.raises(MainModuleError) as info:
        ScriptP.trigger(1)
    assert str(info.value).startswith(
        "ScriptP.trigger: __main__:ScriptStep is defined in __main__ (the script this process runs), "
        "which the 1 job worker process(es) on this database cannot import: move the classes")
    assert _counts(app) == {"ductwork_runs": 0, "ductwork_branches": 0, "ductwork_steps": 0,
                            "ductwork_executions": 0}

    with app.begin() as tx:  # that worker is gone: only this process can run the steps
        tx.execute(schema.processes.delete().where(schema.processes.c.id == elsewhere))
    run = ScriptP.trigger(1)
    drain(app, timeout=30)
    assert run.refresh().status == "completed"
    assert run.steps()[-1].output == 1


# --------------------------------------------------------------------------- at run time


def test_a_class_that_does_not_resolve_halts_after_one_execution(app):
    run = SinceP.trigger(1)
    _retarget(app, run, f"{__name__}:Gone")
    assert _work_once(app).outcome == "invalid"
    assert _work_once(app) is None  # nothing re-queued: no retry, no re-run
    assert run.refresh().status == "halted"
    assert run.halt_reasons == ["unknown_step_class"]
    [row] = executions_of(app, run.id)
    assert (row.status, row.outcome, row.error_klass) == ("failed", "invalid", "ductwork.errors.UnknownStepClassError")
    assert row.error_message == (f"step class '{__name__}:Gone' is not in the configured pipelines "
                                 "(only their classes run; nothing was imported)")


def test_a_module_no_configured_pipeline_comes_from_is_never_imported(app, tmp_path, monkeypatch):
    """(Before only configured code ran, such a module was imported and its error halted
    the branch: now it is not even imported.)"""
    (tmp_path / "dw_mistakes_raises.py").write_text("raise RuntimeError('this module is broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = SinceP.trigger(1)
    _retarget(app, run, "dw_mistakes_raises:Since")
    assert _work_once(app).outcome == "invalid"
    assert _work_once(app) is None
    assert run.refresh().halt_reasons == ["unknown_step_class"]
    assert "dw_mistakes_raises" not in __import__("sys").modules
    [row] = executions_of(app, run.id)
    assert (row.outcome, row.error_klass) == ("invalid", "ductwork.errors.UnknownStepClassError")


def test_a_main_class_that_does_not_resolve_says_how_to_fix_it(app):
    run = SinceP.trigger(1)
    _retarget(app, run, "__main__:NotHere")  # what a worker of another process finds
    assert _work_once(app).outcome == "invalid"
    [row] = executions_of(app, run.id)
    assert row.error_message.endswith("; it is defined in __main__ (a script), which only the process "
                                      "running that script can resolve: move it into an importable module")


def test_stored_input_that_does_not_bind_halts_after_one_execution(app):
    run = SinceP.trigger(1)
    _retarget(app, run, f"{__name__}:NeedsTwo")  # the class changed by a deploy: NeedsTwo(1) never binds
    assert _work_once(app).outcome == "invalid"
    assert _work_once(app) is None
    assert run.refresh().status == "halted"
    assert run.halt_reasons == ["job_invalid"]
    [row] = executions_of(app, run.id)
    assert (row.node, row.outcome, row.status, row.error_klass) == ("Since#0", "invalid", "failed",
                                                                      "builtins.TypeError")
    assert row.error_message == ("NeedsTwo(first, second) cannot take the arguments (1,): "
                                 "missing a required argument: 'second'")


def test_a_child_process_that_cannot_import_the_class_halts_after_one_execution(app, tmp_path, monkeypatch):
    module = tmp_path / "dw_mistakes_child.py"
    module.write_text("from ductwork import Pipeline, Step\n"
                      "class Brittle(Step):\n"
                      "    def __init__(self, n):\n"
                      "        self.n = n\n"
                      "    def execute(self):\n"
                      "        return self.n\n"
                      "class ChildP(Pipeline):\n"
                      "    @classmethod\n"
                      "    def define(cls, pipeline):\n"
                      "        pipeline.start(Brittle, timeout=60)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "dw_mistakes_child", raising=False)
    from dw_mistakes_child import ChildP

    run = ChildP.trigger(1)
    module.write_text("raise RuntimeError('broken since the deploy')\n")  # the child imports this
    assert _work_once(app).outcome == "invalid"
    assert _work_once(app) is None
    assert run.refresh().halt_reasons == ["job_invalid"]
    [row] = executions_of(app, run.id)
    assert (row.outcome, row.error_klass, row.error_message) == (
        "invalid", "builtins.RuntimeError", "broken since the deploy")

