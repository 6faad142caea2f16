"""Retention: delete completed and halted runs, whole, in bounded batches.

    >>> result = prune(app, finished_before=timedelta(days=30))
    >>> result.runs, result.rows["ductwork_executions"]

``prune`` deletes every run that is ``completed`` or ``halted`` and finished
(``completed_at``/``halted_at``) before the database's now minus ``finished_before``
[INV-CLK-1], with every row that belongs to it (:data:`RUN_TABLES`), at most
``batch_size`` runs per transaction.

Guarantees:

- never a live run [INV-PRN-1]: each batch transaction locks its candidate run
  rows and re-reads their status and finish time under the lock, so a run that is
  ``in_progress`` or ``dampened`` at that moment, or resumed or revived since the
  candidates were chosen, is not touched; a ``completed`` or ``halted`` run never
  becomes live again (INV-RUN-1), so the decision holds until the commit.
- whole runs only [INV-PRN-2]: a batch deletes its runs' rows from every table in
  :data:`RUN_TABLES` in one transaction, so a prune killed at any point leaves each
  run either entirely there or entirely gone; running it again carries on.
- bounded: one batch holds the row locks of at most ``batch_size`` runs and their rows.

Not done: a run revived from a pruned run keeps its ``revived_from`` (the id of a run
that no longer exists); rows that belong to no run (processes, limit keys and
buckets) are not touched; the deleted space is the database's to reclaim (VACUUM,
OPTIMIZE TABLE).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa

from ductwork import faults
from ductwork.db import dialects, schema
from ductwork.errors import RunFilterError
from ductwork.limits.executions import forget
from ductwork.pipelines.history import of_pipeline
from ductwork.pipelines.rules import PRUNABLE, may_prune

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx

log = logging.getLogger("ductwork.prune")

#: runs deleted per transaction unless the caller says otherwise
DEFAULT_BATCH_SIZE = 100


@dataclass(frozen=True)
class RunTable:
    """A table with rows that belong to a run, and how a row names its run: ``run`` (a
    ``run_id`` column), ``step`` (a ``step_id`` column of a step of that run), or ``id``
    (the runs table itself)."""

    table: sa.Table
    via: Literal["run", "step", "id"]


#: Every table with rows that belong to a run, in delete order (rows that reference
#: others first). A new table that references a run is one line here; a unit test
#: fails when a table with a foreign key into these is missing [INV-PRN-2].
RUN_TABLES: tuple[RunTable, ...] = (
    RunTable(schema.expand_items, "step"),
    RunTable(schema.executions, "step"),  # ix_execution_step
    RunTable(schema.advancements, "step"),  # by step: ix_advancement_step (no index on branch_id)
    RunTable(schema.steps, "run"),
    RunTable(schema.context, "run"),
    RunTable(schema.halt_hooks, "run"),
    RunTable(schema.branches, "run"),
    RunTable(schema.runs, "id"),
)


@dataclass
class PruneResult:
    """What a prune deleted (or, for a dry run, would delete)."""

    #: the cutoff: runs that finished before this database time
    finished_before: datetime
    dry_run: bool
    #: runs deleted (or that would be)
    runs: int = 0
    #: rows per table (every table of RUN_TABLES, zeros included)
    rows: dict[str, int] = field(default_factory=lambda: {t.table.name: 0 for t in RUN_TABLES})
    #: transactions that deleted at least one run
    batches: int = 0


def _rows_of(run_table: RunTable, ids: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    """The WHERE clause that selects ``run_table``'s rows of the runs ``ids``."""
    t, s = run_table.table, schema.steps
    if run_table.via == "id":
        return t.c.id.in_(ids)
    if run_table.via == "run":
        return t.c.run_id.in_(ids)
    return t.c.step_id.in_(sa.select(s.c.id).where(s.c.run_id.in_(ids)).scalar_subquery())


def _finished(r: sa.Table) -> sa.ColumnElement[Any]:
    return sa.func.coalesce(r.c.completed_at, r.c.halted_at)


#: the run owes an on_halt hook whose outcome is not recorded yet (pending or running):
#: live work, which a prune leaves alone. A final hook never opens again.
_HOOK_OPEN = sa.exists().where(schema.halt_hooks.c.run_id == schema.runs.c.id,
                               schema.halt_hooks.c.status.in_(("pending", "running")))


def _prunable(cutoff: datetime, pipeline: str | None) -> sa.ColumnElement[bool]:
    r = schema.runs
    where = sa.and_(r.c.status.in_(PRUNABLE), _finished(r) < cutoff, ~_HOOK_OPEN)
    return where if pipeline is None else sa.and_(where, of_pipeline(pipeline))


def candidates(tx: Tx, cutoff: datetime, limit: int, pipeline: str | None = None) -> list[str]:
    """Up to ``limit`` prunable run ids (of ``pipeline`` if given) that finished before
    ``cutoff``, oldest trigger first (read without locks; :func:`prune_batch` re-checks
    each under its lock). One query per status, each a walk of ``ix_run_status_triggered``
    that stops after ``limit`` matches, so a batch does not sort every finished run."""
    r = schema.runs
    found: list[str] = []
    for status in PRUNABLE:
        if len(found) >= limit:
            break
        query = sa.select(r.c.id).where(r.c.status == status, _prunable(cutoff, pipeline))
        found += tx.execute(query.order_by(r.c.triggered_at, r.c.id).limit(limit - len(found))).scalars()
    return found


def prune_batch(tx: Tx, run_ids: list[str], cutoff: datetime) -> dict[str, int]:
    """Delete, in the caller's transaction, the runs of ``run_ids`` that are still final
    and finished before ``cutoff`` under their row locks, with all their rows; returns
    rows deleted per table (``ductwork_runs`` is the number of runs)."""
    r, b = schema.runs, schema.branches
    if not run_ids:
        return {}
    locked = tx.execute(dialects.for_update(
        sa.select(r.c.id, r.c.status, _finished(r).label("finished_at"), _HOOK_OPEN.label("hook_open"))
        .where(r.c.id.in_(dialects.inline_ids(sorted(run_ids)))).order_by(r.c.id), tx.conn)).all()
    ids = sorted(row.id for row in locked
                 if may_prune(row.status, row.finished_at, cutoff,
                              bool(row.hook_open)))  # [INV-PRN-1] re-checked under the lock
    if not ids:
        return {}
    batch = dialects.inline_ids(ids)
    # Branches reference each other (fan-out parent, barrier); InnoDB checks a foreign key row
    # by row within one DELETE, so the links inside the runs go first (all three databases alike).
    tx.execute(b.update().where(b.c.run_id.in_(batch)).values(parent_id=None, barrier_id=None))
    deleted: dict[str, int] = {}
    for run_table in RUN_TABLES:
        if run_table.table is schema.runs:
            faults.hit(faults.INSIDE_PRUNE_BATCH)  # every row of the runs deleted but the runs' own
        where = _rows_of(run_table, batch)
        deleted[run_table.table.name] = (  # [INV-PRN-2] every table
            forget(tx, where) if run_table.table is schema.executions  # (the limits layer's table)
            else tx.execute(run_table.table.delete().where(where)).rowcount)
    return deleted


def _count(tx: Tx, run_ids: list[str]) -> dict[str, int]:
    batch = dialects.inline_ids(run_ids)
    return {t.table.name: tx.execute(sa.select(sa.func.count()).select_from(t.table)
                                     .where(_rows_of(t, batch))).scalar_one() for t in RUN_TABLES}


def prune(app: Database, finished_before: timedelta, *, batch_size: int = DEFAULT_BATCH_SIZE, dry_run: bool = False,
          pipeline: str | None = None, on_start: Callable[[datetime], None] | None = None,
          on_batch: Callable[[int, dict[str, int]], None] | None = None) -> PruneResult:
    """Delete completed and halted runs that finished more than ``finished_before`` ago
    (database time), ``batch_size`` runs per transaction, until none is left.

    ``pipeline``: only runs of this pipeline (``module:QualName``, or the bare class name).
    ``on_start(cutoff)``: called once the cutoff is read, before the first batch.
    ``dry_run``: count what would go, in one read-only transaction, and delete nothing.
    ``on_batch(runs, rows)``: called after each committed batch (the CLI prints progress).
    Every committed batch is logged at INFO.
    """
    _check_arguments(batch_size, finished_before)
    if pipeline is not None:
        of_pipeline(pipeline)  # (a filter it refuses is refused before anything starts)
    with app.begin(readonly=True) as tx:
        cutoff = tx.now - finished_before  # [INV-CLK-1] the database's now, one cutoff for every batch
        result = PruneResult(cutoff, dry_run)
        if dry_run:  # what a prune would delete now, counted in this one read-only transaction
            ids = list(tx.execute(sa.select(schema.runs.c.id).where(_prunable(cutoff, pipeline))).scalars())
            result.runs = len(ids)
            for start in range(0, len(ids), batch_size):
                for name, n in _count(tx, ids[start:start + batch_size]).items():
                    result.rows[name] += n
            return result
    if on_start is not None:
        on_start(cutoff)
    while True:
        found, deleted = dialects.retry_transient(lambda: _next_batch(app, cutoff, batch_size, pipeline))
        if not found:
            return result
        if not deleted:  # another prune deleted them first: look again
            continue
        runs = deleted[schema.runs.name]
        result.runs += runs
        result.batches += 1
        for name, n in deleted.items():
            result.rows[name] += n
        log.info("prune: deleted %d runs finished before %s (%s)", runs, cutoff.isoformat(sep=" "),
                 ", ".join(f"{name} {n}" for name, n in deleted.items()))
        if on_batch is not None:
            on_batch(runs, deleted)


def _check_arguments(batch_size: int, finished_before: timedelta) -> None:
    """RunFilterError, naming the option, for a batch size that is not a whole number of
    runs (at least 1) or a negative age."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise RunFilterError("--batch-size", batch_size, "expected a whole number of runs, at least 1")
    if finished_before < timedelta(0):
        raise RunFilterError("--finished-before", finished_before, "must not be negative")


def _next_batch(app: Database, cutoff: datetime, batch_size: int, pipeline: str | None) -> tuple[bool, dict[str, int]]:
    """One batch's transaction: whether candidates were found, and the rows deleted."""
    with app.begin() as tx:
        found = candidates(tx, cutoff, batch_size, pipeline)
        return bool(found), prune_batch(tx, found, cutoff)


def render(result: PruneResult) -> str:
    """``ductwork prune``'s report: runs, then rows per table."""
    verb = "would delete" if result.dry_run else "deleted"
    lines = [f"{verb} {result.runs} runs finished before {result.finished_before.isoformat(sep=' ')} UTC"
             + ("" if result.dry_run else f" in {result.batches} batches")]
    width = max(len(name) for name in result.rows)
    lines += [f"  {name:<{width}}  {n}" for name, n in result.rows.items()]
    return "\n".join(lines)
