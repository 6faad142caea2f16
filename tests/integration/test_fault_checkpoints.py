"""A real process killed (or failed) at every fault checkpoint, then recovery.

For each checkpoint × action × database: a child process runs the fleet's work
for a keyed expand/collapse run with ``DUCTWORK_FAULT=<checkpoint>:<action>:1``;
the test asserts the checkpoint fired and the child ended as the action says
(SIGKILL, exit 1, or the checkpoint's exception raised), force-reaps the dead child's row as its
supervisor would, finishes the work in this process, and checks the run
completed with every step exactly once and the fan-in inputs complete and in
order. The on_halt hook's checkpoints, which only a halting run passes, are
``tests/integration/test_halt_hook_faults.py``'s.

Checkpoints outside the fleet's work have their own test below (``OWN_TESTS``):
``inside_revive`` kills ``ductwork revive`` after it wrote the new run and before it
commits, and checks that nothing or everything of the revive is there.

Checks: INV-ADV-1, INV-ADV-2, INV-ADV-3, INV-ADV-4, INV-EXE-1, INV-EXE-2, INV-LIM-3, INV-REV-1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from datetime import timedelta

import pytest
import sqlalchemy as sa

from ductwork import faults
from ductwork.db import schema
from ductwork.fleet.processes import register
from ductwork.limits.claims import claim
from ductwork.testing import drain
from tests.conftest import TEST_CONFIG, installed, make_app, reset_tables
from tests.integration.fault_child import EXIT_CODES, run_then_reap
from tests.workloads.processes import FAULT_KEY, FAULT_TOTAL_KEY, FaultPipeline, fault_pipeline_expected

ITEMS = 10  # expand_batch is 4: three batches
#: checkpoints outside the fleet's work, each with its own kill test:
#: inside_prune_batch (``ductwork prune``): tests/integration/test_inspection.py;
#: while_async_steps_await (only async steps pass it): tests/integration/test_async_steps.py
ELSEWHERE = (faults.INSIDE_PRUNE_BATCH, faults.WHILE_ASYNC_STEPS_AWAIT, *faults.HOOK_CHECKPOINTS)
CONFIG = {**TEST_CONFIG, "pipelines": ["tests.workloads.processes:FaultPipeline"], "job_worker": {
    **TEST_CONFIG["job_worker"],
    "limits": {FAULT_KEY: {"concurrency": 2, "rate": {"limit": 1000, "per": 1}}, FAULT_TOTAL_KEY: {"concurrency": 1}},
}}


@pytest.fixture
def fault_app(db_url):
    from ductwork.config import Config

    yield from installed(make_app(db_url, config=Config.from_section(CONFIG, source="<fault tests>")))


def _ghost_holding_a_claim(app):
    """A stale process that holds a claim, so a reaper has something to reap."""
    ghost = register(app, role="ghost", label="ghost")
    assert claim(app, ghost) is not None
    with app.begin() as tx:
        tx.execute(schema.processes.update().where(schema.processes.c.id == ghost)
                   .values(last_heartbeat_at=tx.now - timedelta(hours=1)))
    return ghost


#: checkpoints that the fleet's work does not reach, each with its own test in this file
OWN_TESTS = {faults.INSIDE_REVIVE: "test_a_revive_killed_inside_its_transaction_leaves_nothing_or_everything"}


#: the actions each checkpoint is stopped with. Not ``sleep``: a child that pauses at a
#: checkpoint and carries on races nobody here (it is the only process at work), so it is
#: the undisturbed run again; pauses that others race are the chaos tier's (``freeze_host``,
#: ``kill_host_at_checkpoint``) and the lock-race tests'
STOPS = ("kill", "exit", "raise")


@pytest.mark.parametrize("action", STOPS)
@pytest.mark.parametrize("checkpoint", [c for c in faults.CHECKPOINTS if c not in ELSEWHERE and c not in OWN_TESTS])
def test_checkpoint(fault_app, db_url, checkpoint, action):
    app = fault_app
    run = FaultPipeline.trigger(ITEMS)
    if checkpoint == faults.DURING_REAP:
        _ghost_holding_a_claim(app)
    config = CONFIG
    if checkpoint == faults.INSIDE_ADVANCE_BATCH:  # the leaf is then an advancer's, in a batch
        config = {**CONFIG, "pipeline_advancer": {**CONFIG["pipeline_advancer"], "inline_linear": False}}
    run_then_reap(app, db_url, config, "fault-child", f"{checkpoint}:{action}:1")
    drain(app, timeout=60)

    assert run.refresh().status == "completed"
    steps = run.steps()
    assert Counter(s.node for s in steps) == fault_pipeline_expected(ITEMS)  # [INV-ADV-1]
    assert {s.status for s in steps} == {"completed"}
    assert steps[-1].input == [[i * i for i in range(ITEMS)]]  # [INV-ADV-3] once, complete, in order
    with app.begin() as tx:
        open_executions = tx.execute(sa.select(sa.func.count()).select_from(schema.executions)
                                     .where(schema.executions.c.completed_at.is_(None))).scalar_one()
        claimed_branches = tx.execute(sa.select(sa.func.count()).select_from(schema.branches)
                                      .where(schema.branches.c.claim_token.is_not(None))).scalar_one()
    assert (open_executions, claimed_branches) == (0, 0)  # [INV-LIM-3] nothing left held


def test_every_checkpoint_has_exactly_one_call_site():
    """Each name in the registry is passed at exactly one place in ductwork/ (STYLE 17)."""
    import pathlib
    import re

    source = "\n".join(p.read_text() for p in pathlib.Path(faults.__file__).parent.rglob("*.py")
                       if p.name != "faults.py")
    for name, value in vars(faults).items():
        if isinstance(value, str) and value in faults.CHECKPOINTS:
            assert len(re.findall(rf"faults\.hit\(faults\.{name}\)", source)) == 1, name


# --------------------------------------------------------------------------- revive


def _revive_counts(app):
    with app.begin(readonly=True) as tx:
        return {t.name: tx.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                for t in (schema.runs, schema.branches, schema.steps, schema.executions,
                          schema.expand_items, schema.context)}


@pytest.mark.parametrize("action", list(EXIT_CODES))
def test_a_revive_killed_inside_its_transaction_leaves_nothing_or_everything(db_url, action):
    """``ductwork revive`` stopped at ``inside_revive`` (every row written, not committed):
    killed, exited or raised, nothing of the new run exists and a second revive makes it
    whole; carried on (``sleep``), the whole new run exists. Either way one new run, which
    then completes [INV-REV-1]."""
    from ductwork.app import set_default_app
    from tests.integration.test_revive import BROKEN, FanP

    app = make_app(db_url)
    reset_tables(app.engine)
    set_default_app(app)
    try:
        BROKEN["fail"] = True
        run = FanP.trigger(4)
        drain(app, timeout=60, skip_delays=False)
        assert run.refresh().status == "halted"
        before = _revive_counts(app)
        env = {**os.environ, "DUCTWORK_FAULT": f"{faults.INSIDE_REVIVE}:{action}:1", "DUCTWORK_FAULT_SLEEP": "0.05"}
        child = subprocess.run([sys.executable, "-m", "ductwork.cli", "revive", "--database-url", db_url, run.id],
                               env=env, capture_output=True, text=True, timeout=120)
        assert f"FAULT FIRING {faults.INSIDE_REVIVE}:{action}" in child.stderr, child.stderr[-2000:]
        with app.begin(readonly=True) as tx:
            revived = tx.execute(sa.select(schema.runs.c.id).where(schema.runs.c.revived_from == run.id)).all()
        if action == "sleep":
            assert child.returncode == 0, child.stderr[-2000:]
            assert [r.id for r in revived] == [child.stdout.strip()]  # everything
        else:
            assert child.returncode == (1 if action == "raise" else EXIT_CODES[action]), child.stderr[-2000:]
            assert revived == []  # nothing
            assert _revive_counts(app) == before
        new = run.revive()
        assert [r.id for r in revived] in ([], [new.id])
        BROKEN["fail"] = False
        drain(app, timeout=60)
        assert new.refresh().status == "completed"
        assert [s.input for s in new.steps() if s.node.startswith("Total")] == [[[100, 101, 102, 103]]]
    finally:
        BROKEN["fail"] = True
        set_default_app(None)
        app.dispose()
