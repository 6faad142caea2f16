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
any live run is set once), INV-HLT-1 and INV-HLT-2 (the reaper and the orphan sweep crash
only a running hook: a pending one is not run twice, a final one's outcome stays
recorded; mutant ``hook_sweep_takes_any_status``).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
import sqlalchemy as sa

from ductwork.db import schema
from ductwork.db.ids import new_id
from ductwork.errors import ReviveError, RunStateError
from ductwork.fleet.processes import register
from ductwork.fleet.reaper import reap, sweep_orphans
from ductwork.pipelines.context import Context
from ductwork.pipelines.prune import prune
from ductwork.pipelines.runs import Run
from ductwork.testing import drain
from tests.factories import make_run, run_rows
from tests.workloads import Approval, Unkeyed
from tests.workloads.hooks import HaltingPipeline

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
    with app.begin() as tx:  # (and the pruned ones, gone already)
        every_run = {*tx.execute(sa.select(schema.runs.c.id)).scalars(), *made.values()}
    before = {run_id: run_rows(app, run_id) for run_id in every_run}
    prune(app, timedelta(0))
    after = {run_id: run_rows(app, run_id) for run_id in every_run}
    gone = {run_id: {table: [] for table in rows} for run_id, rows in before.items()}
    for status in STATUSES:
        run_id = made[status, "prune"]
        kept = TABLE[status, "prune"] == ("kept",) and status != "pruned"
        # every row of a kept run as it was; a deleted run has no row left in any table
        assert after[run_id] == (before[run_id] if kept else gone[run_id]), f"prune of a {status} run"
    for run_id in every_run:  # (the other columns' runs, and the revivals: each kept whole or deleted whole)
        assert after[run_id] in (before[run_id], gone[run_id]), run_id


#: hook status -> what the orphan sweep and the reaper do to a hook in it that a gone
#: claimer still names: only a running one is crashed (``tests/unit/
#: test_model_recovery_preconditions.py`` holds the model's side of this table)
HOOK_TABLE: dict[str, str] = {"pending": "left to its next claim", "running": "crashed",
                              "succeeded": "its outcome kept", "failed": "its outcome kept"}
HOOK_STATUSES = tuple(HOOK_TABLE)


def test_the_hook_sweep_and_the_reaper_crash_only_a_running_hook(app):
    """An on_halt hook in each status, each still naming a claimer, a token and a claim
    time long ago (a process that is gone: the orphan sweep's; or one being reaped): each
    crashes the running hook only; a pending hook is left to its next claim and a final
    one keeps its recorded outcome [INV-HLT-1, INV-HLT-2]."""
    h = schema.halt_hooks
    long_ago = datetime(2000, 1, 1)
    dead = register(app, role="test", label="dead")
    runs = {(holder, status): make_run(app)[0] for holder in ("orphan", "reaped") for status in HOOK_STATUSES}
    hooks = {cell: new_id() for cell in runs}
    with app.begin() as tx:
        for (holder, status), run_id in runs.items():
            tx.execute(h.insert().values(
                id=hooks[holder, status], run_id=run_id, klass="tests.factories:Noop", status=status,
                eligible_at=long_ago, claim_token=new_id(), claimed_at=long_ago,
                process_id=None if holder == "orphan" else dead, retry_count=0, crash_count=0,
                completed_at=long_ago if status in ("succeeded", "failed") else None,
                created_at=long_ago, updated_at=long_ago))

    def rows():  # (not process_id: deleting the reaped process's row sets it NULL on every hook it named)
        with app.begin() as tx:
            return {row.id: tuple(row) for row in tx.execute(sa.select(*(c for c in h.c if c.name != "process_id")))}

    before = rows()
    assert sweep_orphans(app) == 1
    assert reap(app, dead, force=True)
    after = rows()
    changed = {cell for cell, hook_id in hooks.items() if after[hook_id] != before[hook_id]}
    assert changed == {(holder, status) for holder in ("orphan", "reaped") for status in HOOK_STATUSES
                       if HOOK_TABLE[status] == "crashed"} == {("orphan", "running"), ("reaped", "running")}
