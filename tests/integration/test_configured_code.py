"""Only configured code runs: a class name read from the database is resolved among the
classes of the pipelines the process runs (its configuration's, and those its own code
defined), never by importing the module the row names.

A run's rows name a module planted on the worker's path that writes a marker file when
imported: the worker never imports it (no marker), and the run halts
``unknown_step_class`` with an UnknownStepClassError naming the class path.
"""

from __future__ import annotations

import os
import sys
import uuid

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.testing import drain
from ductwork_proof.fleet import Fleet, wait_for, write_config
from tests.workloads import Unkeyed


def _plant(tmp_path):
    """A module that leaves a marker when imported; returns (module name, marker path)."""
    name = f"dw_planted_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / f"{name}.imported"
    (tmp_path / f"{name}.py").write_text(
        "import pathlib\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "from ductwork import Pipeline, Step\n"
        "class Payload(Step):\n"
        "    def __init__(self, *args):\n"
        "        self.args = args\n"
        "    def execute(self):\n"
        "        return 'ran'\n"
        "class Evil(Pipeline):\n"
        "    @classmethod\n"
        "    def define(cls, p):\n"
        "        p.start(Payload)\n"
    )
    return name, marker


def _errors(app, run_id):
    e, s = schema.executions, schema.steps
    with app.begin(readonly=True) as tx:
        return tx.execute(
            sa.select(e.c.outcome, e.c.error_klass, e.c.error_message)
            .join(s, s.c.id == e.c.step_id)
            .where(s.c.run_id == run_id, e.c.completed_at.is_not(None))
        ).all()


def test_a_worker_never_imports_a_step_class_a_row_names(app, db_url, tmp_path):
    module, marker = _plant(tmp_path)
    run = Unkeyed.trigger(1)
    planted = f"{module}:Payload"
    with app.begin() as tx:  # anyone who can write these rows
        tx.execute(schema.steps.update().where(schema.steps.c.run_id == run.id).values(klass=planted))
    config = write_config(tmp_path / "ductwork.yml", pipelines=["tests.workloads:Unkeyed"])
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    with Fleet(db_url, config, env={"PYTHONPATH": path}) as fleet:
        wait_for(lambda: run.refresh().status in ("completed", "halted"), f"the run ended; log: {fleet.log()[-2000:]}",
                 60)
    assert run.status == "halted"
    assert not marker.exists(), "the worker imported the module a row named"
    assert run.halt_reasons == ["unknown_step_class"]
    ((outcome, klass, message),) = _errors(app, run.id)  # failed at once: no retry, no re-run
    assert (outcome, klass) == ("invalid", "ductwork.errors.UnknownStepClassError")
    assert f"step class {planted!r} is not in the configured pipelines" in message


def test_a_run_naming_an_unknown_pipeline_halts_before_any_import(app, tmp_path, monkeypatch):
    """The run's pipeline name is checked too (a step with ``timeout=`` is built in a
    child process that imports the run's pipeline by that name)."""
    module, marker = _plant(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = Unkeyed.trigger(1)
    with app.begin() as tx:
        tx.execute(schema.runs.update().where(schema.runs.c.id == run.id).values(pipeline_klass=f"{module}:Evil"))
    drain(app, timeout=30)
    assert module not in sys.modules
    assert not marker.exists()
    assert run.refresh().status == "halted"
    assert run.halt_reasons == ["unknown_step_class"]
    ((_, klass, message),) = _errors(app, run.id)
    assert klass == "ductwork.errors.UnknownStepClassError"
    assert f"pipeline class '{module}:Evil' is not in the configured pipelines" in message
