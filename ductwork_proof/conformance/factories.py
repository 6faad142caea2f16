"""Rows and configuration the conformance machines put in place: a run to hang executions
on, executions in a lane, the engine's configuration, and emptied tables between examples.

    reset_tables(engine)                    # every ductwork row deleted (children first)
    run_id, branch_id = make_run(app)
    (execution_id,) = make_executions(app, run_id, branch_id, key="a", eligible_at=app.clock.now())
    follow = open_execution_of(app, step_id)   # the step's open execution (a retry, a re-run)

For machines that drive the claim path directly (the limits conformance machine, and the
tests and benchmarks that do the same; ``tests/factories.py`` re-exports these): a job in
the claim queue needs its step, branch and run rows; the step's definition is never
routed, so a minimal snapshot is enough. Shipped with ``ductwork verify``, which runs the
machines against an adopter's database: nothing here imports the test suite.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.ids import new_id
from ductwork.limits.executions import Pending, enqueue

if TYPE_CHECKING:
    from ductwork.app import App

#: names stored in the rows only: no worker ever resolves them (nothing routes the step)
STEP_CLASS = "ductwork_proof.conformance.factories:Noop"
NODE = "Noop#0"
PIPELINE_CLASS = "ductwork_proof.conformance.factories:NoopPipeline"

#: the engine's configuration in the machines (and the test suite's, ``tests/conftest.py``'s
#: ``TEST_CONFIG``): short retry delays, small budgets, a quick reaper
CONFIG: dict[str, dict[str, Any]] = {
    "job_worker": {"retry_delay": 0.01, "max_retry": 2, "max_crash": 4, "crash_backoff": 10},
    "pipeline_advancer": {"max_retry": 2, "max_crash": 3, "expand_batch": 4},
    "supervisor": {"reaper_timeout": 5, "heartbeat_interval": 0.5, "polling_timeout": 0.2},
}


def reset_tables(engine: sa.Engine) -> None:
    """Delete every ductwork row (children first)."""
    tables = list(reversed(schema.metadata.sorted_tables))
    with engine.begin() as conn:
        if conn.dialect.name in ("mysql", "mariadb"):
            conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS=0")
        for table in tables:
            conn.execute(table.delete())
        if conn.dialect.name in ("mysql", "mariadb"):
            conn.exec_driver_sql("SET FOREIGN_KEY_CHECKS=1")


def make_run(app: App) -> tuple[str, str]:
    """A run with one branch (no steps); returns (run_id, branch_id)."""
    definition = json.dumps({"format": 1, "pipeline": PIPELINE_CLASS, "start": NODE,
                             "nodes": {NODE: {"klass": STEP_CLASS, "delay_us": None, "timeout_us": None,
                                              "limit_by": None}},
                             # an expand: no simple move, so a success leaves its step advancing
                             "edges": {NODE: {"type": "expand", "to": [NODE]}}}, sort_keys=True)
    run_id, branch_id = new_id(), new_id()
    with app.begin() as tx:
        tx.execute(schema.runs.insert().values(
            id=run_id, pipeline_klass=PIPELINE_CLASS, definition=definition,
            definition_sha1=hashlib.sha1(definition.encode()).hexdigest(), status="in_progress",
            triggered_at=tx.now, created_at=tx.now, updated_at=tx.now))
        tx.execute(schema.branches.insert().values(
            id=branch_id, run_id=run_id, status="in_progress", last_advanced_at=tx.now, started_at=tx.now,
            fanin_arrivals=0, created_at=tx.now, updated_at=tx.now))
    return run_id, branch_id


def make_executions(app: App, run_id: str, branch_id: str, key: str | None, eligible_at: datetime,
                    count: int = 1) -> list[str]:
    """``count`` pending executions in lane ``key``, each with its own step, in order.

    Each step is the first of a branch of its own (a child of ``branch_id``, which has no
    step), node ``Noop#0``, whose edge is an expand: a success leaves it ``advancing`` for an
    advancer that never runs (no simple move), as the claim path's tests want."""
    branches, steps, pending = [], [], []
    with app.begin() as tx:
        for _ in range(count):
            step_id, own = new_id(), new_id()
            branches.append({"id": own, "run_id": run_id, "parent_id": branch_id, "status": "in_progress",
                             "last_advanced_at": tx.now, "started_at": tx.now, "fanin_arrivals": 0,
                             "created_at": tx.now, "updated_at": tx.now})
            steps.append({"id": step_id, "run_id": run_id, "branch_id": own, "node": NODE,
                          "klass": STEP_CLASS, "to_transition": "start", "status": "in_progress",
                          "limit_key": key, "timeout_us": None, "input_args": "[null]", "output_payload": None,
                          "started_at": tx.now, "completed_at": None, "created_at": tx.now, "updated_at": tx.now})
            pending.append(Pending(step_id, key, eligible_at))
        tx.execute(schema.branches.insert(), branches)
        tx.execute(schema.steps.insert(), steps)
        return enqueue(tx, pending)


def open_execution_of(app: App, step_id: str) -> sa.Row[Any] | None:
    """The step's open (pending or in-flight) execution, if any."""
    e = schema.executions
    with app.begin() as tx:
        return tx.execute(sa.select(e.c.id, e.c.eligible_at, e.c.retry_count, e.c.crash_count)
                          .where(e.c.step_id == step_id, e.c.completed_at.is_(None))).first()
