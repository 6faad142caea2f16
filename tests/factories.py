"""Row factories: put ductwork rows in place with only the fields a test is about.

    run_id, branch_id = make_run(app)
    (execution_id,) = make_executions(app, run_id, branch_id, key="a", eligible_at=app.clock.now())
    rows = executions_of(app, run_id)       # what the run's executions did, oldest first
    rows = run_rows(app, run_id)            # every row of the run, table by table

For tests that drive the claim path directly (the limits conformance machine,
benchmarks): a job in the claim queue needs its step, job and run rows; the
step's definition is never routed, so a minimal snapshot is enough.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.ids import new_id
from ductwork.limits.executions import Pending, enqueue

if TYPE_CHECKING:
    from ductwork.app import App

STEP_CLASS = "tests.factories:Noop"
NODE = "Noop#0"
PIPELINE_CLASS = "tests.factories:NoopPipeline"


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


def open_execution_of(app: App, step_id: str) -> sa.Row | None:
    """The step's open (pending or in-flight) execution, if any."""
    e = schema.executions
    with app.begin() as tx:
        return tx.execute(sa.select(e.c.id, e.c.eligible_at, e.c.retry_count, e.c.crash_count)
                          .where(e.c.step_id == step_id, e.c.completed_at.is_(None))).first()


def executions_of(app: App, run_id: str) -> list[sa.Row]:
    """Every execution of the run's steps, oldest first, with its step's node and status:
    rows of ``node, status, outcome, retry_count, crash_count, completed_at, error_klass,
    error_message``."""
    e, s = schema.executions, schema.steps
    with app.begin(readonly=True) as tx:
        return tx.execute(
            sa.select(s.c.node, s.c.status, e.c.outcome, e.c.retry_count, e.c.crash_count, e.c.completed_at,
                      e.c.error_klass, e.c.error_message)
            .join(s, s.c.id == e.c.step_id)
            .where(s.c.run_id == run_id).order_by(e.c.created_at, e.c.id)
        ).all()


def run_rows(app: App, run_id: str) -> dict[str, list[tuple]]:
    """Every row of the run, table by table, in a stable order: what a commit could touch,
    what a refused operation or another run's prune must leave as it was."""
    r, b, s, e = schema.runs, schema.branches, schema.steps, schema.executions
    a, x, h, c = schema.advancements, schema.expand_items, schema.halt_hooks, schema.context
    steps = sa.select(s.c.id).where(s.c.run_id == run_id)
    queries = {
        "run": sa.select(r).where(r.c.id == run_id),
        "branches": sa.select(b).where(b.c.run_id == run_id).order_by(b.c.id),
        "steps": sa.select(s).where(s.c.run_id == run_id).order_by(s.c.id),
        "executions": sa.select(e).where(e.c.step_id.in_(steps)).order_by(e.c.id),
        "expand_items": sa.select(x).where(x.c.step_id.in_(steps)).order_by(x.c.step_id, x.c.item_index),
        "advancements": sa.select(a).where(a.c.step_id.in_(steps)).order_by(a.c.id),
        "halt_hooks": sa.select(h).where(h.c.run_id == run_id),
        "context": sa.select(c).where(c.c.run_id == run_id).order_by(c.c.key),
    }
    with app.begin() as tx:
        return {name: [tuple(row) for row in tx.execute(query)] for name, query in queries.items()}
