"""``on_halt`` hooks: a halted run owes its handler one hook, delivered exactly once as a
recorded outcome and at least once as code.

    >>> claimed = claim_hook(app, process_id)          # None: no hook due
    >>> record_hook(app, claimed, "success")           # fenced by the claim's token

The hook's row is written by the transaction that halts the run (:func:`owe_hooks`,
called by ``runs.resolve_runs`` when a run moves to ``halted``), so a crash anywhere
after the halt commits cannot lose it, and a halt that rolls back owes nothing. The
unique constraint ``uq_halt_hook_run`` makes it one hook per run [INV-HLT-1].

A worker claims a due hook (:func:`claim_hook`: a conditional UPDATE from ``pending``
that sets a fresh ``claim_token``, checked by rowcount), runs the handler outside any
transaction, then records the attempt (:func:`record_hook`: a conditional UPDATE on
``status = 'running' AND claim_token = <its token>``, checked by rowcount). A claimer
whose claim was taken (reaped, then re-claimed) records nothing: :class:`HookClaimLost`
[INV-HLT-1]. A failure is retried after ``job_worker.retry_delay`` while ``retry_count <
max_retry``; a crash (the handler could not be built, the worker thread left, the process
died: :func:`crash_hooks_of`, called by the reaper) is re-run, at once for the first
``max_crash // 3`` crashes then ``crash_count × crash_backoff`` later, while
``crash_count < max_crash``; the budgets are the step budgets, looked up for the run's
pipeline and the handler's class (``job_worker.max_retry``/``max_crash`` and their
per-pipeline, per-step overrides; the rule is ``rules.decide_hook``, a pure function of the
counters read under the claim) [INV-HLT-2]. A handler whose class does not resolve
or whose input does not bind ends ``failed`` at once (``invalid``). ``succeeded`` and
``failed`` are final.

Every attempt that did not succeed is logged at WARNING once recorded (run id,
pipeline, handler, attempt, what follows, traceback), and the hook row keeps the last
error. Not done: running the handler (``ductwork.fleet.hooks``), a timeout for it (a
handler runs in the worker's thread, like a step without ``timeout=``), and any
ordering between the hooks of different runs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ductwork import faults, logs
from ductwork.db import dialects, schema
from ductwork.db.ids import new_id
from ductwork.errors import DuctworkError
from ductwork.limits.executions import ErrorInfo
from ductwork.pipelines.rules import decide_hook
from ductwork.pipelines.steps import latest_step
from ductwork.values import Json

if TYPE_CHECKING:
    from ductwork.db.database import Database, Tx

log = logging.getLogger("ductwork.hooks")

_h, _r, _b = schema.halt_hooks, schema.runs, schema.branches
FINAL = ("succeeded", "failed")


class HookClaimLost(DuctworkError):
    """A hook attempt's record matched no row: its claim was reaped (and perhaps re-claimed)
    or its outcome is already recorded. Nothing was recorded."""

    def __init__(self, hook_id: str, token: str):
        self.hook_id, self.token = hook_id, token
        super().__init__(f"on_halt hook {hook_id}: claim {token} is no longer the hook's; "
                         "this attempt's outcome was not recorded")


@dataclass(frozen=True)
class ClaimedHook:
    """A hook this process holds, with what running it needs."""

    hook_id: str
    run_id: str
    klass: str
    pipeline_klass: str
    claim_token: str
    process_id: str
    retry_count: int
    crash_count: int
    #: the handler's one argument: ``run_id``, ``pipeline``, ``halt_reasons``, ``errors``
    halt: dict[str, Json]


# --------------------------------------------------------------------------- owing


def owe_hooks(tx: Tx, run_ids: list[str]) -> int:
    """Inside the transaction that moves ``run_ids`` to ``halted``: write the hook each owes
    its definition's ``on_halt`` handler (runs without one owe nothing); returns how many.

    The unique constraint ``uq_halt_hook_run`` allows one per run [INV-HLT-1]; a run
    already halted is never passed here (a final run never changes, INV-RUN-1)."""
    handlers = {run.id: json.loads(run.definition).get("on_halt") for run in tx.execute(
        sa.select(_r.c.id, _r.c.definition).where(_r.c.id.in_(dialects.inline_ids(sorted(run_ids)))))}
    owed = [{"id": new_id(), "run_id": run_id, "klass": klass, "status": "pending",  # (unclaimed)
             "eligible_at": tx.now, "retry_count": 0, "crash_count": 0, "created_at": tx.now, "updated_at": tx.now}
            for run_id, klass in handlers.items() if klass is not None]
    if owed:
        tx.execute(_h.insert(), owed)  # [INV-HLT-2] owed by the halt's own transaction
        faults.hit(faults.BETWEEN_HALT_AND_HOOK)
        tx.wake()  # a worker may claim it
    return len(owed)


# --------------------------------------------------------------------------- claiming


def claim_hook(app: Database, process_id: str) -> ClaimedHook | None:
    """Claim the oldest due hook for ``process_id``; None when none is due (or another
    worker claimed it first). The claim is a conditional UPDATE from ``pending``, checked
    by rowcount, that sets a fresh ``claim_token``: the fence of this attempt's record."""
    with app.begin() as tx:
        # the hook row alone is locked (no join: the halted run's row stays free)
        row = tx.execute(dialects.for_update(
            sa.select(_h.c.id, _h.c.run_id, _h.c.klass, _h.c.retry_count, _h.c.crash_count)
            .where(_h.c.status == "pending",  # [INV-HLT-1] a running or final hook is not claimable
                   _h.c.eligible_at <= tx.now)
            .order_by(_h.c.eligible_at, _h.c.id).limit(1), tx.conn, skip_locked=True)).first()
        if row is None:
            return None
        pipeline: str = tx.execute(sa.select(_r.c.pipeline_klass).where(_r.c.id == row.run_id)).scalar_one()
        token = new_id()
        claimed = tx.execute(_h.update().where(_h.c.id == row.id, _h.c.status == "pending")  # [INV-HLT-1]
                             .values(status="running", claim_token=token, claimed_at=tx.now,
                                     process_id=process_id, updated_at=tx.now))
        if claimed.rowcount != 1:  # pragma: no cover  the row was read FOR UPDATE (SQLite: BEGIN IMMEDIATE) above
            return None
        halt = halt_of(tx, row.run_id, pipeline)
    return ClaimedHook(row.id, row.run_id, row.klass, pipeline, token, process_id,
                       row.retry_count, row.crash_count, halt)


def halt_of(tx: Tx, run_id: str, pipeline: str) -> dict[str, Json]:
    """What the handler is told: the run, its pipeline, each halted branch's reason and
    node, and the error each halted branch's last step (or advancement) ended with."""
    e, a = schema.executions, schema.advancements
    reasons, errors = [], []
    for branch in tx.execute(sa.select(_b.c.id, _b.c.halt_reason).where(
            _b.c.run_id == run_id, _b.c.status == "halted").order_by(_b.c.id)):
        step = latest_step(tx, branch.id)
        assert step is not None, f"halted branch {branch.id} has a step"
        reasons.append({"node": step.node, "reason": branch.halt_reason, "branch_id": branch.id, "step_id": step.id})
        # the step's last error, else its advancement's (read only when the step has none)
        error = next(filter(None, (tx.execute(
            sa.select(t.c.error_klass, t.c.error_message).where(t.c.step_id == step.id, t.c.error_klass.is_not(None))
            .order_by(t.c.completed_at.desc(), t.c.id.desc()).limit(1)).first() for t in (e, a))), None)
        if error is not None:
            errors.append({"node": step.node, "klass": error.error_klass, "message": error.error_message})
    return {"run_id": run_id, "pipeline": pipeline, "halt_reasons": reasons, "errors": errors}


# --------------------------------------------------------------------------- recording


@dataclass(frozen=True)
class HookEnded:
    """An attempt that did not succeed, to log once its transaction committed."""

    hook_id: str
    run_id: str
    pipeline: str
    klass: str
    attempt: int
    outcome: str
    status: str
    next_at: datetime | None
    budget: int
    error: ErrorInfo


def _record_in(app: Database, tx: Tx, hook: ClaimedHook | sa.Row[Any], outcome: str,
               error: ErrorInfo | None) -> tuple[str | None, HookEnded | None]:
    """The fenced record of ``hook``'s attempt (its claim, or the row a recovery read: the
    hook's id, run, handler, pipeline, claim token and counters): the hook's status after
    it (None: the claim was not the hook's, nothing written), and what to log once
    committed (None for a success)."""
    config = app.config.job_worker
    max_retry, max_crash = config.max_retry_for(hook.pipeline_klass, hook.klass), config.max_crash_for(
        hook.pipeline_klass, hook.klass)
    values = decide_hook(outcome, hook.retry_count, hook.crash_count, tx.now, max_retry=max_retry,
                         max_crash=max_crash, retry_delay=config.retry_delay, crash_backoff=config.crash_backoff)
    values.update(claim_token=None, claimed_at=None, process_id=None, last_outcome=outcome, updated_at=tx.now)
    if error is not None:
        values.update(error_klass=error.klass, error_message=error.message,
                      error_backtrace=error.backtrace)
    result = tx.execute(_h.update().where(_h.c.id == hook.hook_id, _h.c.status == "running",
                                          _h.c.claim_token == hook.claim_token)  # [INV-HLT-1] the claim's fence
                        .values(**values))
    if result.rowcount != 1:
        return None, None
    if values["status"] == "pending":
        tx.wake()
    if outcome == "success":
        return values["status"], None
    return values["status"], HookEnded(
        hook.hook_id, hook.run_id, hook.pipeline_klass, hook.klass, hook.retry_count + hook.crash_count, outcome,
        values["status"], values.get("eligible_at") if values["status"] == "pending" else None,
        max_crash if outcome == "process_crashed" else max_retry, error or ErrorInfo("ductwork.Unknown", "", None))


def record_hook(app: Database, claimed: ClaimedHook, outcome: str, error: ErrorInfo | None = None) -> str:
    """Record how the claimed attempt ended (``success``, ``failure``, ``invalid``,
    ``process_crashed``), fenced by the claim's token; returns the hook's status after it.
    Raises :class:`HookClaimLost` when the claim is no longer the hook's (nothing is
    recorded). A non-success is logged at WARNING once committed."""
    with app.begin() as tx:
        status, ended = _record_in(app, tx, claimed, outcome, error)
        if status is None:
            raise HookClaimLost(claimed.hook_id, claimed.claim_token)
        faults.hit(faults.IN_HOOK_COMMIT)
    log_ended([ended] if ended else [])  # committed: now it may be told
    return status


def crash_hooks_of(app: Database, tx: Tx, hook_ids: list[str]) -> list[HookEnded]:
    """Inside a recovery's transaction (``fleet.reaper.recover``): crash each of these
    hooks that is still running, fenced by the token it holds; returns what to log once
    committed [INV-HLT-2]."""
    rows = tx.execute(sa.select(_h.c.id.label("hook_id"), _h.c.run_id, _h.c.klass, _h.c.claim_token,
                                _h.c.retry_count, _h.c.crash_count, _r.c.pipeline_klass)
                      .join(_r, _r.c.id == _h.c.run_id)
                      .where(_h.c.status == "running", _h.c.id.in_(dialects.inline_ids(sorted(hook_ids))))
                      .order_by(_h.c.id)).all()
    crash = ErrorInfo("ductwork.ProcessCrash", "on_halt hook reaped from a dead process", None)
    return [event for row in rows if (event := _record_in(app, tx, row, "process_crashed", crash)[1]) is not None]


def log_ended(events: list[HookEnded]) -> None:
    """Log attempts that did not succeed (:func:`crash_hooks_of`'s, :func:`record_hook`'s),
    once their transaction committed."""
    for event in events:
        logs.hook_ended(log, run_id=event.run_id, pipeline=event.pipeline, hook=event.klass, hook_id=event.hook_id,
                        attempt=event.attempt, outcome=event.outcome, status=event.status, next_at=event.next_at,
                        budget=event.budget, error=event.error.klass, error_message=event.error.message,
                        traceback=event.error.log_traceback())


def open_hooks(tx: Tx) -> bool:
    """Whether any hook is owed and has no recorded outcome yet."""
    return tx.execute(sa.select(_h.c.id).where(_h.c.status.not_in(FINAL)).limit(1)).first() is not None


def next_hook_at(tx: Tx) -> datetime | None:
    """When the next backed-off hook becomes claimable (None: none waits so)."""
    eligible: datetime | None = tx.execute(sa.select(sa.func.min(_h.c.eligible_at)).where(
        _h.c.status == "pending", _h.c.eligible_at > tx.now)).scalar()
    return eligible
