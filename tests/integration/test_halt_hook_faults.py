"""A real process killed (or failed) at every on_halt hook checkpoint, then recovery.

For each hook checkpoint × action × database: a child process does the fleet's work
for a run that halts and owes a ``HaltRecorder`` hook, with
``DUCTWORK_FAULT=<checkpoint>:<action>:1``; the test asserts the checkpoint fired and
the child ended as the action says, force-reaps the dead child's row as its
supervisor would, finishes the work in this process, and checks that the run is
halted with exactly one hook, ``succeeded``, whose handler ran at least once (every
attempt with the hook's id as its idempotency key) and again only when the kill came
after it ran and before its outcome committed.

- ``between_halt_and_hook``: inside the halting transaction, after the hook row is
  written: the halt and the hook roll back together, the run is halted again later
  and owes one hook;
- ``after_hook_claim``: the hook is claimed, its handler not run: the reap crashes the
  claim and the hook is re-run;
- ``in_hook_commit``: the handler ran, its record is not committed: the reap crashes
  the claim, the handler runs again (at least once as code) and the outcome is
  recorded once.

Checks: INV-HLT-1, INV-HLT-2.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from ductwork import faults
from ductwork.db import schema
from ductwork.testing import drain
from tests.conftest import TEST_CONFIG, installed, make_app
from tests.integration.fault_child import EXIT_CODES, run_then_reap
from tests.workloads.hooks import HOOK_LOG_ENV, HaltingPipeline

CONFIG = {**TEST_CONFIG, "pipelines": ["tests.workloads.hooks:HaltingPipeline"],
          "job_worker": {**TEST_CONFIG["job_worker"], "max_retry": 0}}


@pytest.fixture
def hook_app(db_url):
    from ductwork.config import Config

    yield from installed(make_app(db_url, config=Config.from_section(CONFIG, source="<hook fault tests>")))


@pytest.mark.parametrize("action", list(EXIT_CODES))
@pytest.mark.parametrize("checkpoint", faults.HOOK_CHECKPOINTS)
def test_hook_checkpoint(hook_app, db_url, checkpoint, action, tmp_path, monkeypatch):
    app = hook_app
    log_file = tmp_path / "hooks.log"
    monkeypatch.setenv(HOOK_LOG_ENV, str(log_file))
    run = HaltingPipeline.trigger(5)
    run_then_reap(app, db_url, CONFIG, "hook-fault-child", f"{checkpoint}:{action}:1")
    h = schema.halt_hooks
    died = action in ("kill", "exit")
    crashed_holding_claim = died and checkpoint in (faults.AFTER_HOOK_CLAIM, faults.IN_HOOK_COMMIT)
    if crashed_holding_claim:  # [INV-HLT-2] the reap itself gives the dead worker's hook back
        with app.begin() as tx:
            held = tx.execute(sa.select(h.c.status, h.c.claim_token).where(h.c.run_id == run.id)).one()
        assert tuple(held) == ("pending", None)
    drain(app, timeout=60)

    assert run.refresh().status == "halted"
    with app.begin() as tx:
        rows = tx.execute(sa.select(h).where(h.c.run_id == run.id)).all()
    [hook] = rows  # [INV-HLT-1] one hook, one recorded outcome
    assert (hook.status, hook.claim_token, hook.last_outcome) == ("succeeded", None, "success")
    attempts = log_file.read_text().splitlines()
    assert attempts
    assert {line.split()[0] for line in attempts} == {hook.id}  # the same idempotency key
    assert {line.split()[1] for line in attempts} == {run.id}
    # [INV-HLT-2] a claim held by a dead worker is crashed and re-run; one raised in the
    # worker's own thread is crashed by the worker itself
    raised_in_hook = action == "raise" and checkpoint != faults.BETWEEN_HALT_AND_HOOK
    assert hook.crash_count == (1 if crashed_holding_claim or raised_in_hook else 0)
    ran_before_dying = checkpoint == faults.IN_HOOK_COMMIT and action in ("kill", "exit", "raise")
    assert len(attempts) == (2 if ran_before_dying else 1)  # at least once as code
