"""Creating steps: a step row (which holds its job: input, then output) and its first execution, together.

    >>> create_steps(tx, run_id, definition, [NewStep(branch_id, "Charge#1", "chain", "[42]")])

A step is created with its input and its first (pending) execution in the caller's
transaction, so a step never exists without something to run it, and a rolled
back advancement leaves no step behind [INV-ADV-1]. Options come from the run's
definition snapshot: ``limit_by`` sets the execution's lane (a static key, or a partition
rendered from the step's input: :func:`limit_key`), ``delay`` its
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
from ductwork.errors import PartitionValueError
from ductwork.limit_entries import partition_key
from ductwork.limits.executions import Pending, enqueue
from ductwork.pipelines import payloads

if TYPE_CHECKING:
    from ductwork.db.database import Tx
    from ductwork.pipelines.snapshot import Definition

_MISSING = object()

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
        step_id, key = new_id(), limit_key(definition, spec.node, spec.input_json)
        step_rows.append({
            "id": step_id, "run_id": run_id, "branch_id": spec.branch_id, "node": spec.node,
            "klass": node.klass, "to_transition": spec.to_transition, "status": "in_progress",
            "limit_key": key, "timeout_us": node.timeout_us, "input_args": spec.input_json,
            "output_payload": None, "started_at": now, "completed_at": None, "created_at": now, "updated_at": now,
        })
        eligible = now + timedelta(microseconds=node.delay_us) if node.delay_us else now
        pending.append(Pending(step_id, key, eligible))
    if sum(len(row["input_args"]) for row in step_rows) <= payloads.MAX_PAYLOAD_BYTES:
        dialects.insert_rows(tx.conn, schema.steps, step_rows)  # [INV-ADV-1] uq_step_branch_node
    else:  # large inputs: a statement per row (on PostgreSQL an array holds a column's every value)
        tx.execute(schema.steps.insert(), step_rows)  # [INV-ADV-1] uq_step_branch_node
    enqueue(tx, pending)  # the first executions, in their lanes (and their keys' rows)
    return [row["id"] for row in step_rows]


def limit_key(definition: Definition, node: str, input_json: str) -> str | None:
    """The key of a new step of ``node`` whose input (the JSON list of its arguments) is
    ``input_json``: the node's static ``limit_by``, or its partition rendered from the input
    (docs/semantics.md §5.1): argument ``arg``, then each dotted name in a JSON object.
    Raises :class:`PartitionValueError` when the field is missing or its value cannot be
    rendered (``limit_entries.partition_key``). Rendered once, here: its executions keep it."""
    by = definition.nodes[node].partition
    if by is None:
        return definition.nodes[node].limit_by
    args = json.loads(input_json)
    value: object = args[by.arg] if by.arg < len(args) else _MISSING
    for name in by.field.split(".")[1:]:
        value = value.get(name, _MISSING) if isinstance(value, dict) else _MISSING
    if value is _MISSING:
        raise PartitionValueError(definition.pipeline, node, by.family, by.field, args, "no such field in the input")
    try:
        return partition_key(by.family, value)
    except ValueError as error:
        raise PartitionValueError(definition.pipeline, node, by.family, by.field, value, str(error)) from None


def renders(definition: Definition, node: str | None, value_json: str) -> bool:
    """Whether a step of ``node`` (None: no step) with ``value_json`` as its input has a
    key :func:`limit_key` renders; a worker's inline move leaves the others to an advancer,
    which halts the branch with the error (its success is recorded either way)."""
    try:
        if node is not None:
            limit_key(definition, node, "[" + value_json + "]")
    except PartitionValueError:
        return False
    return True


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


def step_complete(tx: Tx, step_id: str) -> None:
    """Mark an advancing step advanced past. The status guard makes a stale writer match nothing."""
    result = tx.execute(
        schema.steps.update()
        .where(schema.steps.c.id == step_id, schema.steps.c.status == "advancing")
        .values(status="completed", completed_at=tx.now, updated_at=tx.now)
    )
    if result.rowcount != 1:  # pragma: no cover  the caller holds the branch's fence [INV-ADV-1]
        raise AssertionError(f"step {step_id}: expected status advancing inside the fence [INV-ADV-1]")
