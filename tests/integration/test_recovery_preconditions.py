"""Recovery operations over every run status: the exact error or effect of each.

Revive, resume, prune and ``Context.set`` each accept some run statuses and refuse the
others. A test per accepted status existed; here one table covers every status a run
can be in (``in_progress``, ``dampened``, ``halted``, ``completed``, a halted run
``revived`` already, a ``pruned`` run that is gone) × every operation, on each
database, asserting the exact error (class and message) or the exact effect, and that a
refusal writes nothing. ``tests/unit/test_model_recovery_preconditions.py`` holds the
same table for the model's operations (``model/pipelines.py``). The engine mutants
``resume_accepts_in_progress`` and ``revive_accepts_completed`` (tests/mutants.py) each
accept one status too many, and each is killed here. (A prune that also accepted
``in_progress`` or ``dampened`` would change nothing: such a run has no finish time, which
the prune's cutoff needs as well; a halted run is never dampened, for a dampened branch
makes its run ``dampened``.)

Checks: INV-RUN-1 (terminal states are final: a completed or halted run is not
resumed), INV-REV-1 (a halted run is revived once; a revived one returns its revival),
INV-PRN-1 (a prune deletes only completed and halted runs), INV-CTX-1 (a context key of
any live run is set once).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from ductwork.db import schema
from ductwork.errors import ReviveError, RunStateError
from ductwork.pipelines.context import Context
from ductwork.pipelines.prune import prune
from ductwork.pipelines.runs import Run
from ductwork.testing import drain
from tests.workloads import Approval, HaltingPipeline, Unkeyed

STATUSES = ("in_progress", "dampened", "halted", "completed", "revived", "pruned")
OPERATIONS = ("revive", "resume", "context_set", "prune")

#: (status, operation) -> the error it raises (class, message with {run}), or the effect it has
TABLE: dict[tuple[str, str], tuple] = {
    ("in_progress", "revive"): (ReviveError, "cannot revive run {run}: it is in_progress; only a halted run can "
                                             "be revived"),
    ("dampened", "revive"): (ReviveError, "cannot revive run {run}: it is dampened; only a halted run can be "
                                          "revived"),
    ("halted", "revive"): ("a new run",),
    ("completed", "revive"): (ReviveError, "cannot revive run {run}: it is completed; only a halted run can be "
                                           "revived"),
    ("revived", "revive"): ("its revival",),
    ("pruned", "revive"): (ReviveError, "cannot revive run {run}: it does not exist; only a halted run can be "
                                        "revived"),
    ("in_progress", "resume"): (RunStateError, "run {run} is in_progress with no dampened branch; nothing to resume"),
    ("dampened", "resume"): ("resumed",),
    ("halted", "resume"): (RunStateError, "run {run} is halted with no dampened branch; nothing to resume"),
    ("completed", "resume"): (RunStateError, "run {run} is completed with no dampened branch; nothing to resume"),
    ("revived", "resume"): (RunStateError, "run {run} is halted with no dampened branch; nothing to resume"),
    ("pruned", "resume"): (RunStateError, "run {run} does not exist"),
    ("in_progress", "context_set"): ("set",),
    ("dampened", "context_set"): ("set",),
    ("halted", "context_set"): ("set",),
    ("completed", "context_set"): ("set",),
    ("revived", "context_set"): ("set",),
    ("pruned", "context_set"): (RunStateError, "no run {run!r} (never triggered, or pruned)"),
    ("in_progress", "prune"): ("kept",),
    ("dampened", "prune"): ("kept",),
    ("halted", "prune"): ("deleted",),
    ("completed", "prune"): ("deleted",),
    ("revived", "prune"): ("deleted",),
    ("pruned", "prune"): ("kept",),  # (nothing left to delete)
}


def test_the_table_covers_every_status_and_operation():
    assert set(TABLE) == {(s, o) for s in STATUSES for o in OPERATIONS}


def _runs(app) -> dict[tuple[str, str], str]:
    """A run in each status for each operation (pruned ones first: a prune takes every
    finished run)."""
    made: dict[tuple[str, str], str] = {("pruned", o): Unkeyed.trigger(o).id for o in OPERATIONS}
    drain(app, timeout=60)
    assert prune(app, timedelta(0)).runs == len(OPERATIONS)
    kinds = {"dampened": Approval, "completed": Unkeyed, "halted": HaltingPipeline, "revived": HaltingPipeline}
    made.update({(s, o): kinds[s].trigger(o).id for s in kinds for o in OPERATIONS})
    drain(app, timeout=60)
    for o in OPERATIONS:
        Run(app, made["revived", o]).revive()
    made.update({("in_progress", o): Unkeyed.trigger(o).id for o in OPERATIONS})
    return made


def _state(app) -> list[tuple]:
    """Every run, branch and context row: what a refused operation must leave as it was."""
    r, b, c = schema.runs, schema.branches, schema.context
    with app.begin() as tx:
        return [tuple(row) for table in (r, b, c)
                for row in tx.execute(sa.select(table).order_by(table.c.id))]


def _status(app, run_id) -> str | None:
    with app.begin() as tx:
        return tx.execute(sa.select(schema.runs.c.status).where(schema.runs.c.id == run_id)).scalar()


def _apply(app, operation, run_id):
    if operation == "revive":
        return Run(app, run_id, _read=False).revive().id
    if operation == "resume":
        return Run(app, run_id, _read=False).resume().status
    return Context(app, run_id).set("k", 7)


def test_each_operation_over_every_status(app):
    """One table, every cell: the refusals raise their exact error and write nothing; the
    accepted operations have their exact effect [INV-RUN-1, INV-REV-1, INV-PRN-1]."""
    made = _runs(app)
    revivals = {}
    with app.begin() as tx:
        for (status, _), run_id in made.items():
            if status == "revived":
                revivals[run_id] = tx.execute(sa.select(schema.runs.c.id)
                                              .where(schema.runs.c.revived_from == run_id)).scalar_one()
    for status in STATUSES:
        for operation in ("revive", "resume", "context_set"):
            run_id, expected = made[status, operation], TABLE[status, operation]
            cell = f"{operation} of a {status} run"
            if isinstance(expected[0], type):
                before = _state(app)
                with pytest.raises(expected[0]) as refused:
                    _apply(app, operation, run_id)
                assert str(refused.value) == expected[1].format(run=run_id), cell
                assert _state(app) == before, cell
                continue
            got = _apply(app, operation, run_id)
            if expected == ("a new run",):
                assert (got != run_id, _status(app, got), _status(app, run_id)) == (True, "in_progress", "halted")
            elif expected == ("its revival",):
                assert got == revivals[run_id], cell
            elif expected == ("resumed",):
                assert got == "in_progress", cell
            else:
                assert (got, Context(app, run_id).get("k")) == (7, 7), cell
    prune(app, timedelta(0))
    for status in STATUSES:
        run_id = made[status, "prune"]
        kept = _status(app, run_id) is not None
        assert kept == (TABLE[status, "prune"] == ("kept",) and status != "pruned"), f"prune of a {status} run"
