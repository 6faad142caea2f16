"""Running one due ``on_halt`` hook: claim it, build the handler, run it, record the attempt.

    >>> run_due_hook(app, process_id)        # None when no hook is due
    HookPerformed(hook_id='…', run_id='…', outcome='success', status='succeeded')

Called by a job worker (``Worker.run_once``) when it found no execution to claim, and
at least once a second while it is busy. At-least-once as code: ``execute`` runs
before its attempt is recorded, so a crash between the two (or a reaper that took the
claim) runs the handler again; it is built with the hook's id as its
``idempotency_key`` (the same on every attempt) to make that harmless. The outcome is
recorded once (``pipelines.hooks.record_hook``, fenced by the claim's token) [INV-HLT-1].

How an attempt ends, one owner per failure (as for a step): ``execute`` raising is a
``failure`` (retried within ``max_retry``); a class that does not resolve or a halt
that does not bind to ``__init__`` is ``invalid`` (the hook fails at once); ``__init__``
raising or the thread leaving is ``process_crashed`` (re-run within ``max_crash``).
Not done: a timeout (the handler runs in the worker's thread).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ductwork import faults
from ductwork.db.dialects import retry_transient
from ductwork.fleet.invoke import BuildFailed, StepInvalid, build_step
from ductwork.limits.executions import ErrorInfo
from ductwork.pipelines.hooks import ClaimedHook, HookClaimLost, claim_hook, record_hook

if TYPE_CHECKING:
    from collections.abc import Callable

    from ductwork.db.database import Database

log = logging.getLogger("ductwork.hooks")

ABANDONED = ErrorInfo("ductwork.AbandonedClaim", "on_halt hook abandoned by its worker thread", None)


@dataclass(frozen=True)
class HookPerformed:
    """What :func:`run_due_hook` did."""

    hook_id: str
    run_id: str
    #: success | failure | invalid | process_crashed | claim_lost
    outcome: str
    #: the hook's status after the attempt (None: claim_lost, nothing recorded)
    status: str | None


def run_due_hook(app: Database, process_id: str, holding: Callable[[str | None], None] = lambda _: None
                 ) -> HookPerformed | None:
    """Claim the oldest due hook, run its handler and record the attempt; None when none is
    due. ``holding(hook_id)`` is told the hook this thread holds (None once recorded), so
    the runner's reconciliation leaves it alone. Whatever escapes (the thread leaving)
    crashes the attempt first."""
    claimed = claim_hook(app, process_id)
    if claimed is None:
        return None
    holding(claimed.hook_id)
    recorded = False
    try:
        faults.hit(faults.AFTER_HOOK_CLAIM)
        outcome, error = _invoke(app, claimed)
        try:
            status: str | None = retry_transient(lambda: record_hook(app, claimed, outcome, error))
        except HookClaimLost as lost:  # reaped under it: the reaper's re-run is the live attempt
            log.warning("%s", lost)
            outcome, status = "claim_lost", None
        recorded = True
        return HookPerformed(claimed.hook_id, claimed.run_id, outcome, status)
    finally:
        holding(None)
        if not recorded:  # never leave the claim held by a thread that is gone
            try:
                record_hook(app, claimed, "process_crashed", ABANDONED)
            except Exception:  # the reaper, the sweep or the runner's reconciliation crashes it later
                log.exception("on_halt hook %s: could not crash the abandoned attempt", claimed.hook_id)


def _invoke(app: Database, claimed: ClaimedHook) -> tuple[str, ErrorInfo | None]:
    """Build and run the handler: its outcome and error (None for a success)."""
    try:
        # the idempotency key is the hook's id: the same on every attempt [INV-HLT-1]
        handler = build_step(app, claimed.klass, json.dumps([claimed.halt]), claimed.hook_id, claimed.run_id)
    except StepInvalid as invalid:
        return "invalid", invalid.info
    except BuildFailed as failed:
        return "process_crashed", failed.info
    try:
        handler.execute()
    except Exception as error:  # noqa: BLE001 - the handler's own failure: retried, never lost
        return "failure", ErrorInfo.of(error)
    return "success", None
