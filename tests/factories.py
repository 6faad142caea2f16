"""Row factories: put ductwork rows in place with only the fields a test is about.

    run_id, branch_id = make_run(app)
    (execution_id,) = make_executions(app, run_id, branch_id, key="a", eligible_at=app.clock.now())
    rows = executions_of(app, run_id)       # what the run's executions did, oldest first
    rows = run_rows(app, run_id)            # every row of the run, table by table

``make_run``, ``make_executions`` and ``open_execution_of`` are the conformance machines'
(``ductwork_proof/conformance/factories.py``, shipped with ``ductwork verify``), re-exported
here for the tests that drive the claim path directly; the readers below are the tests' own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

from ductwork.db import schema
from ductwork_proof.conformance.factories import (
    NODE,
    PIPELINE_CLASS,
    STEP_CLASS,
    make_executions,
    make_run,
    open_execution_of,
)

if TYPE_CHECKING:
    from ductwork.app import App

__all__ = ["NODE", "PIPELINE_CLASS", "STEP_CLASS", "executions_of", "make_executions", "make_run",
           "open_execution_of", "run_rows"]


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


def of_another_process(app):  # type: ignore[no-untyped-def]
    """An App on ``app``'s database and config, as another process has one: a thread of one
    App passes a lane a sibling is trying to fill (``claims._try_marked``) where a thread of
    another process waits on the key's lock, so claimers meant to race are each of their
    own. The caller disposes of it."""
    from ductwork.app import App

    return App(app.url, app.config)
