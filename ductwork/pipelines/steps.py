"""Creating steps: a step row (which holds its job: input, then output) and its first execution, together.

    >>> create_steps(tx, run_id, definition, [NewStep(branch_id, "Charge#1", "chain", "[42]")])

A step is created with its input and its first (pending) execution in the caller's
transaction, so a step never exists without something to run it, and a rolled
back advancement leaves no step behind [INV-ADV-1]. Options come from the run's
definition snapshot: ``limit_by`` sets the execution's lane, ``delay`` its
eligibility (database time plus the delay), ``timeout`` is kept on the step.

Not done here: deciding which steps to create (advance.py) or running them (fleet/worker.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork.db import dialects, schema
from ductwork.db.ids import new_id
from ductwork.limits.executions import Pending, enqueue
from ductwork.pipelines import payloads

if TYPE_CHECKING:
    from ductwork.db.database import Tx
    from ductwork.pipelines.snapshot import Definition

ADVANCEABLE = ("advancing", "failed")
"""Step statuses meaning "the job is done, the branch can move" (claim and fence share it)."""


@dataclass(frozen=True)
class NewStep:
    branch_id: str
    node: str
    to_transition: str
    #: the JSON text of the positional-argument list
    input_json: str


@dataclass(frozen=True)
class StepRow:
    id: str
    run_id: str
    branch_id: str
    node: str
    klass: str
    status: str


def create_branches(tx: Tx, run_id: str, branches: list[dict[str, Any]]) -> None:
    """Insert new branches of ``run_id``: in progress, no arrivals yet, started now; each
    dict gives the branch's ``id`` and its place (``parent_id``, ``barrier_id``,
    ``barrier_index``, ``merged_barrier_id``). All dicts must have the same keys (one
    statement). The unique constraints on those columns refuse a second child at an index
    or a second merge of a barrier [INV-ADV-3, INV-ADV-4]; not done here: the steps on
    them (:func:`create_steps`)."""
    now = tx.now
    tx.execute(schema.branches.insert(), [
        {"run_id": run_id, "status": "in_progress", "fanin_arrivals": 0, "last_advanced_at": now,
         "started_at": now, "created_at": now, "updated_at": now, **branch}
        for branch in branches
    ])


def create_steps(tx: Tx, run_id: str, definition: Definition, new: list[NewStep]) -> list[str]:
    """Insert each step of one run with its first execution; returns the step ids in order."""
    return create_steps_across(tx, [(run_id, definition, spec) for spec in new])


def create_steps_across(tx: Tx, new: list[tuple[str, Definition, NewStep]]) -> list[str]:
    """Insert each ``(run id, its definition, step)`` with its first execution, in two
    statements whatever the runs (a batch's successors); returns the step ids in order."""
    if not new:
        return []
    now = tx.now
    step_rows: list[dict[str, Any]] = []
    pending: list[Pending] = []
    for run_id, definition, spec in new:
        node = definition.nodes[spec.node]
        step_id = new_id()
        step_rows.append({
            "id": step_id, "run_id": run_id, "branch_id": spec.branch_id, "node": spec.node,
            "klass": node.klass, "to_transition": spec.to_transition, "status": "in_progress",
            "limit_key": node.limit_by, "timeout_us": node.timeout_us, "input_args": spec.input_json,
            "output_payload": None, "started_at": now, "completed_at": None, "created_at": now, "updated_at": now,
        })
        eligible = now + timedelta(microseconds=node.delay_us) if node.delay_us else now
        pending.append(Pending(step_id, node.limit_by, eligible))
    if sum(len(row["input_args"]) for row in step_rows) <= payloads.MAX_PAYLOAD_BYTES:
        dialects.insert_rows(tx.conn, schema.steps, step_rows)  # [INV-ADV-1] uq_step_branch_node
    else:  # large inputs: a statement per row (on PostgreSQL an array holds a column's every value)
        tx.execute(schema.steps.insert(), step_rows)  # [INV-ADV-1] uq_step_branch_node
    enqueue(tx, pending)  # the first executions, in their lanes (and their keys' rows)
    return [row["id"] for row in step_rows]


def latest_step(tx: Tx, branch_id: str) -> StepRow | None:
    """The branch's most recent step (ties on start time broken by the time-ordered id)."""
    s = schema.steps
    row = tx.execute(
        sa.select(s.c.id, s.c.run_id, s.c.branch_id, s.c.node, s.c.klass, s.c.status)
        .where(s.c.branch_id == branch_id)
        .order_by(s.c.started_at.desc(), s.c.id.desc())
        .limit(1)
    ).first()
    return None if row is None else schema.from_row(StepRow, row)


def step_output_json(tx: Tx, step_id: str) -> str:
    """The JSON text of a succeeded step's return value."""
    text = tx.execute(
        sa.select(schema.steps.c.output_payload).where(schema.steps.c.id == step_id)
    ).scalar_one()
    if text is None:  # pragma: no cover  a step's output is written with its success [INV-ADV-1]
        raise AssertionError(f"step {step_id} has no output but is being advanced [INV-ADV-1]")
    return payload_json(text)


def payload_json(output_payload: str) -> str:
    """The value's JSON text inside a step's ``{"payload": …}`` output envelope."""
    return json.dumps(json.loads(output_payload)["payload"])


def step_complete(tx: Tx, step_id: str, *, from_status: tuple[str, ...] = ("advancing",)) -> None:
    """Mark the step advanced past. The status guard makes a stale writer match nothing."""
    result = tx.execute(
        schema.steps.update()
        .where(schema.steps.c.id == step_id, schema.steps.c.status.in_(from_status))
        .values(status="completed", completed_at=tx.now, updated_at=tx.now)
    )
    if result.rowcount != 1:  # pragma: no cover  the caller holds the branch's fence [INV-ADV-1]
        raise AssertionError(f"step {step_id}: expected status in {from_status} inside the fence [INV-ADV-1]")
