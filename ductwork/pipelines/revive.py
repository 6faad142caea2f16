"""Reviving a halted run: a new run that carries the old one's history and resumes each
halted branch where it stopped, in one transaction, exactly once.

    >>> new = run.revive()            # run.status == "halted"
    >>> new.status, new.id != run.id
    ('in_progress', True)

What the transaction writes (the model's ``PipelinesModel.revive``; docs/semantics.md,
"Reviving a halted run"):

* a new run on the same definition snapshot, ``in_progress``, triggered now, with
  ``revived_from`` = the halted run; ``halted_at`` and ``completed_at`` are not copied;
* every branch, with its links (parent, barrier, index, fan-out width and cursor, fan-in
  arrivals and arrival time, merged barrier) mapped to the new ids; a halted branch is
  ``in_progress`` again, without its halt reason; the others keep their status and times;
* every step (input, output, expand items) as history: same status and
  times, **no executions** (those stay with the halted run), so no succeeded step runs
  or advances again [INV-REV-2];
* where each halted branch stopped [INV-REV-3]: a ``failed`` step (retries or crashes
  exhausted, invalid input, unknown class, a rejected return value) becomes a fresh step
  on the same node with the same input and a fresh budget, whose executions get the
  failed step's idempotency key; a step that an advancement halt stopped at
  (``transition_invalid``, ``advancer_*``, a fan-in too large) is carried over
  ``advancing`` with its output, so an advancer runs the transition again;
* context rows only with ``duplicate_context``.

Exactly once [INV-REV-1]: the halted run's row is locked first, so concurrent revivers
queue; the one that finds a run already revived from it returns that run and writes
nothing. The unique index ``uq_run_revived_from`` is the guarantee behind the lock: a
second run naming the same halted run cannot be inserted, and the error boundary maps
the violation to :class:`~ductwork.errors.RevivedConcurrently`, which ``Run.revive``
answers with the existing run.

Not done: reviving a run that is not halted (:class:`~ductwork.errors.ReviveError`),
bounding the transaction (it is proportional to the run's branches and steps; expand
items are copied server-side), or changing the halted run (it stays halted, final).
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork import faults
from ductwork.db import dialects, schema
from ductwork.db.ids import new_id
from ductwork.errors import RevivedConcurrently, ReviveError
from ductwork.limits.executions import Pending, enqueue
from ductwork.pipelines.snapshot import Definition

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx

log = logging.getLogger("ductwork.revive")

_r, _b, _s, _x, _c = schema.runs, schema.branches, schema.steps, schema.expand_items, schema.context


def existing_revival(tx: Tx, run_id: str) -> str | None:
    """The id of the run revived from ``run_id``, if any (at most one: ``uq_run_revived_from``)."""
    found: str | None = tx.execute(sa.select(_r.c.id).where(_r.c.revived_from == run_id)).scalar()
    return found


def revive_run(app: Database, run_id: str, duplicate_context: bool = False) -> str:
    """Revive the halted run ``run_id`` in one transaction; returns the new run's id, or
    the id of the run that already revived it [INV-REV-1]. ReviveError when the run is
    not halted or does not exist; nothing is written then."""
    try:
        with dialects.translate_db_errors(
            {"uq_run_revived_from": lambda _: RevivedConcurrently(run_id)}  # [INV-REV-1]
        ), app.begin() as tx:
            revived, resumed = _revive(app, tx, run_id, duplicate_context)
        if resumed is not None:  # committed: now it may be told
            log.info("run %s revived as run %s: %d halted branch(es) resumed, context %s",
                     run_id, revived, resumed, "copied" if duplicate_context else "not copied",
                     extra={"run_id": revived, "revived_from": run_id})
        return revived
    except RevivedConcurrently:  # pragma: no cover  revivers queue on the run lock and read existing_revival under it
        with app.begin(readonly=True) as tx:
            found = existing_revival(tx, run_id)
        if found is None:  # the winner's row is committed: the index refused ours because of it
            raise
        return found


def _revive(app: Database, tx: Tx, run_id: str, duplicate_context: bool) -> tuple[str, int | None]:
    """The revive in ``tx``: the new run's id and how many halted branches it resumed
    (None: the run was revived already, nothing written)."""
    run = tx.execute(dialects.for_update_run(
        sa.select(_r.c.status, _r.c.pipeline_klass, _r.c.definition, _r.c.definition_sha1)
        .where(_r.c.id == run_id), tx.conn)).first()  # revivers of one run queue here
    if run is None:
        raise ReviveError(run_id, None)
    existing = existing_revival(tx, run_id)
    if existing is not None:  # [INV-REV-1] revived already: that run, nothing written
        return existing, None
    if run.status != "halted":
        raise ReviveError(run_id, run.status)
    definition = app._definitions.get(run.definition_sha1) or Definition.from_json(json.loads(run.definition))
    now, new_run = tx.now, new_id()
    tx.execute(_r.insert().values(
        id=new_run, pipeline_klass=run.pipeline_klass, definition=run.definition,
        definition_sha1=run.definition_sha1, status="in_progress", triggered_at=now, completed_at=None,
        halted_at=None,  # not copied: the new run has not halted
        revived_from=run_id,  # [INV-REV-1] uq_run_revived_from: one new run per halted run
        created_at=now, updated_at=now))
    branches = tx.execute(sa.select(_b).where(_b.c.run_id == run_id)
                          .order_by(_b.c.started_at, _b.c.id)).mappings().all()
    branch_ids = {b["id"]: new_id() for b in branches}
    halted = {b["id"] for b in branches if b["status"] == "halted"}
    _insert_branches(tx, new_run, branches, branch_ids, halted)
    _copy_steps(tx, definition, run_id, new_run, branch_ids, halted)
    keys = tx.execute(sa.select(_c.c.key).where(_c.c.run_id == run_id)
                      .order_by(_c.c.key)).scalars().all() if duplicate_context else []
    if keys:  # a new id per copied context row: a CASE over the row's key (context keys are few)
        tx.execute(_c.insert().from_select(
            ["id", "run_id", "key", "value", "first_set_at", "last_set_at"],
            sa.select(sa.case({key: new_id() for key in keys}, value=_c.c.key), sa.literal(new_run, _c.c.run_id.type),
                      _c.c.key, _c.c.value, _c.c.first_set_at, _c.c.last_set_at).where(_c.c.run_id == run_id)))
    faults.hit(faults.INSIDE_REVIVE)
    tx.wake(advancers=True)  # the re-run steps' executions, and the steps carried over advancing
    return new_run, len(halted)


def _copy_steps(tx: Tx, definition: Definition, run_id: str, new_run: str, branch_ids: dict[str, str],
                halted: set[str]) -> None:
    """Copy every step of ``run_id`` (and its expand items) into ``new_run``, in start
    order, through :func:`_carry_step`; the latest step of each halted branch is where
    that branch resumes. Only the re-enqueued steps get an execution."""
    steps = tx.execute(sa.select(_s).where(_s.c.run_id == run_id)
                       .order_by(_s.c.started_at, _s.c.id)).mappings().all()
    latest = {step["branch_id"]: step for step in steps}  # in start order: the last one of a branch is its latest
    stopped = {latest[b]["id"] for b in halted if b in latest}
    # new ids in the old order: "latest step" stays the latest
    carried = [_carry_step(step, definition, new_run, branch_ids[step["branch_id"]], step["id"] in stopped, tx.now)
               for step in steps]
    tx.execute(_s.insert(), [row for row, _ in carried])  # (a halted run has steps: its branches halted at one)
    for step, (row, _) in zip(steps, carried, strict=True):
        if step["output_payload"] and '"expand_items"' in step["output_payload"]:
            tx.execute(_x.insert().from_select(
                ["step_id", "item_index", "value"],
                sa.select(sa.literal(row["id"], _x.c.step_id.type), _x.c.item_index, _x.c.value)
                .where(_x.c.step_id == step["id"])))
    enqueue(tx, [rerun for _, rerun in carried if rerun is not None])  # the re-runs, with their keys' rows


def _carry_step(step: Any, definition: Definition, new_run: str, branch_id: str, resume: bool,
                now: Any) -> tuple[dict[str, Any], Pending | None]:
    """One step of a halted run into its revived run (the model's
    ``PipelinesModel._carry_step``), under a new id: history, or where a halted branch
    resumes (``resume``). Returns the step row and the execution to enqueue for a
    re-enqueued step (None for every other step: history is never executed again)."""
    sid = new_id()
    row = {**{c.name: step[c.name] for c in _s.c}, "id": sid, "run_id": new_run, "branch_id": branch_id,
           # [INV-REV-3] every copy keeps the old step's key (schema.step_idempotency_key)
           "idempotency_key": step["idempotency_key"] or step["id"]}
    rerun: Pending | None = None
    if resume and step["status"] == "failed":  # re-enqueued, with a fresh budget:
        row.update(status="in_progress", output_payload=None, started_at=now, completed_at=None,
                   created_at=now)  # [INV-REV-3] input_args kept
        delay_us = definition.nodes[step["node"]].delay_us
        rerun = Pending(sid, step["limit_key"], now + timedelta(microseconds=delay_us) if delay_us else now)
    elif resume:  # an advancement halt stopped here: the transition runs again [INV-REV-3]
        row.update(status="advancing", completed_at=None, updated_at=now)
    else:  # [INV-REV-2] history: no execution, its status stays, never advanced again
        row.update(updated_at=now)
    return row, rerun


def _insert_branches(tx: Tx, run_id: str, branches: Any, ids: dict[str, str], halted: set[str]) -> None:
    """Insert the copies, parents and barriers first (their foreign keys are checked per row)."""
    now = tx.now
    resumed = {"status": "in_progress", "halt_reason": None, "completed_at": None, "last_advanced_at": now}
    rows = [{**b, "id": ids[b["id"]], "run_id": run_id, "claim_token": None, "claimed_at": None,
             "updated_at": now, "created_at": now,
             "parent_id": ids.get(b["parent_id"]), "barrier_id": ids.get(b["barrier_id"]),
             "merged_barrier_id": ids.get(b["merged_barrier_id"]),
             **(resumed if b["id"] in halted else {})}  # [INV-REV-3] resumes: in progress again, no halt reason
            for b in branches]
    inserted: set[str | None] = {None}
    while rows:
        ready = [r for r in rows if r["parent_id"] in inserted and r["barrier_id"] in inserted]
        if not ready:  # pragma: no cover  links point to branches created before: they form no cycle
            raise AssertionError(f"run {run_id}: branch links form a cycle")
        tx.execute(_b.insert(), ready)
        inserted.update(r["id"] for r in ready)
        rows = [r for r in rows if r["id"] not in inserted]
